#include "daemon/agents_actuator.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;

class FakeRunner : public NodeActionRunner {
 public:
  std::vector<ActuatorResult> RunActions(const std::vector<core::ReplacementRequest>& requests,
                                         absl::Duration timeout) override {
    timeout_ = timeout;
    std::vector<ActuatorResult> out;
    for (const auto& r : requests) out.push_back({true, "ran on " + r.node});
    return out;
  }
  absl::Duration timeout_;
};

core::ReplacementRequest Request(uint64_t id, const std::string& node) {
  core::ReplacementRequest r;
  r.id = id;
  r.node = node;
  r.action = "replace";
  return r;
}

TEST(AgentsActuatorTest, AgentKindDeliversThroughTheRunner) {
  ActuatorConfig config;
  config.kind = "agent";
  config.timeout = absl::Seconds(42);
  FakeRunner runner;
  auto actuator = MakeActuatorWithAgents(config, &runner);
  ASSERT_TRUE(actuator.ok()) << actuator.status();
  EXPECT_EQ((*actuator)->name(), "agent");
  const std::vector<ActuatorResult> out = (*actuator)->Execute({Request(3, "node-b")});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].detail, "ran on node-b");
  EXPECT_EQ(runner.timeout_, absl::Seconds(42));
}

TEST(AgentsActuatorTest, OtherKindsAreMakeActuatorsAndValidationSeesDryRun) {
  for (const char* kind : {"dry-run", "eks", "slurm"}) {
    ActuatorConfig config;
    config.kind = kind;
    auto actuator = MakeActuatorWithAgents(config, nullptr);
    ASSERT_TRUE(actuator.ok()) << kind;
    EXPECT_EQ((*actuator)->name(), kind);
    EXPECT_EQ(ForValidation(config).kind, kind);
  }
  ActuatorConfig bad;
  bad.kind = "agnet";
  EXPECT_EQ(MakeActuatorWithAgents(bad, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ActuatorConfig agent;
  agent.kind = "agent";
  EXPECT_EQ(ForValidation(agent).kind, "dry-run");
}

// The HyperPod actuator's instance ids come from the cluster's records: the
// operator's file, a HyperPod node name exactly, or the Node's providerID;
// never a substring of a name (a node "x-i-<controller id>" is no
// instance), and an id marked never-replace is refused.
TEST(AgentsActuatorTest, HyperPodInstanceIdsComeFromTheClustersRecords) {
  const std::string dir = testing::TestDir("agents_actuator");
  testing::WriteRecordingStandIn(dir + "/aws", dir + "/aws.calls",
                                 R"({"Successful": [], "Failed": []})");
  // kubectl answers every `get node` with node-d's providerID.
  testing::WriteRecordingStandIn(dir + "/kubectl", dir + "/kubectl.calls",
                                 "aws:///us-west-2a/i-00000000000000ddd");
  setenv("PATH", (dir + ":" + std::getenv("PATH")).c_str(), 1);
  ActuatorConfig config;
  config.kind = "hyperpod";
  config.hyperpod_cluster = "ml-cluster";
  config.node_ids = {{"node-a", "i-00000000000000aaa"}};
  config.never_replace = {"i-0000000000000c0de"};
  auto actuator = MakeActuatorWithAgents(config, nullptr);
  ASSERT_TRUE(actuator.ok()) << actuator.status();
  EXPECT_EQ((*actuator)->name(), "hyperpod");
  const std::vector<ActuatorResult> out = (*actuator)->Execute(
      {Request(1, "node-a"), Request(2, "hyperpod-i-0123456789abcdef0"),
       Request(3, "x-i-0000000000000c0de"), Request(4, "hyperpod-i-0000000000000c0de"),
       Request(5, "node-d")});
  ASSERT_EQ(out.size(), 5u);
  EXPECT_TRUE(out[0].ok) << out[0].detail;
  EXPECT_TRUE(out[1].ok) << out[1].detail;
  EXPECT_FALSE(out[2].ok);
  EXPECT_THAT(out[2].detail, HasSubstr("no HyperPod instance id known for node x-i-"));
  EXPECT_FALSE(out[3].ok);
  EXPECT_THAT(out[3].detail, HasSubstr("is instance i-0000000000000c0de (its HyperPod node "
                                       "name), which is marked never-replace"));
  EXPECT_FALSE(out[4].ok) << "providerIDs are read only when asked";
  EXPECT_EQ(testing::ReadFile(dir + "/aws.calls"),
            "aws sagemaker batch-replace-cluster-nodes --cluster-name ml-cluster --node-ids "
            "i-00000000000000aaa i-0123456789abcdef0 --output json\n");

  config.instance_ids_from_kubernetes = true;
  auto from_nodes = MakeActuatorWithAgents(config, nullptr);
  ASSERT_TRUE(from_nodes.ok());
  const std::vector<ActuatorResult> d = (*from_nodes)->Execute({Request(6, "node-d")});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].ok) << d[0].detail;
  EXPECT_EQ(testing::ReadFile(dir + "/kubectl.calls"),
            "kubectl get node node-d -o jsonpath={.spec.providerID}\n");
  EXPECT_THAT(testing::ReadFile(dir + "/aws.calls"),
              HasSubstr("--node-ids i-00000000000000ddd --output json\n"));
}

}  // namespace
}  // namespace sdc::daemon
