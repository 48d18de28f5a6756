#include "kernels/abft.h"

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/nonfinite.h"

namespace sdc::kernels {
namespace {

// ---- Storage in each dtype (round to nearest even), written independently of
// abft.cc.

uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

uint16_t ToBf16(float f) {
  const uint32_t b = FloatBits(f);
  const uint32_t rounding = 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>((b + rounding) >> 16);
}

float Bf16ToFloat(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

// fp16 by the hardware-independent route: scale into an exactly rounded
// double computation. |f| must be below 65520 (no overflow in these tests).
uint16_t ToFp16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  double a = std::fabs(static_cast<double>(f));
  if (a == 0.0) return sign;
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1).
  int exponent = e - 1;  // a in [2^exponent, 2^(exponent+1)).
  if (exponent < -14) exponent = -14;  // Subnormal spacing 2^-24.
  const double quantum = std::ldexp(1.0, exponent - 10);
  const double units = std::nearbyint(a / quantum);  // Ties to even.
  const double rounded = units * quantum;
  // Re-encode from the rounded magnitude.
  if (rounded < 0x1p-14) return sign | static_cast<uint16_t>(rounded / 0x1p-24);
  int re;
  const double rm = std::frexp(rounded, &re);
  const int biased = re - 1 + 15;
  const uint16_t mantissa = static_cast<uint16_t>((rm * 2.0 - 1.0) * 1024.0);
  return sign | static_cast<uint16_t>(biased << 10) | mantissa;
}

float Fp16ToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double v = exponent == 0 ? mantissa * 0x1p-24
                           : std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  return static_cast<float>((h & 0x8000) ? -v : v);
}

// A matrix stored in one dtype, with its values as fp32 (exactly).
struct Stored {
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0;
  std::vector<float> f32;       // Storage when kFloat32.
  std::vector<uint16_t> half;   // Storage when 16-bit.

  Stored(DType d, int64_t r, int64_t c) : dtype(d), rows(r), cols(c) {
    if (d == DType::kFloat32) {
      f32.assign(r * c, 0.0f);
    } else {
      half.assign(r * c, 0);
    }
  }
  // Stores v rounded to the dtype.
  void Set(int64_t i, int64_t j, float v) {
    const int64_t at = i * cols + j;
    if (dtype == DType::kFloat32) {
      f32[at] = v;
    } else {
      half[at] = dtype == DType::kBFloat16 ? ToBf16(v) : ToFp16(v);
    }
  }
  float Get(int64_t i, int64_t j) const {
    const int64_t at = i * cols + j;
    if (dtype == DType::kFloat32) return f32[at];
    return dtype == DType::kBFloat16 ? Bf16ToFloat(half[at]) : Fp16ToFloat(half[at]);
  }
  MatrixRef Ref() const {
    const void* p = dtype == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                             : static_cast<const void*>(half.data());
    return RowMajor(p, rows, cols, dtype);
  }
};

enum class Order { kSequential, kPairwise, kBlocked };

// The product as a GPU or CPU computes it: fp32 products, fp32 accumulation
// in the given order, rounded once to C's dtype.
Stored Multiply(const Stored& a, const Stored& b, DType out_dtype, Order order,
                const Stored* bias = nullptr, bool truncate = false) {
  Stored c(out_dtype, a.rows, b.cols);
  // A truncating accumulator: every fp32 product and add rounds toward zero
  // (the final rounding to C's dtype stays to nearest, in Set).
  struct RoundingMode {
    explicit RoundingMode(bool truncate) : saved(std::fegetround()) {
      if (truncate) std::fesetround(FE_TOWARDZERO);
    }
    ~RoundingMode() { std::fesetround(saved); }
    int saved;
  };
  std::vector<float> terms(a.cols);
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < b.cols; ++j) {
      std::optional<RoundingMode> mode;
      mode.emplace(truncate);
      for (int64_t l = 0; l < a.cols; ++l) terms[l] = a.Get(i, l) * b.Get(l, j);
      float acc = 0.0f;
      if (order == Order::kSequential) {
        for (float t : terms) acc += t;
      } else if (order == Order::kBlocked) {
        // 32-wide blocks summed, then the block sums (a GEMM's k-tiles).
        for (size_t l0 = 0; l0 < terms.size(); l0 += 32) {
          float block = 0.0f;
          for (size_t l = l0; l < std::min(terms.size(), l0 + 32); ++l) block += terms[l];
          acc += block;
        }
      } else {
        std::vector<float> level = terms;
        while (level.size() > 1) {
          std::vector<float> next((level.size() + 1) / 2);
          for (size_t t = 0; t < next.size(); ++t) {
            next[t] = 2 * t + 1 < level.size() ? level[2 * t] + level[2 * t + 1]
                                               : level[2 * t];
          }
          level.swap(next);
        }
        acc = level.empty() ? 0.0f : level[0];
      }
      if (bias != nullptr) acc += bias->Get(0, j);
      mode.reset();
      c.Set(i, j, acc);
    }
  }
  return c;
}

// Equal, or both NaN (a NaN discrepancy must agree across paths too).
bool Same(double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); }

