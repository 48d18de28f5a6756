#include "common/diagnostic_plan.h"

#include "gtest/gtest.h"

namespace sdc::common {
namespace {

TEST(ResolveShapeTest, DefaultsAndLimits) {
  absl::StatusOr<Shape> s = ResolveShape(0, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size, 1024u);
  EXPECT_EQ(s->repetitions, 3u);
  s = ResolveShape(8192, 1000);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size, 8192u);
  EXPECT_EQ(s->repetitions, 1000u);
  s = ResolveShape(1, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size, 1u);
  EXPECT_EQ(ResolveShape(8193, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveShape(8193, 1).status().message(), "size 8193 is out of range (1..8192)");
  EXPECT_EQ(ResolveShape(16, 1001).status().message(),
            "repetitions 1001 is out of range (1..1000)");
}

TEST(ExactInFp32Test, Boundary) {
  // 64 n < 2^24  <=>  n <= 262143.
  EXPECT_TRUE(ExactInFp32(262143));
  EXPECT_FALSE(ExactInFp32(262144));
}

TEST(PlanDevicesTest, OneGpuAllGpusOrTheCpu) {
  const std::vector<GpuRef> gpus = {{"GPU-a", 0}, {"GPU-b", 1}};
  auto all = PlanDevices("", gpus);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].label, "GPU-a");
  EXPECT_EQ((*all)[0].cuda_index, 0);
  EXPECT_EQ((*all)[1].label, "GPU-b");
  EXPECT_EQ((*all)[1].cuda_index, 1);
  auto one = PlanDevices("GPU-b", gpus);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].cuda_index, 1);
  auto cpu = PlanDevices("cpu", gpus);
  ASSERT_TRUE(cpu.ok());
  ASSERT_EQ(cpu->size(), 1u);
  EXPECT_EQ((*cpu)[0].label, "cpu");
  EXPECT_EQ((*cpu)[0].cuda_index, -1);
  auto none = PlanDevices("", {});
  ASSERT_TRUE(none.ok());
  ASSERT_EQ(none->size(), 1u);
  EXPECT_EQ((*none)[0].label, "cpu");
}

TEST(PlanDevicesTest, UnknownGpuIsNotFound) {
  auto missing = PlanDevices("GPU-z", {{"GPU-a", 0}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "no GPU GPU-z on this node (GPUs: GPU-a; or \"cpu\")");
  EXPECT_EQ(PlanDevices("GPU-z", {}).status().message(),
            "no GPU GPU-z on this node (GPUs: none; or \"cpu\")");
}

}  // namespace
}  // namespace sdc::common
