// sdc-agent's trainer relay, end to end: a real sdcd (fresh database, free
// ports, node identities on), a real sdc-agent per node relaying on a Unix
// socket, and trainer ranks that attach to their node's agent instead of sdcd: scripted ranks over the real gRPC
// API, and the client library's own CoordinatorLink. Everything sdcd says
// reaches the rank it names through the relay; when sdcd restarts, the
// relayed ranks' streams end and they reconnect through the agent, losing
// nothing acknowledged.

#include <stdlib.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_link.h"
#include "daemon/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/model_digest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string> kTensors = {"w0", "w1", "b0"};
constexpr uint32_t kWorld = 6;  // Nodes node-a, node-b, node-c of two ranks.

class AgentRelayTest : public ::testing::Test {
 protected:
  static constexpr const char* kNodes[] = {"node-a", "node-b", "node-c"};

  void SetUp() override {
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    // Node identities on: each node's agent proves its node with its
    // certificate and relays that node's ranks (sdcd places every rank a
    // relay carries on the relay's node).
    absl::StatusOr<std::unique_ptr<Sdcd>> d =
        Sdcd::StartWithIdentities(dir_, {kNodes[0], kNodes[1], kNodes[2]});
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
    // A Unix socket path has at most 107 characters; the test directory's
    // can be longer.
    char socket_dir[] = "/tmp/sdc-relay-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir), nullptr);
    socket_dir_ = socket_dir;
    for (int n = 0; n < 3; ++n) {
      const std::string node = kNodes[n];
      std::vector<std::string> argv = {
          BinaryPath("agent/sdc-agent"), absl::StrCat("--coordinator=", sdcd_->agent_address()),
          absl::StrCat("--node_name=", node), "--heartbeat=1s",
          absl::StrCat("--relay_listen=", relay(node)),
          absl::StrCat("--nvml_library=", BinaryPath("agent/libfake_nvml.so"))};
      for (const std::string& flag : sdcd_->AgentTlsFlags(node)) argv.push_back(flag);
      const std::string log = absl::StrCat(dir_, "/agent-", node, ".log");
      // The agent lists the GPUs its ranks report (TestHello: GPU-<rank>):
      // a GPU id its node's agent did not list would leave the rank
      // unproven, and its evidence could open no request.
      absl::StatusOr<Process> agent = Process::Start(
          argv, log, {{"FAKE_NVML_UUIDS", absl::StrCat("GPU-", 2 * n, ",GPU-", 2 * n + 1)}});
      ASSERT_TRUE(agent.ok()) << agent.status();
      agents_.push_back(std::make_unique<Process>(*std::move(agent)));
      ASSERT_TRUE(agents_.back()->WaitForLog("relaying trainer streams from .*").ok())
          << ReadFile(log);
      // Only the allowed uids' processes may relay (the agent's own by
      // default, the test's here): not world-writable.
      struct stat st;
      ASSERT_EQ(stat(relay(node).substr(5).c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0660u);
    }
  }

  void TearDown() override {
    agents_.clear();  // Stops them.
    sdc::testing::Run({"rm", "-rf", socket_dir_});
  }

  // The relay socket of `node`'s agent.
  std::string relay(const std::string& node = "node-a") const {
    return absl::StrCat("unix:", socket_dir_, "/", node, ".sock");
  }
  // Each rank dials its own node's agent.
  ChannelFor Relays() const {
    return [this](const std::string& node) { return Channel(relay(node)); };
  }
  // node-a's agent.
  Process* agent() { return agents_.front().get(); }

  std::string dir_;
  std::string socket_dir_;
  std::unique_ptr<Sdcd> sdcd_;
  std::vector<std::unique_ptr<Process>> agents_;
};

TEST_F(AgentRelayTest, AnAuditThroughTheRelayBlamesTheFaultyRank) {
  absl::StatusOr<Ranks> ranks = ConnectRanks(Relays(), "job-relay", kWorld, 2, kTensors);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  // Six ranks, one relay stream per node, as sdcd's metrics see them.
  absl::StatusOr<std::string> metrics = HttpGet(sdcd_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("\nsdc_relay_streams 3\n"));
  EXPECT_THAT(*metrics, HasSubstr("\nsdc_attached_ranks 6\n"));
  ASSERT_TRUE(SendScheduledAudit(*ranks, 10, /*faulty=*/3).ok());
  // Every rank gets the verdict, through the relay, naming rank 3.
  for (auto& rank : *ranks) {
    absl::StatusOr<v1::CoordinatorMessage> verdict = rank->WaitFor(
        [](const v1::CoordinatorMessage& m) {
          return m.has_audit_verdict() && m.audit_verdict().outcome() == v1::FAULTY;
        },
        absl::Seconds(20));
    ASSERT_TRUE(verdict.ok()) << "rank " << rank->hello().placement.rank << ": "
                              << verdict.status();
    EXPECT_THAT(verdict->audit_verdict().faulty_ranks(), ElementsAre(3));
  }
  // sdcd saw six ranks and opened a request for rank 3's node.
  auto admin = sdcd_->Admin();
  v1::ListRanksRequest rq;
  rq.set_job_id("job-relay");
  v1::ListRanksResponse rs;
  ASSERT_TRUE(admin->ListRanks(sdcd_->AdminContext().get(), rq, &rs).ok());
  EXPECT_EQ(rs.ranks_size(), static_cast<int>(kWorld));
  v1::ListRequestsResponse requests;
  ASSERT_TRUE(admin->ListRequests(sdcd_->AdminContext().get(), {}, &requests).ok());
  ASSERT_EQ(requests.requests_size(), 1);
  EXPECT_EQ(requests.requests(0).node_name(), "node-b");
}

// The value of one sample line ("name{labels} value") of an exposition.
double Sample(const std::string& exposition, const std::string& series) {
  const size_t at = exposition.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  const size_t from = at + series.size() + 2;
  double v = -1;
  if (!absl::SimpleAtod(exposition.substr(from, exposition.find('\n', from) - from), &v)) return -1;
  return v;
}

// A weight report of kTensors; `wrong` changes one fingerprint of "w1".
core::WeightReport WeightsOf(bool wrong) {
  core::WeightReport w;
  std::vector<kernels::NamedFingerprint> named;
  for (size_t t = 0; t < kTensors.size(); ++t) {
    w.tensors.push_back({64, 1000 + t, 2000 + t + (wrong && t == 1 ? 1 : 0)});
    named.push_back({kTensors[t], w.tensors.back()});
  }
  w.digest = kernels::ModelDigest(named);
  return w;
}

// Issue 27, item 4: a frame that does not parse ends the rank's relayed
// stream with INVALID_ARGUMENT (it ended with OK), and the relay carries on.
TEST_F(AgentRelayTest, AMalformedFrameEndsItsSessionWithInvalidArgument) {
  const grpc::Status s = SendRawFrame(Channel(relay()), "/sdc.v1.TrainerService/Attach",
                                      std::string("\xff\xff\xff\xff", 4));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("malformed message: not a sdc.v1.TrainerMessage"));
  ScriptedRank fresh(Channel(relay()), TestHello("job-m", 0, 1, 1, kTensors));
  ASSERT_TRUE(fresh.Connect().ok());
  EXPECT_TRUE(fresh.WaitAcked(fresh.Send(1, core::StepReport{})).ok());
}