std::string PathsNote(CpuPath path) { return std::string("path ") + CpuPathName(path); }

// Checks on every CPU path, both rules, both axes; expects every path to give
// the same answer to the bit, and returns it.
AbftResult CheckAllPaths(const Stored& a, const Stored& b, const Stored& c,
                         AbftOptions options, const Stored* bias = nullptr) {
  const MatrixRef bias_ref = bias != nullptr ? bias->Ref() : MatrixRef{};
  AbftResult first;
  bool have_first = false;
  for (CpuPath path : SupportedCpuPaths()) {
    auto r = internal::CheckMatrixProductOnPath(a.Ref(), b.Ref(), c.Ref(),
                                                bias ? &bias_ref : nullptr, options, path);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    if (!have_first) {
      first = *r;
      have_first = true;
      continue;
    }
    EXPECT_EQ(r->passed, first.passed) << PathsNote(path);
    EXPECT_EQ(r->worst_index, first.worst_index) << PathsNote(path);
    EXPECT_TRUE(Same(r->discrepancy, first.discrepancy))
        << PathsNote(path) << ": " << r->discrepancy << " vs " << first.discrepancy;
    EXPECT_TRUE(Same(r->threshold, first.threshold))
        << PathsNote(path) << ": " << r->threshold << " vs " << first.threshold;
  }
  return first;
}

// Every healthy product must pass under both rules, on both axes.
void ExpectHealthy(const Stored& a, const Stored& b, const Stored& c, const char* what,
                   const Stored* bias = nullptr) {
  for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
    AbftOptions options;
    options.rule = rule;
    options.axis = AbftAxis::kBoth;
    const AbftResult r = CheckAllPaths(a, b, c, options, bias);
    EXPECT_TRUE(r.passed) << what << " rule " << static_cast<int>(rule) << ": worst "
                          << r.worst_index << " axis " << static_cast<int>(r.worst_axis)
                          << " discrepancy " << r.discrepancy << " threshold "
                          << r.threshold;
    // The threshold is never below the discrepancy it allowed, and the
    // probabilistic rule is never looser than the guaranteed one.
    EXPECT_LE(std::fabs(r.discrepancy), r.threshold) << what;
  }
}

template <typename Gen>
Stored Fill(DType d, int64_t rows, int64_t cols, Gen gen) {
  Stored s(d, rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) s.Set(i, j, gen(i, j));
  }
  return s;
}

constexpr DType kInputs[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr Order kOrders[] = {Order::kSequential, Order::kPairwise, Order::kBlocked};

TEST(AbftTest, RandomShapesAllDtypesAndOrdersPass) {
  std::mt19937_64 rng(45);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> dim(1, 70);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t m = dim(rng), k = dim(rng), n = dim(rng);
    for (DType in : kInputs) {
      const Stored a = Fill(in, m, k, [&](int64_t, int64_t) { return normal(rng); });
      const Stored b = Fill(in, k, n, [&](int64_t, int64_t) { return normal(rng); });
      for (DType out : {DType::kFloat32, in}) {
        const Order order = kOrders[trial % 3];
        const Stored c = Multiply(a, b, out, order);
        ExpectHealthy(a, b, c, "random shape");
      }
    }
  }
}

// Row-major operands are summed eight columns at a time, the sums kept in
// registers over all the rows, and the last n mod 8 columns element by
// element (abft.cc, AccumulateColumnsAvx2): both parts, with unit and
// per-row weights (the probabilistic rule's), agree with the portable path
// to the bit, and a wrong element in either part is found in its column.
TEST(AbftTest, EightColumnBlocksAndTheirTailAgreeOnEveryPath) {
  std::mt19937_64 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {8, 13, 29}) {
    for (DType in : kInputs) {
      const Stored a = Fill(in, 37, 19, [&](int64_t, int64_t) { return normal(rng); });
      const Stored b = Fill(in, 19, n, [&](int64_t, int64_t) { return normal(rng); });
      const Stored c = Multiply(a, b, in, Order::kBlocked);
      ExpectHealthy(a, b, c, "eight-column blocks");
      for (const int64_t col : {int64_t{3}, n - 1}) {  // In a block; in the tail (n > 8).
        Stored bad = c;
        const float v = bad.Get(11, col);
        bad.Set(11, col, v + 2.0f * std::max(std::fabs(v), 1.0f));
        for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
          AbftOptions options;
          options.rule = rule;
          const AbftResult r = CheckAllPaths(a, b, bad, options);
          EXPECT_FALSE(r.passed) << "n " << n << " column " << col;
          EXPECT_EQ(r.worst_index, col) << "n " << n;
        }
      }
    }
  }
}

