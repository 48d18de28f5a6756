#include "client/tensor_checks.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "client/device.h"
#include "gtest/gtest.h"
#include "kernels/model_digest.h"

namespace sdc::client {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

const kernels::FingerprintKey& Key() {
  static const auto* key = new kernels::FingerprintKey(kernels::FingerprintKey::FromSeed(5));
  return *key;
}

kernels::Fingerprint OneFingerprint(const torch::Tensor& t) {
  std::vector<kernels::Fingerprint> out;
  EXPECT_TRUE(FingerprintOnDevice({t.contiguous()}, Key(), &out).ok());
  return out.at(0);
}

TEST(TensorChecksTest, FingerprintsKeepPositionsAndSkipUndefined) {
  const torch::Tensor a = torch::arange(6, torch::kFloat).reshape({2, 3});
  const torch::Tensor b = torch::ones({4}, torch::kDouble);
  const std::vector<kernels::Fingerprint> fps = Fingerprints(Key(), {a, torch::Tensor(), b});
  ASSERT_EQ(fps.size(), 3u);
  EXPECT_EQ(fps[0], OneFingerprint(a));
  EXPECT_EQ(fps[1], (kernels::Fingerprint{0, 0, 0}));
  EXPECT_EQ(fps[2], OneFingerprint(b));
  EXPECT_EQ(fps[0].byte_length, 24u);
  // A strided view fingerprints as its values laid out in order.
  EXPECT_EQ(Fingerprints(Key(), {a.t()})[0], OneFingerprint(a.t().contiguous()));
  EXPECT_NE(Fingerprints(Key(), {a.t()})[0], fps[0]);
}

TEST(TensorChecksTest, ScansCountNonFiniteAndSumSquares) {
  const std::vector<kernels::ScanResult> scans =
      ScanTensors({torch::tensor({3.0f, 4.0f}), torch::tensor({kNaN, 1.0f, kInf})});
  ASSERT_EQ(scans.size(), 2u);
  EXPECT_EQ(scans[0].nonfinite, 0u);
  EXPECT_DOUBLE_EQ(scans[0].sum_squares, 25.0);
  EXPECT_EQ(scans[1].nonfinite, 2u);
  // NonFinite skips what the kernels cannot read (undefined, integer).
  EXPECT_EQ(NonFinite({torch::tensor({kNaN, 1.0f, kInf}), torch::Tensor(),
                       torch::zeros({3}, torch::kInt64), torch::tensor({-kInf}, torch::kDouble)}),
            3u);
}

TEST(TensorChecksTest, DigestDependsOnNamesAndOrder) {
  const kernels::Fingerprint x{4, 1, 2}, y{4, 3, 4};
  const uint64_t d = Digest({"a", "b"}, {x, y});
  EXPECT_EQ(d, Digest({"a", "b", "unused"}, {x, y}));
  EXPECT_NE(d, Digest({"a", "c"}, {x, y}));
  EXPECT_NE(d, Digest({"a", "b"}, {y, x}));
}

TEST(TensorChecksTest, LossBitsAreTheDoublesBits) {
  EXPECT_EQ(LossBits(torch::tensor(0.5f)), 0x3FE0000000000000ull);
  EXPECT_EQ(LossBits(torch::tensor(-2.0, torch::kDouble)), 0xC000000000000000ull);
}

TEST(TensorChecksTest, FlipMantissaBitChangesOnlyThatBitOfTheFirstElement) {
  torch::Tensor t = torch::ones({3});
  FlipMantissaBit(t, 0);
  EXPECT_EQ(t[0].item<float>(), std::nextafter(1.0f, 2.0f));
  EXPECT_EQ(t[1].item<float>(), 1.0f);
  FlipMantissaBit(t, 0);
  EXPECT_EQ(t[0].item<float>(), 1.0f);
}

absl::Status Throws() {
  SDC_TORCH_TRY(TORCH_CHECK(false, "the reason"));
  return absl::OkStatus();
}

TEST(TensorChecksTest, LibtorchErrorsBecomeInternal) {
  const absl::Status s = Throws();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(s.message()).find("libtorch: the reason"), std::string::npos) << s;
  // A kernel's failure is a libtorch error inside a step.
  EXPECT_THROW(ThrowIfFailed(absl::InvalidArgumentError("bad")), c10::Error);
  EXPECT_NO_THROW(ThrowIfFailed(absl::OkStatus()));
}

}  // namespace
}  // namespace sdc::client