TEST_F(AgentRelayTest, WeightTensorsCrossTheRelayOncePerDigest) {
  absl::StatusOr<Ranks> connected = ConnectRanks(Relays(), "job-weights", kWorld, 2, kTensors);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Ranks ranks = *std::move(connected);
  // One after another, so that each relay's order is known. Each node's
  // agent relays its two ranks (node-a 0 and 1, node-b 2 and 3, node-c 4
  // and 5) and carries each digest's tensors once: ranks 0, 2, 3 (its own
  // digest) and 4 with tensors, ranks 1 and 5 without.
  for (core::Rank r = 0; r < kWorld; ++r) {
    const uint64_t seq = ranks[r]->Send(10, WeightsOf(/*wrong=*/r == 3));
    ASSERT_TRUE(ranks[r]->WaitAcked(seq, absl::Seconds(20)).ok()) << r;
  }
  // The vote still names rank 3 and the tensor where it differs.
  for (auto& rank : ranks) {
    absl::StatusOr<v1::CoordinatorMessage> verdict = rank->WaitFor(
        [](const v1::CoordinatorMessage& m) { return m.has_weight_verdict(); },
        absl::Seconds(20));
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_FALSE(verdict->weight_verdict().pass());
    EXPECT_THAT(verdict->weight_verdict().minority_ranks(), ElementsAre(3));
    EXPECT_THAT(verdict->weight_verdict().differing_tensors(), ElementsAre("w1"));
  }
  // What sdcd received: four reports with tensors, two without.
  v1::Report full = daemon::ToProto(core::Report{"job-weights", 0, 1, 1, 10, WeightsOf(false)});
  v1::Report elided = full;
  elided.mutable_weights()->clear_tensors();
  elided.mutable_weights()->set_tensors_elided(true);
  absl::StatusOr<std::string> metrics = HttpGet(sdcd_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const double bytes = Sample(*metrics, "sdc_report_bytes_total{kind=\"weights\"}");
  EXPECT_EQ(Sample(*metrics, "sdc_reports_total{kind=\"weights\"}"), 6);
  EXPECT_GE(bytes, 4 * full.ByteSizeLong() + 2 * elided.ByteSizeLong());
  EXPECT_LT(bytes, 5 * full.ByteSizeLong() + 1 * elided.ByteSizeLong());
}

TEST_F(AgentRelayTest, TheClientLibraryWorksThroughTheRelay) {
  client::GuardOptions o;
  o.coordinator = relay();
  o.job_id = "job-link";
  client::CoordinatorLink link(o, TestHello("job-link", 0, /*world=*/1, 1, {"w"}));
  link.Start();
  for (core::Step s = 1; s <= 3; ++s) link.Send(s, core::StepReport{});
  ASSERT_TRUE(link.Flush(absl::Seconds(20))) << link.stats().last_error;
  EXPECT_EQ(link.stats().acked, 3u);
  EXPECT_EQ(link.stats().rejected, 0u);

  // MayCheckpoint goes through the agent too.
  auto stub = v1::TrainerService::NewStub(Channel(relay()));
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CheckpointRequest q;
  q.set_job_id("job-link");
  q.set_step(3);
  v1::CheckpointDecision d;
  const grpc::Status s = stub->MayCheckpoint(&c, q, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(d.allowed()) << "no weight check at step 3 yet";
  EXPECT_THAT(d.reason(), HasSubstr("weight"));
}

TEST_F(AgentRelayTest, RelayedRanksReconnectWhenSdcdRestarts) {
  absl::StatusOr<Ranks> connected = ConnectRanks(Relays(), "job-restart", kWorld, 2, kTensors);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Ranks ranks = *std::move(connected);
  const core::StepReport clean{0, 0, 1.0, 7, true, "", false};
  for (auto& r : ranks) r->Send(1, clean);
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAcked(1).ok());

  const int port = sdcd_->trainer_port();
  const int agent_port = sdcd_->agent_port();
  sdcd_->process().Kill();
  // The agent ends every stream it relayed, saying why.
  for (auto& r : ranks) {
    const grpc::Status ended = r->WaitFinished(absl::Seconds(20));
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(ended.error_message(), HasSubstr("sdc-agent lost its stream to sdcd"));
  }
  absl::StatusOr<std::unique_ptr<Sdcd>> second = Sdcd::StartWithIdentities(
      dir_, {kNodes[0], kNodes[1], kNodes[2]}, {}, {}, port, agent_port);
  ASSERT_TRUE(second.ok()) << second.status();
  // Back through the same agent: sdcd remembers what it acknowledged.
  for (auto& r : ranks) {
    ASSERT_TRUE(r->Connect(absl::Seconds(20)).ok());
    EXPECT_EQ(r->welcome_acked(), 1u);
    r->Send(2, clean);
  }
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAcked(2, absl::Seconds(20)).ok());
}

