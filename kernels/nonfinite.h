#ifndef SDC_KERNELS_NONFINITE_H_
#define SDC_KERNELS_NONFINITE_H_

// The non-finite scan fused with the sum of squares: one pass over each
// gradient tensor gives the count of NaN/Inf elements (check 1) and the
// squared L2 norm in fp64 (for gradient norm clipping).
//
// SUM ORDER. Floating-point sums depend on their order; ranks that clip with
// the same reduced gradients must compute the same norm to the last bit, on
// any thread count and any CPU. So the order is part of the definition:
//   1. A tensor is cut into chunks of kScanChunkElements elements.
//   2. In a chunk, element j is converted exactly to fp64 (x), squared
//      (x * x, rounded to fp64, never fused into an FMA) and added to
//      accumulator acc[j mod 16], in increasing j, all starting at +0.0.
//   3. chunk_sum = ((acc[0]+acc[4]) + (acc[8]+acc[12]))
//                + ((acc[1]+acc[5]) + (acc[9]+acc[13]))
//                + ((acc[2]+acc[6]) + (acc[10]+acc[14]))
//                + ((acc[3]+acc[7]) + (acc[11]+acc[15])), evaluated as
//      (r0 + r1) + (r2 + r3) with r_k = (acc[k]+acc[k+4]) + (acc[k+8]+acc[k+12]).
//   4. sum_squares = +0.0 + chunk_sum_0 + chunk_sum_1 + ..., left to right.
// Non-finite elements are counted and also enter the sum (so the sum is
// NaN or Inf whenever the count is non-zero). On x86-64 the scan sets its own
// SSE environment (round to nearest, no flush-to-zero, no
// denormals-are-zero) and restores the caller's, so neither the result nor
// the caller's exception flags depend on the other. The CUDA scan (kernels/cuda.h)
// counts identically but sums in its own fixed order.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu_dispatch.h"

namespace sdc::kernels {

class ThreadPool;

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,   // IEEE 754 binary16.
  kBFloat16 = 3,  // The top 16 bits of an fp32.
};

// Bytes per element; 0 for a value outside the enum.
int DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

inline constexpr uint64_t kScanChunkElements = 1ull << 16;

// A dense tensor: `num_elements` values of `dtype` from `data` on.
struct TensorRef {
  const void* data = nullptr;
  uint64_t num_elements = 0;
  DType dtype = DType::kFloat32;
};

struct ScanResult {
  uint64_t nonfinite = 0;    // Elements that are NaN, +Inf or -Inf.
  double sum_squares = 0.0;  // Sum of x^2 in fp64, in the order above.
};

// Scans every tensor of `tensors` into the same position of `out`, splitting
// work across and within tensors on `pool` (nullptr: ThreadPool::Default()).
// Returns InvalidArgument when the spans differ in length, a dtype is not one
// of DType's values, or a non-empty tensor has a null pointer. Pointers need
// no alignment.
absl::Status ScanNonFinite(absl::Span<const TensorRef> tensors,
                           absl::Span<ScanResult> out,
                           ThreadPool* pool = nullptr);

namespace internal {
// ScanNonFinite on an explicit code path, for tests and benchmarks.
// REQUIRES: `path` is supported by this CPU.
absl::Status ScanNonFiniteOnPath(absl::Span<const TensorRef> tensors,
                                 absl::Span<ScanResult> out, ThreadPool* pool,
                                 CpuPath path);
// Checks the arguments of a scan (shared with the CUDA entry point).
absl::Status ValidateScanArgs(absl::Span<const TensorRef> tensors,
                              size_t out_size);
}  // namespace internal

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_NONFINITE_H_
