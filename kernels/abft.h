#ifndef SDC_KERNELS_ABFT_H_
#define SDC_KERNELS_ABFT_H_

// Algorithm-based fault tolerance (Huang and Abraham's checksums) for one
// matrix product C = A * B (+ a bias row), checked after the fact from the
// product's operands and its stored output: no second product is computed.
//
// THE CHECK (column checksums; rows are the same check on the transposes).
// In fp64, from A (m x k), B (k x n) and C (m x n) as stored:
//   reference_j = sum_l (sum_i A_il) * B_lj  (+ m * bias_j)    ((e^T A) B)_j
//   observed_j  = sum_i C_ij                                    (e^T C)_j
//   discrepancy_j = observed_j - reference_j
// The product fails when |discrepancy_j| > threshold_j for some column j.
// Cost: one pass over A, over B and over C each, O(mk + kn + mn).
//
// THE THRESHOLD. The product is modelled as GPUs and CPUs compute it: inputs
// read as stored (or first rounded to a narrower input format, e.g. TF32),
// each C_ij a sum of k products (plus the bias) accumulated in fp32 in ANY
// order (sequential, blocked, tree, FMA or not), then rounded once to C's
// dtype. Let u = 2^-24 (fp32 accumulation, round to nearest; settable),
// u_in the input rounding (0 unless set), u_out C's unit roundoff (0 for
// fp32, 2^-8 bf16, 2^-11 fp16), K = k + (bias ? 1 : 0),
// gamma_K = K u / (1 - K u),
// beta = (1 + u_in)^2 (1 + gamma_K) - 1, and the fp64 statistics
//   T_j = sum_l (sum_i |A_il|) |B_lj|  (+ m |bias_j|)     = (e^T |A| |B|)_j
//   S_j = sum_i |C_ij|.
// kGuaranteed (the default) is Higham's forward bound summed over the column:
//   threshold_j = beta T_j + u_out/(1 - u_out) S_j
//               + (fp64 rounding of the check itself) + (underflow terms),
// which no healthy product can exceed, whatever its data or summation order
// (abft.cc proves it term by term). kProbabilistic treats rounding errors as
// independent zero-mean variables bounded by the unit roundoff (Higham and
// Mary's model, the one behind V-ABFT's variance thresholds) and takes
// lambda standard deviations of the column's summed error, by Azuma's
// inequality exceeded with probability at most 2 exp(-lambda^2 / 2) per
// column; it is capped at the guaranteed threshold, so it is never looser.
// See docs/ARCHITECTURE.md, "Every-step checksums (issue 45)".
//
// Not covered: a product that treats denormal INPUTS as zero (DAZ), and
// fp64 products. Non-finite values anywhere make the check fail (a NaN or
// Inf discrepancy is never within a threshold); they are the non-finite
// scan's business too.

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/nonfinite.h"

