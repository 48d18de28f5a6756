#include "kernels/cuda_check_queue.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/mersenne61.h"

namespace sdc::kernels {
namespace {

// Smaller than the CPU's chunks: a GPU needs thousands of blocks in flight.
// Whole level-1 blocks, as the kernel requires.
constexpr uint64_t kCudaFingerprintChunkBytes = 256ull << 10;
static_assert(kCudaFingerprintChunkBytes % kFingerprintBlockBytes == 0);
static_assert(cuda_impl::kBlockWords == kFingerprintBlockWords);

constexpr size_t kKeyWords = 2 * kFingerprintBlockWords;
// Descriptor arrays start on this boundary (their fields are 8-byte words).
constexpr size_t kAlign = 64;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// What a buffer grows to: room for twice the need, so a step a little
// larger than the last does not allocate again.
size_t GrownSize(size_t need) { return std::max<size_t>(2 * need, 4096); }

}  // namespace

CudaCheckQueue::CudaCheckQueue(CudaLauncher& launcher) : launcher_(launcher) {}

CudaCheckQueue::~CudaCheckQueue() {
  if (queued_) (void)launcher_.Synchronize(stream_);
  FreeRetired();
  for (Buffer* b : {&descriptors_, &results_, &key_}) {
    if (b->ptr != nullptr) launcher_.FreeDevice(b->ptr);
  }
  for (Buffer* b : {&staging_, &host_results_}) {
    if (b->ptr != nullptr) launcher_.FreePinned(b->ptr);
  }
}

absl::Status CudaCheckQueue::Fail(const char* what, int code) {
  absl::Status s = absl::InternalError(
      absl::StrCat(what, ": CUDA error ", code, ": ", launcher_.ErrorString(code)));
  if (failure_.ok()) failure_ = s;
  return s;
}

absl::Status CudaCheckQueue::UseStream(Stream stream) {
  if (queued_ && stream != stream_) {
    if (int err = launcher_.OrderAfter(stream, stream_); err != 0) {
      return Fail("ordering the checks after the step's earlier ones", err);
    }
  }
  stream_ = stream;
  queued_ = true;
  return absl::OkStatus();
}

absl::Status CudaCheckQueue::GrowDevice(Buffer& b, size_t need, size_t keep) {
  if (b.bytes >= need) return absl::OkStatus();
  Buffer grown;
  grown.bytes = GrownSize(need);
  if (int err = launcher_.AllocDevice(&grown.ptr, grown.bytes); err != 0) {
    return Fail("growing a device buffer of the checks", err);
  }
  if (keep > 0) {
    if (int err = launcher_.CopyAsync(grown.ptr, b.ptr, keep,
                                      CudaLauncher::Copy::kDeviceToDevice, stream_);
        err != 0) {
      launcher_.FreeDevice(grown.ptr);
      return Fail("moving the checks' results to a larger buffer", err);
    }
  }
  if (b.ptr != nullptr) retired_device_.push_back(b.ptr);
  b = grown;
  return absl::OkStatus();
}

absl::Status CudaCheckQueue::GrowPinned(Buffer& b, size_t need) {
  if (b.bytes >= need) return absl::OkStatus();
  Buffer grown;
  grown.bytes = GrownSize(need);
  if (int err = launcher_.AllocPinned(&grown.ptr, grown.bytes); err != 0) {
    return Fail("growing a pinned buffer of the checks", err);
  }
  if (b.ptr != nullptr) retired_pinned_.push_back(b.ptr);
  b = grown;
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaCheckQueue::StageToDevice(const void* src, size_t bytes) {
  // Both buffers are only appended to within a step: a queued copy or
  // launch may still read what an earlier call wrote. A grown buffer keeps
  // the same offsets (its prefix unused this step) so the next step fits.
  const size_t at_staging = AlignUp(staging_used_);
  const size_t at_device = AlignUp(descriptors_used_);
  if (absl::Status s = GrowPinned(staging_, at_staging + bytes); !s.ok()) return s;
  if (absl::Status s = GrowDevice(descriptors_, at_device + bytes, 0); !s.ok()) return s;
  unsigned char* host = static_cast<unsigned char*>(staging_.ptr) + at_staging;
  unsigned char* device = static_cast<unsigned char*>(descriptors_.ptr) + at_device;
  std::memcpy(host, src, bytes);
  if (int err = launcher_.CopyAsync(device, host, bytes, CudaLauncher::Copy::kHostToDevice,
                                    stream_);
      err != 0) {
    return Fail("copying chunk descriptors to the device", err);
  }
  staging_used_ = at_staging + bytes;
  descriptors_used_ = at_device + bytes;
  return static_cast<void*>(device);
}

absl::StatusOr<size_t> CudaCheckQueue::ReserveResults(size_t words) {
  const size_t first = results_words_;
  if (absl::Status s = GrowDevice(results_, (first + words) * sizeof(uint64_t),
                                  first * sizeof(uint64_t));
      !s.ok()) {
    return s;
  }
  results_words_ = first + words;
  return first;
}

absl::Status CudaCheckQueue::UploadKey(const FingerprintKey& key) {
  std::vector<uint64_t> words(kKeyWords);
  for (int j = 0; j < 2; ++j) {
    std::memcpy(words.data() + j * kFingerprintBlockWords, key.words(j),
                sizeof(uint64_t) * kFingerprintBlockWords);
  }
  if (words == key_words_) return absl::OkStatus();  // The usual case: the job's key.
  if (absl::Status s = GrowDevice(key_, kKeyWords * sizeof(uint64_t), 0); !s.ok()) return s;
  const size_t at = AlignUp(staging_used_);
  const size_t bytes = kKeyWords * sizeof(uint64_t);
  if (absl::Status s = GrowPinned(staging_, at + bytes); !s.ok()) return s;
  unsigned char* host = static_cast<unsigned char*>(staging_.ptr) + at;
  std::memcpy(host, words.data(), bytes);
  // In stream order after every launch that read the previous key.
  if (int err = launcher_.CopyAsync(key_.ptr, host, bytes, CudaLauncher::Copy::kHostToDevice,
                                    stream_);
      err != 0) {
    return Fail("copying the fingerprint key to the device", err);
  }
  staging_used_ = at + bytes;
  key_words_ = std::move(words);
  return absl::OkStatus();
}

absl::StatusOr<size_t> CudaCheckQueue::QueueScan(absl::Span<const TensorRef> tensors,
                                                 Stream stream) {
  if (absl::Status s = internal::ValidateScanArgs(tensors, tensors.size()); !s.ok()) return s;
  std::vector<uint64_t> sizes(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const auto address = reinterpret_cast<uintptr_t>(tensors[t].data);
    if (address % DTypeSize(tensors[t].dtype) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ScanNonFiniteCuda: tensor ", t, " is not aligned to its ",
          DTypeSize(tensors[t].dtype), "-byte elements"));
    }
    sizes[t] = tensors[t].num_elements;
  }
  if (!failure_.ok()) return failure_;
  Op op;
  op.kind = Kind::kScan;
  op.tensors = tensors.size();
  std::vector<cuda_impl::ScanChunk> chunks;
  for (const Chunk& c : SplitIntoChunks(sizes, kScanChunkElements)) {
    chunks.push_back({tensors[c.tensor].data, c.begin, c.length,
                      static_cast<uint32_t>(tensors[c.tensor].dtype)});
    op.chunk_tensor.push_back(c.tensor);
  }
  if (!chunks.empty()) {
    if (absl::Status s = UseStream(stream); !s.ok()) return s;
    absl::StatusOr<void*> device = StageToDevice(chunks.data(), chunks.size() * sizeof(chunks[0]));
    if (!device.ok()) return device.status();
    absl::StatusOr<size_t> first = ReserveResults(2 * chunks.size());
    if (!first.ok()) return first.status();
    op.first_word = *first;
    if (int err = launcher_.LaunchScan(static_cast<const cuda_impl::ScanChunk*>(*device),
                                       chunks.size(),
                                       static_cast<uint64_t*>(results_.ptr) + op.first_word,
                                       stream_);
        err != 0) {
      return Fail("ScanNonFiniteCuda", err);
    }
  }
  ops_.push_back(std::move(op));
  return scans_++;
}

