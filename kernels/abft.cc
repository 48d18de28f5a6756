#include "kernels/abft.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/half_float.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

constexpr double kFp64UnitRoundoff = 0x1p-53;
constexpr double kFp32MinNormal = 0x1p-126;
constexpr double kEvaluationSlack = 1.0 + 0x1p-40;

// The ones of a bias's companion column/row, read with stride 0.
constexpr float kOne = 1.0f;

double LoadValue(const unsigned char* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, sizeof(f));
      return f;
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof(h));
      return BitsToFloat(static_cast<uint32_t>(h) << 16);
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof(h));
      return HalfToFloat(h);
    }
    case DType::kFloat64:
      break;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

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

// Elements [from, n) of a row at p, `stride` elements apart.
void AccumulateRowPortable(const unsigned char* p, int64_t stride, DType dtype,
                           int64_t from, int64_t n, const RowSinks& s) {
  const int64_t step = stride * DTypeSize(dtype);
  for (int64_t j = from; j < n; ++j) AccumulateOne(LoadValue(p + j * step, dtype), j, s);
}

// Rows accumulated in one sweep over the arrays.
constexpr int kRowBlock = 4;

#if defined(__x86_64__)

#define SDC_AVX2 __attribute__((target("avx2,f16c")))

// Eight values at q widened to fp64, low four and high four.
SDC_AVX2 inline void Load8(const unsigned char* q, DType dtype, __m256d& lo, __m256d& hi) {
  __m256 x;
  if (dtype == DType::kFloat32) {
    x = _mm256_loadu_ps(reinterpret_cast<const float*>(q));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    x = dtype == DType::kFloat16
            ? _mm256_cvtph_ps(h)
            : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
}

// `count` (1..kRowBlock) contiguous rows into the same arrays: each array
// slot is loaded once, gets row 0's term, then row 1's, ... (multiply, then
// add; never fused), and is stored once. Each element sees the same
// operations in the same order as the portable path running the rows one
// after another, so both agree to the bit. A weight of 1 for every row of
// the block skips the multiply (x * 1 is x exactly, NaN and signed zero
// included), which is most of the work the checksums of C and of L do.
template <int kCount>
SDC_AVX2 void AccumulateRowsAvx2(const unsigned char* const* rows, DType dtype, int64_t n,
                                 const RowSinks* s) {
  const __m256d sign_mask = _mm256_set1_pd(-0.0);
  __m256d w_sum[kCount], w_abs[kCount], w_sq[kCount], w_abs2[kCount];
  bool unit_sum = true, unit_abs = true, unit_sq = true;
  for (int r = 0; r < kCount; ++r) {
    w_sum[r] = _mm256_set1_pd(s[r].w_sum);
    w_abs[r] = _mm256_set1_pd(s[r].w_abs);
    w_sq[r] = _mm256_set1_pd(s[r].w_sq);
    w_abs2[r] = _mm256_set1_pd(s[r].w_abs2);
    unit_sum = unit_sum && s[r].w_sum == 1.0;
    unit_abs = unit_abs && s[r].w_abs == 1.0;
    unit_sq = unit_sq && s[r].w_sq == 1.0;
  }
  const RowSinks& a = s[0];
  const int64_t size = DTypeSize(dtype);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256d v[kCount][2];
    for (int r = 0; r < kCount; ++r) Load8(rows[r] + j * size, dtype, v[r][0], v[r][1]);
    for (int h = 0; h < 2; ++h) {
      const int64_t at = j + 4 * h;
      if (a.sum != nullptr) {
        __m256d acc = _mm256_loadu_pd(a.sum + at);
        if (unit_sum) {
          for (int r = 0; r < kCount; ++r) acc = _mm256_add_pd(acc, v[r][h]);
        } else {
          for (int r = 0; r < kCount; ++r) acc = _mm256_add_pd(acc, _mm256_mul_pd(w_sum[r], v[r][h]));
        }
        _mm256_storeu_pd(a.sum + at, acc);
      }
      if (a.abs != nullptr || a.abs2 != nullptr) {
        __m256d m[kCount];
        for (int r = 0; r < kCount; ++r) m[r] = _mm256_andnot_pd(sign_mask, v[r][h]);
        if (a.abs != nullptr) {
          __m256d acc = _mm256_loadu_pd(a.abs + at);
          if (unit_abs) {
            for (int r = 0; r < kCount; ++r) acc = _mm256_add_pd(acc, m[r]);
          } else {
            for (int r = 0; r < kCount; ++r) acc = _mm256_add_pd(acc, _mm256_mul_pd(w_abs[r], m[r]));
          }
          _mm256_storeu_pd(a.abs + at, acc);
        }
        if (a.abs2 != nullptr) {
          __m256d acc = _mm256_loadu_pd(a.abs2 + at);
          for (int r = 0; r < kCount; ++r) acc = _mm256_add_pd(acc, _mm256_mul_pd(w_abs2[r], m[r]));
          _mm256_storeu_pd(a.abs2 + at, acc);
        }
      }
      if (a.sq != nullptr) {
        __m256d acc = _mm256_loadu_pd(a.sq + at);
        if (unit_sq) {
          for (int r = 0; r < kCount; ++r) acc = _mm256_add_pd(acc, _mm256_mul_pd(v[r][h], v[r][h]));
        } else {
          for (int r = 0; r < kCount; ++r) {
            acc = _mm256_add_pd(acc, _mm256_mul_pd(w_sq[r], _mm256_mul_pd(v[r][h], v[r][h])));
          }
        }
        _mm256_storeu_pd(a.sq + at, acc);
      }
    }
  }
  for (; j < n; ++j) {
    for (int r = 0; r < kCount; ++r) AccumulateOne(LoadValue(rows[r] + j * size, dtype), j, s[r]);
  }
}

