#include "kernels/nonfinite.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "gtest/gtest.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/reference.h"
#include "kernels/thread_pool.h"

namespace sdc::kernels {
namespace {

using ::sdc::kernels::internal::ScanNonFiniteOnPath;

std::vector<CpuPath> Paths() { return SupportedCpuPaths(); }

ScanResult ScanOne(const TensorRef& t, CpuPath path, ThreadPool* pool = nullptr) {
  ScanResult r;
  absl::Status s = ScanNonFiniteOnPath({&t, 1}, {&r, 1}, pool, path);
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

// Equal to the last bit, treating any two NaNs as equal.
void ExpectSameResult(const ScanResult& got, const ScanResult& want,
                      const std::string& where) {
  EXPECT_EQ(got.nonfinite, want.nonfinite) << where;
  if (std::isnan(want.sum_squares)) {
    EXPECT_TRUE(std::isnan(got.sum_squares)) << where << " got " << got.sum_squares;
  } else {
    EXPECT_EQ(Bits(got.sum_squares), Bits(want.sum_squares))
        << where << " got " << got.sum_squares << " want " << want.sum_squares;
  }
}

// Raw element bits per dtype, so tests can place exact special values.
struct DTypeCase {
  DType dtype;
  uint64_t one;       // 1.0
  uint64_t minus_two; // -2.0
  uint64_t nan;
  uint64_t pos_inf;
  uint64_t neg_inf;
  uint64_t neg_zero;
  uint64_t denormal;  // The smallest positive subnormal...
  double denormal_square;  // ...and its square in fp64.
};

std::vector<DTypeCase> DTypeCases() {
  return {
      {DType::kFloat32, 0x3f800000, 0xc0000000, 0x7fc00000, 0x7f800000,
       0xff800000, 0x80000000, 0x00000001, std::ldexp(1.0, -298)},
      {DType::kFloat64, 0x3ff0000000000000, 0xc000000000000000,
       0x7ff8000000000000, 0x7ff0000000000000, 0xfff0000000000000,
       0x8000000000000000, 0x0000000000000001, 0.0 /* 2^-2148 underflows */},
      {DType::kFloat16, 0x3c00, 0xc000, 0x7e00, 0x7c00, 0xfc00, 0x8000, 0x0001,
       std::ldexp(1.0, -48)},
      {DType::kBFloat16, 0x3f80, 0xc000, 0x7fc0, 0x7f80, 0xff80, 0x8000, 0x0001,
       std::ldexp(1.0, -266)},
  };
}

// A buffer of n elements of `dtype`, all set to the raw bits `fill`.
std::vector<unsigned char> Filled(DType dtype, uint64_t n, uint64_t fill) {
  const int size = DTypeSize(dtype);
  std::vector<unsigned char> buf(size * n);
  for (uint64_t i = 0; i < n; ++i) std::memcpy(buf.data() + size * i, &fill, size);
  return buf;
}

void Put(std::vector<unsigned char>& buf, DType dtype, uint64_t i, uint64_t bits) {
  std::memcpy(buf.data() + DTypeSize(dtype) * i, &bits, DTypeSize(dtype));
}

TEST(NonFiniteTest, HandWorkedValues) {
  for (const DTypeCase& c : DTypeCases()) {
    // {1, -2, -0, denormal}: 1 + 4 + 0 + denormal^2, nothing non-finite.
    std::vector<unsigned char> buf = Filled(c.dtype, 4, c.one);
    Put(buf, c.dtype, 1, c.minus_two);
    Put(buf, c.dtype, 2, c.neg_zero);
    Put(buf, c.dtype, 3, c.denormal);
    const TensorRef t{buf.data(), 4, c.dtype};
    // Lanes 0..3 are folded as ((a0 + a4) + (a8 + a12)) ... = 1 + 4 + 0 + d^2
    // summed as (1 + 4) + (0 + d^2); d^2 is far below 5's last bit.
    const double want = 5.0 + c.denormal_square;
    for (CpuPath path : Paths()) {
      const ScanResult r = ScanOne(t, path);
      EXPECT_EQ(r.nonfinite, 0u) << DTypeName(c.dtype);
      EXPECT_EQ(r.sum_squares, want) << DTypeName(c.dtype);
    }
    // A lone denormal: its exact square (0 for fp64, which underflows).
    const std::vector<unsigned char> lone = Filled(c.dtype, 1, c.denormal);
    EXPECT_EQ(ScanOne({lone.data(), 1, c.dtype}, DetectedCpuPath()).sum_squares,
              c.denormal_square)
        << DTypeName(c.dtype);
  }
  // fp32 {3, 4}: the classic 25.
  const float f[] = {3.0f, 4.0f};
  EXPECT_EQ(ScanOne({f, 2, DType::kFloat32}, DetectedCpuPath()).sum_squares, 25.0);
  // 1000 ones: exactly 1000 whatever the order.
  const std::vector<float> ones(1000, 1.0f);
  EXPECT_EQ(ScanOne({ones.data(), 1000, DType::kFloat32}, DetectedCpuPath()).sum_squares,
            1000.0);
}

TEST(NonFiniteTest, SpecialValuesAtFirstMiddleAndLastPositions) {
  // Lengths cover a pure tail (5), vector rounds plus a tail (1000), more
  // than one chunk (kScanChunkElements + 3) and a pair of full chunks summed
  // in lockstep plus a short one (2 * kScanChunkElements + 3, whose middle
  // lies in the pair's second chunk).
  for (const DTypeCase& c : DTypeCases()) {
    for (uint64_t n : {uint64_t{5}, uint64_t{1000}, kScanChunkElements + 3,
                       2 * kScanChunkElements + 3}) {
      for (uint64_t pos : {uint64_t{0}, n / 2, n - 1}) {
        for (uint64_t special : {c.nan, c.pos_inf, c.neg_inf, c.neg_zero, c.denormal}) {
          std::vector<unsigned char> buf = Filled(c.dtype, n, c.one);
          Put(buf, c.dtype, pos, special);
          const TensorRef t{buf.data(), n, c.dtype};
          const ScanResult want = ReferenceScan(t);
          const bool nonfinite =
              special == c.nan || special == c.pos_inf || special == c.neg_inf;
          ASSERT_EQ(want.nonfinite, nonfinite ? 1u : 0u);
          if (special == c.nan) {
            ASSERT_TRUE(std::isnan(want.sum_squares));
          }
          if (special == c.pos_inf || special == c.neg_inf) {
            ASSERT_EQ(want.sum_squares, std::numeric_limits<double>::infinity());
          }
          if (special == c.neg_zero) {
            ASSERT_EQ(want.sum_squares, static_cast<double>(n - 1)) << DTypeName(c.dtype);
          }
          if (special == c.denormal) {
            // n - 1 ones plus a tiny square that survives only next to small n.
            ASSERT_GE(want.sum_squares, static_cast<double>(n - 1)) << DTypeName(c.dtype);
            ASSERT_LE(want.sum_squares - static_cast<double>(n - 1), 1e-14);
          }
          for (CpuPath path : Paths()) {
            ExpectSameResult(ScanOne(t, path), want,
                             std::string(DTypeName(c.dtype)) + " " +
                                 CpuPathName(path) + " n=" + std::to_string(n) +
                                 " pos=" + std::to_string(pos) +
                                 " bits=" + std::to_string(special));
          }
        }
      }
    }
  }
}

TEST(NonFiniteTest, RandomTensorsMatchReferenceBitForBitOnAnyPathAndThreadCount) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 3.0);
  ThreadPool one(1);
  ThreadPool three(3);
  for (const DTypeCase& c : DTypeCases()) {
    std::vector<std::vector<unsigned char>> storage;
    std::vector<TensorRef> tensors;
    for (int i = 0; i < 12; ++i) {
      const uint64_t n = i < 2 ? 3 * kScanChunkElements + rng() % 1000 : rng() % 70000;
      std::vector<unsigned char> buf(DTypeSize(c.dtype) * (n + 1));
      for (uint64_t k = 0; k <= n; ++k) {
        const double v = normal(rng);
        uint64_t bits = 0;
        switch (c.dtype) {
          case DType::kFloat64:
            std::memcpy(&bits, &v, 8);
            break;
          case DType::kFloat32: {
            const float f = static_cast<float>(v);
            std::memcpy(&bits, &f, 4);
            break;
          }
          default:  // Any 16-bit pattern but the non-finite ones.
            bits = rng() & 0x3fff;
            break;
        }
        std::memcpy(buf.data() + DTypeSize(c.dtype) * k, &bits, DTypeSize(c.dtype));
      }
      storage.push_back(std::move(buf));
      // Odd tensors start one element in: not 32-byte aligned.
      tensors.push_back({storage.back().data() + (i % 2) * DTypeSize(c.dtype), n, c.dtype});
    }
    std::vector<ScanResult> want;
    for (const TensorRef& t : tensors) want.push_back(ReferenceScan(t));
    for (CpuPath path : Paths()) {
      for (ThreadPool* pool : {&one, &three}) {
        std::vector<ScanResult> got(tensors.size());
        ASSERT_TRUE(ScanNonFiniteOnPath(tensors, absl::MakeSpan(got), pool, path).ok());
        for (size_t t = 0; t < tensors.size(); ++t) {
          ExpectSameResult(got[t], want[t],
                           std::string(DTypeName(c.dtype)) + " " + CpuPathName(path) +
                               " threads=" + std::to_string(pool->threads()) +
                               " tensor=" + std::to_string(t));
        }
      }
    }
  }
}

// bf16 values at the edges of the AVX-512 loop, which squares in fp32: the
// largest finite value and 2^64 (squares overflow fp32), 2^64 less one step
// (the largest that does not), 2^-63 (the smallest normal fp32 square),
// 2^-74 (an exact subnormal square), 1.99 * 2^-70 (a subnormal square that
// loses bits), bf16 subnormals, zeros and the non-finite values, with both
// signs. Each sits in the vector part of a pair of full chunks and in the
// tail of an odd length.
TEST(NonFiniteTest, BFloat16EdgeValuesMatchReferenceOnEveryPath) {
  struct Edge {
    uint16_t bits;
    bool nonfinite;
  };
  const std::vector<Edge> edges = {
      {0x7f7f, false}, {0x5f80, false}, {0x5f7f, false}, {0x2000, false},
      {0x1a80, false}, {0x1cff, false}, {0x0001, false}, {0x007f, false},
      {0x0000, false}, {0x7f80, true},  {0x7fc0, true},  {0x7f81, true},
      {0xff80, true},  {0xffc1, true},
  };
  // Lengths: two full chunks (paired) and an odd remainder, so positions in
  // the vector rounds and in the scalar tail both occur.
  const uint64_t n = 2 * kScanChunkElements + 37;
  std::mt19937_64 rng(11);
  for (const Edge& e : edges) {
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const uint16_t bits = e.bits ^ sign;
      for (uint64_t pos : {uint64_t{0}, uint64_t{17}, kScanChunkElements - 1,
                           kScanChunkElements + 12345, 2 * kScanChunkElements - 32,
                           2 * kScanChunkElements + 33}) {
        // Among zeros the value's square is its lane's whole sum, so a
        // square rounded in fp32 shows; among values near 2^-7 it is added
        // to others.
        for (bool zeros : {true, false}) {
          std::vector<uint16_t> v(n, 0);
          if (!zeros) {
            for (uint16_t& x : v) x = 0x3c00 + (rng() & 0x3ff);
          }
          v[pos] = bits;
          const TensorRef t{v.data(), n, DType::kBFloat16};
          const ScanResult want = ReferenceScan(t);
          ASSERT_EQ(want.nonfinite, e.nonfinite ? 1u : 0u);
          for (CpuPath path : Paths()) {
            ExpectSameResult(ScanOne(t, path), want,
                             std::string(CpuPathName(path)) + " bits=" +
                                 std::to_string(bits) + " pos=" + std::to_string(pos) +
                                 (zeros ? " among zeros" : ""));
          }
        }
      }
    }
  }
}

