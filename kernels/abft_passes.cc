#include "kernels/abft_passes.h"

#include <cstring>
#include <limits>

#include "kernels/half_float.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sdc::kernels::abft_passes {

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

double ElementAt(const MatrixRef& m, int64_t r, int64_t c) {
  const auto* p = static_cast<const unsigned char*>(m.data) +
                  (r * m.row_stride + c * m.col_stride) * DTypeSize(m.dtype);
  return LoadValue(p, m.dtype);
}

// Elements [from, n) of a row at p, `stride` elements apart.
void AccumulateRowPortable(const unsigned char* p, int64_t stride, DType dtype,
                           int64_t from, int64_t n, const RowSinks& s) {
  const int64_t step = stride * DTypeSize(dtype);
  for (int64_t j = from; j < n; ++j) AccumulateOne(LoadValue(p + j * step, dtype), j, s);
}

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

void AccumulateColumns(const unsigned char* base, int64_t stride, DType dtype, int64_t rows,
                       int64_t n, const RowSinks& arrays, const RowWeights& w, CpuPath path) {
#if defined(__x86_64__)
  if (path != CpuPath::kPortable) {
    AccumulateColumnsAvx2(base, stride, dtype, rows, n, arrays, w);
    return;
  }
#else
  (void)path;
#endif
  auto weight = [](const double* v, int64_t i) { return v == kUnitWeights ? 1.0 : v[i]; };
  for (int64_t i = 0; i < rows; ++i) {
    const RowSinks s{weight(w.sum, i), arrays.sum,  weight(w.abs, i),  arrays.abs,
                     weight(w.sq, i),  arrays.sq,   weight(w.abs2, i), arrays.abs2};
    AccumulateRowPortable(base + i * stride, 1, dtype, 0, n, s);
  }
}

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

void AccumulateLine(const unsigned char* p, int64_t stride, DType dtype, int64_t n,
                    const RowSinks& s, CpuPath path) {
  if (stride == 1) {
    // One row: its weights as one-element weight vectors.
    auto one = [](const double& v) { return v == 1.0 ? kUnitWeights : &v; };
    AccumulateColumns(p, 0, dtype, 1, n, s, RowWeights{one(s.w_sum), one(s.w_abs), one(s.w_sq),
                                                        one(s.w_abs2)},
                      path);
    return;
  }
  AccumulateRowPortable(p, stride, dtype, 0, n, s);
}

void AccumulateRow(const MatrixRef& m, int64_t row, const RowSinks& s, CpuPath path) {
  AccumulateLine(RowStart(m, row), m.col_stride, m.dtype, m.cols, s, path);
}

}  // namespace sdc::kernels::abft_passes