TEST(AbftTest, LargeDynamicRangePasses) {
  // |values| from 1e-30 to 1e30, random signs: products from 1e-60 (below
  // fp32's range: they underflow) to 1e60 (kept below fp32's overflow by
  // pairing: B's large values only meet A's small ones).
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-30.0, 30.0);
  std::bernoulli_distribution negative(0.5);
  auto value = [&](double e) {
    const float v = static_cast<float>(std::pow(10.0, e));
    return negative(rng) ? -v : v;
  };
  const int64_t m = 33, k = 257, n = 19;
  std::vector<double> a_exp(m * k);
  const Stored a = Fill(DType::kFloat32, m, k, [&](int64_t i, int64_t l) {
    return value(a_exp[i * k + l] = exponent(rng));
  });
  // B_lj ~ 10^(e) with e chosen so A_il B_lj stays within 1e-30..1e30 in
  // magnitude for most pairs and some products reach 1e30.
  const Stored b = Fill(DType::kFloat32, k, n, [&](int64_t, int64_t) {
    return value(std::uniform_real_distribution<double>(-8.0, 6.0)(rng));
  });
  for (Order order : kOrders) {
    ExpectHealthy(a, b, Multiply(a, b, DType::kFloat32, order), "dynamic range");
    ExpectHealthy(a, b, Multiply(a, b, DType::kBFloat16, order), "dynamic range bf16 out");
  }
}

TEST(AbftTest, HeavyCancellationPasses) {
  // Each dot product is a sum of large terms that cancel to a result near
  // zero: A's row has pairs (x, x + ulp) and B's column (y, -y), so every
  // C_ij is about 1e-5 of its terms, rounding error included. At scale 1e10
  // the terms are 1e20; at scale 30 the result fits fp16.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  const int64_t m = 40, k = 512, n = 24;
  for (float scale : {1e10f, 30.0f}) {
    const Stored a = Fill(DType::kFloat32, m, k, [&](int64_t i, int64_t l) {
      const float x = scale * (1.0f + static_cast<float>((i * 131 + l / 2) % 97) / 97.0f);
      return (l % 2 == 0) ? x : std::nextafter(x, 2 * x);
    });
    std::vector<float> col(k);
    const Stored b = Fill(DType::kFloat32, k, n, [&](int64_t l, int64_t) {
      if (l % 2 == 0) col[l] = scale * unit(rng);
      return (l % 2 == 0) ? col[l] : -col[l - 1];
    });
    for (Order order : kOrders) {
      ExpectHealthy(a, b, Multiply(a, b, DType::kFloat32, order), "cancellation");
      if (scale < 100.0f) {
        ExpectHealthy(a, b, Multiply(a, b, DType::kFloat16, order), "cancellation fp16 out");
        ExpectHealthy(a, b, Multiply(a, b, DType::kBFloat16, order), "cancellation bf16 out");
      }
    }
  }
}

TEST(AbftTest, DenormalsPass) {
  // fp32 subnormal inputs (1e-45..1e-38) times normal ones, and products
  // that underflow to subnormals or zero; bf16 inputs share fp32's range.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> exponent(-45.0, -36.0);
  std::uniform_real_distribution<double> other(-10.0, 2.0);
  std::bernoulli_distribution negative(0.5);
  for (DType in : {DType::kFloat32, DType::kBFloat16}) {
    const Stored a = Fill(in, 17, 300, [&](int64_t, int64_t) {
      const float v = static_cast<float>(std::pow(10.0, exponent(rng)));
      return negative(rng) ? -v : v;
    });
    const Stored b = Fill(in, 300, 13, [&](int64_t, int64_t) {
      const float v = static_cast<float>(std::pow(10.0, other(rng)));
      return negative(rng) ? -v : v;
    });
    for (Order order : kOrders) {
      ExpectHealthy(a, b, Multiply(a, b, DType::kFloat32, order), "denormals");
      ExpectHealthy(a, b, Multiply(a, b, in, order), "denormals, narrow out");
    }
  }
  // fp16 subnormals (below 2^-14) in and out.
  const Stored a = Fill(DType::kFloat16, 9, 200, [&](int64_t i, int64_t l) {
    return static_cast<float>(((i * 7 + l) % 13) - 6) * 0x1p-20f;
  });
  const Stored b = Fill(DType::kFloat16, 200, 11, [&](int64_t l, int64_t j) {
    return static_cast<float>(((l * 5 + j) % 11) - 5) * 0x1p-12f;
  });
  for (Order order : kOrders) {
    ExpectHealthy(a, b, Multiply(a, b, DType::kFloat16, order), "fp16 subnormal out");
  }
}

