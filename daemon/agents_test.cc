#include "daemon/agents.h"

#include <functional>
#include <string>
#include <vector>

#include "daemon/core/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

AgentIdentity Identity(const std::string& node, std::vector<std::string> gpus = {}) {
  AgentIdentity id;
  id.node_name = node;
  id.hostname = node + ".local";
  id.agent_version = "0.1.0";
  id.heartbeat_interval = absl::Seconds(10);
  uint32_t index = 0;
  for (const std::string& uuid : gpus) id.gpus.push_back({uuid, "NVIDIA H100", index++});
  return id;
}

DeviceResult Passed(const std::string& gpu, uint32_t device_count = 1) {
  DeviceResult r;
  r.gpu = gpu;
  r.device = gpu == "cpu" ? "cpu" : "cuda:0";
  r.pass = true;
  r.size = 1024;
  r.repetitions = 3;
  r.device_count = device_count;
  return r;
}

DeviceResult Wrong(const std::string& gpu, uint32_t device_count = 1) {
  DeviceResult r = Passed(gpu, device_count);
  r.pass = false;
  r.mismatches = 1;
  r.max_abs_error = 1;
  return r;
}

DeviceResult Errored(const std::string& gpu, uint32_t device_count = 1) {
  DeviceResult r = Passed(gpu, device_count);
  r.pass = false;
  r.error = "CUDA is not usable";
  return r;
}

class AgentRegistryTest : public ::testing::Test {
 protected:
  AgentRegistryTest() : registry_(AgentRegistryOptions{}, &clock_) {}

  uint64_t Register(const AgentIdentity& id) {
    absl::StatusOr<AgentRegistry::Registration> r = registry_.Register(id);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->session : 0;
  }

  NodeStatus StatusOf(const std::string& node) {
    absl::StatusOr<NodeView> n = registry_.GetNode(node);
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? n->status : NodeStatus::kDisconnected;
  }

  core::FakeClock clock_;
  AgentRegistry registry_;
};

TEST_F(AgentRegistryTest, ReadyWhileHeartbeatsComeStaleAfterThreeMissedDisconnectedAfterEnd) {
  const uint64_t s = Register(Identity("node-a", {"GPU-1", "GPU-2"}));
  EXPECT_EQ(StatusOf("node-a"), NodeStatus::kReady);
  clock_.Advance(absl::Seconds(30));  // Exactly three periods: not yet stale.
  EXPECT_EQ(StatusOf("node-a"), NodeStatus::kReady);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(StatusOf("node-a"), NodeStatus::kStale);
  ASSERT_TRUE(registry_.Heartbeat("node-a", s).ok());
  EXPECT_EQ(StatusOf("node-a"), NodeStatus::kReady);
  absl::StatusOr<NodeView> n = registry_.GetNode("node-a");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->last_heartbeat, clock_.Now());
  EXPECT_EQ(n->identity.gpus.size(), 2u);
  EXPECT_EQ(n->identity.hostname, "node-a.local");
  EXPECT_TRUE(registry_.Disconnect("node-a", s).empty());
  EXPECT_EQ(StatusOf("node-a"), NodeStatus::kDisconnected);
  // Known nodes stay listed, by name.
  Register(Identity("node-0"));
  std::vector<std::string> names;
  for (const NodeView& v : registry_.ListNodes()) names.push_back(v.identity.node_name);
  EXPECT_THAT(names, ElementsAre("node-0", "node-a"));
  EXPECT_EQ(registry_.GetNode("node-z").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AgentRegistryTest, RegisterRefusesWhatActuatorsCouldNotUse) {
  struct Case {
    std::function<void(AgentIdentity&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](AgentIdentity& i) { i.node_name = "node b"; },
       "node_name 'node b' is not a node name ([A-Za-z0-9._-], 1 to 253 characters)"},
      {[](AgentIdentity& i) { i.node_name = "-rf"; },
       "node_name '-rf' is not a node name ([A-Za-z0-9._-], 1 to 253 characters)"},
      {[](AgentIdentity& i) { i.instance_id = "i-123"; },
       "instance_id 'i-123' is not i- and 8 to 17 hex digits"},
      {[](AgentIdentity& i) { i.heartbeat_interval = absl::ZeroDuration(); },
       "heartbeat_interval_ms 0 is out of range (1000..600000)"},
      {[](AgentIdentity& i) { i.gpus = {{"GPU-1", "", 0}, {"GPU-1", "", 1}}; },
       "GPU UUID 'GPU-1' is empty or listed twice"},
  };
  for (const Case& k : cases) {
    AgentIdentity id = Identity("node-a");
    k.mutate(id);
    absl::StatusOr<AgentRegistry::Registration> r = registry_.Register(id);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << k.message;
    EXPECT_EQ(r.status().message(), k.message);
  }
  EXPECT_THAT(registry_.ListNodes(), IsEmpty());
}

