// AgentHub, the join of the registry, the agents' streams and the waiters,
// with recording sinks in place of gRPC streams and a fake clock. The
// reactors themselves run over real sockets in tests/agent_e2e_test.cc.

#include "daemon/agent_service.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/core/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;

class RecordingSink : public AgentSink {
 public:
  void Push(v1::CoordinatorToAgent message) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(std::move(message));
  }
  void End(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    ended_ = status;
  }
  std::vector<v1::CoordinatorToAgent> messages() {
    absl::MutexLock lock(&mu_);
    return messages_;
  }
  // Waits (bounded) until a NodeAction arrives; its request id, or 0.
  uint64_t WaitAction(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& m : messages_) {
        if (m.has_action()) return true;
      }
      return false;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&has), timeout)) return 0;
    for (const auto& m : messages_) {
      if (m.has_action()) return m.action().request_id();
    }
    return 0;
  }
  absl::Status ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CoordinatorToAgent> messages_ ABSL_GUARDED_BY(mu_);
  absl::Status ended_ ABSL_GUARDED_BY(mu_) = absl::OkStatus();
};

AgentIdentity Identity(const std::string& node) {
  AgentIdentity id;
  id.node_name = node;
  id.heartbeat_interval = absl::Seconds(10);
  return id;
}

core::ReplacementRequest Request(uint64_t id, const std::string& node) {
  core::ReplacementRequest r;
  r.id = id;
  r.node = node;
  r.action = "replace";
  return r;
}

v1::DiagnosticResult Result(uint64_t id, bool pass) {
  v1::DiagnosticResult r;
  r.set_id(id);
  r.set_gpu("cpu");
  r.set_pass(pass);
  r.set_mismatches(pass ? 0 : 1);
  r.set_device_count(1);
  return r;
}

class AgentHubTest : public ::testing::Test {
 protected:
  AgentHubTest() : registry_(AgentRegistryOptions{}, &clock_), hub_(&registry_, &clock_) {}

  uint64_t Open(const std::string& node, std::shared_ptr<RecordingSink> sink) {
    absl::StatusOr<uint64_t> s = hub_.OpenStream(Identity(node), sink);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : 0;
  }

  core::FakeClock clock_;
  AgentRegistry registry_;
  AgentHub hub_;
};

TEST_F(AgentHubTest, WelcomesSendsDiagnosticsAndEndsAReplacedStream) {
  auto first = std::make_shared<RecordingSink>();
  Open("node-b", first);
  ASSERT_EQ(first->messages().size(), 1u);
  EXPECT_TRUE(first->messages()[0].has_welcome());
  absl::StatusOr<Diagnostic> d = hub_.StartDiagnostic("node-b", "", 0, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(first->messages().size(), 2u);
  const v1::DiagnosticRequest& q = first->messages()[1].diagnostic();
  EXPECT_EQ(q.id(), d->id);
  EXPECT_EQ(q.gpu_uuid(), "");
  EXPECT_EQ(q.size(), 1024u);
  EXPECT_EQ(q.repetitions(), 5u);
  auto second = std::make_shared<RecordingSink>();
  Open("node-b", second);
  EXPECT_EQ(first->ended().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(second->ended().ok());
}

TEST_F(AgentHubTest, AwaitDiagnosticAnswersOnTheResultTheDeadlineOrAtOnce) {
  auto sink = std::make_shared<RecordingSink>();
  const uint64_t s = Open("node-b", sink);
  std::vector<absl::StatusOr<Diagnostic>> answers;
  auto record = [&](absl::StatusOr<Diagnostic> d) { answers.push_back(std::move(d)); };

  // The result arrives.
  absl::StatusOr<Diagnostic> d = hub_.StartDiagnostic("node-b", "", 8, 1);
  hub_.AwaitDiagnostic(d->id, clock_.Now() + absl::Seconds(10), record);
  EXPECT_TRUE(answers.empty());
  ASSERT_TRUE(hub_.RecordDiagnosticResult("node-b", s, Result(d->id, false)).ok());
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0]->state, DiagnosticState::kFailed);
  // Already finished: at once.
  hub_.AwaitDiagnostic(d->id, clock_.Now() + absl::Seconds(10), record);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[1]->state, DiagnosticState::kFailed);
  // Unknown: NotFound at once.
  hub_.AwaitDiagnostic(999, clock_.Now() + absl::Seconds(10), record);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[2].status().code(), absl::StatusCode::kNotFound);
  // No result: the deadline answers with the diagnostic still running.
  d = hub_.StartDiagnostic("node-b", "", 8, 1);
  hub_.AwaitDiagnostic(d->id, clock_.Now() + absl::Seconds(10), record);
  clock_.Advance(absl::Seconds(9));
  hub_.Tick();
  EXPECT_EQ(answers.size(), 3u);
  clock_.Advance(absl::Seconds(1));
  hub_.Tick();
  ASSERT_EQ(answers.size(), 4u);
  EXPECT_EQ(answers[3]->state, DiagnosticState::kRunning);
  // The stream ends: its waiter hears the error.
  d = hub_.StartDiagnostic("node-b", "", 8, 1);
  hub_.AwaitDiagnostic(d->id, clock_.Now() + absl::Seconds(10), record);
  hub_.CloseStream("node-b", s);
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_EQ(answers[4]->state, DiagnosticState::kError);
  EXPECT_EQ(answers[4]->error, "the agent's stream ended before it answered");
}

