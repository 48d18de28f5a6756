#include "kernels/cuda.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/cuda_kernels.h"
#include "kernels/mersenne61.h"

namespace sdc::kernels {

#ifdef SDC_HAVE_CUDA

namespace {

// Smaller than the CPU's chunks: a GPU needs thousands of blocks in flight.
// Whole level-1 blocks, as the kernel requires.
constexpr uint64_t kCudaFingerprintChunkBytes = 256ull << 10;
static_assert(kCudaFingerprintChunkBytes % kFingerprintBlockBytes == 0);
static_assert(cuda_impl::kBlockWords == kFingerprintBlockWords);

absl::Status CudaError(const char* what, int code) {
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", code, ": ", cuda_impl::ErrorString(code)));
}

}  // namespace

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
  std::vector<uint64_t> sizes(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) sizes[t] = tensors[t].size;
  std::vector<cuda_impl::FingerprintChunk> chunks;
  for (const Chunk& c : SplitIntoChunks(sizes, kCudaFingerprintChunkBytes)) {
    chunks.push_back(
        {tensors[c.tensor].data, c.begin, c.length, sizes[c.tensor], c.tensor});
  }
  uint64_t key_words[2 * kFingerprintBlockWords];
  for (int j = 0; j < 2; ++j) {
    std::memcpy(key_words + j * kFingerprintBlockWords, key.words(j),
                sizeof(uint64_t) * kFingerprintBlockWords);
  }
  std::vector<uint64_t> sums(4 * tensors.size());
  if (int err = cuda_impl::RunFingerprint(chunks.data(), chunks.size(),
                                          tensors.size(), key_words, key.r(0),
                                          key.r(1), sums.data(), stream);
      err != 0) {
    return CudaError("FingerprintTensorsCuda", err);
  }
  // sum = low + high * 2^32 over the chunks, then the length's term n * r.
  constexpr uint64_t kTwoTo32 = 1ull << 32;
  for (size_t t = 0; t < tensors.size(); ++t) {
    uint64_t s[2];
    for (int j = 0; j < 2; ++j) {
      const uint64_t low = m61::Reduce(sums[4 * t + 2 * j]);
      const uint64_t high = m61::Reduce(sums[4 * t + 2 * j + 1]);
      s[j] = m61::Add(m61::Add(low, m61::Mul(high, kTwoTo32)),
                      m61::Mul(m61::Reduce(sizes[t]), key.r(j)));
    }
    out[t] = {sizes[t], s[0], s[1]};
  }
  return absl::OkStatus();
}

absl::Status ScanNonFiniteCuda(absl::Span<const TensorRef> tensors,
                               absl::Span<ScanResult> out, CudaStream stream) {
  if (absl::Status s = internal::ValidateScanArgs(tensors, out.size());
      !s.ok()) {
    return s;
  }
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
  const std::vector<Chunk> plan = SplitIntoChunks(sizes, kScanChunkElements);
  std::vector<cuda_impl::ScanChunk> chunks;
  chunks.reserve(plan.size());
  for (const Chunk& c : plan) {
    chunks.push_back({tensors[c.tensor].data, c.begin, c.length,
                      static_cast<uint32_t>(tensors[c.tensor].dtype)});
  }
  std::vector<uint64_t> nonfinite(chunks.size());
  std::vector<double> sum_squares(chunks.size());
  if (int err = cuda_impl::RunScan(chunks.data(), chunks.size(),
                                   nonfinite.data(), sum_squares.data(), stream);
      err != 0) {
    return CudaError("ScanNonFiniteCuda", err);
  }
  for (ScanResult& r : out) r = ScanResult{};
  for (size_t i = 0; i < plan.size(); ++i) {
    out[plan[i].tensor].nonfinite += nonfinite[i];
    out[plan[i].tensor].sum_squares += sum_squares[i];
  }
  return absl::OkStatus();
}

#else  // !SDC_HAVE_CUDA

namespace {

absl::Status NotBuilt() {
  return absl::FailedPreconditionError(
      "built without CUDA: nvcc was not found when this binary was built "
      "(./sdc passes --define=sdc_cuda=1 when /usr/local/cuda/bin/nvcc exists)");
}

}  // namespace

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
