#include "kernels/cuda.h"

#include <algorithm>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda_check_queue.h"
#include "kernels/cuda_kernels.h"
#include "kernels/cuda_launcher.h"

namespace sdc::kernels {

#ifdef SDC_HAVE_CUDA

namespace {

// The CUDA runtime, through cuda_kernels.cu (nvcc compiles the runtime's
// headers; this file needs none).
class CudaRuntimeLauncher : public CudaLauncher {
 public:
  int CurrentDevice(int* device) override { return cuda_impl::GetDevice(device); }
  int AllocDevice(void** ptr, size_t bytes) override { return cuda_impl::Malloc(ptr, bytes); }
  int AllocPinned(void** ptr, size_t bytes) override {
    return cuda_impl::MallocHost(ptr, bytes);
  }
  void FreeDevice(void* ptr) override { cuda_impl::Free(ptr); }
  void FreePinned(void* ptr) override { cuda_impl::FreeHost(ptr); }
  int CopyAsync(void* dst, const void* src, size_t bytes, Copy kind, Stream stream) override {
    const int code = kind == Copy::kHostToDevice ? 1 : kind == Copy::kDeviceToHost ? 2 : 3;
    return cuda_impl::MemcpyAsync(dst, src, bytes, code, stream);
  }
  int ZeroAsync(void* dst, size_t bytes, Stream stream) override {
    return cuda_impl::MemsetAsync(dst, bytes, stream);
  }
  int LaunchScan(const cuda_impl::ScanChunk* chunks, size_t num_chunks, uint64_t* results,
                 Stream stream) override {
    return cuda_impl::LaunchScan(chunks, num_chunks, results, stream);
  }
  int LaunchFingerprint(const cuda_impl::FingerprintChunk* chunks, size_t num_chunks,
                        const uint64_t* key_words, uint64_t r1, uint64_t r2, uint64_t* sums,
                        Stream stream) override {
    return cuda_impl::LaunchFingerprint(chunks, num_chunks, key_words, r1, r2, sums, stream);
  }
  int OrderAfter(Stream later, Stream earlier) override {
    return cuda_impl::OrderAfter(later, earlier);
  }
  int Synchronize(Stream stream) override { return cuda_impl::StreamSynchronize(stream); }
  const char* ErrorString(int code) override { return cuda_impl::ErrorString(code); }
};

// The blocking entry points share one queue per device (its buffers
// persist, so a call allocates only when it needs more than any before).
class BlockingQueues {
 public:
  template <typename Fn>
  absl::Status Run(Fn fn) {
    int device = 0;
    if (int err = RuntimeLauncher().CurrentDevice(&device); err != 0) {
      return absl::InternalError(
          absl::StrCat("cudaGetDevice: CUDA error ", err, ": ", cuda_impl::ErrorString(err)));
    }
    absl::MutexLock lock(&mu_);
    std::unique_ptr<CudaCheckQueue>& q = queues_[device];
    if (q == nullptr) q = std::make_unique<CudaCheckQueue>(RuntimeLauncher());
    return fn(*q);
  }

 private:
  absl::Mutex mu_;
  std::map<int, std::unique_ptr<CudaCheckQueue>> queues_ ABSL_GUARDED_BY(mu_);
};

BlockingQueues& Blocking() {
  static auto* queues = new BlockingQueues();  // Never destroyed: used at exit.
  return *queues;
}

}  // namespace

CudaLauncher& RuntimeLauncher() {
  static auto* launcher = new CudaRuntimeLauncher();
  return *launcher;
}

bool CudaBuilt() { return true; }

absl::Status CudaAvailable() {
  int count = 0;
  if (int err = cuda_impl::DeviceCount(&count); err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable GPU: ", cuda_impl::ErrorString(err)));
  }
  if (count == 0) return absl::FailedPreconditionError("no GPU device present");
  return absl::OkStatus();
}

absl::Status FingerprintTensorsCuda(absl::Span<const ByteSpan> tensors,
                                    const FingerprintKey& key,
                                    absl::Span<Fingerprint> out,
                                    CudaStream stream) {
  if (absl::Status s = internal::ValidateFingerprintArgs(tensors, out.size());
      !s.ok()) {
    return s;
  }
  return Blocking().Run([&](CudaCheckQueue& q) -> absl::Status {
    absl::StatusOr<size_t> handle = q.QueueFingerprint(tensors, key, stream);
    absl::StatusOr<CudaCheckQueue::Results> r = q.Read();
    if (!handle.ok()) return handle.status();
    if (!r.ok()) return r.status();
    std::copy(r->fingerprints[*handle].begin(), r->fingerprints[*handle].end(), out.begin());
    return absl::OkStatus();
  });
}

absl::Status ScanNonFiniteCuda(absl::Span<const TensorRef> tensors,
                               absl::Span<ScanResult> out, CudaStream stream) {
  if (absl::Status s = internal::ValidateScanArgs(tensors, out.size());
      !s.ok()) {
    return s;
  }
  return Blocking().Run([&](CudaCheckQueue& q) -> absl::Status {
    absl::StatusOr<size_t> handle = q.QueueScan(tensors, stream);
    absl::StatusOr<CudaCheckQueue::Results> r = q.Read();
    if (!handle.ok()) return handle.status();
    if (!r.ok()) return r.status();
    std::copy(r->scans[*handle].begin(), r->scans[*handle].end(), out.begin());
    return absl::OkStatus();
  });
}

#else  // !SDC_HAVE_CUDA

namespace {

absl::Status NotBuilt() {
  return absl::FailedPreconditionError(
      "built without CUDA: nvcc was not found when this binary was built "
      "(./sdc passes --define=sdc_cuda=1 when /usr/local/cuda/bin/nvcc exists)");
}

// Every call fails as the runtime does without a device.
class NoCudaLauncher : public CudaLauncher {
 public:
  static constexpr int kNoDevice = 100;  // cudaErrorNoDevice
  int CurrentDevice(int*) override { return kNoDevice; }
  int AllocDevice(void**, size_t) override { return kNoDevice; }
  int AllocPinned(void**, size_t) override { return kNoDevice; }
  void FreeDevice(void*) override {}
  void FreePinned(void*) override {}
  int CopyAsync(void*, const void*, size_t, Copy, Stream) override { return kNoDevice; }
  int ZeroAsync(void*, size_t, Stream) override { return kNoDevice; }
  int LaunchScan(const cuda_impl::ScanChunk*, size_t, uint64_t*, Stream) override {
    return kNoDevice;
  }
  int LaunchFingerprint(const cuda_impl::FingerprintChunk*, size_t, const uint64_t*, uint64_t,
                        uint64_t, uint64_t*, Stream) override {
    return kNoDevice;
  }
  int OrderAfter(Stream, Stream) override { return kNoDevice; }
  int Synchronize(Stream) override { return kNoDevice; }
  const char* ErrorString(int) override { return "built without CUDA"; }
};

}  // namespace

CudaLauncher& RuntimeLauncher() {
  static auto* launcher = new NoCudaLauncher();
  return *launcher;
}

bool CudaBuilt() { return false; }

absl::Status CudaAvailable() { return NotBuilt(); }

absl::Status FingerprintTensorsCuda(absl::Span<const ByteSpan>,
                                    const FingerprintKey&,
                                    absl::Span<Fingerprint>, CudaStream) {
  return NotBuilt();
}

absl::Status ScanNonFiniteCuda(absl::Span<const TensorRef>,
                               absl::Span<ScanResult>, CudaStream) {
  return NotBuilt();
}

#endif  // SDC_HAVE_CUDA

}  // namespace sdc::kernels
