#include "agent/diagnostic.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Matrix Make(uint32_t n, std::vector<float> values) { return Matrix{n, std::move(values)}; }

const common::PlannedDevice kCpu{"cpu", -1};

// A product small enough to check by hand:
// [1 2; 3 4] x [5 6; 7 8] = [19 22; 43 50].
TEST(ReferenceProductTest, KnownSmallProduct) {
  absl::StatusOr<Matrix> c = ReferenceProduct(Make(2, {1, 2, 3, 4}), Make(2, {5, 6, 7, 8}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->values, (std::vector<float>{19, 22, 43, 50}));
  // With negatives and the extremes: [-8 8; 0 -1] x [8 -8; 1 0] = [-56 64; -1 0].
  c = ReferenceProduct(Make(2, {-8, 8, 0, -1}), Make(2, {8, -8, 1, 0}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->values, (std::vector<float>{-56, 64, -1, 0}));
}

TEST(ReferenceProductTest, RefusesWhatIsNotExact) {
  EXPECT_EQ(ReferenceProduct(Make(2, {1, 2, 3, 4}), Make(1, {1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Matrix> c = ReferenceProduct(Make(2, {1, 2.5f, 3, 4}), Make(2, {1, 0, 0, 1}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), "A[0][1] = 2.5 is not an integer in [-8, 8]");
  c = ReferenceProduct(Make(2, {1, 0, 0, 1}), Make(2, {1, 9, 0, 1}));
  EXPECT_EQ(c.status().message(), "B[0][1] = 9 is not an integer in [-8, 8]");
}

TEST(DeviceProductsTest, CpuComputesTheKnownProduct) {
  std::vector<Matrix> seen;
  double seconds = -1;
  absl::Status s = DeviceProducts(Make(2, {1, 2, 3, 4}), Make(2, {5, 6, 7, 8}), -1, 2,
                                  [&](uint32_t r, Matrix& c) { seen.push_back(c); }, &seconds);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].values, (std::vector<float>{19, 22, 43, 50}));
  EXPECT_EQ(seen[1].values, (std::vector<float>{19, 22, 43, 50}));
  EXPECT_GE(seconds, 0);
}

// The generator is part of the diagnostic's definition: the same entries on
// every machine, in range, and not degenerate.
TEST(FillMatrixTest, DeterministicIntegersInRange) {
  const Matrix a = FillMatrix(64, kSeedA);
  const Matrix again = FillMatrix(64, kSeedA);
  const Matrix b = FillMatrix(64, kSeedB);
  EXPECT_EQ(a.values, again.values);
  EXPECT_NE(a.values, b.values);
  std::vector<int> histogram(17, 0);
  for (float v : a.values) {
    ASSERT_EQ(v, std::nearbyint(v));
    ASSERT_GE(v, -8);
    ASSERT_LE(v, 8);
    ++histogram[static_cast<int>(v) + 8];
  }
  for (int count : histogram) EXPECT_GT(count, 64 * 64 / 17 / 2);  // Every value appears.
  // Pinned: entry k is SplitMix64(seed + k + 1) mod 17 - 8.
  const Matrix small = FillMatrix(2, 0);
  EXPECT_EQ(small.values, (std::vector<float>{2, 8, -4, 2}));  // Computed in Python.
}

TEST(CompareBitsTest, CountsEveryDifferingBitPattern) {
  const Matrix want = Make(2, {1, 0, -3, 4});
  Comparison c = CompareBits(Make(2, {1, 0, -3, 4}), want);
  EXPECT_EQ(c.mismatches, 0u);
  EXPECT_EQ(c.max_abs_error, 0);
  c = CompareBits(Make(2, {1, -0.0f, -3, 6}), want);  // -0 differs from +0 in its bits.
  EXPECT_EQ(c.mismatches, 2u);
  EXPECT_EQ(c.max_abs_error, 2);
  c = CompareBits(Make(2, {NAN, 0, -3, 4}), want);
  EXPECT_EQ(c.mismatches, 1u);
  EXPECT_TRUE(std::isinf(c.max_abs_error));
}

TEST(ConfirmationDiagnosticTest, CleanRunOnTheCpuPasses) {
  ConfirmationDiagnostic d({/*size=*/96, /*repetitions=*/3});
  const DeviceOutcome out = d.Run(kCpu, {});
  EXPECT_TRUE(out.error.empty()) << out.error;
  EXPECT_TRUE(out.pass) << out.detail;
  EXPECT_EQ(out.mismatches, 0u);
  EXPECT_EQ(out.max_abs_error, 0);
  EXPECT_EQ(out.gpu, "cpu");
  EXPECT_EQ(out.device, "cpu");
  EXPECT_EQ(out.size, 96u);
  EXPECT_EQ(out.repetitions, 3u);
  EXPECT_GT(out.seconds, 0);
  EXPECT_GT(out.gflops, 0);
  EXPECT_THAT(out.detail,
              StartsWith("cpu: 3 products of 96x96 fp32 matched the integer reference bit for bit"));
}

// The comparison must see a single wrong element: the injected fault adds 1
// to one element of the first product.
TEST(ConfirmationDiagnosticTest, InjectedFaultIsDetectedExactly) {
  ConfirmationDiagnostic d({/*size=*/96, /*repetitions=*/3});
  const DeviceOutcome out = d.Run(kCpu, {/*inject_fault=*/true});
  EXPECT_TRUE(out.error.empty()) << out.error;
  EXPECT_FALSE(out.pass);
  EXPECT_EQ(out.mismatches, 1u);
  EXPECT_EQ(out.max_abs_error, 1.0);
  EXPECT_EQ(out.detail,
            absl::StrCat("cpu: 1 of 27648 elements differ from the integer reference (max abs "
                         "error 1) over 3 products of 96x96 fp32"));
  // The same object still passes without the fault: the reference is intact.
  EXPECT_TRUE(d.Run(kCpu, {}).pass);
}

// The largest sums of the default size are far from 2^24, and still exact.
TEST(ConfirmationDiagnosticTest, DefaultSizeIsExactOnTheCpu) {
  ConfirmationDiagnostic d({common::kDefaultSize, 1});
  const DeviceOutcome out = d.Run(kCpu, {});
  EXPECT_TRUE(out.pass) << out.detail << out.error;
  std::printf("%s\n", out.detail.c_str());
}

// On a GPU machine with a CUDA libtorch this runs the diagnostic on cuda:0;
// elsewhere it checks that the outcome says why it could not run.
TEST(ConfirmationDiagnosticTest, CudaDeviceRunsOrSaysWhyNot) {
  ConfirmationDiagnostic d({/*size=*/256, /*repetitions=*/2});
  const absl::Status usable = CudaDeviceUsable(0);
  const DeviceOutcome out = d.Run({"GPU-test", 0}, {});
  EXPECT_EQ(out.device, "cuda:0");
  EXPECT_EQ(out.gpu, "GPU-test");
  if (!usable.ok()) {
    std::printf("skipping the CUDA run: %s\n", std::string(usable.message()).c_str());
    EXPECT_FALSE(out.pass);
    EXPECT_EQ(out.error, usable.message());
    EXPECT_THAT(out.detail, HasSubstr("cuda:0: could not run 2 products of 256x256 fp32: "));
    return;
  }
  EXPECT_TRUE(out.pass) << out.detail << out.error;
  EXPECT_TRUE(d.Run({"GPU-test", 0}, {true}).mismatches == 1);
}

// A reference handed over in a file (as the agent does to its diagnostic
// processes) gives the same verdicts as one computed in place.
TEST(ConfirmationDiagnosticTest, ReferenceFromAFileGivesTheSameVerdicts) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/reference.f32";
  ConfirmationDiagnostic computed({/*size=*/48, /*repetitions=*/2});
  absl::StatusOr<const Matrix*> reference = computed.Reference();
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE(WriteMatrix(**reference, path).ok());

  absl::StatusOr<Matrix> read = ReadMatrix(path, 48);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->values, (*reference)->values);
  EXPECT_EQ(ReadMatrix(path, 47).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadMatrix(path + ".missing", 48).status().code(), absl::StatusCode::kNotFound);

  ConfirmationDiagnostic handed({48, 2});
  EXPECT_EQ(handed.UseReference(Matrix{47, std::vector<float>(47 * 47)}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(handed.UseReference(*std::move(read)).ok());
  EXPECT_TRUE(handed.Run(kCpu, {}).pass);
  EXPECT_EQ(handed.Run(kCpu, {/*inject_fault=*/true}).mismatches, 1u);
}

}  // namespace
}  // namespace sdc::agent
