// torch's wheel and Debian's gRPC, protobuf and Abseil in one process: the
// libraries the trainer client links together. torch bundles its own copies
// of protobuf (as onnx_torch), fmt and parts of libstdc++; none of them may
// capture a call meant for Debian's. Each test makes real calls through
// both sides in the same process.

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "admin.grpc.pb.h"
#include "client/device.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/sdcd.h"
#include "trainer.pb.h"

namespace sdc {
namespace {

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

TEST(TorchWithGrpcTest, AGrpcCallAndATorchOpInOneProcess) {
  const std::string dir = TestDir("grpc");
  std::filesystem::create_directories(dir);
  absl::StatusOr<std::unique_ptr<testing::Sdcd>> sdcd = testing::Sdcd::Start(dir);
  ASSERT_TRUE(sdcd.ok()) << sdcd.status();

  // A torch op before, between and after gRPC calls.
  torch::manual_seed(5);
  const torch::Tensor a = torch::randn({64, 64});
  const torch::Tensor before = torch::matmul(a, a.t());
  v1::ListJobsResponse jobs;
  grpc::Status status = (*sdcd)->Admin()->ListJobs((*sdcd)->AdminContext().get(),
                                                   v1::ListJobsRequest(), &jobs);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(jobs.jobs_size(), 0);
  EXPECT_TRUE(torch::equal(torch::matmul(a, a.t()), before));

  // A refused call carries gRPC's status through protobuf's error path.
  grpc::ClientContext no_token;
  status = (*sdcd)->Admin()->ListJobs(&no_token, v1::ListJobsRequest(), &jobs);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  // The symmetric product is symmetric (bits, not only values).
  EXPECT_TRUE(torch::equal(before, before.t()));
}

TEST(TorchWithGrpcTest, ProtobufMessagesRoundTripBesideTorch) {
  v1::TrainerMessage m;
  m.mutable_hello()->set_job_id("job");
  m.mutable_hello()->set_world_size(16384);
  std::string wire;
  ASSERT_TRUE(m.SerializeToString(&wire));
  v1::TrainerMessage back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.hello().job_id(), "job");
  EXPECT_EQ(back.hello().world_size(), 16384u);
  const torch::Tensor t = torch::arange(10, torch::kInt64);
  EXPECT_EQ(t.sum().item<int64_t>(), 45);
}

// libtorch.so exports its own std::filesystem::remove_all; bound to it (torch
// before libstdc++ in the link order), this call jumped to address 0 and
// sdc-agent died after every diagnostic.
TEST(TorchWithGrpcTest, LibstdcxxCallsBindToTheSystemLibrary) {
  const std::string dir = TestDir("remove_all") + "/a/b";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  std::error_code error;
  EXPECT_EQ(std::filesystem::remove_all(TestDir("remove_all"), error), 4u) << error.message();
  EXPECT_FALSE(error) << error.message();
  EXPECT_FALSE(std::filesystem::exists(TestDir("remove_all")));
}

TEST(TorchWithGrpcTest, TorchsCudaLibrariesAreLinkedAndLoadWithoutAGpu) {
  // device.cc's CUDA path is in this binary; without a GPU torch says so.
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: tests/gpu covers it";
  EXPECT_EQ(torch::cuda::device_count(), 0u);
  EXPECT_FALSE(client::CheckDevice(torch::Device(torch::kCUDA, 0)).ok());
}

}  // namespace
}  // namespace sdc