absl::StatusOr<size_t> CudaCheckQueue::QueueFingerprint(absl::Span<const ByteSpan> tensors,
                                                        const FingerprintKey& key,
                                                        Stream stream) {
  if (absl::Status s = internal::ValidateFingerprintArgs(tensors, tensors.size()); !s.ok()) {
    return s;
  }
  if (!failure_.ok()) return failure_;
  Op op;
  op.kind = Kind::kFingerprint;
  op.tensors = tensors.size();
  op.r1 = key.r(0);
  op.r2 = key.r(1);
  for (const ByteSpan& t : tensors) op.sizes.push_back(t.size);
  std::vector<cuda_impl::FingerprintChunk> chunks;
  for (const Chunk& c : SplitIntoChunks(op.sizes, kCudaFingerprintChunkBytes)) {
    chunks.push_back({tensors[c.tensor].data, c.begin, c.length, op.sizes[c.tensor], c.tensor});
  }
  if (!tensors.empty()) {
    // Every tensor has its four counters (an empty one's stay zero).
    if (absl::Status s = UseStream(stream); !s.ok()) return s;
    absl::StatusOr<size_t> first = ReserveResults(4 * tensors.size());
    if (!first.ok()) return first.status();
    op.first_word = *first;
    uint64_t* sums = static_cast<uint64_t*>(results_.ptr) + op.first_word;
    if (int err = launcher_.ZeroAsync(sums, 4 * tensors.size() * sizeof(uint64_t), stream_);
        err != 0) {
      return Fail("FingerprintTensorsCuda", err);
    }
    if (!chunks.empty()) {
      if (absl::Status s = UploadKey(key); !s.ok()) return s;
      absl::StatusOr<void*> device =
          StageToDevice(chunks.data(), chunks.size() * sizeof(chunks[0]));
      if (!device.ok()) return device.status();
      if (int err = launcher_.LaunchFingerprint(
              static_cast<const cuda_impl::FingerprintChunk*>(*device), chunks.size(),
              static_cast<const uint64_t*>(key_.ptr), op.r1, op.r2, sums, stream_);
          err != 0) {
        return Fail("FingerprintTensorsCuda", err);
      }
    }
  }
  ops_.push_back(std::move(op));
  return fingerprints_++;
}

