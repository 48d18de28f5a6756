#include "common/identity.h"

#include "gtest/gtest.h"

namespace sdc::common {
namespace {

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
  EXPECT_EQ(InstanceIdFromNodeName("ip-10-1-0-31"), "");
  EXPECT_EQ(InstanceIdFromNodeName("node-b"), "");
  EXPECT_EQ(InstanceIdFromNodeName("i-0123456789abcdef0"), "");
}

}  // namespace
}  // namespace sdc::common
