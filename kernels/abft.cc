#include "kernels/abft.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/abft_passes.h"
#include "kernels/abft_rule.h"
#include "kernels/cpu_dispatch.h"

// WHY THE GUARANTEED THRESHOLD HOLDS. Write the check on columns of
// C = L R, L p x q, R q x s (for kColumns L = A, R = B; a bias is one more
// column of ones in L and one more row, the bias, in R, so K = q + 1 terms).
// 1. Each stored C_ij = fl_out(c^_ij), where c^_ij is the fp32 dot product of
//    K terms. Higham (Accuracy and Stability of Numerical Algorithms, 3.1):
//    in any order, |c^_ij - c_ij| <= gamma_K sum_l |L'_il R'_lj|, where L', R'
//    are the inputs the product multiplied. With L' = L (1 + a), |a| <= u_in,
//    the same for R', |c^_ij - c_ij| <= beta sum_l |L_il||R_lj|.
// 2. Rounding to C's dtype: |C_ij - c^_ij| <= u_out |c^_ij|
//    <= u_out / (1 - u_out) |C_ij|.
// 3. Summing over i: |e^T C - e^T L R|_j <= beta T_j + uo S_j (T, S as in
//    abft.h), since e^T L R = (e^T L) R exactly.
// 4. The check evaluates e^T C and (e^T L) R in fp64: each is a sum of at most
//    p + q + 1 rounded operations on values whose magnitudes sum to S_j or
//    T_j, so each is off by at most gamma64_N (S_j or T_j), N = p + q + 4;
//    the computed T^ and S^ themselves are at least (1 - gamma64_N) T and S.
// 5. Underflow breaks the relative model: a flushed (or gradually underflowed)
//    fp32 product or partial sum loses less than 2^-126, at most 2K times per
//    element; rounding C to bf16 loses less than 2^-126 and to fp16 less than
//    2^-14 (flushed) per element.
// The threshold is the sum of these, times (1 + 2^-40) for the few roundings
// in evaluating it and the discrepancy. The probabilistic rule replaces the
// first-order part of 1-3 by lambda sigma, with sigma^2 <= sum over rounding
// sites of (unit roundoff x operand)^2 bounded by
//   sum_i K u^2 (sum_l |L_il||R_lj|)^2 + 2 u_in^2 sum_i sum_l (L_il R_lj)^2
//     + uo^2 sum_i C_ij^2,
// and the first term by Cauchy-Schwarz, (sum_l |L_il||R_lj|)^2 <=
// (sum_l |L_il|) (sum_l |L_il| R_lj^2), so everything is a weighted sum over
// l of R_lj or its square: O(pq + qs + ps) work.