SDC_AVX2 void AccumulateRowsAvx2(const unsigned char* const* rows, int count, DType dtype,
                                 int64_t n, const RowSinks* s) {
  static_assert(kRowBlock == 4, "one instance per count");
  switch (count) {
    case 1:
      return AccumulateRowsAvx2<1>(rows, dtype, n, s);
    case 2:
      return AccumulateRowsAvx2<2>(rows, dtype, n, s);
    case 3:
      return AccumulateRowsAvx2<3>(rows, dtype, n, s);
    default:
      return AccumulateRowsAvx2<4>(rows, dtype, n, s);
  }
}

#endif  // defined(__x86_64__)

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
constexpr double kUnitWeightsTag = 1.0;
constexpr const double* kUnitWeights = &kUnitWeightsTag;

// w[j] * x, where w may be kUnitWeights.
inline double Weighted(const double* w, int64_t j, double x) {
  return w == kUnitWeights ? x : w[j] * x;
}
struct DotSums {
  double sum = 0.0, abs = 0.0, sq = 0.0;
};

constexpr int kDotLanes = 8;

double FoldLanes(const double* l) {
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

struct DotLanes {
  double sum[kDotLanes] = {}, abs[kDotLanes] = {}, sq[kDotLanes] = {};
};

void DotTailPortable(const unsigned char* p, DType dtype, int64_t from, int64_t n,
                     const DotWeights& w, DotLanes& lanes) {
  const int64_t size = DTypeSize(dtype);
  for (int64_t j = from; j < n; ++j) {
    const double x = LoadValue(p + j * size, dtype);
    const int lane = static_cast<int>(j % kDotLanes);
    if (w.sum != nullptr) lanes.sum[lane] += Weighted(w.sum, j, x);
    if (w.abs != nullptr) lanes.abs[lane] += Weighted(w.abs, j, std::fabs(x));
    if (w.sq != nullptr) lanes.sq[lane] += Weighted(w.sq, j, x * x);
    if (w.abs_into != nullptr) w.abs_into[j] += std::fabs(x);
  }
}

DotSums FoldDot(const DotLanes& lanes) {
  return {FoldLanes(lanes.sum), FoldLanes(lanes.abs), FoldLanes(lanes.sq)};
}

#if defined(__x86_64__)

SDC_AVX2 inline void Dot4(__m256d x, const double* w, __m256d& acc) {
  acc = _mm256_add_pd(acc, _mm256_mul_pd(_mm256_loadu_pd(w), x));
}

// Dot4 of w[at..at+3], or of ones when `unit` (w is kUnitWeights, not read).
SDC_AVX2 inline void Dot4Or1(__m256d x, bool unit, const double* w, int64_t at, __m256d& acc) {
  if (unit) {
    acc = _mm256_add_pd(acc, x);
  } else {
    Dot4(x, w + at, acc);
  }
}

// FoldLanes of the eight lanes lo (0-3) and hi (4-7), the same operations
// in the same order: ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)).
SDC_AVX2 inline double FoldAvx2(__m256d lo, __m256d hi) {
  const __m256d t = _mm256_add_pd(lo, hi);  // l0+l4, l1+l5, l2+l6, l3+l7.
  const __m128d u = _mm_hadd_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
  return _mm_cvtsd_f64(u) + _mm_cvtsd_f64(_mm_unpackhi_pd(u, u));
}

SDC_AVX2 DotSums DotLineAvx2(const unsigned char* p, DType dtype, int64_t n,
                             const DotWeights& w) {
  const __m256d sign_mask = _mm256_set1_pd(-0.0);
  // Named accumulators, no arrays: arrays indexed in loops are kept in
  // memory by the compiler, which chains every add through a store.
  __m256d sum0 = _mm256_setzero_pd(), sum1 = sum0, abs0 = sum0, abs1 = sum0, sq0 = sum0,
          sq1 = sum0;
  const int64_t size = DTypeSize(dtype);
  const bool unit_sum = w.sum == kUnitWeights, unit_abs = w.abs == kUnitWeights,
             unit_sq = w.sq == kUnitWeights;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256d v0, v1;
    Load8(p + j * size, dtype, v0, v1);
    if (w.sum != nullptr) {
      Dot4Or1(v0, unit_sum, w.sum, j, sum0);
      Dot4Or1(v1, unit_sum, w.sum, j + 4, sum1);
    }
    if (w.abs != nullptr || w.abs_into != nullptr) {
      const __m256d m0 = _mm256_andnot_pd(sign_mask, v0), m1 = _mm256_andnot_pd(sign_mask, v1);
      if (w.abs != nullptr) {
        Dot4Or1(m0, unit_abs, w.abs, j, abs0);
        Dot4Or1(m1, unit_abs, w.abs, j + 4, abs1);
      }
      if (w.abs_into != nullptr) {
        double* into = w.abs_into + j;
        _mm256_storeu_pd(into, _mm256_add_pd(_mm256_loadu_pd(into), m0));
        _mm256_storeu_pd(into + 4, _mm256_add_pd(_mm256_loadu_pd(into + 4), m1));
      }
    }
    if (w.sq != nullptr) {
      Dot4Or1(_mm256_mul_pd(v0, v0), unit_sq, w.sq, j, sq0);
      Dot4Or1(_mm256_mul_pd(v1, v1), unit_sq, w.sq, j + 4, sq1);
    }
  }
  if (j == n) {  // No tail: fold in registers, in FoldLanes' order.
    return {FoldAvx2(sum0, sum1), FoldAvx2(abs0, abs1), FoldAvx2(sq0, sq1)};
  }
  DotLanes lanes;
  _mm256_storeu_pd(lanes.sum, sum0);
  _mm256_storeu_pd(lanes.sum + 4, sum1);
  _mm256_storeu_pd(lanes.abs, abs0);
  _mm256_storeu_pd(lanes.abs + 4, abs1);
  _mm256_storeu_pd(lanes.sq, sq0);
  _mm256_storeu_pd(lanes.sq + 4, sq1);
  DotTailPortable(p, dtype, j, n, w, lanes);
  return FoldDot(lanes);
}

