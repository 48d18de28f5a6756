#include "kernels/nonfinite.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/half_float.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sdc::kernels {
namespace {

constexpr int kAccumulators = 16;

struct Partial {
  uint64_t nonfinite = 0;
  double sum_squares = 0.0;
};

// Step 3 of the sum order in nonfinite.h.
double FoldAccumulators(const double* acc) {
  double r[4];
  for (int k = 0; k < 4; ++k) {
    r[k] = (acc[k] + acc[k + 4]) + (acc[k + 8] + acc[k + 12]);
  }
  return (r[0] + r[1]) + (r[2] + r[3]);
}

template <typename T>
T Load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// One element as {fp64 value, is it NaN/Inf}.
struct Element {
  double value;
  bool nonfinite;
};

template <DType D>
Element LoadElement(const unsigned char* p, uint64_t j);

template <>
Element LoadElement<DType::kFloat32>(const unsigned char* p, uint64_t j) {
  const uint32_t bits = Load<uint32_t>(p + 4 * j);
  return {static_cast<double>(BitsToFloat(bits)),
          (bits & 0x7f800000u) == 0x7f800000u};
}

template <>
Element LoadElement<DType::kFloat64>(const unsigned char* p, uint64_t j) {
  const uint64_t bits = Load<uint64_t>(p + 8 * j);
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return {d, (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull};
}

template <>
Element LoadElement<DType::kFloat16>(const unsigned char* p, uint64_t j) {
  const uint16_t bits = Load<uint16_t>(p + 2 * j);
  return {static_cast<double>(HalfToFloat(bits)), (bits & 0x7c00u) == 0x7c00u};
}

template <>
Element LoadElement<DType::kBFloat16>(const unsigned char* p, uint64_t j) {
  const uint16_t bits = Load<uint16_t>(p + 2 * j);
  return {static_cast<double>(BitsToFloat(static_cast<uint32_t>(bits) << 16)),
          (bits & 0x7f80u) == 0x7f80u};
}

// Elements [from, n) in the canonical order, continuing `acc`.
template <DType D>
void AccumulateScalar(const unsigned char* p, uint64_t from, uint64_t n,
                      double* acc) {
  for (uint64_t j = from; j < n; ++j) {
    const double x = LoadElement<D>(p, j).value;
    const double square = x * x;
    acc[j % kAccumulators] += square;
  }
}

template <DType D>
uint64_t CountNonFinite(const unsigned char* p, uint64_t n) {
  uint64_t count = 0;
  for (uint64_t j = 0; j < n; ++j) count += LoadElement<D>(p, j).nonfinite ? 1 : 0;
  return count;
}

template <DType D>
double SumChunkPortable(const unsigned char* p, uint64_t n) {
  double acc[kAccumulators] = {};
  AccumulateScalar<D>(p, 0, n, acc);
  return FoldAccumulators(acc);
}

#if defined(__x86_64__)

#define SDC_AVX2 __attribute__((target("avx2,f16c")))

// Adds the squares of eight fp32 values to acc[0..3] (`lo`) and acc[4..7]
// (`hi`).
SDC_AVX2 inline void Accumulate8(__m256 x, __m256d& lo, __m256d& hi) {
  const __m256d x_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d x_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  lo = _mm256_add_pd(lo, _mm256_mul_pd(x_lo, x_lo));
  hi = _mm256_add_pd(hi, _mm256_mul_pd(x_hi, x_hi));
}

// Eight values of a 16-bit float type at p, widened to fp32.
template <DType D>
SDC_AVX2 inline __m256 Load8Half(const unsigned char* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (D == DType::kFloat16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Sixteen canonical lanes in four registers.
struct Avx2Lanes {
  __m256d a0, a1, a2, a3;
};

// fp32, fp16 and bf16: one round of sixteen values at q, widened exactly to
// fp32, squared into the canonical lanes.
template <DType D>
SDC_AVX2 inline void Avx2Round(const unsigned char* q, Avx2Lanes& acc) {
  __m256 x0, x1;
  if constexpr (D == DType::kFloat32) {
    x0 = _mm256_loadu_ps(reinterpret_cast<const float*>(q));
    x1 = _mm256_loadu_ps(reinterpret_cast<const float*>(q + 32));
  } else {
    x0 = Load8Half<D>(q);
    x1 = Load8Half<D>(q + 16);
  }
  Accumulate8(x0, acc.a0, acc.a1);
  Accumulate8(x1, acc.a2, acc.a3);
}

// The rounds done in `acc`, the tail from element `from` on, then the fold.
template <DType D>
SDC_AVX2 double Avx2Finish(const unsigned char* p, uint64_t from, uint64_t n,
                           const Avx2Lanes& acc) {
  alignas(32) double lanes[kAccumulators];
  _mm256_store_pd(lanes + 0, acc.a0);
  _mm256_store_pd(lanes + 4, acc.a1);
  _mm256_store_pd(lanes + 8, acc.a2);
  _mm256_store_pd(lanes + 12, acc.a3);
  AccumulateScalar<D>(p, from, n, lanes);
  return FoldAccumulators(lanes);
}

template <DType D>
SDC_AVX2 double SumChunkAvx2Narrow(const unsigned char* p, uint64_t n) {
  constexpr int kStride = (D == DType::kFloat32 ? 4 : 2) * kAccumulators;
  const __m256d zero = _mm256_setzero_pd();
  Avx2Lanes acc{zero, zero, zero, zero};
  const uint64_t rounds = n / kAccumulators;
  for (uint64_t m = 0; m < rounds; ++m) Avx2Round<D>(p + kStride * m, acc);
  return Avx2Finish<D>(p, rounds * kAccumulators, n, acc);
}

// Two chunks of n elements in lockstep: each keeps its own lanes and order,
// and their independent chains of adds overlap, where one chunk alone waits
// on the latency of its adds.
template <DType D>
SDC_AVX2 void SumChunkPairAvx2Narrow(const unsigned char* const* p, uint64_t n,
                                     double* sums) {
  constexpr int kStride = (D == DType::kFloat32 ? 4 : 2) * kAccumulators;
  const __m256d zero = _mm256_setzero_pd();
  Avx2Lanes acc0{zero, zero, zero, zero}, acc1 = acc0;
  const uint64_t rounds = n / kAccumulators;
  for (uint64_t m = 0; m < rounds; ++m) {
    Avx2Round<D>(p[0] + kStride * m, acc0);
    Avx2Round<D>(p[1] + kStride * m, acc1);
  }
  sums[0] = Avx2Finish<D>(p[0], rounds * kAccumulators, n, acc0);
  sums[1] = Avx2Finish<D>(p[1], rounds * kAccumulators, n, acc1);
}

SDC_AVX2 double SumChunkAvx2Float64(const unsigned char* p, uint64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd(), _mm256_setzero_pd()};
  const uint64_t rounds = n / kAccumulators;
  for (uint64_t m = 0; m < rounds; ++m) {
    const double* q = reinterpret_cast<const double*>(p + 8 * kAccumulators * m);
    for (int v = 0; v < 4; ++v) {
      const __m256d x = _mm256_loadu_pd(q + 4 * v);
      acc[v] = _mm256_add_pd(acc[v], _mm256_mul_pd(x, x));
    }
  }
  alignas(32) double lanes[kAccumulators];
  for (int v = 0; v < 4; ++v) _mm256_store_pd(lanes + 4 * v, acc[v]);
  AccumulateScalar<DType::kFloat64>(p, rounds * kAccumulators, n, lanes);
  return FoldAccumulators(lanes);
}

#undef SDC_AVX2

#define SDC_AVX512 __attribute__((target("avx512f,avx512bw,avx2,f16c")))

// Adds the squares of sixteen fp32 values to acc[0..7] (`lo`) and
// acc[8..15] (`hi`).
SDC_AVX512 inline void Accumulate16(__m512 x, __m512d& lo, __m512d& hi) {
  const __m512d x_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d x_hi = _mm512_cvtps_pd(
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  lo = _mm512_add_pd(lo, _mm512_mul_pd(x_lo, x_lo));
  hi = _mm512_add_pd(hi, _mm512_mul_pd(x_hi, x_hi));
}

// Sixteen fp32, fp16 or bf16 values at q, widened exactly to fp32.
template <DType D>
SDC_AVX512 inline __m512 Load16(const unsigned char* q) {
  if constexpr (D == DType::kFloat32) {
    return _mm512_loadu_ps(q);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    if constexpr (D == DType::kFloat16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType D>
SDC_AVX512 double Avx512Finish(const unsigned char* p, uint64_t from, uint64_t n,
                               __m512d lo, __m512d hi) {
  alignas(64) double acc[kAccumulators];
  _mm512_store_pd(acc + 0, lo);
  _mm512_store_pd(acc + 8, hi);
  AccumulateScalar<D>(p, from, n, acc);
  return FoldAccumulators(acc);
}

template <DType D>
SDC_AVX512 double SumChunkAvx512Narrow(const unsigned char* p, uint64_t n) {
  constexpr int kStride = (D == DType::kFloat32 ? 4 : 2) * kAccumulators;
  __m512d lo = _mm512_setzero_pd(), hi = lo;
  const uint64_t rounds = n / kAccumulators;
  for (uint64_t m = 0; m < rounds; ++m) {
    Accumulate16(Load16<D>(p + kStride * m), lo, hi);
  }
  return Avx512Finish<D>(p, rounds * kAccumulators, n, lo, hi);
}

// As SumChunkPairAvx2Narrow.
template <DType D>
SDC_AVX512 void SumChunkPairAvx512Narrow(const unsigned char* const* p,
                                         uint64_t n, double* sums) {
  constexpr int kStride = (D == DType::kFloat32 ? 4 : 2) * kAccumulators;
  __m512d lo0 = _mm512_setzero_pd(), hi0 = lo0, lo1 = lo0, hi1 = lo0;
  const uint64_t rounds = n / kAccumulators;
  for (uint64_t m = 0; m < rounds; ++m) {
    // Two streams a thread: asking 1 KiB ahead measured bf16 0.88 - 0.93
    // of read bandwidth against 0.84 - 0.92 without (three A/B pairs). A
    // prefetch never faults, so asking past the chunk's end is harmless.
    _mm_prefetch(reinterpret_cast<const char*>(p[0] + kStride * m + 1024), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p[1] + kStride * m + 1024), _MM_HINT_T0);
    Accumulate16(Load16<D>(p[0] + kStride * m), lo0, hi0);
    Accumulate16(Load16<D>(p[1] + kStride * m), lo1, hi1);
  }
  sums[0] = Avx512Finish<D>(p[0], rounds * kAccumulators, n, lo0, hi0);
  sums[1] = Avx512Finish<D>(p[1], rounds * kAccumulators, n, lo1, hi1);
}

SDC_AVX512 double SumChunkAvx512Float64(const unsigned char* p, uint64_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = lo;
  const uint64_t rounds = n / kAccumulators;
  for (uint64_t m = 0; m < rounds; ++m) {
    const unsigned char* q = p + 8 * kAccumulators * m;
    const __m512d x_lo = _mm512_loadu_pd(q);
    const __m512d x_hi = _mm512_loadu_pd(q + 64);
    lo = _mm512_add_pd(lo, _mm512_mul_pd(x_lo, x_lo));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(x_hi, x_hi));
  }
  alignas(64) double acc[kAccumulators];
  _mm512_store_pd(acc + 0, lo);
  _mm512_store_pd(acc + 8, hi);
  AccumulateScalar<DType::kFloat64>(p, rounds * kAccumulators, n, acc);
  return FoldAccumulators(acc);
}

// bf16 pairs with the squares taken in fp32. A bf16 value has 8 significant
// bits, so its square has at most 16 and fp32 holds it exactly unless it
// overflows (|x| >= 2^64: the square becomes Inf, and so does the sum) or
// falls below fp32's normal range and loses bits (|x| < 2^-63: MXCSR's
// underflow flag, see ScopedScanFpEnvironment). Exact fp32 squares widen
// exactly to fp64, so every add sees the value of the canonical order and the
// sum is bit-identical; one fp32 multiply replaces two fp64 ones and the
// widening moves 32 elements per 64-byte load. The caller redoes a chunk on
// the fp64 loop when its sum is not finite or the flag is set.
//
// Lanes: an in-lane unpack of 64 bytes with zero gives fp32 vectors of
// elements {0-3, 8-11, 16-19, 24-27} and {4-7, 12-15, 20-23, 28-31}; their
// low halves widen to classes (j mod 16) {0-3, 8-11} and {4-7, 12-15}, their
// high halves to the same classes 16 elements later. So `a` holds acc[0..3,
// 8..11], `b` acc[4..7, 12..15], and each is added low half first, as the
// canonical order requires.
SDC_AVX512 inline __m256 HighHalf(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

SDC_AVX512 inline void Bf16Fp32SquaresRound(const unsigned char* q, __m512d& a,
                                             __m512d& b) {
  const __m512i x = _mm512_loadu_si512(q);
  const __m512i zero = _mm512_setzero_si512();
  __m512 lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, x));
  __m512 hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, x));
  lo = _mm512_mul_ps(lo, lo);
  hi = _mm512_mul_ps(hi, hi);
  a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(lo)));
  b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm512_castps512_ps256(hi)));
  a = _mm512_add_pd(a, _mm512_cvtps_pd(HighHalf(lo)));
  b = _mm512_add_pd(b, _mm512_cvtps_pd(HighHalf(hi)));
}

