#ifndef SDC_KERNELS_CUDA_H_
#define SDC_KERNELS_CUDA_H_

// CUDA versions of the kernels, for tensors in GPU memory. Same definitions
// as fingerprint.h (bit-identical fingerprints) and nonfinite.h (identical
// counts; the sum of squares uses the GPU's own fixed order, deterministic
// from run to run but not bit-equal to the CPU's).
//
// Built when Bazel runs with --define=sdc_cuda=1 (./sdc does this when nvcc
// exists), for sm_80 and sm_90. Without it every entry point returns
// FailedPrecondition.

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"

// cudaStream_t is `CUstream_st*`; naming the struct keeps CUDA's headers out
// of every file that includes this one.
struct CUstream_st;

namespace sdc::kernels {

using CudaStream = CUstream_st*;

// True when this binary was built with the CUDA kernels.
bool CudaBuilt();

// OK when the CUDA kernels are built and a GPU is usable; otherwise
// FailedPrecondition saying why (built without CUDA, no driver, no device).
absl::Status CudaAvailable();

// Fingerprints tensors in device memory under `key` with one kernel launch
// for the whole list, enqueued on `stream` (nullptr: the legacy default
// stream). Blocks until the results are in `out` (host memory). Same
// argument checks as FingerprintTensors; a CUDA failure is Internal with
// CUDA's message.
absl::Status FingerprintTensorsCuda(absl::Span<const ByteSpan> tensors,
                                    const FingerprintKey& key,
                                    absl::Span<Fingerprint> out,
                                    CudaStream stream);

// Scans tensors in device memory with one kernel launch, enqueued on
// `stream`; blocks until `out` (host memory) is filled. Same argument checks
// as ScanNonFinite, plus: element pointers must be aligned to the element
// size (InvalidArgument otherwise), as every framework allocation is.
absl::Status ScanNonFiniteCuda(absl::Span<const TensorRef> tensors,
                               absl::Span<ScanResult> out, CudaStream stream);

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_CUDA_H_
