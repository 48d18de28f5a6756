#include "common/identity.h"

#include <string>

#include "gtest/gtest.h"

namespace sdc::common {
namespace {

TEST(IdentityTest, NodeNames) {
  for (const char* name : {"node-b", "ip-10-1-0-31", "hyperpod-i-0123456789abcdef0",
                           "node_b.cluster.local", "N0", "a"}) {
    EXPECT_TRUE(IsSafeNodeName(name)) << name;
  }
  EXPECT_TRUE(IsSafeNodeName(std::string(253, 'n')));
  EXPECT_FALSE(IsSafeNodeName(std::string(254, 'n')));
  for (const char* name : {"", "-rf", "node b", "node;b", "node/b", "node:b", "$(x)", "jöb",
                           "node\n"}) {
    EXPECT_FALSE(IsSafeNodeName(name)) << name;
  }
}

TEST(IdentityTest, GpuIds) {
  for (const char* gpu : {"GPU-3", "GPU-0f1e2d3c-aaaa-bbbb-cccc-0123456789ab",
                          "MIG-GPU-0f1e2d3c/1/0", "cpu-node-b-3", "cpu:0"}) {
    EXPECT_TRUE(IsSafeGpuId(gpu)) << gpu;
  }
  EXPECT_TRUE(IsSafeGpuId(std::string(kMaxGpuIdLength, 'g')));
  EXPECT_FALSE(IsSafeGpuId(std::string(kMaxGpuIdLength + 1, 'g')));
  for (const char* gpu : {"", "-x", "GPU 3", "GPU-3;", "GPU-3\n"}) {
    EXPECT_FALSE(IsSafeGpuId(gpu)) << gpu;
  }
}

TEST(IdentityTest, InstanceIds) {
  EXPECT_TRUE(IsInstanceId("i-0123456789abcdef0"));  // 17 digits.
  EXPECT_TRUE(IsInstanceId("i-0123abcd"));           // 8 digits.
  EXPECT_FALSE(IsInstanceId("i-0123abc"));           // 7.
  EXPECT_FALSE(IsInstanceId("i-0123456789abcdef01"));  // 18.
  EXPECT_FALSE(IsInstanceId("i-0123456789ABCDEF0"));   // Upper case.
  EXPECT_FALSE(IsInstanceId("0123456789abcdef0"));
  EXPECT_FALSE(IsInstanceId(""));
}

TEST(IdentityTest, FromHyperPodNodeNames) {
  EXPECT_EQ(InstanceIdFromNodeName("hyperpod-i-0123456789abcdef0"), "i-0123456789abcdef0");
  EXPECT_EQ(InstanceIdFromNodeName("hyperpod-i-0123456789abcdef0-x"), "");
  // A forged name that embeds a controller's id names no instance.
  EXPECT_EQ(InstanceIdFromNodeName("x-i-0123456789abcdef0"), "");
  EXPECT_EQ(InstanceIdFromNodeName("x-hyperpod-i-0123456789abcdef0"), "");
  EXPECT_EQ(InstanceIdFromNodeName("ip-10-1-0-31"), "");
  EXPECT_EQ(InstanceIdFromNodeName("node-b"), "");
  EXPECT_EQ(InstanceIdFromNodeName("i-0123456789abcdef0"), "");
}

TEST(IdentityTest, FromProviderIds) {
  EXPECT_EQ(InstanceIdFromProviderId("aws:///us-west-2a/i-0123456789abcdef0"),
            "i-0123456789abcdef0");
  EXPECT_EQ(InstanceIdFromProviderId(
                "aws:///usw2-az2/sagemaker/cluster/hyperpod-abc123def456-i-0123456789abcdef0\n"),
            "i-0123456789abcdef0");
  EXPECT_EQ(InstanceIdFromProviderId("aws:///us-west-2a/i-0123456789abcdef0x"), "");
  EXPECT_EQ(InstanceIdFromProviderId("i-0123456789abcdef0"), "");  // Not a providerID.
  EXPECT_EQ(InstanceIdFromProviderId("kind://docker/kind/kind-worker"), "");
  EXPECT_EQ(InstanceIdFromProviderId(""), "");
}

}  // namespace
}  // namespace sdc::common
