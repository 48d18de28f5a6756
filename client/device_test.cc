// client/device.h on the CPU (the tests' only device): the kernels it picks,
// the RNG state a replay carries, and what it refuses.

#include "client/device.h"

#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"

namespace sdc::client {
namespace {

const kernels::FingerprintKey& Key() {
  static const auto* key = new kernels::FingerprintKey(kernels::FingerprintKey::FromSeed(77));
  return *key;
}

TEST(DeviceTest, CpuTensorsGetTheCpuKernelsResults) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> dense = {torch::randn({1000}), torch::randn({3, 7}, torch::kDouble),
                                      torch::randn({64}).to(torch::kBFloat16)};
  dense[0][17] = std::numeric_limits<float>::infinity();
  std::vector<kernels::Fingerprint> fps;
  ASSERT_TRUE(FingerprintOnDevice(dense, Key(), &fps).ok());
  std::vector<kernels::ScanResult> scans;
  ASSERT_TRUE(ScanOnDevice(dense, &scans).ok());
  ASSERT_EQ(fps.size(), 3u);
  ASSERT_EQ(scans.size(), 3u);
  for (size_t i = 0; i < dense.size(); ++i) {
    const kernels::ByteSpan span{dense[i].data_ptr(),
                                 static_cast<uint64_t>(dense[i].numel()) * dense[i].element_size()};
    kernels::Fingerprint direct;
    ASSERT_TRUE(kernels::FingerprintTensors({&span, 1}, Key(), {&direct, 1}).ok());
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

TEST(DeviceTest, RestoredRngReplaysTheDraws) {
  const torch::Device cpu(torch::kCPU);
  torch::manual_seed(11);
  const torch::Tensor before = CaptureRng(cpu);
  const torch::Tensor first = torch::rand({8});  // What the original pass drew.
  const torch::Tensor own = CaptureRng(cpu);
  const torch::Tensor second = torch::rand({8});  // What this rank draws next.
  ASSERT_FALSE(torch::equal(first, second));
  ASSERT_TRUE(RestoreRng(cpu, before).ok());
  EXPECT_TRUE(torch::equal(torch::rand({8}), first)) << "a replay draws what the original drew";
  ASSERT_TRUE(RestoreRng(cpu, own).ok());
  EXPECT_TRUE(torch::equal(torch::rand({8}), second)) << "and the rank's own stream goes on";
  // A state of the wrong size changes nothing.
  const torch::Tensor now = CaptureRng(cpu);
  const torch::Tensor expected = torch::rand({8});
  ASSERT_TRUE(RestoreRng(cpu, now).ok());
  const absl::Status bad = RestoreRng(cpu, before.narrow(0, 0, 16).clone());
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.message()).find("same libtorch"), std::string::npos) << bad.message();
  EXPECT_TRUE(torch::equal(torch::rand({8}), expected));
}

TEST(DeviceTest, RefusesWhatItCannotRead) {
  EXPECT_TRUE(CheckDevice(torch::Device(torch::kCPU)).ok());
  EXPECT_EQ(CheckDevice(torch::Device(torch::kMeta)).code(), absl::StatusCode::kUnimplemented);
  std::vector<kernels::Fingerprint> fps;
  const absl::Status meta =
      FingerprintOnDevice({torch::empty({4}, torch::device(torch::kMeta))}, Key(), &fps);
  EXPECT_EQ(meta.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(meta.message()).find("tensors on meta"), std::string::npos)
      << meta.message();
}

// The CUDA path on a GPU (tests/gpu/run.sh runs this binary there): the CUDA
// kernels on the current stream give the CPU's fingerprints and counts, and
// the CUDA generator travels with the RNG state.
class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible to torch";
    if (absl::Status s = kernels::CudaAvailable(); !s.ok()) GTEST_SKIP() << s.message();
  }
};