namespace sdc::kernels {
namespace {

using abft_passes::AccumulateRow;
using abft_passes::AccumulateRows;
using abft_passes::ColumnMajor;
using abft_passes::ColumnStart;
using abft_passes::DotLine;
using abft_passes::DotSums;
using abft_passes::DotWeights;
using abft_passes::ElementAt;
using abft_passes::kUnitWeights;
using abft_passes::RowSinks;
using abft_passes::RowStart;
using abft_passes::SumColumns;

using abft_rule::kFp32MinNormal;

// The ones of a bias's companion column/row, read with stride 0.
constexpr float kOne = 1.0f;

// Absolute error of rounding one value to C's dtype, below the normal range.
double OutputUnderflow(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return kFp32MinNormal;
    case DType::kFloat16:
      return 0x1p-14;
    default:
      return 0.0;
  }
}

struct LineResult {
  bool passed = true;
  int64_t index = -1;
  double ratio = -1.0;
  double discrepancy = 0.0;
  double threshold = 0.0;
  double reference = 0.0;
};

// Working arrays of one check, reused across the products of a batch.
struct Scratch {
  std::vector<double> l_sum, l_abs, l_weighted, l_sq, row_abs;
  std::vector<double> reference, t, variance, sq_weight, observed, s_abs, c_sq;
};

// Sets v to n zeros (n = 0: empty), keeping its storage.
void Zeros(std::vector<double>& v, int64_t n) { v.assign(static_cast<size_t>(n), 0.0); }

// The column check of C = [L | lx] [R ; ry] (lx: p x 1 or null; ry: 1 x s or
// null; both or neither).
LineResult CheckColumns(const MatrixRef& l, const MatrixRef* lx, const MatrixRef& r,
                        const MatrixRef* ry, const MatrixRef& c,
                        const AbftOptions& options, CpuPath path, Scratch& w) {
  const int64_t p = l.rows, q = l.cols, s = r.cols;
  const bool extra = lx != nullptr;
  const int64_t terms = q + (extra ? 1 : 0);
  const bool probabilistic = options.rule == AbftRule::kProbabilistic;
  const bool input_rounding = options.input_unit_roundoff > 0.0;
  const double u = options.accumulate_unit_roundoff;
  const double u_in = options.input_unit_roundoff;

  // Pass over L: its column sums, absolute column sums, and for the
  // probabilistic rule sum_i rowabs_i |L_il| and sum_i L_il^2.
  std::vector<double>&l_sum = w.l_sum, &l_abs = w.l_abs, &l_weighted = w.l_weighted,
                      &l_sq = w.l_sq, &row_abs = w.row_abs;
  Zeros(l_sum, terms);
  Zeros(l_abs, terms);
  Zeros(l_weighted, probabilistic ? terms : 0);
  Zeros(l_sq, probabilistic && input_rounding ? terms : 0);
  Zeros(row_abs, probabilistic ? p : 0);
  if (ColumnMajor(l)) {
    // Columns of L contiguous: a dot product per column.
    for (int64_t k = 0; k < q; ++k) {
      const unsigned char* line = ColumnStart(l, k);
      // One pass: the column's sums, and its |values| into their rows' sums.
      const DotSums d =
          DotLine(line, l.dtype, p,
                  DotWeights{kUnitWeights, kUnitWeights, l_sq.empty() ? nullptr : kUnitWeights,
                             probabilistic ? row_abs.data() : nullptr},
                  path);
      l_sum[k] = d.sum;
      l_abs[k] = d.abs;
      if (!l_sq.empty()) l_sq[k] = d.sq;
    }
    for (int64_t i = 0; i < p && extra; ++i) {
      const double x = ElementAt(*lx, i, 0);
      l_sum[q] += x;
      l_abs[q] += std::fabs(x);
      if (probabilistic) row_abs[i] += std::fabs(x);
    }
    if (probabilistic) {
      for (int64_t k = 0; k < q; ++k) {
        l_weighted[k] =
            DotLine(ColumnStart(l, k), l.dtype, p, DotWeights{nullptr, row_abs.data(), nullptr},
                    path)
                .abs;
      }
      for (int64_t i = 0; i < p && extra; ++i) {
        l_weighted[q] += row_abs[i] * std::fabs(ElementAt(*lx, i, 0));
      }
    }
  } else {
    // Rows of L contiguous (or strided both ways). For the probabilistic
    // rule, each row's absolute sum weights its row in sum_i rowabs_i |L_il|.
    if (probabilistic) {
      for (int64_t i = 0; i < p; ++i) {
        if (l.col_stride == 1) {
          row_abs[i] = DotLine(RowStart(l, i), l.dtype, q,
                               DotWeights{nullptr, kUnitWeights, nullptr}, path)
                           .abs;
        } else {
          for (int64_t j = 0; j < q; ++j) row_abs[i] += std::fabs(ElementAt(l, i, j));
        }
        if (extra) row_abs[i] += std::fabs(ElementAt(*lx, i, 0));
      }
    }
    AccumulateRows(
        l, p,
        [&](int64_t i) {
          return RowSinks{1.0,
                          l_sum.data(),
                          1.0,
                          l_abs.data(),
                          1.0,
                          l_sq.empty() ? nullptr : l_sq.data(),
                          probabilistic ? row_abs[i] : 0.0,
                          probabilistic ? l_weighted.data() : nullptr};
        },
        path);
    for (int64_t i = 0; i < p && extra; ++i) {
      const double x = ElementAt(*lx, i, 0);
      l_sum[q] += x;
      l_abs[q] += std::fabs(x);
      if (probabilistic) l_weighted[q] += row_abs[i] * std::fabs(x);
    }
  }

  // Pass over R: reference_j, T_j and (probabilistic) the variance's
  // operand part.
  std::vector<double>&reference = w.reference, &t = w.t, &variance = w.variance,
                      &sq_weight = w.sq_weight;
  Zeros(reference, s);
  Zeros(t, s);
  Zeros(variance, probabilistic ? s : 0);
  Zeros(sq_weight, probabilistic ? terms : 0);
  const double site_weight = static_cast<double>(terms) * u * u;
  for (int64_t k = 0; k < terms && probabilistic; ++k) {
    sq_weight[k] = site_weight * l_weighted[k] +
                   (k < q && input_rounding ? 2.0 * u_in * u_in * l_sq[k] : 0.0);
  }
  auto r_sinks = [&](int64_t k) {
    return RowSinks{l_sum[k], reference.data(), l_abs[k], t.data(),
                    probabilistic ? sq_weight[k] : 0.0,
                    probabilistic ? variance.data() : nullptr};
  };
  // Column by column, reference_j, T_j and the variance are dot products of
  // column j with the weights from L.
  SumColumns(r, q, s,
             DotWeights{l_sum.data(), l_abs.data(), probabilistic ? sq_weight.data() : nullptr},
             r_sinks, reference.data(), t.data(), probabilistic ? variance.data() : nullptr,
             path);
  if (extra) AccumulateRow(*ry, 0, r_sinks(q), path);

  // Pass over C: observed_j, S_j and (probabilistic, C narrower than fp32)
  // sum_i C_ij^2. An fp32 C has uo = 0: its squares would only be
  // multiplied by 0.
  const double u_out = AbftOutputUnitRoundoff(c.dtype);
  const double uo = u_out / (1.0 - u_out);
  const bool c_squares = probabilistic && uo > 0.0;
  std::vector<double>&observed = w.observed, &s_abs = w.s_abs, &c_sq = w.c_sq;
  Zeros(observed, s);
  Zeros(s_abs, s);
  Zeros(c_sq, c_squares ? s : 0);
  const RowSinks c_sinks{1.0, observed.data(), 1.0, s_abs.data(), 1.0,
                         c_sq.empty() ? nullptr : c_sq.data()};
  SumColumns(c, p, s,
             DotWeights{kUnitWeights, kUnitWeights, c_squares ? kUnitWeights : nullptr},
             [&](int64_t) { return c_sinks; }, observed.data(), s_abs.data(),
             c_squares ? c_sq.data() : nullptr, path);

  const abft_rule::Constants rule = abft_rule::MakeConstants(
      p, q, terms, u, u_in, u_out, OutputUnderflow(c.dtype), probabilistic, options.lambda);

  LineResult out;
  for (int64_t j = 0; j < s; ++j) {
    const double threshold = abft_rule::Threshold(rule, t[j], s_abs[j],
                                                  probabilistic ? variance[j] : 0.0,
                                                  c_squares ? c_sq[j] : 0.0);
    const double discrepancy = observed[j] - reference[j];
    const double magnitude = std::fabs(discrepancy);
    // A NaN or Inf in the operands or in C makes the discrepancy NaN or Inf
    // (and may make the threshold Inf): never a pass.
    const bool finite = std::isfinite(discrepancy);
    const bool ok = finite && magnitude <= threshold;
    double ratio;
    if (!finite) {
      ratio = std::numeric_limits<double>::infinity();
    } else if (threshold > 0.0) {
      ratio = magnitude / threshold;
    } else {
      ratio = magnitude > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
    }
    if (!ok) out.passed = false;
    if (ratio > out.ratio) {
      out.ratio = ratio;
      out.index = j;
      out.discrepancy = discrepancy;
      out.threshold = threshold;
      out.reference = reference[j];
    }
  }
  return out;
}

bool SupportedDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat16;
}