namespace sdc::kernels {

// A strided matrix: element (r, c) is at data + (r * row_stride + c *
// col_stride) elements. A transpose is the same memory with the dims and
// strides swapped. Strides may be any values, zero and negative included.
struct MatrixRef {
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // In elements.
  int64_t col_stride = 1;  // In elements.
  DType dtype = DType::kFloat32;  // kFloat32, kBFloat16 or kFloat16.
};

// A dense row-major matrix view.
inline MatrixRef RowMajor(const void* data, int64_t rows, int64_t cols,
                          DType dtype) {
  return MatrixRef{data, rows, cols, cols, 1, dtype};
}

// The same memory read as its transpose.
inline MatrixRef Transposed(const MatrixRef& m) {
  return MatrixRef{m.data, m.cols, m.rows, m.col_stride, m.row_stride, m.dtype};
}

enum class AbftRule : uint8_t {
  kGuaranteed = 0,     // Deterministic bound: never trips on a healthy product.
  kProbabilistic = 1,  // lambda-sigma bound, capped at kGuaranteed.
};

enum class AbftAxis : uint8_t {
  kColumns = 0,  // e^T C against (e^T A) B: n checks, locates a column.
  kRows = 1,     // C e against A (B e): m checks, locates a row.
  kBoth = 2,     // Both; locates an element when one is wrong.
};

struct AbftOptions {
  AbftRule rule = AbftRule::kGuaranteed;  // Default: kGuaranteed.
  // Standard deviations for kProbabilistic. Default: 10 (a column's false
  // alarm probability at most 2e^-50 ~ 4e-22 under the model).
  double lambda = 10.0;
  // Unit roundoff of a rounding the product applies to its inputs before
  // multiplying (TF32 tensor cores: 2^-11), for inputs in the normal range.
  // Default: 0 (inputs used as stored, as in fp32 CPU products and bf16/fp16
  // products).
  double input_unit_roundoff = 0.0;
  // The largest relative error of one fp32 accumulation step. Default: 2^-24
  // (round to nearest). An accumulator that truncates (round toward zero,
  // as NVIDIA tensor cores' fp32 accumulation is reported to) needs 2^-23,
  // and its errors are biased, which the probabilistic rule's model does not
  // allow: use kGuaranteed there.
  double accumulate_unit_roundoff = 0x1p-24;
  AbftAxis axis = AbftAxis::kColumns;  // Default: kColumns.
};

struct AbftResult {
  bool passed = true;
  // The check with the largest |discrepancy| / threshold (-1 when C is
  // empty): a column of C, or a row when `worst_axis` is kRows.
  int64_t worst_index = -1;
  AbftAxis worst_axis = AbftAxis::kColumns;
  int64_t worst_batch = 0;   // The product of a batch holding it (else 0).
  double discrepancy = 0.0;  // observed - reference at worst_index (signed).
  double threshold = 0.0;    // The threshold at worst_index.
  double reference = 0.0;    // The reference checksum at worst_index.
};

// Checks C = A * B (+ bias broadcast over C's rows when `bias` is given: a
// vector of n values, element j at bias->data + j * bias->col_stride, read
// as a 1 x n MatrixRef). Single-threaded; no allocation beyond O(m + k + n)
// doubles. Thread-safe (no shared state).
// Returns InvalidArgument when shapes disagree (A.cols != B.rows, C not
// A.rows x B.cols, bias not 1 x n), a dtype is not fp32/bf16/fp16, a
// non-empty matrix has a null pointer, lambda is negative or not finite,
// or a unit roundoff is not finite or outside [0, 2^-4) (accumulation:
// (0, 2^-4)).
absl::StatusOr<AbftResult> CheckMatrixProduct(const MatrixRef& a,
                                              const MatrixRef& b,
                                              const MatrixRef& c,
                                              const MatrixRef* bias = nullptr,
                                              const AbftOptions& options = {});

// Where product i of a batch starts: each operand's data + i * stride
// elements (bmm, attention's products per sequence and head).
struct BatchStrides {
  int64_t a = 0;
  int64_t b = 0;
  int64_t c = 0;
  int64_t bias = 0;
};

// CheckMatrixProduct on each of `batch` products of one shape, reusing its
// working memory: one call per bmm rather than one per matrix. The result
// is the worst check over the batch (worst_batch names the product); passed
// only when every product passes. InvalidArgument as CheckMatrixProduct, or
// for a negative batch; batch 0 passes.
absl::StatusOr<AbftResult> CheckBatchedMatrixProduct(int64_t batch, const MatrixRef& a,
                                                     const MatrixRef& b, const MatrixRef& c,
                                                     const BatchStrides& strides,
                                                     const MatrixRef* bias = nullptr,
                                                     const AbftOptions& options = {});

// C's unit roundoff as the rule uses it: 0 for fp32 (the fp32 accumulator is
// stored as is), 2^-8 for bf16, 2^-11 for fp16.
double AbftOutputUnitRoundoff(DType dtype);

namespace internal {
// CheckMatrixProduct's argument checks (the CUDA check's too).
absl::Status ValidateMatrixProduct(const MatrixRef& a, const MatrixRef& b, const MatrixRef& c,
                                   const MatrixRef* bias, const AbftOptions& options);
// The absolute error of rounding one value below the normal range to
// `dtype` (the rule's underflow term per element of C).
double AbftOutputUnderflow(DType dtype);
// CheckMatrixProduct on an explicit code path, for tests and benchmarks.
// REQUIRES: `path` is supported by this CPU.
absl::StatusOr<AbftResult> CheckMatrixProductOnPath(
    const MatrixRef& a, const MatrixRef& b, const MatrixRef& c,
    const MatrixRef* bias, const AbftOptions& options, CpuPath path);
absl::StatusOr<AbftResult> CheckBatchedMatrixProductOnPath(
    int64_t batch, const MatrixRef& a, const MatrixRef& b, const MatrixRef& c,
    const BatchStrides& strides, const MatrixRef* bias, const AbftOptions& options,
    CpuPath path);
}  // namespace internal

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_ABFT_H_