TEST(AbftTest, LongInnerDimensionPasses) {
  // k = 65536 of same-signed terms: the worst case for sequential fp32
  // accumulation (the partial sums grow and every add rounds).
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> pos(0.5f, 1.5f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 65536;
  for (DType in : kInputs) {
    const Stored a = Fill(in, 3, k, [&](int64_t i, int64_t) {
      return i == 0 ? pos(rng) : normal(rng);
    });
    const Stored b = Fill(in, k, 3, [&](int64_t, int64_t j) {
      return j == 0 ? pos(rng) : normal(rng);
    });
    for (Order order : kOrders) {
      ExpectHealthy(a, b, Multiply(a, b, DType::kFloat32, order), "k = 65536");
      if (in != DType::kFloat16) {  // fp16 out would overflow at ~65536.
        ExpectHealthy(a, b, Multiply(a, b, in, order), "k = 65536, narrow out");
      }
    }
  }
}

TEST(AbftTest, BiasAndStridedViewsPass) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Stored a = Fill(DType::kBFloat16, 21, 45, [&](int64_t, int64_t) { return normal(rng); });
  const Stored b = Fill(DType::kBFloat16, 45, 30, [&](int64_t, int64_t) { return normal(rng); });
  const Stored bias = Fill(DType::kBFloat16, 1, 30, [&](int64_t, int64_t) { return 100 * normal(rng); });
  const Stored c = Multiply(a, b, DType::kBFloat16, Order::kSequential, &bias);
  ExpectHealthy(a, b, c, "bias", &bias);
  // Without the bias the same output is far off: the check sees the bias.
  auto r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->passed);

  // C^T = B^T A^T through transposed views of the same memory.
  AbftOptions options;
  options.axis = AbftAxis::kBoth;
  const Stored plain = Multiply(a, b, DType::kFloat32, Order::kSequential);
  auto t = CheckMatrixProduct(Transposed(b.Ref()), Transposed(a.Ref()),
                              Transposed(plain.Ref()), nullptr, options);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->passed);

  // Negative strides: A and C read bottom row first (still C = A B), and
  // one element of the reversed view wrong is found at its reversed row.
  Stored wrong = plain;
  MatrixRef a_rev = a.Ref(), c_rev = wrong.Ref();
  a_rev.data = a.half.data() + (a.rows - 1) * a.cols;
  a_rev.row_stride = -a.cols;
  c_rev.data = wrong.f32.data() + (wrong.rows - 1) * wrong.cols;
  c_rev.row_stride = -wrong.cols;
  for (CpuPath path : SupportedCpuPaths()) {
    auto rev = internal::CheckMatrixProductOnPath(a_rev, b.Ref(), c_rev, nullptr, options, path);
    ASSERT_TRUE(rev.ok());
    EXPECT_TRUE(rev->passed) << PathsNote(path);
  }
  wrong.Set(2, 3, wrong.Get(2, 3) + 4.0f);  // Row 2 is row rows-3 of the view.
  options.axis = AbftAxis::kRows;
  auto rev = CheckMatrixProduct(a_rev, b.Ref(), c_rev, nullptr, options);
  ASSERT_TRUE(rev.ok());
  EXPECT_FALSE(rev->passed);
  EXPECT_EQ(rev->worst_index, wrong.rows - 3);
}

TEST(AbftTest, TensorFloat32InputsNeedTheirInputRoundoff) {
  // A product that rounds fp32 inputs to TF32 (10 explicit mantissa bits)
  // is healthy only under input_unit_roundoff = 2^-11.
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> pos(1.0f, 2.0f);
  auto tf32 = [](float v) { return FromBits((FloatBits(v) + 0xfffu + ((FloatBits(v) >> 13) & 1u)) & ~0x1fffu); };
  const int64_t m = 64, k = 8, n = 16;
  const Stored a = Fill(DType::kFloat32, m, k, [&](int64_t, int64_t) { return pos(rng); });
  const Stored b = Fill(DType::kFloat32, k, n, [&](int64_t, int64_t) { return pos(rng); });
  Stored ta(DType::kFloat32, m, k), tb(DType::kFloat32, k, n);
  for (int64_t i = 0; i < m * k; ++i) ta.f32[i] = tf32(a.f32[i]);
  for (int64_t i = 0; i < k * n; ++i) tb.f32[i] = tf32(b.f32[i]);
  const Stored c = Multiply(ta, tb, DType::kFloat32, Order::kSequential);
  AbftOptions options;
  options.input_unit_roundoff = 0x1p-11;
  for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
    options.rule = rule;
    auto r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref(), nullptr, options);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->passed) << r->discrepancy << " " << r->threshold;
  }
  // All-positive data: TF32's rounding moves every column sum far beyond
  // what fp32 alone allows.
  auto strict = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref());
  ASSERT_TRUE(strict.ok());
  EXPECT_FALSE(strict->passed);
}