absl::Status ValidateMatrix(const MatrixRef& m, const char* name) {
  if (!SupportedDType(m.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("abft: ", name, " has dtype ", DTypeName(m.dtype),
                     "; only float32, bfloat16 and float16 products are checked"));
  }
  if (m.rows < 0 || m.cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("abft: ", name, " has negative dims ", m.rows, " x ", m.cols));
  }
  if (m.rows > 0 && m.cols > 0 && m.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("abft: ", name, " is null"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const MatrixRef& a, const MatrixRef& b, const MatrixRef& c,
                      const MatrixRef* bias, const AbftOptions& options) {
  for (const auto& [m, name] : {std::pair<const MatrixRef*, const char*>{&a, "A"},
                                {&b, "B"}, {&c, "C"}, {bias, "bias"}}) {
    if (m == nullptr) continue;
    if (absl::Status st = ValidateMatrix(*m, name); !st.ok()) return st;
  }
  if (a.cols != b.rows || c.rows != a.rows || c.cols != b.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "abft: shapes do not multiply: A ", a.rows, " x ", a.cols, ", B ", b.rows,
        " x ", b.cols, ", C ", c.rows, " x ", c.cols));
  }
  if (bias != nullptr && (bias->rows != 1 || bias->cols != b.cols)) {
    return absl::InvalidArgumentError(absl::StrCat("abft: bias is ", bias->rows, " x ",
                                                   bias->cols, ", want 1 x ", b.cols));
  }
  if (!std::isfinite(options.lambda) || options.lambda < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("abft: lambda must be finite and non-negative, got ", options.lambda));
  }
  // NaN fails both comparisons, so it is rejected too.
  if (!(options.input_unit_roundoff >= 0.0 && options.input_unit_roundoff < 0x1p-4) ||
      !(options.accumulate_unit_roundoff > 0.0 && options.accumulate_unit_roundoff < 0x1p-4)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "abft: input_unit_roundoff (", options.input_unit_roundoff,
        ") must be in [0, 2^-4) and accumulate_unit_roundoff (",
        options.accumulate_unit_roundoff, ") in (0, 2^-4)"));
  }
  if (options.rule != AbftRule::kGuaranteed && options.rule != AbftRule::kProbabilistic) {
    return absl::InvalidArgumentError("abft: unknown rule");
  }
  if (options.axis != AbftAxis::kColumns && options.axis != AbftAxis::kRows &&
      options.axis != AbftAxis::kBoth) {
    return absl::InvalidArgumentError("abft: unknown axis");
  }
  return absl::OkStatus();
}

}  // namespace

double AbftOutputUnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 0x1p-8;
    case DType::kFloat16:
      return 0x1p-11;
    default:
      return 0.0;
  }
}

namespace internal {

absl::StatusOr<AbftResult> CheckBatchedMatrixProductOnPath(
    int64_t batch, const MatrixRef& a, const MatrixRef& b, const MatrixRef& c,
    const BatchStrides& strides, const MatrixRef* bias, const AbftOptions& options,
    CpuPath path) {
  if (batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("abft: batch is ", batch));
  }
  if (absl::Status st = Validate(a, b, c, bias, options); !st.ok()) return st;
  AbftResult result;
  if (c.rows == 0 || c.cols == 0 || batch == 0) return result;

  // A bias is a column of ones appended to A and the bias appended to B as a
  // row; for the row check, the transposes: bias appended to B^T as a column
  // and ones to A^T as a row.
  const MatrixRef ones_column{&kOne, a.rows, 1, 0, 0, DType::kFloat32};
  const MatrixRef ones_row{&kOne, 1, a.rows, 0, 0, DType::kFloat32};
  auto at = [](MatrixRef m, int64_t index, int64_t stride) {
    m.data = static_cast<const unsigned char*>(m.data) + index * stride * DTypeSize(m.dtype);
    return m;
  };

