#ifndef SDC_KERNELS_CUDA_CHECK_QUEUE_H_
#define SDC_KERNELS_CUDA_CHECK_QUEUE_H_

// Device-resident scans and fingerprints, read once per step.
//
// A step queues any number of scans (QueueScan: a DDP bucket's, from the
// communication hook) and fingerprints (QueueFingerprint) on the caller's
// stream; each only queues work: its chunk descriptors are written to a
// pinned staging buffer and copied to a device buffer asynchronously, its
// kernel writes into the step's results buffer on the device, and the host
// never waits. Read then copies the step's whole results buffer to pinned
// host memory (one device-to-host copy) and synchronizes the stream once,
// and folds the per-chunk partials into per-tensor results exactly as the
// blocking entry points of kernels/cuda.h do (they are this queue with a
// Read after each call).
//
// Buffers persist across steps and grow (to twice what a step needed) only
// when a step needs more than any step before it: a training loop whose
// steps queue the same work allocates on its first step and never again.
// Every host call goes through a CudaLauncher (cuda_launcher.h); a test
// drives this class with a counting launcher to pin the calls per step.
//
// Thread-compatible: one queue per device, its calls serialized by the
// caller (StepPipeline holds its lock around them).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda_launcher.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"

namespace sdc::kernels {

class CudaCheckQueue {
 public:
  using Stream = CudaLauncher::Stream;

  // What Read hands back: scans[h] for QueueScan's handle h, fingerprints[h]
  // for QueueFingerprint's, each in the order of the tensors queued, and
  // copies[h] for QueueCopy's.
  struct Results {
    std::vector<std::vector<ScanResult>> scans;
    std::vector<std::vector<Fingerprint>> fingerprints;
    std::vector<std::vector<unsigned char>> copies;
  };

  // REQUIRES: `launcher` outlives the queue; the current device is the one
  // the queued tensors live on, at every call.
  explicit CudaCheckQueue(CudaLauncher& launcher);
  // Waits for queued work (nothing may still read the buffers), then frees.
  ~CudaCheckQueue();
  CudaCheckQueue(const CudaCheckQueue&) = delete;
  CudaCheckQueue& operator=(const CudaCheckQueue&) = delete;

  // Queues a non-finite scan of `tensors` (device memory) on `stream` and
  // returns its handle. The tensors must hold their values until the
  // queued work has run (stream order). InvalidArgument as ScanNonFinite,
  // or for an element pointer not aligned to its element size; Internal
  // with CUDA's message on a CUDA failure (the step then fails at Read).
  absl::StatusOr<size_t> QueueScan(absl::Span<const TensorRef> tensors, Stream stream);

  // Queues fingerprints of `tensors` under `key`, as above (InvalidArgument
  // as FingerprintTensors).
  absl::StatusOr<size_t> QueueFingerprint(absl::Span<const ByteSpan> tensors,
                                          const FingerprintKey& key, Stream stream);

  // Queues a copy of `bytes` bytes of device memory at `device` (a loss
  // scaler's scale, say) into the step's results, so it comes back with
  // the same read. InvalidArgument for a null pointer with bytes > 0.
  absl::StatusOr<size_t> QueueCopy(const void* device, size_t bytes, Stream stream);

  // The step's one read: copies every queued result to the host, waits
  // for it, and starts the next step. With nothing queued it returns empty
  // results and calls nothing. Returns the step's first error (Internal),
  // after waiting for its queued work, when any queue call or the read
  // failed.
  absl::StatusOr<Results> Read();

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  // One queued call: where its partials start in the results buffer and
  // what folds them.
  enum class Kind { kScan, kFingerprint, kCopy };
  struct Op {
    Kind kind = Kind::kScan;
    size_t first_word = 0;
    size_t tensors = 0;
    std::vector<uint32_t> chunk_tensor;  // Scans: each chunk's tensor.
    std::vector<uint64_t> sizes;         // Fingerprints: each tensor's bytes; copies: {bytes}.
    uint64_t r1 = 0;
    uint64_t r2 = 0;
  };

  absl::Status Fail(const char* what, int code);
  // Orders this call after the step's earlier work when it comes on
  // another stream.
  absl::Status UseStream(Stream stream);
  // Copies `bytes` from `src` through the staging buffer into the
  // descriptor buffer; returns the device address.
  absl::StatusOr<void*> StageToDevice(const void* src, size_t bytes);
  // Reserves `words` words of the results buffer; returns the first.
  absl::StatusOr<size_t> ReserveResults(size_t words);
  // Grows `b` to hold `need` bytes; the old buffer is kept until Read has
  // waited for the work that may read it. `keep` bytes of its content
  // move to the new one (device to device, queued).
  absl::Status GrowDevice(Buffer& b, size_t need, size_t keep);
  absl::Status GrowPinned(Buffer& b, size_t need);
  absl::Status UploadKey(const FingerprintKey& key);
  void FreeRetired();

  CudaLauncher& launcher_;
  Stream stream_ = nullptr;
  bool queued_ = false;   // Work queued since the last Read.
  absl::Status failure_;  // The step's first error.
  std::vector<Op> ops_;
  size_t scans_ = 0;
  size_t fingerprints_ = 0;
  size_t copies_ = 0;

  Buffer staging_;         // Pinned: descriptors and keys on their way.
  size_t staging_used_ = 0;
  Buffer descriptors_;     // Device.
  size_t descriptors_used_ = 0;
  Buffer results_;         // Device: the step's partials, uint64 words.
  size_t results_words_ = 0;
  Buffer host_results_;    // Pinned: Read's copy of results_.
  Buffer key_;             // Device: the key's words.
  std::vector<uint64_t> key_words_;  // What key_ holds; empty before the first.
  std::vector<void*> retired_device_;
  std::vector<void*> retired_pinned_;
};

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_CUDA_CHECK_QUEUE_H_