// A linear layer y = x W^T + b and its two backward products, with the
// operands as torch lays them out (row-major tensors; W^T and dY^T are
// transposed views, read column by column): healthy passes and a
// perturbation of one output element by a tenth of its magnitude is caught.
TEST(AbftTest, LinearLayerForwardAndBackwardProducts) {
  std::mt19937_64 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t tokens = 96, in = 40, out = 56;
  for (DType d : kInputs) {
    SCOPED_TRACE(DTypeName(d));
    auto gen = [&](int64_t, int64_t) { return normal(rng); };
    const Stored x = Fill(d, tokens, in, gen), w = Fill(d, out, in, gen);
    const Stored dy = Fill(d, tokens, out, gen), bias = Fill(d, 1, out, gen);
    // Materialized transposes, only to compute the products here.
    Stored wt(d, in, out), dyt(d, out, tokens);
    for (int64_t i = 0; i < out; ++i) {
      for (int64_t j = 0; j < in; ++j) wt.Set(j, i, w.Get(i, j));
      for (int64_t t = 0; t < tokens; ++t) dyt.Set(i, t, dy.Get(t, i));
    }
    struct Product {
      const char* name;
      MatrixRef a, b;
      Stored c;
      const Stored* bias;
    };
    Product products[] = {
        {"y = x W^T + b", x.Ref(), Transposed(w.Ref()),
         Multiply(x, wt, DType::kFloat32, Order::kBlocked, &bias), &bias},
        {"dx = dy W", dy.Ref(), w.Ref(), Multiply(dy, w, DType::kFloat32, Order::kBlocked),
         nullptr},
        {"dW = dy^T x", Transposed(dy.Ref()), x.Ref(),
         Multiply(dyt, x, DType::kFloat32, Order::kBlocked), nullptr},
    };
    for (Product& prod : products) {
      SCOPED_TRACE(prod.name);
      const MatrixRef bias_ref = prod.bias ? prod.bias->Ref() : MatrixRef{};
      for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
        AbftOptions options;
        options.rule = rule;
        options.axis = AbftAxis::kBoth;
        AbftResult first;
        for (CpuPath path : SupportedCpuPaths()) {
          auto r = internal::CheckMatrixProductOnPath(prod.a, prod.b, prod.c.Ref(),
                                                      prod.bias ? &bias_ref : nullptr,
                                                      options, path);
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_TRUE(r->passed) << PathsNote(path) << " " << r->discrepancy << " > "
                                 << r->threshold;
          if (path == CpuPath::kPortable) {
            first = *r;
          } else {
            EXPECT_EQ(r->discrepancy, first.discrepancy) << PathsNote(path);
            EXPECT_EQ(r->threshold, first.threshold) << PathsNote(path);
          }
        }
        Stored bad = prod.c;
        const float v = bad.Get(5, 9);
        bad.Set(5, 9, v + 0.1f * std::max(std::fabs(v), 1.0f));
        auto r = CheckMatrixProduct(prod.a, prod.b, bad.Ref(), prod.bias ? &bias_ref : nullptr,
                                    options);
        ASSERT_TRUE(r.ok());
        EXPECT_FALSE(r->passed);
        EXPECT_EQ(r->worst_index, r->worst_axis == AbftAxis::kColumns ? 9 : 5);
      }
    }
  }
}

TEST(AbftTest, TruncatingAccumulationNeedsTwiceTheUnitRoundoff) {
  // Round-toward-zero accumulation (every error the same sign) of positive
  // terms: healthy under the guaranteed rule with u = 2^-23, while the
  // probabilistic rule, whose model wants unbiased errors, trips on it.
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<float> pos(0.5f, 1.5f);
  const int64_t m = 256, k = 256, n = 8;
  const Stored a = Fill(DType::kFloat32, m, k, [&](int64_t, int64_t) { return pos(rng); });
  const Stored b = Fill(DType::kFloat32, k, n, [&](int64_t, int64_t) { return pos(rng); });
  for (Order order : kOrders) {
    const Stored c = Multiply(a, b, DType::kFloat32, order, nullptr, /*truncate=*/true);
    AbftOptions options;
    options.accumulate_unit_roundoff = 0x1p-23;
    options.axis = AbftAxis::kBoth;
    const AbftResult guaranteed = CheckAllPaths(a, b, c, options);
    EXPECT_TRUE(guaranteed.passed) << guaranteed.discrepancy << " > " << guaranteed.threshold;
    if (order == Order::kSequential) {
      options.rule = AbftRule::kProbabilistic;
      options.accumulate_unit_roundoff = 0x1p-24;
      EXPECT_FALSE(CheckAllPaths(a, b, c, options).passed);
    }
  }
}

TEST(AbftTest, BatchedProductsFindTheWrongOne) {
  // Attention's Q K^T per (sequence, head): K stored [batch, 20, 16] and read
  // as K_b^T; the batch shares one call.
  std::mt19937_64 rng(43);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t batch = 6, m = 24, k = 16, n = 20;
  std::vector<Stored> qs, ks, cs;
  Stored q_all(DType::kBFloat16, batch * m, k), k_all(DType::kBFloat16, batch * n, k);
  for (int64_t i = 0; i < batch * m * k; ++i) q_all.half[i] = ToBf16(normal(rng));
  for (int64_t i = 0; i < batch * n * k; ++i) k_all.half[i] = ToBf16(normal(rng));
  Stored c_all(DType::kFloat32, batch * m, n);
  for (int64_t b = 0; b < batch; ++b) {
    Stored qb(DType::kBFloat16, m, k), kt(DType::kBFloat16, k, n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t l = 0; l < k; ++l) qb.Set(i, l, q_all.Get(b * m + i, l));
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < k; ++l) kt.Set(l, j, k_all.Get(b * n + j, l));
    }
    const Stored cb = Multiply(qb, kt, DType::kFloat32, Order::kPairwise);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c_all.Set(b * m + i, j, cb.Get(i, j));
    }
  }
  const MatrixRef a = RowMajor(q_all.half.data(), m, k, DType::kBFloat16);
  const MatrixRef bt = Transposed(RowMajor(k_all.half.data(), n, k, DType::kBFloat16));
  const MatrixRef c = RowMajor(c_all.f32.data(), m, n, DType::kFloat32);
  const BatchStrides strides{m * k, n * k, m * n, 0};
  for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
    AbftOptions options;
    options.rule = rule;
    options.axis = AbftAxis::kBoth;
    for (CpuPath path : SupportedCpuPaths()) {
      auto r = internal::CheckBatchedMatrixProductOnPath(batch, a, bt, c, strides, nullptr,
                                                         options, path);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->passed) << PathsNote(path);
    }
    const float saved = c_all.Get(4 * m + 3, 7);
    c_all.Set(4 * m + 3, 7, saved + 0.5f);
    options.axis = AbftAxis::kColumns;
    auto r = CheckBatchedMatrixProduct(batch, a, bt, c, strides, nullptr, options);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->passed);
    EXPECT_EQ(r->worst_batch, 4);
    EXPECT_EQ(r->worst_index, 7);
    c_all.Set(4 * m + 3, 7, saved);
  }
  EXPECT_EQ(CheckBatchedMatrixProduct(-1, a, bt, c, strides).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto none = CheckBatchedMatrixProduct(0, a, bt, c, strides);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->passed);
}