TEST_F(AgentRelayTest, ARefusedRankEndsWithSdcdsStatusWhileItsNodeCarriesOn) {
  absl::StatusOr<Ranks> connected = ConnectRanks(Relays(), "job-refuse", kWorld, 2, kTensors);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Ranks ranks = *std::move(connected);
  // Rank 0 keeps writing after sending another rank's report: sdcd's
  // refusal, not the relay's, is what ends its stream.
  v1::Report wrong;
  wrong.set_job_id("job-refuse");
  wrong.set_rank(1);
  wrong.set_incarnation(1);
  wrong.set_sequence(1);
  wrong.set_step(1);
  wrong.mutable_step_report()->set_applied(true);
  ASSERT_TRUE(ranks[0]->SendRaw(wrong));
  for (int i = 0; i < 20; ++i) ranks[0]->SendRaw(wrong);
  const grpc::Status ended = ranks[0]->WaitFinished(absl::Seconds(20));
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ended.error_message();
  EXPECT_THAT(ended.error_message(), HasSubstr("report for job job-refuse rank 1 on the stream of "
                                               "job job-refuse rank 0"));
  // The other ranks on the same relay go on.
  const core::StepReport clean{0, 0, 1.0, 7, true, "", false};
  for (core::Rank r = 1; r < kWorld; ++r) ranks[r]->Send(1, clean);
  for (core::Rank r = 1; r < kWorld; ++r) ASSERT_TRUE(ranks[r]->WaitAcked(1).ok()) << r;
  // Rank 0 comes back through the relay and is welcomed.
  ASSERT_TRUE(ranks[0]->Connect(absl::Seconds(20)).ok());
  ranks[0]->Send(1, clean);
  ASSERT_TRUE(ranks[0]->WaitAcked(1).ok());
}

TEST_F(AgentRelayTest, StoppingSdcdEndsRelayedStreamsSayingSo) {
  absl::StatusOr<Ranks> connected = ConnectRanks(Relays(), "job-stop", kWorld, 2, kTensors);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Ranks ranks = *std::move(connected);
  std::thread stop([&] {
    EXPECT_EQ(sdcd_->process().Stop(absl::Seconds(20)), 0) << "sdcd exits cleanly (SIGTERM)";
  });
  for (auto& r : ranks) {
    const grpc::Status ended = r->WaitFinished(absl::Seconds(20));
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(ended.error_message(), HasSubstr("sdcd is shutting down"));
  }
  // A rank that reconnects at once, through the same agent, is not taken
  // in by the stopping sdcd.
  EXPECT_FALSE(ranks[0]->Connect(absl::Seconds(5)).ok());
  stop.join();
}

}  // namespace
}  // namespace sdc::testing