TEST_F(AgentHubTest, RunActionsWaitsForTheAgentsAnswer) {
  auto sink = std::make_shared<RecordingSink>();
  const uint64_t s = Open("node-b", sink);
  std::thread agent([&] {
    const uint64_t id = sink->WaitAction(absl::Seconds(10));
    v1::ActionResult r;
    r.set_request_id(id);
    r.set_ok(true);
    r.set_detail("/usr/local/bin/node-action replace 7: ok");
    ASSERT_TRUE(hub_.RecordActionResult("node-b", s, r).ok());
  });
  const std::vector<ActuatorResult> out =
      hub_.RunActions({Request(7, "node-b"), Request(8, "node-z")}, absl::Seconds(30));
  agent.join();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].ok);
  EXPECT_EQ(out[0].detail, "agent on node-b: /usr/local/bin/node-action replace 7: ok");
  EXPECT_FALSE(out[1].ok);
  EXPECT_EQ(out[1].detail, "agent: no agent has registered node node-z");
  // The action told the agent what the orchestrator would be told.
  for (const auto& m : sink->messages()) {
    if (!m.has_action()) continue;
    EXPECT_EQ(m.action().action(), "replace");
    EXPECT_THAT(m.action().command_hint(),
                HasSubstr("scontrol update node=node-b state=fail reason=Action:Replace"));
  }
}

TEST_F(AgentHubTest, RunActionsGivesUpAtTheTimeoutAndRefusesTheLateAnswer) {
  auto sink = std::make_shared<RecordingSink>();
  const uint64_t s = Open("node-b", sink);
  const std::vector<ActuatorResult> out =
      hub_.RunActions({Request(7, "node-b")}, absl::Milliseconds(200));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].ok);
  EXPECT_EQ(out[0].detail, "agent on node-b: no result within 200ms");
  v1::ActionResult late;
  late.set_request_id(7);
  late.set_ok(true);
  EXPECT_EQ(hub_.RecordActionResult("node-b", s, late).code(), absl::StatusCode::kNotFound);
  // Not connected: queued, never delivered within the timeout.
  hub_.CloseStream("node-b", s);
  const std::vector<ActuatorResult> queued =
      hub_.RunActions({Request(9, "node-b")}, absl::Milliseconds(100));
  EXPECT_EQ(queued[0].detail,
            "agent on node-b: no result within 100ms (its agent was not connected)");
}