// ---- Exact detection at the threshold.

// The guaranteed threshold of one column, recomputed here from the rule as
// abft.h states it (fp32 output, no bias, no input rounding).
double StatedThreshold(const Stored& a, const Stored& b, const Stored& c, int64_t j) {
  const int64_t m = a.rows, k = a.cols;
  double t = 0.0, s = 0.0;
  for (int64_t l = 0; l < k; ++l) {
    double col = 0.0;
    for (int64_t i = 0; i < m; ++i) col += std::fabs(a.Get(i, l));
    t += col * std::fabs(b.Get(l, j));
  }
  for (int64_t i = 0; i < m; ++i) s += std::fabs(c.Get(i, j));
  const double u = 0x1p-24, kd = static_cast<double>(k);
  const double beta = kd * u / (1 - kd * u);
  const double u_out = c.dtype == DType::kFloat32 ? 0.0
                       : c.dtype == DType::kBFloat16 ? 0x1p-8 : 0x1p-11;
  const double g64 = (m + k + 4) * 0x1p-53;
  const double under = m * (2.0 * kd * 0x1p-126 * (1 + beta) +
                            (c.dtype == DType::kBFloat16 ? 0x1p-126
                             : c.dtype == DType::kFloat16 ? 0x1p-14 : 0.0));
  return beta * t + u_out / (1 - u_out) * s + g64 * (t + s) + under;
}

TEST(AbftTest, OneUlpAboveTheThresholdIsDetectedAndBelowIsNot) {
  // Small-integer operands: the healthy product is exact in every order, so
  // the discrepancy is exactly the perturbation. Element (i0, j0) is 0; its
  // value is walked through every representable value around the
  // threshold.
  const int64_t m = 48, k = 96, n = 20, i0 = 17, j0 = 11;
  for (DType out : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(out));
    // |C| <= k / 2 < 256: exact in bf16 and fp16 too.
    Stored a = Fill(DType::kFloat32, m, k, [](int64_t i, int64_t l) {
      return static_cast<float>(((i * 5 + l * 3) % 3) - 1);
    });
    for (int64_t l = 0; l < k; ++l) a.Set(i0, l, 0.0f);  // Row i0 of C is 0.
    const Stored b = Fill(DType::kFloat32, k, n, [](int64_t l, int64_t j) {
      return static_cast<float>(((l * 7 + j * 11) % 5) - 2) / 2.0f;
    });
    Stored c = Multiply(a, b, out, Order::kSequential);
    ASSERT_EQ(c.Get(i0, j0), 0.0f);

    auto healthy = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref());
    ASSERT_TRUE(healthy.ok());
    ASSERT_TRUE(healthy->passed);
    ASSERT_EQ(healthy->discrepancy, 0.0);

    // Walk up from 0 through representable values of C's dtype: the first
    // value that fails must exceed the stated threshold and the one before
    // it must not; the walk takes one step per representable value.
    float below = 0.0f, value = 0.0f;
    const double stated0 = StatedThreshold(a, b, c, j0);
    // Jump near the threshold, then step one representable value at a time.
    value = static_cast<float>(stated0 * (out == DType::kFloat32 ? 0.9999 : 0.99));
    c.Set(i0, j0, value);
    value = c.Get(i0, j0);
    ASSERT_LT(value, stated0);
    AbftResult at_fail;
    for (int steps = 0;; ++steps) {
      ASSERT_LT(steps, 100000) << "no failure near the threshold";
      below = value;
      if (out == DType::kFloat32) {
        value = std::nextafter(value, 1e30f);
      } else if (out == DType::kBFloat16) {
        value = Bf16ToFloat(static_cast<uint16_t>(ToBf16(value) + 1));
      } else {
        value = Fp16ToFloat(static_cast<uint16_t>(ToFp16(value) + 1));
      }
      c.Set(i0, j0, value);
      ASSERT_EQ(c.Get(i0, j0), value);
      auto r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref());
      ASSERT_TRUE(r.ok());
      if (!r->passed) {
        at_fail = *r;
        break;
      }
    }
    // The failing value is above the stated threshold (with C as perturbed),
    // the value one step below is not, and the result names the column.
    EXPECT_GT(static_cast<double>(value), StatedThreshold(a, b, c, j0));
    EXPECT_EQ(at_fail.worst_index, j0);
    EXPECT_EQ(at_fail.discrepancy, static_cast<double>(value));
    EXPECT_NEAR(at_fail.threshold, StatedThreshold(a, b, c, j0),
                1e-9 * at_fail.threshold);
    c.Set(i0, j0, below);
    EXPECT_LE(static_cast<double>(below), StatedThreshold(a, b, c, j0));
    auto r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref());
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->passed) << "one step below the threshold must pass";
    // And negative: the same magnitude downward.
    c.Set(i0, j0, -value);
    r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref());
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->passed);
    c.Set(i0, j0, -below);
    r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref());
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->passed);
    std::printf("[%s out] threshold %.9g; detected %.9g, passed %.9g\n", DTypeName(out),
                at_fail.threshold, value, below);
  }
}