SDC_AVX512 double Bf16Fp32SquaresFinish(const unsigned char* p, uint64_t from,
                                        uint64_t n, __m512d a, __m512d b) {
  alignas(64) double la[8];
  alignas(64) double lb[8];
  _mm512_store_pd(la, a);
  _mm512_store_pd(lb, b);
  double acc[kAccumulators];
  for (int i = 0; i < 4; ++i) {
    acc[i] = la[i];
    acc[8 + i] = la[4 + i];
    acc[4 + i] = lb[i];
    acc[12 + i] = lb[4 + i];
  }
  AccumulateScalar<DType::kBFloat16>(p, from, n, acc);
  return FoldAccumulators(acc);
}

// REQUIRES: runs under ScopedScanFpEnvironment; noinline so that the flag the
// caller reads afterwards covers every multiply of this loop.
SDC_AVX512 __attribute__((noinline)) void SumBf16ChunkPairFp32Squares(
    const unsigned char* const* p, uint64_t n, double* sums) {
  constexpr int kRound = 32;  // Elements, 64 bytes.
  __m512d a0 = _mm512_setzero_pd(), b0 = a0, a1 = a0, b1 = a0;
  const uint64_t rounds = n / kRound;
  for (uint64_t m = 0; m < rounds; ++m) {
    _mm_prefetch(reinterpret_cast<const char*>(p[0] + 2 * kRound * m + 1024), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p[1] + 2 * kRound * m + 1024), _MM_HINT_T0);
    Bf16Fp32SquaresRound(p[0] + 2 * kRound * m, a0, b0);
    Bf16Fp32SquaresRound(p[1] + 2 * kRound * m, a1, b1);
  }
  sums[0] = Bf16Fp32SquaresFinish(p[0], rounds * kRound, n, a0, b0);
  sums[1] = Bf16Fp32SquaresFinish(p[1], rounds * kRound, n, a1, b1);
}