absl::StatusOr<size_t> CudaCheckQueue::QueueCopy(const void* device, size_t bytes,
                                                 Stream stream) {
  if (device == nullptr && bytes > 0) {
    return absl::InvalidArgumentError("QueueCopy: null device pointer");
  }
  if (!failure_.ok()) return failure_;
  Op op;
  op.kind = Kind::kCopy;
  op.sizes = {bytes};
  if (bytes > 0) {
    if (absl::Status s = UseStream(stream); !s.ok()) return s;
    const size_t words = (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t);
    absl::StatusOr<size_t> first = ReserveResults(words);
    if (!first.ok()) return first.status();
    op.first_word = *first;
    if (int err = launcher_.CopyAsync(static_cast<uint64_t*>(results_.ptr) + op.first_word,
                                      device, bytes, CudaLauncher::Copy::kDeviceToDevice,
                                      stream_);
        err != 0) {
      return Fail("copying a value into the step's results", err);
    }
  }
  ops_.push_back(std::move(op));
  return copies_++;
}

void CudaCheckQueue::FreeRetired() {
  for (void* p : retired_device_) launcher_.FreeDevice(p);
  for (void* p : retired_pinned_) launcher_.FreePinned(p);
  retired_device_.clear();
  retired_pinned_.clear();
}

absl::StatusOr<CudaCheckQueue::Results> CudaCheckQueue::Read() {
  absl::Status failure = std::exchange(failure_, absl::OkStatus());
  std::vector<Op> ops = std::exchange(ops_, {});
  const size_t words = std::exchange(results_words_, 0);
  const bool queued = std::exchange(queued_, false);
  scans_ = fingerprints_ = copies_ = 0;
  staging_used_ = descriptors_used_ = 0;
  if (failure.ok() && words > 0) {
    // The step's one device-to-host copy and one wait.
    if (absl::Status s = GrowPinned(host_results_, words * sizeof(uint64_t)); !s.ok()) {
      failure = s;
    } else if (int err = launcher_.CopyAsync(host_results_.ptr, results_.ptr,
                                             words * sizeof(uint64_t),
                                             CudaLauncher::Copy::kDeviceToHost, stream_);
               err != 0) {
      failure = Fail("reading the step's checks", err);
    }
  }
  if (queued) {
    if (int err = launcher_.Synchronize(stream_); err != 0 && failure.ok()) {
      failure = Fail("waiting for the step's checks", err);
    }
  }
  failure_ = absl::OkStatus();
  // Nothing queued reads the old buffers now.
  FreeRetired();
  if (!failure.ok()) {
    key_words_.clear();  // The key's copy may not have happened.
    return failure;
  }
  const uint64_t* host = static_cast<const uint64_t*>(host_results_.ptr);
  Results out;
  for (const Op& op : ops) {
    if (op.kind == Kind::kCopy) {
      const unsigned char* from = reinterpret_cast<const unsigned char*>(host + op.first_word);
      out.copies.emplace_back(from, from + op.sizes[0]);
      continue;
    }
    if (op.kind == Kind::kScan) {
      std::vector<ScanResult> r(op.tensors);
      for (size_t c = 0; c < op.chunk_tensor.size(); ++c) {
        double sum;
        std::memcpy(&sum, &host[op.first_word + 2 * c + 1], sizeof(sum));
        r[op.chunk_tensor[c]].nonfinite += host[op.first_word + 2 * c];
        r[op.chunk_tensor[c]].sum_squares += sum;
      }
      out.scans.push_back(std::move(r));
      continue;
    }
    // sum = low + high * 2^32 over the chunks, then the length's term n * r.
    constexpr uint64_t kTwoTo32 = 1ull << 32;
    std::vector<Fingerprint> fps(op.tensors);
    for (size_t t = 0; t < op.tensors; ++t) {
      uint64_t s[2];
      const uint64_t r[2] = {op.r1, op.r2};
      for (int j = 0; j < 2; ++j) {
        const uint64_t low = m61::Reduce(host[op.first_word + 4 * t + 2 * j]);
        const uint64_t high = m61::Reduce(host[op.first_word + 4 * t + 2 * j + 1]);
        s[j] = m61::Add(m61::Add(low, m61::Mul(high, kTwoTo32)),
                        m61::Mul(m61::Reduce(op.sizes[t]), r[j]));
      }
      fps[t] = {op.sizes[t], s[0], s[1]};
    }
    out.fingerprints.push_back(std::move(fps));
  }
  return out;
}

}  // namespace sdc::kernels