// Every bf16 bit pattern but the non-finite ones, both signs, in pairs of
// full chunks: most chunks hold squares that overflow or lose bits in fp32.
TEST(NonFiniteTest, BFloat16AnyBitPatternMatchesReferenceOnEveryPath) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 4; ++trial) {
    const uint64_t n = 4 * kScanChunkElements + rng() % 64;
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) {
      do {
        x = static_cast<uint16_t>(rng());
      } while ((x & 0x7f80) == 0x7f80);
    }
    // Trial 0: all patterns. Later trials: exponents in fp32's exact range
    // except one tiny value per chunk, so both outcomes of the check occur.
    if (trial > 0) {
      for (uint16_t& x : v) {
        const uint16_t exponent = 64 + rng() % 127;  // |x| in [2^-63, 2^64).
        x = static_cast<uint16_t>((x & 0x807f) | (exponent << 7));
      }
      v[rng() % n] = 0x0003;
    }
    const TensorRef t{v.data(), n, DType::kBFloat16};
    const ScanResult want = ReferenceScan(t);
    ASSERT_EQ(want.nonfinite, 0u);
    ASSERT_TRUE(std::isfinite(want.sum_squares));
    for (CpuPath path : Paths()) {
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        ExpectSameResult(ScanOne(t, path, &pool), want,
                         std::string(CpuPathName(path)) + " trial " +
                             std::to_string(trial));
      }
    }
  }
}