#undef SDC_AVX512

#endif  // __x86_64__

#if defined(__x86_64__)
// Every scan runs under one SSE environment, whatever the caller set: all
// exceptions masked, round to nearest, no flush-to-zero, no
// denormals-are-zero (torch.set_flush_denormal sets both), so the caller's
// settings cannot change a norm. The caller's MXCSR, flags included, comes
// back on destruction. Scopes nest. Not copyable.
class ScopedScanFpEnvironment {
 public:
  ScopedScanFpEnvironment() : saved_(_mm_getcsr()) { _mm_setcsr(kScanMxcsr); }
  ~ScopedScanFpEnvironment() { _mm_setcsr(saved_); }
  ScopedScanFpEnvironment(const ScopedScanFpEnvironment&) = delete;
  ScopedScanFpEnvironment& operator=(const ScopedScanFpEnvironment&) = delete;

  // True when an operation since construction rounded a result below the
  // normal range (IEEE underflow: tiny and inexact).
  bool Underflowed() const { return (_mm_getcsr() & kUnderflowFlag) != 0; }

 private:
  static constexpr unsigned kScanMxcsr = 0x1f80;  // Masks set, flags clear.
  static constexpr unsigned kUnderflowFlag = 0x10;
  const unsigned saved_;
};

// bf16 pairs on AVX-512: the fp32-squares loop, and the fp64 loop for a chunk
// whose fp32 squares were not all exact.
void SumBf16ChunkPairAvx512(const unsigned char* const* p, uint64_t n,
                            double* sums) {
  bool underflowed;
  {
    ScopedScanFpEnvironment fp_environment;  // Clears the flags.
    SumBf16ChunkPairFp32Squares(p, n, sums);
    underflowed = fp_environment.Underflowed();
  }
  for (int k = 0; k < 2; ++k) {
    if (underflowed || !std::isfinite(sums[k])) {
      sums[k] = SumChunkAvx512Narrow<DType::kBFloat16>(p[k], n);
    }
  }
}
#endif

