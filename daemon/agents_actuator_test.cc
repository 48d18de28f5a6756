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
  auto actuator = MakeActuatorWithAgents(config, &runner, nullptr);
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
    auto actuator = MakeActuatorWithAgents(config, nullptr, nullptr);
    ASSERT_TRUE(actuator.ok()) << kind;
    EXPECT_EQ((*actuator)->name(), kind);
    EXPECT_EQ(ForValidation(config).kind, kind);
  }
  ActuatorConfig bad;
  bad.kind = "agnet";
  EXPECT_EQ(MakeActuatorWithAgents(bad, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ActuatorConfig agent;
  agent.kind = "agent";
  EXPECT_EQ(ForValidation(agent).kind, "dry-run");
}

// The HyperPod actuator asks the agents for instance ids at every batch;
// the operator's file wins where both name a node.
TEST(AgentsActuatorTest, HyperPodTakesInstanceIdsFromTheAgents) {
  const std::string dir = testing::TestDir("agents_actuator");
  testing::WriteRecordingStandIn(dir + "/aws", dir + "/aws.calls",
                                 R"({"Successful": [], "Failed": []})");
  setenv("PATH", (dir + ":" + std::getenv("PATH")).c_str(), 1);
  ActuatorConfig config;
  config.kind = "hyperpod";
  config.hyperpod_cluster = "ml-cluster";
  config.node_ids = {{"node-a", "i-00000000000000aaa"}};
  std::map<std::string, std::string> from_agents = {{"node-a", "i-11111111111111aaa"}};
  auto actuator = MakeActuatorWithAgents(config, nullptr, [&] { return from_agents; });
  ASSERT_TRUE(actuator.ok()) << actuator.status();
  EXPECT_EQ((*actuator)->name(), "hyperpod");
  // node-b registered after the actuator was made.
  from_agents["node-b"] = "i-0123456789abcdef0";
  const std::vector<ActuatorResult> out =
      (*actuator)->Execute({Request(1, "node-a"), Request(2, "node-b"), Request(3, "node-c")});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].ok) << out[0].detail;
  EXPECT_TRUE(out[1].ok) << out[1].detail;
  EXPECT_FALSE(out[2].ok);
  EXPECT_EQ(out[2].detail, "no HyperPod instance id known for node node-c");
  EXPECT_EQ(testing::ReadFile(dir + "/aws.calls"),
            "aws sagemaker batch-replace-cluster-nodes --cluster-name ml-cluster --node-ids "
            "i-00000000000000aaa i-0123456789abcdef0 --output json\n");
}

}  // namespace
}  // namespace sdc::daemon