#if defined(__x86_64__)
// The caller's flush-to-zero, denormals-are-zero and rounding mode do not
// change a norm, and the caller gets its MXCSR back, flags included. Each
// tensor (two full chunks and a tail, zeros but for the values named) would
// come out different under one of those settings.
TEST(NonFiniteTest, ResultAndCallerMxcsrDoNotDependOnEachOther) {
  const uint64_t n = 2 * kScanChunkElements + 5;
  std::vector<std::vector<uint16_t>> storage(3, std::vector<uint16_t>(n, 0));
  storage[0][3] = 0x0001;  // A bf16 subnormal: DAZ reads it as 0.
  // Its fp32 square is subnormal and inexact: FTZ makes it 0.
  storage[1][70001] = 0x1cff;
  // 2^104 + 2.25 * 2^50 in one lane: the sum is 0.5625 of a unit in the last
  // place above 2^104, which rounds up to nearest and down toward zero.
  storage[2][100000] = 0x5980;  // 2^52.
  storage[2][100016] = 0x4c40;  // 1.5 * 2^25.
  std::vector<TensorRef> tensors;
  std::vector<ScanResult> want;
  for (const auto& v : storage) {
    tensors.push_back({v.data(), n, DType::kBFloat16});
    want.push_back(ReferenceScan(tensors.back()));
  }
  const unsigned saved = _mm_getcsr();
  // FTZ, DAZ, round toward zero, and the precision flag already raised.
  const unsigned caller = saved | 0x8000u | 0x0040u | 0x6000u | 0x0020u;
  for (CpuPath path : Paths()) {
    std::vector<ScanResult> got(tensors.size());
    _mm_setcsr(caller);
    const absl::Status s =
        ScanNonFiniteOnPath(tensors, absl::MakeSpan(got), nullptr, path);
    const unsigned after = _mm_getcsr();
    _mm_setcsr(saved);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(after, caller) << CpuPathName(path);
    for (size_t t = 0; t < tensors.size(); ++t) {
      ExpectSameResult(got[t], want[t],
                       std::string(CpuPathName(path)) + " tensor " + std::to_string(t));
    }
  }
}
#endif

