#include "agent/gpus.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::agent {
namespace {

using ::testing::StartsWith;

// The fake NVML built next to this test (agent/testdata/fake_nvml.cc).
std::string FakeNvml() {
  return std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") +
         "/agent/libfake_nvml.so";
}

// Holds the fake loaded for the whole test, so ListGpus's dlopen/dlclose
// share its state and the test can read how many nvmlInit_v2 calls were
// not shut down.
class GpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = dlopen(FakeNvml().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
  }
  void TearDown() override {
    unsetenv("FAKE_NVML");
    if (handle_ != nullptr) dlclose(handle_);
  }
  int OpenInits() {
    auto inits = reinterpret_cast<int (*)()>(dlsym(handle_, "sdc_fake_nvml_inits"));
    return inits == nullptr ? -1 : inits();
  }

  void* handle_ = nullptr;
};

TEST_F(GpusTest, ListsEveryGpuInIndexOrder) {
  absl::StatusOr<std::vector<Gpu>> gpus = ListGpus(FakeNvml());
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].uuid, "GPU-11111111-0000-0000-0000-000000000000");
  EXPECT_EQ((*gpus)[0].model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ((*gpus)[0].index, 0u);
  EXPECT_EQ((*gpus)[1].uuid, "GPU-22222222-0000-0000-0000-000000000000");
  EXPECT_EQ((*gpus)[1].index, 1u);
  EXPECT_EQ(OpenInits(), 0);  // nvmlShutdown was called.
}

TEST_F(GpusTest, NoLibraryIsFailedPreconditionWithTheReason) {
  absl::StatusOr<std::vector<Gpu>> gpus = ListGpus("/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(gpus.status().message());
  EXPECT_EQ(message,
            "NVML: cannot load /nonexistent/libnvidia-ml.so.1: cannot open shared object file: "
            "No such file or directory (no NVIDIA driver on this node?)");
}

TEST_F(GpusTest, DriverNotLoadedIsFailedPrecondition) {
  setenv("FAKE_NVML", "driver_not_loaded", 1);
  absl::StatusOr<std::vector<Gpu>> gpus = ListGpus(FakeNvml());
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpus.status().message(), "NVML: nvmlInit_v2 returned 9 (Driver Not Loaded)");
}

TEST_F(GpusTest, AFailedQueryIsInternalAndStillShutsDown) {
  setenv("FAKE_NVML", "uuid_fails", 1);
  absl::StatusOr<std::vector<Gpu>> gpus = ListGpus(FakeNvml());
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(gpus.status().message(), "NVML: nvmlDeviceGetUUID(1) returned 999 (Unknown Error)");
  EXPECT_EQ(OpenInits(), 0);
}

// The real library: absent on machines without a driver (then the agent
// reports zero GPUs); listed when present. Either way a clear answer.
TEST_F(GpusTest, TheRealLibraryAnswersOrSaysWhyNot) {
  absl::StatusOr<std::vector<Gpu>> gpus = ListGpus();
  if (!gpus.ok()) {
    EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition) << gpus.status();
    std::printf("no NVML here: %s\n", std::string(gpus.status().message()).c_str());
    return;
  }
  for (const Gpu& g : *gpus) {
    EXPECT_THAT(g.uuid, StartsWith("GPU-"));
    std::printf("GPU %u: %s %s\n", g.index, g.uuid.c_str(), g.model.c_str());
  }
}

}  // namespace
}  // namespace sdc::agent