#endif  // defined(__x86_64__)

// A contiguous line of `n` values at p.
DotSums DotLine(const unsigned char* p, DType dtype, int64_t n, const DotWeights& w,
                CpuPath path) {
#if defined(__x86_64__)
  if (path != CpuPath::kPortable) return DotLineAvx2(p, dtype, n, w);
#else
  (void)path;
#endif
  DotLanes lanes;
  DotTailPortable(p, dtype, 0, n, w, lanes);
  return FoldDot(lanes);
}

// Column `col` of m, which must have row_stride 1 (columns contiguous).
const unsigned char* ColumnStart(const MatrixRef& m, int64_t col) {
  return static_cast<const unsigned char*>(m.data) + col * m.col_stride * DTypeSize(m.dtype);
}

// Whether a matrix is best read column by column.
bool ColumnMajor(const MatrixRef& m) { return m.row_stride == 1 && m.col_stride != 1; }

// n values at p, `stride` elements apart, into the sinks.
void AccumulateLine(const unsigned char* p, int64_t stride, DType dtype, int64_t n,
                    const RowSinks& s, CpuPath path) {
#if defined(__x86_64__)
  if (path != CpuPath::kPortable && stride == 1) {
    AccumulateRowsAvx2(&p, 1, dtype, n, &s);
    return;
  }
#else
  (void)path;
#endif
  AccumulateRowPortable(p, stride, dtype, 0, n, s);
}