template <DType D>
double SumChunk(const unsigned char* p, uint64_t n, CpuPath path) {
#if defined(__x86_64__)
  if constexpr (D == DType::kFloat64) {
    if (path == CpuPath::kAvx512) return SumChunkAvx512Float64(p, n);
    if (path == CpuPath::kAvx2) return SumChunkAvx2Float64(p, n);
  } else {
    if (path == CpuPath::kAvx512) return SumChunkAvx512Narrow<D>(p, n);
    if (path == CpuPath::kAvx2) return SumChunkAvx2Narrow<D>(p, n);
  }
#else
  (void)path;
#endif
  return SumChunkPortable<D>(p, n);
}

// Two chunks of n elements each, in lockstep on the vector paths. Within a
// chunk every add waits for the one before it in its lane (the sum order),
// so one chunk alone is bound by the latency of its adds, not by memory
// (for a 16-bit type, 32 bytes per add latency); two chains overlap.
template <DType D>
void SumChunkPair(const unsigned char* const* p, uint64_t n, CpuPath path,
                  double* sums) {
#if defined(__x86_64__)
  if constexpr (D == DType::kBFloat16) {
    if (path == CpuPath::kAvx512) return SumBf16ChunkPairAvx512(p, n, sums);
  }
  if constexpr (D != DType::kFloat64) {
    if (path == CpuPath::kAvx512) return SumChunkPairAvx512Narrow<D>(p, n, sums);
    if (path == CpuPath::kAvx2) return SumChunkPairAvx2Narrow<D>(p, n, sums);
  }
#endif
  for (int k = 0; k < 2; ++k) sums[k] = SumChunk<D>(p[k], n, path);
}

