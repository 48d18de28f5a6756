#include "kernels/cuda.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/cuda_kernels.h"

namespace sdc::kernels {

#ifdef SDC_HAVE_CUDA

namespace {

// Smaller than the CPU's chunks: a GPU needs thousands of blocks in flight.
constexpr uint64_t kCudaFingerprintChunkBytes = 256ull << 10;

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
    chunks.push_back({tensors[c.tensor].data, c.begin, c.length, c.tensor});
  }
  std::vector<uint64_t> sums(2 * tensors.size());
  if (int err = cuda_impl::RunFingerprint(chunks.data(), chunks.size(),
                                          tensors.size(), sums.data(), stream);
      err != 0) {
    return CudaError("FingerprintTensorsCuda", err);
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    out[t] = {sizes[t], sums[2 * t], sums[2 * t + 1]};
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
                                    absl::Span<Fingerprint>, CudaStream) {
  return NotBuilt();
}

absl::Status ScanNonFiniteCuda(absl::Span<const TensorRef>,
                               absl::Span<ScanResult>, CudaStream) {
  return NotBuilt();
}

#endif  // SDC_HAVE_CUDA

}  // namespace sdc::kernels