const unsigned char* RowStart(const MatrixRef& m, int64_t row) {
  return static_cast<const unsigned char*>(m.data) + row * m.row_stride * DTypeSize(m.dtype);
}

void AccumulateRow(const MatrixRef& m, int64_t row, const RowSinks& s, CpuPath path) {
  AccumulateLine(RowStart(m, row), m.col_stride, m.dtype, m.cols, s, path);
}

#if defined(__x86_64__)

// Per-row weights of AccumulateRows: one value per row, or kUnitWeights
// (every row's weight 1: the multiply is skipped, x * 1 being x exactly).
struct RowWeights {
  const double* sum = kUnitWeights;
  const double* abs = kUnitWeights;
  const double* sq = kUnitWeights;
  const double* abs2 = kUnitWeights;
};

// acc + w[i] x, or acc + x for unit weights.
SDC_AVX2 inline __m256d AddWeighted(__m256d acc, bool unit, const double* w, int64_t i,
                                    __m256d x) {
  return _mm256_add_pd(acc, unit ? x : _mm256_mul_pd(_mm256_set1_pd(w[i]), x));
}

// Four values of an array at `at` (zeros for an absent array), and back.
SDC_AVX2 inline __m256d LoadSlot(const double* array, int64_t at) {
  return array != nullptr ? _mm256_loadu_pd(array + at) : _mm256_setzero_pd();
}
SDC_AVX2 inline void StoreSlot(double* array, int64_t at, __m256d v) {
  if (array != nullptr) _mm256_storeu_pd(array + at, v);
}

// Rows [0, rows) of a matrix with contiguous rows (`stride` bytes apart),
// eight columns at a time: the eight columns' running sums stay in
// registers over all the rows (two per array), so each element is read
// once and no array slot is loaded or stored per row. Column j sees the
// same operations in the same order as the portable path (row 0's term,
// then row 1's, ...; multiply, then add), so both agree to the bit.
SDC_AVX2 void AccumulateColumnsAvx2(const unsigned char* base, int64_t stride, DType dtype,
                                    int64_t rows, int64_t n, const RowSinks& a,
                                    const RowWeights& w) {
  const __m256d sign_mask = _mm256_set1_pd(-0.0);
  const int64_t size = DTypeSize(dtype);
  const bool unit_sum = w.sum == kUnitWeights, unit_abs = w.abs == kUnitWeights,
             unit_sq = w.sq == kUnitWeights, unit_abs2 = w.abs2 == kUnitWeights;
  const bool any_abs = a.abs != nullptr || a.abs2 != nullptr;
  // Named accumulators, no arrays (see DotLineAvx2).
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256d sum0 = LoadSlot(a.sum, j), sum1 = LoadSlot(a.sum, j + 4);
    __m256d abs0 = LoadSlot(a.abs, j), abs1 = LoadSlot(a.abs, j + 4);
    __m256d sq0 = LoadSlot(a.sq, j), sq1 = LoadSlot(a.sq, j + 4);
    __m256d abs20 = LoadSlot(a.abs2, j), abs21 = LoadSlot(a.abs2, j + 4);
    const unsigned char* p = base + j * size;
    for (int64_t i = 0; i < rows; ++i, p += stride) {
      __m256d v0, v1;
      Load8(p, dtype, v0, v1);
      if (a.sum != nullptr) {
        sum0 = AddWeighted(sum0, unit_sum, w.sum, i, v0);
        sum1 = AddWeighted(sum1, unit_sum, w.sum, i, v1);
      }
      if (any_abs) {
        const __m256d m0 = _mm256_andnot_pd(sign_mask, v0), m1 = _mm256_andnot_pd(sign_mask, v1);
        if (a.abs != nullptr) {
          abs0 = AddWeighted(abs0, unit_abs, w.abs, i, m0);
          abs1 = AddWeighted(abs1, unit_abs, w.abs, i, m1);
        }
        if (a.abs2 != nullptr) {
          abs20 = AddWeighted(abs20, unit_abs2, w.abs2, i, m0);
          abs21 = AddWeighted(abs21, unit_abs2, w.abs2, i, m1);
        }
      }
      if (a.sq != nullptr) {
        sq0 = AddWeighted(sq0, unit_sq, w.sq, i, _mm256_mul_pd(v0, v0));
        sq1 = AddWeighted(sq1, unit_sq, w.sq, i, _mm256_mul_pd(v1, v1));
      }
    }
    StoreSlot(a.sum, j, sum0);
    StoreSlot(a.sum, j + 4, sum1);
    StoreSlot(a.abs, j, abs0);
    StoreSlot(a.abs, j + 4, abs1);
    StoreSlot(a.sq, j, sq0);
    StoreSlot(a.sq, j + 4, sq1);
    StoreSlot(a.abs2, j, abs20);
    StoreSlot(a.abs2, j + 4, abs21);
  }
  // The last n mod 8 columns, element by element in the same order.
  auto weight = [](const double* w, int64_t i) { return w == kUnitWeights ? 1.0 : w[i]; };
  for (int64_t i = 0; i < rows && j < n; ++i) {
    const RowSinks s{weight(w.sum, i), a.sum,  weight(w.abs, i),  a.abs,
                     weight(w.sq, i),  a.sq,   weight(w.abs2, i), a.abs2};
    for (int64_t c = j; c < n; ++c) AccumulateOne(LoadValue(base + i * stride + c * size, dtype), c, s);
  }
}