// The hot loops only sum. Any NaN or Inf element makes the chunk's sum NaN or
// Inf (squares are >= 0, so no Inf - Inf can cancel), so a finite sum proves
// the chunk clean; only a non-finite sum pays for an exact count.
// `count` (1 or 2) chunks of n elements each start at p[0..count).
template <DType D>
void ScanChunksOf(const unsigned char* const* p, int count, uint64_t n,
                  CpuPath path, Partial* out) {
#if defined(__x86_64__)
  ScopedScanFpEnvironment fp_environment;
#endif
  double sums[2];
  if (count == 2) {
    SumChunkPair<D>(p, n, path, sums);
  } else {
    sums[0] = SumChunk<D>(p[0], n, path);
  }
  for (int k = 0; k < count; ++k) {
    out[k].sum_squares = sums[k];
    if (!std::isfinite(sums[k])) out[k].nonfinite = CountNonFinite<D>(p[k], n);
  }
}

void ScanChunks(DType dtype, const unsigned char* const* p, int count,
                uint64_t n, CpuPath path, Partial* out) {
  switch (dtype) {
    case DType::kFloat32:
      return ScanChunksOf<DType::kFloat32>(p, count, n, path, out);
    case DType::kFloat16:
      return ScanChunksOf<DType::kFloat16>(p, count, n, path, out);
    case DType::kBFloat16:
      return ScanChunksOf<DType::kBFloat16>(p, count, n, path, out);
    case DType::kFloat64:
      return ScanChunksOf<DType::kFloat64>(p, count, n, path, out);
  }
  // Unreachable: dtypes are validated first.
}