TEST_F(AgentHubTest, AQueuedActionIsDeliveredWhenTheAgentComesBack) {
  auto old_sink = std::make_shared<RecordingSink>();
  hub_.CloseStream("node-b", Open("node-b", old_sink));
  auto sink = std::make_shared<RecordingSink>();
  std::thread agent([&] {
    absl::SleepFor(absl::Milliseconds(100));  // The agent restarts meanwhile.
    const uint64_t s = Open("node-b", sink);
    const uint64_t id = sink->WaitAction(absl::Seconds(10));
    v1::ActionResult r;
    r.set_request_id(id);
    r.set_ok(false);
    r.set_detail("no node-local action configured");
    ASSERT_TRUE(hub_.RecordActionResult("node-b", s, r).ok());
  });
  const std::vector<ActuatorResult> out =
      hub_.RunActions({Request(7, "node-b")}, absl::Seconds(30));
  agent.join();
  EXPECT_FALSE(out[0].ok);
  EXPECT_EQ(out[0].detail, "agent on node-b: no node-local action configured");
  ASSERT_GE(sink->messages().size(), 2u);
  EXPECT_TRUE(sink->messages()[0].has_welcome());
  EXPECT_EQ(sink->messages()[1].action().request_id(), 7u);
}

TEST_F(AgentHubTest, ShutdownEndsTheWait) {
  Open("node-b", std::make_shared<RecordingSink>());
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(100));
    hub_.Shutdown();
  });
  const absl::Time start = absl::Now();
  const std::vector<ActuatorResult> out = hub_.RunActions({Request(7, "node-b")}, absl::Minutes(5));
  stopper.join();
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
  EXPECT_EQ(out[0].detail, "agent on node-b: sdcd is shutting down");
}

TEST(ConversionTest, IdentityAndDiagnosticRoundTrip) {
  v1::NodeIdentity p;
  p.set_node_name("hyperpod-i-0123456789abcdef0");
  p.set_hostname("ip-10-1-0-31");
  p.set_instance_id("i-0123456789abcdef0");
  p.set_agent_version("0.1.0");
  p.set_heartbeat_interval_ms(30'000);
  p.set_gpu_note("");
  v1::GpuIdentity* g = p.add_gpus();
  g->set_uuid("GPU-1");
  g->set_model("NVIDIA H100");
  g->set_index(3);
  const AgentIdentity id = FromProto(p);
  EXPECT_EQ(id.heartbeat_interval, absl::Seconds(30));
  ASSERT_EQ(id.gpus.size(), 1u);
  EXPECT_EQ(id.gpus[0].index, 3u);
  NodeView view{id, NodeStatus::kStale, absl::FromUnixMillis(1000), absl::FromUnixMillis(2000), {}};
  const v1::Node node = ToProto(view);
  EXPECT_EQ(node.status(), v1::NODE_STALE);
  EXPECT_EQ(node.instance_id(), "i-0123456789abcdef0");
  EXPECT_EQ(node.last_heartbeat_unix_ms(), 2000);
  EXPECT_EQ(node.gpus(0).uuid(), "GPU-1");
  EXPECT_EQ(node.heartbeat_interval_ms(), 30'000u);

  v1::DiagnosticResult r = Result(4, false);
  r.set_max_abs_error(1);
  r.set_seconds(0.5);
  r.set_device("cuda:3");
  const v1::DiagnosticResult back = ToProto(FromProto(r), 4);
  EXPECT_EQ(back.SerializeAsString(), r.SerializeAsString());
  Diagnostic d;
  d.id = 4;
  d.node = "node-b";
  d.state = DiagnosticState::kFailed;
  d.results = {FromProto(r)};
  d.requested = absl::FromUnixMillis(5);
  const v1::Diagnostic pd = ToProto(d);
  EXPECT_EQ(pd.state(), v1::DIAGNOSTIC_FAILED);
  EXPECT_EQ(pd.finished_unix_ms(), 0);  // Still InfinitePast: not finished.
  EXPECT_EQ(pd.results(0).id(), 4u);
}

}  // namespace
}  // namespace sdc::daemon