#endif  // defined(__x86_64__)

// Per-row weight vectors of AccumulateRows, reused across calls.
struct RowWeightScratch {
  std::vector<double> sum, abs, sq, abs2;
};

// Rows [0, rows) of m, row i into sinks_for(i) (all with the same arrays),
// eight columns at a time over all the rows where the rows are contiguous.
template <typename SinksFor>
void AccumulateRows(const MatrixRef& m, int64_t rows, SinksFor sinks_for, CpuPath path) {
#if defined(__x86_64__)
  if (path != CpuPath::kPortable && m.col_stride == 1 && rows > 0) {
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
    AccumulateColumnsAvx2(static_cast<const unsigned char*>(m.data),
                          m.row_stride * DTypeSize(m.dtype), m.dtype, rows, m.cols, first, w);
    return;
  }
#endif
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

double ElementAt(const MatrixRef& m, int64_t r, int64_t c) {
  const auto* p = static_cast<const unsigned char*>(m.data) +
                  (r * m.row_stride + c * m.col_stride) * DTypeSize(m.dtype);
  return LoadValue(p, m.dtype);
}

double Gamma(double count, double unit_roundoff) {
  const double nu = count * unit_roundoff;
  return nu < 1.0 ? nu / (1.0 - nu) : std::numeric_limits<double>::infinity();
}

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

  const double beta = (1.0 + u_in) * (1.0 + u_in) * (1.0 + Gamma(terms, u)) - 1.0;
  const double beta_first_order = static_cast<double>(terms) * u + 2.0 * u_in;
  const double g64 = Gamma(static_cast<double>(p + q + 4), kFp64UnitRoundoff);
  const double lift = 1.0 / (1.0 - g64);
  // An underflow's absolute error is carried through the later roundings of
  // the same dot product: at most (1 + gamma_K) of it reaches c^.
  const double underflow =
      static_cast<double>(p) * (2.0 * static_cast<double>(terms) * kFp32MinNormal *
                                    (1.0 + Gamma(terms, u)) +
                                OutputUnderflow(c.dtype));

  LineResult out;
  for (int64_t j = 0; j < s; ++j) {
    const double t_j = t[j] * lift, s_j = s_abs[j] * lift;
    const double check = g64 * (t_j + s_j) + underflow;
    double threshold = (beta * t_j + uo * s_j + check) * kEvaluationSlack;
    if (probabilistic) {
      const double sigma = std::sqrt((variance[j] + (c_squares ? uo * uo * c_sq[j] : 0.0)) * lift);
      const double second_order = (beta - beta_first_order) * t_j + uo * beta * t_j;
      const double bound =
          (options.lambda * sigma + second_order + check) * kEvaluationSlack;
      threshold = std::min(threshold, bound);
    }
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

  Scratch scratch;
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
