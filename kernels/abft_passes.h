#ifndef SDC_KERNELS_ABFT_PASSES_H_
#define SDC_KERNELS_ABFT_PASSES_H_

// The passes of the matrix-product checksums (abft.cc) over one operand:
// weighted sums of its elements (and of their absolute values and squares)
// along its rows or columns, in fp64, in the operand's memory order. Every
// CPU path gives the same bits as the portable one: the same operations on
// each sum in the same order (abft.h's threshold covers the order these
// fix). Internal to //kernels:abft.

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/abft.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/nonfinite.h"

namespace sdc::kernels::abft_passes {

// The value at p, widened to double (NaN for a dtype the checks do not take).
double LoadValue(const unsigned char* p, DType dtype);

// Element (r, c) of m.
double ElementAt(const MatrixRef& m, int64_t r, int64_t c);

// Where one row of values goes: sum[j] += w_sum * x_j, abs[j] += w_abs *
// |x_j|, abs2[j] += w_abs2 * |x_j|, sq[j] += w_sq * (x_j * x_j); a null
// array is skipped. Rows accumulated together share the arrays.
struct RowSinks {
  double w_sum = 0.0;
  double* sum = nullptr;
  double w_abs = 0.0;
  double* abs = nullptr;
  double w_sq = 0.0;
  double* sq = nullptr;
  double w_abs2 = 0.0;
  double* abs2 = nullptr;
};

inline void AccumulateOne(double x, int64_t j, const RowSinks& s) {
  if (s.sum != nullptr) s.sum[j] += s.w_sum * x;
  if (s.abs != nullptr) s.abs[j] += s.w_abs * std::fabs(x);
  if (s.sq != nullptr) s.sq[j] += s.w_sq * (x * x);
  if (s.abs2 != nullptr) s.abs2[j] += s.w_abs2 * std::fabs(x);
}

// A contiguous line x (n values) against weight vectors: sum w_sum[j] x_j,
// sum w_abs[j] |x_j|, sum w_sq[j] (x_j * x_j); a null weight is skipped.
// Element j goes to lane j mod 8, folded as ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)),
// on every path, so all paths agree to the bit.
// kUnitWeights as a weight vector means all ones: the multiply is skipped
// (x * 1 is x exactly), and no vector of ones is read.
struct DotWeights {
  const double* sum = nullptr;
  const double* abs = nullptr;
  const double* sq = nullptr;
  // Not a weight: when set, abs_into[j] += |x_j| as well, in the same pass
  // (a column of L adding to its rows' absolute sums).
  double* abs_into = nullptr;
};
inline constexpr double kUnitWeightsTag = 1.0;
inline constexpr const double* kUnitWeights = &kUnitWeightsTag;

// w[j] * x, where w may be kUnitWeights.
inline double Weighted(const double* w, int64_t j, double x) {
  return w == kUnitWeights ? x : w[j] * x;
}
struct DotSums {
  double sum = 0.0, abs = 0.0, sq = 0.0;
};

// A contiguous line of `n` values at p against the weights.
DotSums DotLine(const unsigned char* p, DType dtype, int64_t n, const DotWeights& w,
                CpuPath path);

// Column `col` of m, which must have row_stride 1 (columns contiguous).
inline const unsigned char* ColumnStart(const MatrixRef& m, int64_t col) {
  return static_cast<const unsigned char*>(m.data) + col * m.col_stride * DTypeSize(m.dtype);
}

// Whether a matrix is best read column by column.
inline bool ColumnMajor(const MatrixRef& m) { return m.row_stride == 1 && m.col_stride != 1; }

inline const unsigned char* RowStart(const MatrixRef& m, int64_t row) {
  return static_cast<const unsigned char*>(m.data) + row * m.row_stride * DTypeSize(m.dtype);
}

// n values at p, `stride` elements apart, into the sinks.
void AccumulateLine(const unsigned char* p, int64_t stride, DType dtype, int64_t n,
                    const RowSinks& s, CpuPath path);

// Row `row` of m into the sinks.
void AccumulateRow(const MatrixRef& m, int64_t row, const RowSinks& s, CpuPath path);

// Per-row weights of AccumulateRows: one value per row, or kUnitWeights
// (every row's weight 1: the multiply is skipped, x * 1 being x exactly).
struct RowWeights {
  const double* sum = kUnitWeights;
  const double* abs = kUnitWeights;
  const double* sq = kUnitWeights;
  const double* abs2 = kUnitWeights;
};

// Rows [0, rows) of a matrix whose rows are contiguous (`stride` bytes
// apart, n values each) into the arrays of `arrays` (its weights unused),
// row i with weight w.X[i]; the same bits as AccumulateLine row by row.
// AVX2: eight columns at a time, their sums in registers over all rows.
void AccumulateColumns(const unsigned char* base, int64_t stride, DType dtype, int64_t rows,
                       int64_t n, const RowSinks& arrays, const RowWeights& w, CpuPath path);

// Per-row weight vectors of AccumulateRows, reused across calls.
struct RowWeightScratch {
  std::vector<double> sum, abs, sq, abs2;
};

// Rows [0, rows) of m, row i into sinks_for(i) (all with the same arrays,
// row 0's naming them), by AccumulateColumns where the rows are contiguous.
template <typename SinksFor>
void AccumulateRows(const MatrixRef& m, int64_t rows, SinksFor sinks_for, CpuPath path) {
  if (m.col_stride == 1 && rows > 0) {
    // Each weight: kUnitWeights when every row's is 1, else one per row.
    thread_local RowWeightScratch scratch;
    const RowSinks first = sinks_for(0);
    bool unit_sum = true, unit_abs = true, unit_sq = true, unit_abs2 = true;
    scratch.sum.resize(static_cast<size_t>(rows));
    scratch.abs.resize(static_cast<size_t>(rows));
    scratch.sq.resize(static_cast<size_t>(rows));
    scratch.abs2.resize(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      const RowSinks s = i == 0 ? first : sinks_for(i);
      scratch.sum[i] = s.w_sum;
      scratch.abs[i] = s.w_abs;
      scratch.sq[i] = s.w_sq;
      scratch.abs2[i] = s.w_abs2;
      unit_sum = unit_sum && s.w_sum == 1.0;
      unit_abs = unit_abs && s.w_abs == 1.0;
      unit_sq = unit_sq && s.w_sq == 1.0;
      unit_abs2 = unit_abs2 && s.w_abs2 == 1.0;
    }
    const RowWeights w{unit_sum ? kUnitWeights : scratch.sum.data(),
                       unit_abs ? kUnitWeights : scratch.abs.data(),
                       unit_sq ? kUnitWeights : scratch.sq.data(),
                       unit_abs2 ? kUnitWeights : scratch.abs2.data()};
    AccumulateColumns(static_cast<const unsigned char*>(m.data),
                      m.row_stride * DTypeSize(m.dtype), m.dtype, rows, m.cols, first, w, path);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) AccumulateRow(m, i, sinks_for(i), path);
}

// The weighted sums of each of m's `columns` columns over its first `rows`
// rows, in m's memory order: column by column (weights: one per row) where
// columns are contiguous, else row by row into sinks_for(i), which must add
// into the same `sum`, `abs` and `sq` arrays with the same weights.
template <typename SinksFor>
void SumColumns(const MatrixRef& m, int64_t rows, int64_t columns, const DotWeights& weights,
                SinksFor sinks_for, double* sum, double* abs, double* sq, CpuPath path) {
  if (!ColumnMajor(m)) {
    AccumulateRows(m, rows, sinks_for, path);
    return;
  }
  for (int64_t j = 0; j < columns; ++j) {
    const DotSums d = DotLine(ColumnStart(m, j), m.dtype, rows, weights, path);
    sum[j] = d.sum;
    abs[j] = d.abs;
    if (sq != nullptr) sq[j] = d.sq;
  }
}

}  // namespace sdc::kernels::abft_passes

#endif  // SDC_KERNELS_ABFT_PASSES_H_