// The probabilistic threshold of one column, recomputed here from the rule
// as abft.h and abft.cc state it (fp32 inputs and output, no bias).
double StatedProbabilisticThreshold(const Stored& a, const Stored& b, const Stored& c,
                                    int64_t j, double lambda) {
  const int64_t m = a.rows, k = a.cols;
  const double u = 0x1p-24, kd = static_cast<double>(k);
  std::vector<double> row_abs(m, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t l = 0; l < k; ++l) row_abs[i] += std::fabs(a.Get(i, l));
  }
  double variance = 0.0, c_sq = 0.0, t = 0.0, s = 0.0;
  for (int64_t l = 0; l < k; ++l) {
    double weighted = 0.0, col = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      weighted += row_abs[i] * std::fabs(a.Get(i, l));
      col += std::fabs(a.Get(i, l));
    }
    const double blj = b.Get(l, j);
    variance += kd * u * u * weighted * blj * blj;
    t += col * std::fabs(blj);
  }
  for (int64_t i = 0; i < m; ++i) {
    c_sq += double(c.Get(i, j)) * c.Get(i, j);
    s += std::fabs(c.Get(i, j));
  }
  (void)c_sq;  // u_out = 0 for fp32 output: C's own term vanishes.
  const double gamma = kd * u / (1 - kd * u);
  const double second = (gamma - kd * u) * t;
  const double check = (m + k + 4) * 0x1p-53 * (t + s) + m * 2.0 * kd * 0x1p-126 * (1 + gamma);
  return std::min(lambda * std::sqrt(variance) + second + check, StatedThreshold(a, b, c, j));
}

TEST(AbftTest, ProbabilisticBoundaryIsTheStatedFormula) {
  // Random data: the healthy discrepancy is not zero, so the walk moves one
  // element up through consecutive floats until the check fails, and the
  // flip must be where |discrepancy| crosses the stated threshold.
  std::mt19937_64 rng(47);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t m = 80, k = 120, n = 12, i0 = 33, j0 = 5;
  const Stored a = Fill(DType::kFloat32, m, k, [&](int64_t, int64_t) { return normal(rng); });
  const Stored b = Fill(DType::kFloat32, k, n, [&](int64_t, int64_t) { return normal(rng); });
  Stored c = Multiply(a, b, DType::kFloat32, Order::kBlocked);
  AbftOptions options;
  options.rule = AbftRule::kProbabilistic;
  auto healthy = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref(), nullptr, options);
  ASSERT_TRUE(healthy.ok());
  ASSERT_TRUE(healthy->passed);
  const float original = c.Get(i0, j0);
  const double tau0 = StatedProbabilisticThreshold(a, b, c, j0, options.lambda);
  ASSERT_LT(tau0, StatedThreshold(a, b, c, j0));  // The probabilistic term binds.
  // Start 1% below the boundary (the healthy discrepancy is far smaller).
  float value = static_cast<float>(original + 0.99 * tau0), below = value;
  AbftResult at_fail;
  for (int steps = 0;; ++steps) {
    ASSERT_LT(steps, 1 << 20) << "no failure near the threshold";
    c.Set(i0, j0, value);
    auto r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref(), nullptr, options);
    ASSERT_TRUE(r.ok());
    if (!r->passed) {
      at_fail = *r;
      break;
    }
    below = value;
    value = std::nextafter(value, 1e30f);
  }
  ASSERT_NE(below, value);
  EXPECT_EQ(at_fail.worst_index, j0);
  const double stated = StatedProbabilisticThreshold(a, b, c, j0, options.lambda);
  EXPECT_NEAR(at_fail.threshold, stated, 1e-9 * stated);
  EXPECT_GT(std::fabs(at_fail.discrepancy), stated);
  // One float below: within the threshold, and passing.
  c.Set(i0, j0, below);
  auto r = CheckMatrixProduct(a.Ref(), b.Ref(), c.Ref(), nullptr, options);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->passed);
  EXPECT_LE(std::fabs(r->discrepancy),
            StatedProbabilisticThreshold(a, b, c, j0, options.lambda) * (1 + 1e-9));
  std::printf("probabilistic: threshold %.9g; C[%d][%d] = %.9g fails, %.9g passes\n",
              at_fail.threshold, int(i0), int(j0), value, below);
}