TEST_F(AgentRegistryTest, DiagnosticLifecycleAcrossTwoDevices) {
  const uint64_t s = Register(Identity("node-b", {"GPU-1", "GPU-2"}));
  absl::StatusOr<Diagnostic> d = registry_.StartDiagnostic("node-b", "", 0, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->id, 1u);
  EXPECT_EQ(d->size, 1024u);  // Defaults resolved here, as the agent would.
  EXPECT_EQ(d->repetitions, 3u);
  EXPECT_EQ(d->session, s);
  EXPECT_EQ(d->state, DiagnosticState::kRunning);
  absl::StatusOr<AgentEvents> e = registry_.RecordDiagnosticResult("node-b", s, 1, Passed("GPU-1", 2));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->empty());  // One of two devices.
  clock_.Advance(absl::Seconds(5));
  e = registry_.RecordDiagnosticResult("node-b", s, 1, Passed("GPU-2", 2));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->diagnostics.size(), 1u);
  EXPECT_EQ(e->diagnostics[0].state, DiagnosticState::kPassed);
  EXPECT_EQ(e->diagnostics[0].results.size(), 2u);
  EXPECT_EQ(e->diagnostics[0].finished, clock_.Now());
  EXPECT_EQ(registry_.GetDiagnostic(1)->state, DiagnosticState::kPassed);
  // A result after it finished is not for a running diagnostic.
  EXPECT_EQ(registry_.RecordDiagnosticResult("node-b", s, 1, Passed("GPU-2", 2)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(AgentRegistryTest, WrongValuesFailAndOutrankErrors) {
  const uint64_t s = Register(Identity("node-b", {"GPU-1", "GPU-2"}));
  struct Case {
    DeviceResult first, second;
    DiagnosticState want;
  };
  const std::vector<Case> cases = {
      {Passed("GPU-1", 2), Passed("GPU-2", 2), DiagnosticState::kPassed},
      {Passed("GPU-1", 2), Wrong("GPU-2", 2), DiagnosticState::kFailed},
      {Errored("GPU-1", 2), Passed("GPU-2", 2), DiagnosticState::kError},
      {Errored("GPU-1", 2), Wrong("GPU-2", 2), DiagnosticState::kFailed},
  };
  for (const Case& k : cases) {
    absl::StatusOr<Diagnostic> d = registry_.StartDiagnostic("node-b", "", 64, 1);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(registry_.RecordDiagnosticResult("node-b", s, d->id, k.first).ok());
    absl::StatusOr<AgentEvents> e = registry_.RecordDiagnosticResult("node-b", s, d->id, k.second);
    ASSERT_TRUE(e.ok());
    ASSERT_EQ(e->diagnostics.size(), 1u);
    EXPECT_EQ(e->diagnostics[0].state, k.want) << d->id;
  }
  // "pass" with mismatches is not a pass.
  absl::StatusOr<Diagnostic> d = registry_.StartDiagnostic("node-b", "GPU-1", 64, 1);
  DeviceResult odd = Passed("GPU-1");
  odd.mismatches = 3;
  EXPECT_EQ(registry_.RecordDiagnosticResult("node-b", s, d->id, odd)->diagnostics[0].state,
            DiagnosticState::kFailed);
}

TEST_F(AgentRegistryTest, StartDiagnosticRefusals) {
  EXPECT_EQ(registry_.StartDiagnostic("node-z", "", 0, 0).status().message(),
            "no agent has registered node node-z (sdcctl get nodes lists those that have)");
  const uint64_t s = Register(Identity("node-b", {"GPU-1"}));
  absl::StatusOr<Diagnostic> d = registry_.StartDiagnostic("node-b", "GPU-9", 0, 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.status().message(), "node node-b has no GPU GPU-9 (its GPUs: GPU-1; or \"cpu\")");
  EXPECT_TRUE(registry_.StartDiagnostic("node-b", "cpu", 0, 0).ok());
  d = registry_.StartDiagnostic("node-b", "", 9000, 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.status().message(), "size 9000 is out of range (1..8192)");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(registry_.StartDiagnostic("node-b", "", 8, 1).ok());
  d = registry_.StartDiagnostic("node-b", "", 8, 1);  // A fifth running one.
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.status().message(), "node node-b already runs 4 diagnostics; wait for one to finish");
  registry_.Disconnect("node-b", s);
  clock_.Advance(absl::Seconds(75));
  d = registry_.StartDiagnostic("node-b", "", 0, 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status().message(),
            "the agent of node node-b is not connected (last heartbeat 1m15s ago)");
}

TEST_F(AgentRegistryTest, ResultsAreCheckedAgainstTheirStream) {
  const uint64_t s = Register(Identity("node-b"));
  absl::StatusOr<Diagnostic> d = registry_.StartDiagnostic("node-b", "", 8, 1);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(registry_.RecordDiagnosticResult("node-b", s + 100, d->id, Passed("cpu")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.RecordDiagnosticResult("node-b", s, d->id + 100, Passed("cpu")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.RecordDiagnosticResult("node-b", s, d->id, Passed("cpu", 0)).status().message(),
            "diagnostic 1: device_count 0 is out of range (1..64)");
  ASSERT_TRUE(registry_.RecordDiagnosticResult("node-b", s, d->id, Passed("cpu", 2)).ok());
  EXPECT_EQ(registry_.RecordDiagnosticResult("node-b", s, d->id, Passed("cpu", 3)).status().message(),
            "diagnostic 1: device_count 3 after 2");
}

TEST_F(AgentRegistryTest, AStreamThatEndsOrIsReplacedFailsWhatItLeftUnanswered) {
  const uint64_t first = Register(Identity("node-b"));
  ASSERT_TRUE(registry_.StartDiagnostic("node-b", "", 8, 1).ok());
  ASSERT_TRUE(registry_.StartAction("node-b", {7, "replace", ""}).ok());
  // The agent reconnects before sdcd noticed the old stream end.
  absl::StatusOr<AgentRegistry::Registration> r = registry_.Register(Identity("node-b"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->replaced_session, first);
  ASSERT_EQ(r->events.diagnostics.size(), 1u);
  EXPECT_EQ(r->events.diagnostics[0].state, DiagnosticState::kError);
  EXPECT_EQ(r->events.diagnostics[0].error,
            "a newer stream of the node's agent replaced the one it was sent on before it answered");
  ASSERT_EQ(r->events.actions.size(), 1u);
  EXPECT_EQ(r->events.actions[0].request_id, 7u);
  EXPECT_FALSE(r->events.actions[0].ok);
  EXPECT_EQ(r->events.actions[0].detail,
            "a newer stream of the node's agent replaced the one it was sent on before it "
            "reported a result; the action may have run (a reboot ends the stream)");
  EXPECT_EQ(registry_.Heartbeat("node-b", first).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(registry_.Disconnect("node-b", first).empty());  // The old stream's end: no-op.
  EXPECT_EQ(StatusOf("node-b"), NodeStatus::kReady);
  // The new stream ends: its diagnostic fails the same way.
  ASSERT_TRUE(registry_.StartDiagnostic("node-b", "", 8, 1).ok());
  AgentEvents e = registry_.Disconnect("node-b", r->session);
  ASSERT_EQ(e.diagnostics.size(), 1u);
  EXPECT_EQ(e.diagnostics[0].error, "the agent's stream ended before it answered");
}

TEST_F(AgentRegistryTest, ActionsAreSentNowOrQueuedUntilTheAgentRegisters) {
  EXPECT_EQ(registry_.StartAction("node-b", {7, "replace", ""}).status().code(),
            absl::StatusCode::kNotFound);
  const uint64_t s = Register(Identity("node-b"));
  absl::StatusOr<AgentRegistry::ActionDelivery> a = registry_.StartAction("node-b", {7, "replace", ""});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->send_now);
  EXPECT_EQ(a->session, s);
  a = registry_.StartAction("node-b", {7, "replace", ""});  // Asked again: not sent twice.
  EXPECT_FALSE(a->send_now);
  EXPECT_EQ(registry_.RecordActionResult("node-b", s + 1, 7, true, "ok").status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<AgentEvents> e = registry_.RecordActionResult("node-b", s, 7, true, "ran");
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->actions.size(), 1u);
  EXPECT_EQ(e->actions[0].node, "node-b");
  EXPECT_TRUE(e->actions[0].ok);
  EXPECT_EQ(e->actions[0].detail, "ran");
  EXPECT_EQ(registry_.RecordActionResult("node-b", s, 7, true, "again").status().code(),
            absl::StatusCode::kNotFound);
  // Disconnected: queued, then sent on the next registration.
  registry_.Disconnect("node-b", s);
  a = registry_.StartAction("node-b", {8, "reboot", "hint"});
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->send_now);
  EXPECT_EQ(a->session, 0u);
  absl::StatusOr<AgentRegistry::Registration> r = registry_.Register(Identity("node-b"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->actions.size(), 1u);
  EXPECT_EQ(r->actions[0].request_id, 8u);
  EXPECT_EQ(r->actions[0].action, "reboot");
  EXPECT_EQ(r->actions[0].command_hint, "hint");
  // Given up: a late answer is refused.
  registry_.CancelAction("node-b", 8);
  EXPECT_EQ(registry_.RecordActionResult("node-b", r->session, 8, true, "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(AgentRegistryTest, TickEndsDiagnosticsPastTheTimeout) {
  Register(Identity("node-b"));
  ASSERT_TRUE(registry_.StartDiagnostic("node-b", "", 8, 1).ok());
  clock_.Advance(absl::Minutes(30) - absl::Seconds(1));
  EXPECT_TRUE(registry_.Tick().empty());
  clock_.Advance(absl::Seconds(1));
  AgentEvents e = registry_.Tick();
  ASSERT_EQ(e.diagnostics.size(), 1u);
  EXPECT_EQ(e.diagnostics[0].state, DiagnosticState::kError);
  EXPECT_EQ(e.diagnostics[0].error, "no answer from the agent within 30m");
}

TEST(AgentRegistryKeepTest, KeepsTheLastFinishedDiagnosticsNewestFirst) {
  core::FakeClock clock;
  AgentRegistryOptions options;
  options.diagnostics_kept_per_node = 2;
  AgentRegistry registry(options, &clock);
  const uint64_t s = registry.Register(Identity("node-b"))->session;
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(registry.StartDiagnostic("node-b", "", 8, 1).ok());
    ASSERT_TRUE(registry.RecordDiagnosticResult("node-b", s, id, Passed("cpu")).ok());
  }
  ASSERT_TRUE(registry.StartDiagnostic("node-b", "", 8, 1).ok());  // 4, running: kept.
  absl::StatusOr<NodeView> n = registry.GetNode("node-b");
  ASSERT_TRUE(n.ok());
  std::vector<uint64_t> ids;
  for (const Diagnostic& d : n->diagnostics) ids.push_back(d.id);
  EXPECT_THAT(ids, ElementsAre(4, 3, 2));
  EXPECT_EQ(registry.GetDiagnostic(1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AgentRegistryTest, GpuIdsAreWhatTheNodesAgentListed) {
  AgentIdentity a = Identity("node-a");
  a.gpus = {{"GPU-aaaa", "H100", 0}, {"GPU-bbbb", "H100", 1}};
  Register(a);
  Register(Identity("node-b"));
  EXPECT_THAT(registry_.GpuIds("node-a"), ElementsAre("GPU-aaaa", "GPU-bbbb"));
  EXPECT_TRUE(registry_.GpuIds("node-b").empty());
  EXPECT_TRUE(registry_.GpuIds("node-c").empty());
}

}  // namespace
}  // namespace sdc::daemon