TEST_F(CudaDeviceTest, CudaTensorsGetTheCpuResults) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> cpu = {torch::randn({1 << 20}), torch::randn({77, 13}, torch::kDouble),
                                    torch::randn({4099}).to(torch::kBFloat16),
                                    torch::randn({513}).to(torch::kHalf)};
  cpu[0][12345] = std::numeric_limits<float>::quiet_NaN();
  cpu[2][7] = -std::numeric_limits<float>::infinity();
  std::vector<torch::Tensor> gpu;
  for (const torch::Tensor& t : cpu) gpu.push_back(t.to(torch::kCUDA));
  std::vector<kernels::Fingerprint> fc, fg;
  std::vector<kernels::ScanResult> sc, sg;
  ASSERT_TRUE(FingerprintOnDevice(cpu, Key(), &fc).ok());
  ASSERT_TRUE(FingerprintOnDevice(gpu, Key(), &fg).ok());
  ASSERT_TRUE(ScanOnDevice(cpu, &sc).ok());
  ASSERT_TRUE(ScanOnDevice(gpu, &sg).ok());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(fc[i], fg[i]) << i;
    EXPECT_EQ(sc[i].nonfinite, sg[i].nonfinite) << i;
  }
  EXPECT_EQ(sg[0].nonfinite, 1u);
  EXPECT_EQ(sg[2].nonfinite, 1u);
  // Mixed devices in one call: each device's tensors go to its kernels.
  std::vector<kernels::Fingerprint> mixed;
  ASSERT_TRUE(FingerprintOnDevice({cpu[0], gpu[1]}, Key(), &mixed).ok());
  EXPECT_EQ(mixed[0], fc[0]);
  EXPECT_EQ(mixed[1], fc[1]);
}

TEST_F(CudaDeviceTest, RestoredRngReplaysCudaDraws) {
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(11);
  const torch::Tensor before = CaptureRng(cuda);
  EXPECT_GT(before.numel(), CaptureRng(torch::Device(torch::kCPU)).numel());
  const torch::Tensor first = torch::rand({64}, torch::device(cuda));
  ASSERT_TRUE(RestoreRng(cuda, before).ok());
  EXPECT_TRUE(torch::equal(torch::rand({64}, torch::device(cuda)), first));
  // A CPU-only state is refused for a CUDA model.
  EXPECT_EQ(RestoreRng(cuda, CaptureRng(torch::Device(torch::kCPU))).code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 24, item 14: a GPU is named as NVML and DCGM name it, so incidents
// and a GPU's history join DCGM's metrics and follow the physical device.
TEST(DeviceTest, GpuUuidsAreFormattedAsNvmlPrintsThem) {
  const unsigned char bytes[16] = {0x5f, 0x0e, 0x7a, 0x2c, 0x1d, 0x2b, 0x4c, 0x3a,
                                   0x9e, 0x8f, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab};
  EXPECT_EQ(GpuUuidString(bytes), "GPU-5f0e7a2c-1d2b-4c3a-9e8f-0123456789ab");
  EXPECT_EQ(DeviceUuid(torch::Device(torch::kCPU)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, TheDeviceUuidIsNvmlsFormat) {
  absl::StatusOr<std::string> uuid = DeviceUuid(torch::Device(torch::kCUDA, 0));
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  EXPECT_EQ(uuid->size(), 40u) << *uuid;
  EXPECT_EQ(uuid->rfind("GPU-", 0), 0u) << *uuid;
}

TEST(DeviceTest, CudaIsRefusedWithTheReasonWhenNoGpuIsUsable) {
  if (kernels::CudaAvailable().ok()) GTEST_SKIP() << "a GPU is usable here: tests/gpu covers it";
  const absl::Status cuda = CheckDevice(torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(cuda.code(), absl::StatusCode::kFailedPrecondition) << cuda.message();
  EXPECT_EQ(cuda.message(), kernels::CudaAvailable().message());
}

// Issue 40, item 6: what audits need of cuBLAS is its own check, so a job
// without audits runs without the variable (GuardEngine turns audits off
// then) and one with audits is refused with the variable named.
TEST(DeviceTest, DeterministicReplaysOnCudaNeedTheCublasWorkspaceSetting) {
  const char* before = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string saved = before != nullptr ? before : "";
  EXPECT_TRUE(CheckDeterministicConfig(torch::Device(torch::kCPU)).ok());
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  absl::Status s = CheckDeterministicConfig(torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("CUBLAS_WORKSPACE_CONFIG is unset"), absl::string_view::npos) << s;
  setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0", 1);
  s = CheckDeterministicConfig(torch::Device(torch::kCUDA, 0));
  EXPECT_NE(s.message().find("is ':0:0'"), absl::string_view::npos) << s;
  for (const char* good : {":4096:8", ":16:8"}) {
    setenv("CUBLAS_WORKSPACE_CONFIG", good, 1);
    EXPECT_TRUE(CheckDeterministicConfig(torch::Device(torch::kCUDA, 0)).ok()) << good;
  }
  if (before != nullptr) {
    setenv("CUBLAS_WORKSPACE_CONFIG", saved.c_str(), 1);
  } else {
    unsetenv("CUBLAS_WORKSPACE_CONFIG");
  }
}

}  // namespace
}  // namespace sdc::client