TEST(NonFiniteTest, SumIsCloseToTheExactValue) {
  // The canonical order is a choice; it must still be an accurate sum.
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(300000);
  long double exact = 0;
  for (float& x : v) {
    x = u(rng);
    exact += static_cast<long double>(x) * x;
  }
  const ScanResult r = ScanOne({v.data(), v.size(), DType::kFloat32}, DetectedCpuPath());
  EXPECT_NEAR(r.sum_squares, static_cast<double>(exact), 1e-9 * static_cast<double>(exact));
}

TEST(NonFiniteTest, BadInputIsInvalidArgument) {
  std::vector<ScanResult> out(2);
  const float f = 1.0f;
  const TensorRef bad_dtype[] = {{&f, 1, static_cast<DType>(9)}};
  absl::Status s = ScanNonFinite(bad_dtype, absl::MakeSpan(out).first(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unsupported dtype code 9"), absl::string_view::npos) << s;

  const TensorRef null_ref[] = {{nullptr, 3, DType::kBFloat16}};
  s = ScanNonFinite(null_ref, absl::MakeSpan(out).first(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("null pointer and 3 elements"), absl::string_view::npos) << s;

  const TensorRef one[] = {{&f, 1, DType::kFloat32}};
  s = ScanNonFinite(one, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1 tensors but room for 2"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace sdc::kernels