// A unit of parallel work: one chunk, or two neighbours of one tensor with
// the same length, which SumChunkPair sums in lockstep.
struct WorkItem {
  size_t first_chunk;
  int count;
};

std::vector<WorkItem> PairChunks(absl::Span<const Chunk> chunks) {
  std::vector<WorkItem> items;
  for (size_t i = 0; i < chunks.size();) {
    const bool pair = i + 1 < chunks.size() &&
                      chunks[i + 1].tensor == chunks[i].tensor &&
                      chunks[i + 1].length == chunks[i].length;
    items.push_back({i, pair ? 2 : 1});
    i += pair ? 2 : 1;
  }
  return items;
}

}  // namespace

int DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

namespace internal {

absl::Status ValidateScanArgs(absl::Span<const TensorRef> tensors,
                              size_t out_size) {
  if (tensors.size() != out_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ScanNonFinite: ", tensors.size(),
                     " tensors but room for ", out_size, " results"));
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (DTypeSize(tensors[t].dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ScanNonFinite: tensor ", t, " has unsupported dtype code ",
          static_cast<int>(tensors[t].dtype),
          " (supported: float32, float64, float16, bfloat16)"));
    }
    if (tensors[t].data == nullptr && tensors[t].num_elements != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ScanNonFinite: tensor ", t, " has a null pointer and ",
                       tensors[t].num_elements, " elements"));
    }
  }
  return absl::OkStatus();
}

absl::Status ScanNonFiniteOnPath(absl::Span<const TensorRef> tensors,
                                 absl::Span<ScanResult> out, ThreadPool* pool,
                                 CpuPath path) {
  if (absl::Status s = ValidateScanArgs(tensors, out.size()); !s.ok()) return s;
  std::vector<uint64_t> sizes(tensors.size());
  uint64_t total_bytes = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    sizes[t] = tensors[t].num_elements;
    total_bytes += sizes[t] * DTypeSize(tensors[t].dtype);
  }
  const std::vector<Chunk> chunks = SplitIntoChunks(sizes, kScanChunkElements);
  const std::vector<WorkItem> items = PairChunks(chunks);
  std::vector<Partial> partial(chunks.size());
  RunChunks(pool, static_cast<int64_t>(items.size()), total_bytes,
            [&](int64_t i) {
              const WorkItem& item = items[i];
              const TensorRef& t = tensors[chunks[item.first_chunk].tensor];
              const auto* base = static_cast<const unsigned char*>(t.data);
              const unsigned char* starts[2];
              for (int k = 0; k < item.count; ++k) {
                starts[k] = base + chunks[item.first_chunk + k].begin * DTypeSize(t.dtype);
              }
              ScanChunks(t.dtype, starts, item.count,
                         chunks[item.first_chunk].length, path,
                         &partial[item.first_chunk]);
            });
  for (ScanResult& r : out) r = ScanResult{};
  // Step 4 of the sum order: chunks of a tensor left to right.
  for (size_t i = 0; i < chunks.size(); ++i) {
    ScanResult& r = out[chunks[i].tensor];
    r.nonfinite += partial[i].nonfinite;
    r.sum_squares += partial[i].sum_squares;
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::Status ScanNonFinite(absl::Span<const TensorRef> tensors,
                           absl::Span<ScanResult> out, ThreadPool* pool) {
  return internal::ScanNonFiniteOnPath(tensors, out, pool, DetectedCpuPath());
}

}  // namespace sdc::kernels