  // One set of arrays per thread, kept across calls: the every-step checks
  // run dozens of products a step, and each check's dozen arrays were
  // allocated and freed every time. Zeros() sets every array a pass reads.
  thread_local Scratch scratch;
  LineResult best;
  AbftAxis best_axis = AbftAxis::kColumns;
  int64_t best_batch = 0;
  auto consider = [&](const LineResult& line, AbftAxis axis, int64_t index) {
    if (!line.passed) best.passed = false;
    if (line.ratio > best.ratio) {
      const bool passed = best.passed;
      best = line;
      best.passed = passed;
      best_axis = axis;
      best_batch = index;
    }
  };
  for (int64_t i = 0; i < batch; ++i) {
    const MatrixRef ai = at(a, i, strides.a), bi = at(b, i, strides.b), ci = at(c, i, strides.c);
    const MatrixRef bias_i = bias != nullptr ? at(*bias, i, strides.bias) : MatrixRef{};
    const MatrixRef bias_column = bias != nullptr ? Transposed(bias_i) : MatrixRef{};
    if (options.axis != AbftAxis::kRows) {
      consider(CheckColumns(ai, bias ? &ones_column : nullptr, bi, bias ? &bias_i : nullptr, ci,
                            options, path, scratch),
               AbftAxis::kColumns, i);
    }
    if (options.axis != AbftAxis::kColumns) {
      consider(CheckColumns(Transposed(bi), bias ? &bias_column : nullptr, Transposed(ai),
                            bias ? &ones_row : nullptr, Transposed(ci), options, path, scratch),
               AbftAxis::kRows, i);
    }
  }
  result.passed = best.passed;
  result.worst_index = best.index;
  result.worst_axis = best_axis;
  result.worst_batch = best_batch;
  result.discrepancy = best.discrepancy;
  result.threshold = best.threshold;
  result.reference = best.reference;
  return result;
}

absl::Status ValidateMatrixProduct(const MatrixRef& a, const MatrixRef& b, const MatrixRef& c,
                                   const MatrixRef* bias, const AbftOptions& options) {
  return Validate(a, b, c, bias, options);
}

double AbftOutputUnderflow(DType dtype) { return OutputUnderflow(dtype); }

absl::StatusOr<AbftResult> CheckMatrixProductOnPath(
    const MatrixRef& a, const MatrixRef& b, const MatrixRef& c,
    const MatrixRef* bias, const AbftOptions& options, CpuPath path) {
  return CheckBatchedMatrixProductOnPath(1, a, b, c, BatchStrides{}, bias, options, path);
}

}  // namespace internal

absl::StatusOr<AbftResult> CheckBatchedMatrixProduct(int64_t batch, const MatrixRef& a,
                                                     const MatrixRef& b, const MatrixRef& c,
                                                     const BatchStrides& strides,
                                                     const MatrixRef* bias,
                                                     const AbftOptions& options) {
  return internal::CheckBatchedMatrixProductOnPath(batch, a, b, c, strides, bias, options,
                                                   DetectedCpuPath());
}

absl::StatusOr<AbftResult> CheckMatrixProduct(const MatrixRef& a, const MatrixRef& b,
                                              const MatrixRef& c, const MatrixRef* bias,
                                              const AbftOptions& options) {
  return internal::CheckMatrixProductOnPath(a, b, c, bias, options, DetectedCpuPath());
}

}  // namespace sdc::kernels
