// The CUDA product check's host code (abft_cuda.cc: its passes, offsets,
// weights and strides) over a host emulation of its kernels
// (abft_cuda_emulated.cc), against the CPU check (abft.h) on the same
// products: runs on any machine. cuda_test runs the real kernels against
// the CPU check where there is a GPU.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/abft.h"
#include "kernels/abft_cuda.h"
#include "kernels/abft_test_values.h"
#include "kernels/half_float.h"
#include "kernels/nonfinite.h"

namespace sdc::kernels {
namespace {

using test_values::Store;
using test_values::Widen;

struct Case {
  int64_t batch, p, q, s;
  DType in, out;
  bool bias, a_column_major;
};

// A batch of healthy products: C = A B (+ bias) accumulated in fp32 in
// order, rounded once to C's dtype.
struct Product {
  Case k;
  std::vector<unsigned char> a, b, v, c;

  MatrixRef A() const {
    return k.a_column_major ? MatrixRef{a.data(), k.p, k.q, 1, k.p, k.in}
                            : MatrixRef{a.data(), k.p, k.q, k.q, 1, k.in};
  }
  MatrixRef B() const { return RowMajor(b.data(), k.q, k.s, k.in); }
  MatrixRef C() const { return RowMajor(c.data(), k.p, k.s, k.out); }
  MatrixRef V() const { return MatrixRef{v.data(), 1, k.s, 0, 1, k.in}; }
  BatchStrides Strides() const { return {k.p * k.q, k.q * k.s, k.p * k.s, k.s}; }
};

Product Make(const Case& k, uint64_t seed) {
  Product x{k, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t is = DTypeSize(k.in), os = DTypeSize(k.out);
  x.a.resize(k.batch * k.p * k.q * is);
  x.b.resize(k.batch * k.q * k.s * is);
  x.v.resize(k.batch * k.s * is);
  x.c.resize(k.batch * k.p * k.s * os);
  for (std::vector<unsigned char>* m : {&x.a, &x.b, &x.v}) {
    for (size_t i = 0; i < m->size(); i += is) Store(normal(rng), k.in, &(*m)[i]);
  }
  const BatchStrides st = x.Strides();
  const MatrixRef a = x.A();
  for (int64_t n = 0; n < k.batch; ++n) {
    for (int64_t i = 0; i < k.p; ++i) {
      for (int64_t j = 0; j < k.s; ++j) {
        float acc = k.bias ? Widen(&x.v[(n * st.bias + j) * is], k.in) : 0.0f;
        for (int64_t l = 0; l < k.q; ++l) {
          const float ail =
              Widen(&x.a[(n * st.a + i * a.row_stride + l * a.col_stride) * is], k.in);
          const float product = ail * Widen(&x.b[(n * st.b + l * k.s + j) * is], k.in);
          acc += product;
        }
        Store(acc, k.out, &x.c[(n * st.c + i * k.s + j) * os]);
      }
    }
  }
  return x;
}

CudaAbftRecord Emulated(Product& x, const AbftOptions& options, bool poison) {
  const MatrixRef v = x.V();
  absl::StatusOr<size_t> bytes = CudaProductCheckWorkspaceBytes(
      x.k.batch, x.A(), x.B(), x.C(), x.k.bias ? &v : nullptr, options);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  // Filled with NaN: a pass that read what no pass wrote would show.
  std::vector<double> workspace(bytes.value_or(0) / sizeof(double) + 2,
                                std::numeric_limits<double>::quiet_NaN());
  CudaAbftRecord record;
  const absl::Status s = QueueMatrixProductCheckCuda(
      x.k.batch, x.A(), x.B(), x.C(), x.Strides(), x.k.bias ? &v : nullptr, options, 7, poison,
      workspace.data(), bytes.value_or(0), &record, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return record;
}

AbftResult OnCpu(const Product& x, const AbftOptions& options) {
  const MatrixRef v = x.V();
  absl::StatusOr<AbftResult> r = CheckBatchedMatrixProduct(
      x.k.batch, x.A(), x.B(), x.C(), x.Strides(), x.k.bias ? &v : nullptr, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.value_or(AbftResult{});
}

const Case kCases[] = {
    {1, 96, 200, 70, DType::kFloat32, DType::kFloat32, true, false},
    {3, 64, 48, 33, DType::kFloat32, DType::kFloat32, false, true},
    {1, 3000, 16, 40, DType::kFloat32, DType::kFloat32, true, false},  // Row chunks folded.
    {2, 80, 128, 96, DType::kBFloat16, DType::kBFloat16, true, false},
    {2, 80, 128, 96, DType::kBFloat16, DType::kFloat32, false, true},
    {1, 130, 256, 64, DType::kFloat16, DType::kFloat16, true, true},
};

std::string Name(const Case& k, AbftRule rule) {
  return absl::StrCat(DTypeName(k.in), "->", DTypeName(k.out), " ", k.batch, "x", k.p, "x", k.q,
                      "x", k.s, k.bias ? " bias" : "", k.a_column_major ? " A^T" : "",
                      rule == AbftRule::kGuaranteed ? " guaranteed" : " probabilistic");
}

// Healthy products pass as on the CPU: the same worst column, the same
// threshold to the fp64 sums' rounding (the rule is one function), with
// TF32-style input rounding too.
TEST(AbftCudaEmulatedTest, HealthyProductsMatchTheCpuCheck) {
  uint64_t seed = 1;
  for (const Case& k : kCases) {
    Product x = Make(k, ++seed);
    for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
      for (double u_in : {0.0, 0x1p-11}) {
        AbftOptions options;
        options.rule = rule;
        options.input_unit_roundoff = u_in;
        const std::string what = absl::StrCat(Name(k, rule), " u_in ", u_in);
        const AbftResult cpu = OnCpu(x, options);
        const CudaAbftRecord gpu = Emulated(x, options, /*poison=*/true);
        ASSERT_TRUE(cpu.passed) << what;
        EXPECT_EQ(gpu.failed, 0) << what;
        EXPECT_EQ(gpu.op_id, 7) << what;
        EXPECT_EQ(static_cast<int64_t>(gpu.column), cpu.worst_index) << what;
        EXPECT_EQ(static_cast<int64_t>(gpu.batch), cpu.worst_batch) << what;
        EXPECT_GT(gpu.threshold, 0) << what;
        EXPECT_NEAR(gpu.threshold, cpu.threshold, 1e-12 * cpu.threshold) << what;
        EXPECT_NEAR(gpu.discrepancy, cpu.discrepancy, 1e-3 * cpu.threshold) << what;
        EXPECT_NEAR(gpu.reference, cpu.reference, 1e-3 * cpu.threshold) << what;
      }
    }
  }
}

// One element moved by a quarter of its column's magnitude: both fail at
// its column and batch member, and the poisoned first element of that
// column is NaN.
TEST(AbftCudaEmulatedTest, OneWrongElementIsFoundAndPoisoned) {
  for (const Case& k : kCases) {
    Product x = Make(k, 99);
    const int64_t n = k.batch - 1, i = k.p / 2, j = k.s / 3, os = DTypeSize(k.out);
    double column = 0;
    for (int64_t r = 0; r < k.p; ++r) {
      column += std::fabs(Widen(&x.c[(n * k.p * k.s + r * k.s + j) * os], k.out));
    }
    unsigned char* e = &x.c[(n * k.p * k.s + i * k.s + j) * os];
    Store(Widen(e, k.out) + static_cast<float>(0.25 * column), k.out, e);
    for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
      AbftOptions options;
      options.rule = rule;
      const AbftResult cpu = OnCpu(x, options);
      EXPECT_FALSE(cpu.passed) << Name(k, rule);
      EXPECT_EQ(cpu.worst_index, j) << Name(k, rule);
      Product copy = x;
      const CudaAbftRecord gpu = Emulated(copy, options, /*poison=*/true);
      EXPECT_GE(gpu.failed, 1) << Name(k, rule);
      EXPECT_EQ(static_cast<int64_t>(gpu.column), j) << Name(k, rule);
      EXPECT_EQ(static_cast<int64_t>(gpu.batch), n) << Name(k, rule);
      EXPECT_NEAR(gpu.discrepancy, cpu.discrepancy, 1e-9 * std::fabs(cpu.discrepancy));
      EXPECT_TRUE(std::isnan(Widen(&copy.c[(n * k.p * k.s + j) * os], k.out))) << Name(k, rule);
      // Without poison, C is left as it was.
      Product untouched = x;
      EXPECT_GE(Emulated(untouched, options, /*poison=*/false).failed, 1);
      EXPECT_EQ(untouched.c, x.c) << Name(k, rule);
    }
  }
}

// An empty product writes a passing record with no column.
TEST(AbftCudaEmulatedTest, EmptyProductPasses) {
  Product x = Make({2, 0, 5, 4, DType::kFloat32, DType::kFloat32, false, false}, 3);
  const CudaAbftRecord r = Emulated(x, {}, true);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.column, -1);
  EXPECT_TRUE(ResultOfRecord(r).passed);
}

}  // namespace
}  // namespace sdc::kernels
