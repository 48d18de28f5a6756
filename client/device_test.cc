// client/device.h on the CPU (the tests' only device): the kernels it picks,
// the RNG state a replay carries, and what it refuses.

#include "client/device.h"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"

namespace sdc::client {
namespace {

TEST(DeviceTest, CpuTensorsGetTheCpuKernelsResults) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> dense = {torch::randn({1000}), torch::randn({3, 7}, torch::kDouble),
                                      torch::randn({64}).to(torch::kBFloat16)};
  dense[0][17] = std::numeric_limits<float>::infinity();
  std::vector<kernels::Fingerprint> fps;
  ASSERT_TRUE(FingerprintOnDevice(dense, &fps).ok());
  std::vector<kernels::ScanResult> scans;
  ASSERT_TRUE(ScanOnDevice(dense, &scans).ok());
  ASSERT_EQ(fps.size(), 3u);
  ASSERT_EQ(scans.size(), 3u);
  for (size_t i = 0; i < dense.size(); ++i) {
    const kernels::ByteSpan span{dense[i].data_ptr(),
                                 static_cast<uint64_t>(dense[i].numel()) * dense[i].element_size()};
    kernels::Fingerprint direct;
    ASSERT_TRUE(kernels::FingerprintTensors({&span, 1}, {&direct, 1}).ok());
    EXPECT_EQ(fps[i], direct) << i;
  }
  EXPECT_EQ(scans[0].nonfinite, 1u);
  EXPECT_EQ(scans[1].nonfinite, 0u);
  EXPECT_EQ(scans[2].nonfinite, 0u);
  EXPECT_GT(scans[1].sum_squares, 0);
  // Integer tensors are not gradients.
  EXPECT_EQ(ScanOnDevice({torch::zeros({4}, torch::kInt64)}, &scans).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceTest, SwappedRngReplaysTheDraws) {
  const torch::Device cpu(torch::kCPU);
  torch::manual_seed(11);
  const torch::Tensor state = CaptureRng(cpu);
  const torch::Tensor first = torch::rand({8});  // What the original pass drew.
  const torch::Tensor own = SwapRng(cpu, state);
  EXPECT_TRUE(torch::equal(torch::rand({8}), first)) << "the replay draws what the original drew";
  SwapRng(cpu, own);
  EXPECT_FALSE(torch::equal(torch::rand({8}), first)) << "and the rank's own stream goes on";
}

TEST(DeviceTest, RefusesWhatItCannotRead) {
  EXPECT_TRUE(CheckDevice(torch::Device(torch::kCPU)).ok());
  EXPECT_EQ(CheckDevice(torch::Device(torch::kMeta)).code(), absl::StatusCode::kUnimplemented);
  std::vector<kernels::Fingerprint> fps;
  const absl::Status meta =
      FingerprintOnDevice({torch::empty({4}, torch::device(torch::kMeta))}, &fps);
  EXPECT_EQ(meta.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(meta.message()).find("tensors on meta"), std::string::npos)
      << meta.message();
}

TEST(DeviceTest, WithoutTheCudaPathCudaIsRefusedWithTheWayToBuildIt) {
  if (TorchCudaBuilt()) GTEST_SKIP() << "this build has the CUDA path";
  const absl::Status cuda = CheckDevice(torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(cuda.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(cuda.message()).find("--define=sdc_torch_cuda=1"), std::string::npos)
      << cuda.message();
}

}  // namespace
}  // namespace sdc::client