TEST(AbftTest, BothAxesLocateTheElement) {
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Stored a = Fill(DType::kFloat32, 64, 64, [&](int64_t, int64_t) { return normal(rng); });
  const Stored b = Fill(DType::kFloat32, 64, 48, [&](int64_t, int64_t) { return normal(rng); });
  Stored c = Multiply(a, b, DType::kFloat32, Order::kSequential);
  c.Set(40, 7, c.Get(40, 7) + 1.0f);
  for (AbftAxis axis : {AbftAxis::kColumns, AbftAxis::kRows}) {
    AbftOptions options;
    options.axis = axis;
    const AbftResult r = CheckAllPaths(a, b, c, options);
    EXPECT_FALSE(r.passed);
    EXPECT_EQ(r.worst_axis, axis);
    EXPECT_EQ(r.worst_index, axis == AbftAxis::kColumns ? 7 : 40);
    EXPECT_NEAR(r.discrepancy, 1.0, 1e-4);
  }
}

TEST(AbftTest, NonFiniteOutputFails) {
  const Stored a = Fill(DType::kFloat32, 4, 4, [](int64_t i, int64_t l) { return float(i + l); });
  const Stored b = Fill(DType::kFloat32, 4, 4, [](int64_t l, int64_t j) { return float(l - j); });
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    Stored c = Multiply(a, b, DType::kFloat32, Order::kSequential);
    c.Set(2, 3, bad);
    const AbftResult r = CheckAllPaths(a, b, c, AbftOptions{});
    EXPECT_FALSE(r.passed);
    EXPECT_EQ(r.worst_index, 3);
  }
}

TEST(AbftTest, ProbabilisticRuleIsTighterOnRandomData) {
  // Transformer-like shapes: prints the smallest relative perturbation of one
  // element each rule detects (threshold / rms of the column), the figure
  // ARCHITECTURE quotes.
  std::mt19937_64 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t m = 256, k = 256, n = 64;
  for (DType in : kInputs) {
    const Stored a = Fill(in, m, k, [&](int64_t, int64_t) { return normal(rng); });
    const Stored b = Fill(in, k, n, [&](int64_t, int64_t) { return normal(rng); });
    for (DType out : {DType::kFloat32, in}) {
      const Stored c = Multiply(a, b, out, Order::kSequential);
      double rms = 0.0;
      for (int64_t i = 0; i < m; ++i) rms += double(c.Get(i, 0)) * c.Get(i, 0);
      rms = std::sqrt(rms / m);
      double thresholds[2];
      for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
        AbftOptions options;
        options.rule = rule;
        const AbftResult r = CheckAllPaths(a, b, c, options);
        EXPECT_TRUE(r.passed);
        thresholds[static_cast<int>(rule)] = r.threshold;
      }
      EXPECT_LE(thresholds[1], thresholds[0]);
      std::printf("%dx%dx%d %s in, %s out: detects one element off by %.3g (guaranteed), "
                  "%.3g (probabilistic) of the rms\n",
                  int(m), int(k), int(n), DTypeName(in), DTypeName(out), thresholds[0] / rms,
                  thresholds[1] / rms);
    }
  }
}

TEST(AbftTest, RejectsBadArguments) {
  float x[4] = {};
  const MatrixRef a = RowMajor(x, 2, 2, DType::kFloat32);
  const MatrixRef wrong = RowMajor(x, 3, 1, DType::kFloat32);
  EXPECT_EQ(CheckMatrixProduct(a, wrong, a).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckMatrixProduct(a, a, wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  const MatrixRef f64 = RowMajor(x, 2, 1, DType::kFloat64);
  EXPECT_EQ(CheckMatrixProduct(a, a, f64).status().code(),
            absl::StatusCode::kInvalidArgument);
  const MatrixRef null = RowMajor(nullptr, 2, 2, DType::kFloat32);
  EXPECT_EQ(CheckMatrixProduct(a, null, a).status().code(),
            absl::StatusCode::kInvalidArgument);
  const MatrixRef bias = RowMajor(x, 1, 3, DType::kFloat32);
  EXPECT_EQ(CheckMatrixProduct(a, a, a, &bias).status().code(),
            absl::StatusCode::kInvalidArgument);
  AbftOptions options;
  options.lambda = -1.0;
  EXPECT_EQ(CheckMatrixProduct(a, a, a, nullptr, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.input_unit_roundoff = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(CheckMatrixProduct(a, a, a, nullptr, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.accumulate_unit_roundoff = 0.0;
  EXPECT_EQ(CheckMatrixProduct(a, a, a, nullptr, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Empty products pass with no worst line.
  const MatrixRef empty = RowMajor(nullptr, 0, 2, DType::kFloat32);
  auto r = CheckMatrixProduct(empty, a, RowMajor(nullptr, 0, 2, DType::kFloat32));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->passed);
  EXPECT_EQ(r->worst_index, -1);
}

}  // namespace
}  // namespace sdc::kernels
