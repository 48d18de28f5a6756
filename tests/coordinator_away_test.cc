// When sdcd is late, gone or restarted, nothing the trainers found is lost
// (issue 37). A 6-rank job (3 nodes x 2) of the client library's own
// CoordinatorLinks, each sending what a guarded trainer sends (audit
// results computed as the ranks compute them in-band, tie-breaks, step
// reports, weights, the checkpoint gate), to a real sdcd behind one local
// TCP proxy per node (demo/tcp_proxy.h: the name trainers dial). Faults of
// the coordinator and the network at exact points of the step protocol:
// sdcd starting after the job, kill -9 between steps, mid-audit, between an
// audit's results and its tie-breaks, mid-weight-vote, mid-checkpoint-gate
// and while ranks deliver what they held; sdcd back on a new port behind the
// same name; one node cut off for less, and for more, than the report
// deadline. Directly and through each node's sdc-agent relay.
//
// After each: every fault the ranks caught is a confirmed incident naming
// the faulty rank, no request is duplicated, every report sent is
// acknowledged (or counted as dropped: none is here), and the database
// passes PRAGMA integrity_check.

#include <sqlite3.h>
#include <stdlib.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/coordinator_link.h"
#include "demo/tcp_proxy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/attribution.h"
#include "protocol/replay_plan.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kNodes = 3;
constexpr int kGpus = 2;
constexpr int kWorld = kNodes * kGpus;
const std::vector<std::string> kTensors = {"w0", "w1"};

std::string IntegrityCheck(const std::string& db) {
  sqlite3* h = nullptr;
  std::string out = "cannot open";
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &s, nullptr) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
    }
    sqlite3_finalize(s);
  }
  sqlite3_close(h);
  return out;
}

// A guarded 6-rank job and its coordinator, for fault injection.
class AwayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    for (int n = 0; n < kNodes; ++n) {
      absl::StatusOr<std::unique_ptr<demo::TcpProxy>> p = demo::TcpProxy::Start(0);
      ASSERT_TRUE(p.ok()) << p.status();
      proxies_.push_back(*std::move(p));
    }
  }

  void TearDown() override {
    for (auto& link : links_) link->Stop(absl::ZeroDuration());
    links_.clear();
    agents_.clear();
  }

  // sdcd on `trainer_port` (0: a new one), the same database every time;
  // the proxies forward to it: to its trainer port, or with relays to its
  // agent port (agents and their relays have their own listener).
  void StartSdcd(int trainer_port = 0) {
    absl::StatusOr<std::unique_ptr<Sdcd>> d =
        Sdcd::Start(dir_, {absl::StrCat("--report_deadline=", report_deadline_)}, {}, trainer_port,
                    admin_port_, metrics_port_);
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
    admin_port_ = sdcd_->admin_port();
    metrics_port_ = sdcd_->metrics_port();
    const int target = agents_.empty() ? sdcd_->trainer_port() : sdcd_->agent_port();
    for (auto& p : proxies_) p->Retarget(target);
  }
  void KillSdcd() { sdcd_->process().Kill(); }
  // kill -9, a pause, and sdcd back on its database (and port, unless moved).
  void Restart(bool new_port = false, absl::Duration pause = absl::Milliseconds(500)) {
    const int port = sdcd_->trainer_port();
    KillSdcd();
    absl::SleepFor(pause);
    ASSERT_NO_FATAL_FAILURE(StartSdcd(new_port ? 0 : port));
    ++restarts_;
  }

  // One sdc-agent per node relaying its ranks to sdcd (through that node's
  // proxy); the ranks dial the agents.
  void StartRelays() {
    char socket_dir[] = "/tmp/sdc-away-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir), nullptr);
    socket_dir_ = socket_dir;
    for (int n = 0; n < kNodes; ++n) {
      const std::string node = std::string("node-") + static_cast<char>('a' + n);
      absl::StatusOr<Process> agent =
          Process::Start({BinaryPath("agent/sdc-agent"),
                          absl::StrCat("--coordinator=127.0.0.1:", proxies_[n]->port()),
                          absl::StrCat("--node_name=", node), "--heartbeat=1s",
                          absl::StrCat("--relay_listen=", RelayOf(n)),
                          absl::StrCat("--nvml_library=", BinaryPath("agent/libfake_nvml.so"))},
                         absl::StrCat(dir_, "/agent-", node, ".log"),
                         // The GPUs its ranks report (TestHello: GPU-<rank>);
                         // one its agent did not list leaves a rank unproven.
                         {{"FAKE_NVML_UUIDS",
                           absl::StrCat("GPU-", kGpus * n, ",GPU-", kGpus * n + 1)}});
      ASSERT_TRUE(agent.ok()) << agent.status();
      agents_.push_back(std::make_unique<Process>(*std::move(agent)));
      ASSERT_TRUE(agents_.back()->WaitForLog("relaying trainer streams from .*").ok());
    }
  }
  std::string RelayOf(int node) const {
    return absl::StrCat("unix:", socket_dir_, "/relay-", node, ".sock");
  }

  // The ranks: each dials its node's proxy (or relay).
  void StartJob(const std::string& job) {
    job_ = job;
    for (int r = 0; r < kWorld; ++r) {
      client::GuardOptions o;
      o.coordinator = agents_.empty() ? absl::StrCat("127.0.0.1:", proxies_[r / kGpus]->port())
                                      : RelayOf(r / kGpus);
      o.job_id = job;
      o.report_linger = absl::ZeroDuration();
      o.reconnect_max = absl::Seconds(1);
      hellos_.push_back(TestHello(job, r, kWorld, kGpus, kTensors));
      members_.push_back({static_cast<protocol::Rank>(r), hellos_.back().placement.node});
      links_.push_back(std::make_unique<client::CoordinatorLink>(o, hellos_.back()));
      links_.back()->Start();
    }
  }

  // What the ranks send at an audit step: every rank's original and replay,
  // `faulty`'s own batch and its replays wrong, then the tie-breaks they
  // derive in-band from all of them. `part` picks which ranks send now
  // (the others send with Finish...): ranks whose reports reach sdcd first.
  struct Audit {
    std::vector<std::vector<protocol::AuditResult>> results;    // By rank.
    std::vector<std::vector<protocol::AuditResult>> tiebreaks;  // By rank.
  };
  Audit AuditOf(protocol::Step step, std::optional<protocol::Rank> faulty) const {
    const protocol::Topology topology(members_);
    const protocol::ReplayPlan plan = protocol::PlanFullAudit(topology, step / 10);
    auto value = [](protocol::Rank subject) { return 0x3ff0000000000000ull + subject; };
    Audit out;
    out.results.resize(kWorld);
    out.tiebreaks.resize(kWorld);
    absl::flat_hash_map<protocol::Rank, protocol::Evidence> originals, replays;
    for (int r = 0; r < kWorld; ++r) {
      protocol::AuditResult a;
      a.role = protocol::AuditRole::kOriginal;
      a.subject = r;
      a.loss_bits = a.gradient_digest = value(r) + (faulty == protocol::Rank(r) ? 1 : 0);
      out.results[r].push_back(a);
      originals[r] = {a.loss_bits, a.gradient_digest, {}};
    }
    for (const protocol::Assignment& x : plan.assignments) {
      protocol::AuditResult a;
      a.role = protocol::AuditRole::kReplay;
      a.subject = x.subject;
      a.loss_bits = a.gradient_digest = value(x.subject) + (x.replayer == faulty ? 2 : 0);
      out.results[x.replayer].push_back(a);
      replays[x.replayer] = {a.loss_bits, a.gradient_digest, {}};
    }
    protocol::AuditInput in;
    in.plan = &plan;
    in.topology = &topology;
    in.originals = &originals;
    in.replays = &replays;
    in.compare_gradients = true;
    in.salt = step;
    for (const protocol::TieBreak& t : protocol::Attribute(in).tiebreaks) {
      protocol::AuditResult a;
      a.role = protocol::AuditRole::kTieBreak;
      a.subject = t.subject;
      a.loss_bits = a.gradient_digest = value(t.subject) + (t.tiebreaker == faulty ? 3 : 0);
      out.tiebreaks[t.tiebreaker].push_back(a);
    }
    return out;
  }

  static protocol::WeightReport Weights(bool checkpoint) {
    protocol::WeightReport w;
    w.digest = 0x5eed;
    w.tensors = {{8, 1, 2}, {8, 3, 4}};
    w.checkpoint = checkpoint;
    return w;
  }

  // Hooks at the points of a step where a test injects its fault.
  struct Hooks {
    std::function<void()> mid_audit;  // Half the ranks sent their results.
    std::function<void()> before_tiebreaks;
    std::function<void()> mid_weights;  // Half the ranks sent their weights.
    std::function<void()> mid_gate;     // The gate is being asked.
  };

  // Steps `from` .. `to` as the ranks run them: audits every 10 steps
  // (`faults` says who is wrong at which), weights every 10, a checkpoint
  // gate every 20 (asked by rank 0, as the engine's leader does).
  void Run(protocol::Step from, protocol::Step to, const std::map<protocol::Step, protocol::Rank>& faults = {},
           const std::map<protocol::Step, Hooks>& hooks = {}) {
    for (protocol::Step s = from; s <= to; ++s) {
      auto fault = faults.find(s);
      const std::optional<protocol::Rank> faulty =
          fault == faults.end() ? std::nullopt : std::optional<protocol::Rank>(fault->second);
      auto hook = hooks.find(s);
      const Hooks none;
      const Hooks& h = hook == hooks.end() ? none : hook->second;
      if (s % 10 == 0) {
        const Audit a = AuditOf(s, faulty);
        for (int r = 0; r < kWorld; ++r) {
          if (r == kWorld / 2 && h.mid_audit) h.mid_audit();
          for (const auto& x : a.results[r]) links_[r]->Send(s, x);
        }
        if (h.before_tiebreaks) h.before_tiebreaks();
        for (int r = 0; r < kWorld; ++r) {
          for (const auto& x : a.tiebreaks[r]) links_[r]->Send(s, x);
        }
      }
      for (int r = 0; r < kWorld; ++r) {
        protocol::StepReport report;
        report.applied = !faulty.has_value();
        if (faulty.has_value()) report.skip_reason = "replay audit mismatch";
        links_[r]->Send(s, report);
      }
      // The checkpoint gate (every 20 steps) is asked while the weight
      // vote it waits for comes in.
      std::thread gate;
      if (s % 10 == 0) {
        for (int r = 0; r < kWorld; ++r) {
          if (r == kWorld / 2 && h.mid_weights) h.mid_weights();
          if (r == kWorld / 2 && s % 20 == 0) {
            gate = std::thread([this, s] {
              absl::StatusOr<v1::CheckpointDecision> d =
                  links_[0]->MayCheckpoint(s, absl::Seconds(10));
              absl::MutexLock lock(&gates_mu_);
              gates_[s] = d.ok() ? (d->allowed() ? "allowed" : "vetoed") : "unavailable";
            });
            if (h.mid_gate) {
              absl::SleepFor(absl::Milliseconds(200));  // It waits for the other half.
              h.mid_gate();
            }
          }
          links_[r]->Send(s, Weights(s % 20 == 0));
        }
      }
      if (gate.joinable()) gate.join();
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  // What every test checks once the job is over: everything delivered,
  // every fault an incident, no request twice, the database sound.
  void ExpectNothingLost(const std::map<protocol::Step, protocol::Rank>& faults) {
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(links_[r]->Flush(absl::Seconds(60)))
          << "rank " << r << ": " << links_[r]->stats().last_error;
      const client::CoordinatorLink::Stats s = links_[r]->stats();
      EXPECT_EQ(s.sent, s.acked + s.dropped) << "rank " << r;
      EXPECT_EQ(s.dropped, 0u) << "rank " << r;
    }
    auto admin = sdcd_->Admin();
    v1::ListIncidentsRequest iq;
    iq.set_job_id(job_);
    v1::ListIncidentsResponse incidents;
    ASSERT_TRUE(admin->ListIncidents(sdcd_->AdminContext().get(), iq, &incidents).ok());
    std::set<std::string> faulty_nodes;
    for (const auto& [step, rank] : faults) {
      faulty_nodes.insert(hellos_[rank].placement.node);
      int found = 0;
      for (const v1::Incident& i : incidents.incidents()) {
        if (i.step() == step && i.confirmed()) {
          ++found;
          EXPECT_THAT(i.ranks(), ElementsAre(rank)) << i.explanation();
        }
      }
      EXPECT_EQ(found, 1) << "the fault caught at step " << step << " on rank " << rank;
    }
    for (const v1::Incident& i : incidents.incidents()) {
      EXPECT_TRUE(!i.confirmed() || faults.count(i.step()) > 0)
          << "a blame nobody earned: " << i.explanation();
    }
    v1::ListRequestsResponse requests;
    ASSERT_TRUE(admin->ListRequests(sdcd_->AdminContext().get(), {}, &requests).ok());
    std::map<std::string, int> per_node;
    for (const v1::ReplacementRequest& q : requests.requests()) ++per_node[q.node_name()];
    for (const std::string& node : faulty_nodes) {
      EXPECT_EQ(per_node[node], 1) << "one request for " << node;
    }
    EXPECT_EQ(per_node.size(), faulty_nodes.size());
    for (auto& link : links_) link->Stop(absl::ZeroDuration());
    EXPECT_EQ(IntegrityCheck(sdcd_->db()), "ok");
  }

  std::string dir_;
  std::string job_;
  std::string socket_dir_;
  std::string report_deadline_ = "30s";
  std::unique_ptr<Sdcd> sdcd_;
  int admin_port_ = 0;
  int metrics_port_ = 0;
  int restarts_ = 0;
  std::vector<std::unique_ptr<demo::TcpProxy>> proxies_;
  std::vector<std::unique_ptr<Process>> agents_;
  std::vector<protocol::Hello> hellos_;
  std::vector<protocol::PlanMember> members_;
  std::vector<std::unique_ptr<client::CoordinatorLink>> links_;
  absl::Mutex gates_mu_;
  std::map<protocol::Step, std::string> gates_;  // Each gate's answer to rank 0.
};

// The common Kubernetes case: trainer pods ready before the coordinator.
// The ranks hold steps 1-12 (the audit and weights of step 10 among them)
// and attach one by one, in any order, when sdcd starts: reports of the
// first ranks came before the last rank's Hello and were refused; the job's
// last step in sdcd froze at 9 and the later faults were never recorded.
TEST_F(AwayTest, SdcdStartsAfterTheJobsFirstSteps) {
  StartJob("late");
  const std::map<protocol::Step, protocol::Rank> faults = {{10, 3}, {30, 3}};
  Run(1, 12, faults);
  ASSERT_NO_FATAL_FAILURE(StartSdcd());
  // The backlog reaches sdcd before the next step. Without this wait the
  // test raced the link's own rule: a checkpoint gate asked after an outage
  // longer than a reconnection (10 s) does not wait for the link, and under
  // CI's load sdcd's start alone took that long, so the gate of step 20
  // answered "unavailable".
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(links_[r]->Flush(absl::Seconds(60))) << "rank " << r;
  }
  Run(13, 40, faults);
  ExpectNothingLost(faults);
  EXPECT_EQ(gates_[20], "vetoed") << "rank 3 was attributed faulty at step 10";
}

// kill -9 and a restart on the same database at six points of the step
// protocol. The kill between an audit's results and its tie-breaks is the
// case of the issue (sdcd killed at 9 s of a 200-step job: the tie-breaker
// reconnected first, its result was refused, and the fault caught at step
// 130 never became an incident).
TEST_F(AwayTest, SdcdKilledAtSixPointsLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartSdcd());
  StartJob("killed");
  const std::map<protocol::Step, protocol::Rank> faults = {{30, 3}, {50, 1}};
  auto restart = [this] { Restart(); };
  std::map<protocol::Step, Hooks> hooks;
  hooks[10].mid_audit = restart;         // Half the ranks' audit results are in.
  hooks[20].mid_weights = restart;       // Half the weight vote.
  hooks[30].before_tiebreaks = restart;  // The fault's audit, before its tie-breaks.
  hooks[40].mid_gate = restart;          // The checkpoint gate being asked.
  hooks[50].mid_audit = restart;         // A second fault, mid-audit.
  Run(1, 4);
  Restart();  // Between steps.
  Run(5, 60, faults, hooks);
  EXPECT_EQ(restarts_, 6);
  ExpectNothingLost(faults);
  EXPECT_EQ(gates_[40], "vetoed") << "sdcd died while the gate was asked: asked again once back";
  EXPECT_EQ(gates_[60], "vetoed") << "faulty GPUs are still in the job";
}

// sdcd rescheduled: the same database, a new port, the same name (the
// proxies: a Kubernetes Service). The ranks find it within reconnect_max.
TEST_F(AwayTest, SdcdBackOnANewPortBehindTheSameName) {
  ASSERT_NO_FATAL_FAILURE(StartSdcd());
  StartJob("moved");
  const std::map<protocol::Step, protocol::Rank> faults = {{20, 5}};
  const int first = sdcd_->trainer_port();
  std::map<protocol::Step, Hooks> hooks;
  hooks[20].before_tiebreaks = [this] { Restart(/*new_port=*/true, absl::Seconds(2)); };
  Run(1, 30, faults, hooks);
  EXPECT_NE(sdcd_->trainer_port(), first);
  ExpectNothingLost(faults);
}

// One node's ranks cut off from sdcd (its proxy stops forwarding) for a few
// steps, while rank 4 on that node is caught: its results come when the
// node is back, before the report deadline.
TEST_F(AwayTest, ANodeCutOffForAWhile) {
  ASSERT_NO_FATAL_FAILURE(StartSdcd());
  StartJob("cut");
  const std::map<protocol::Step, protocol::Rank> faults = {{20, 4}};
  Run(1, 15, faults);
  proxies_[2]->Cut();  // node-c: ranks 4 and 5.
  Run(16, 25, faults);
  absl::SleepFor(absl::Seconds(1));
  proxies_[2]->Restore();
  Run(26, 30, faults);
  ExpectNothingLost(faults);
}

// The same for longer than sdcd's report deadline: the audit that caught
// rank 4 is decided without node-c's results (incomplete), and is judged
// again when they come ("decided in-band while sdcd was away").
TEST_F(AwayTest, ANodeCutOffLongerThanTheReportDeadline) {
  report_deadline_ = "2s";
  ASSERT_NO_FATAL_FAILURE(StartSdcd());
  StartJob("cut-long");
  const std::map<protocol::Step, protocol::Rank> faults = {{20, 4}};
  Run(1, 15, faults);
  proxies_[2]->Cut();
  Run(16, 25, faults);
  absl::SleepFor(absl::Seconds(4));  // sdcd decides step 20 without node-c.
  proxies_[2]->Restore();
  Run(26, 30, faults);
  ExpectNothingLost(faults);
  auto admin = sdcd_->Admin();
  v1::ListIncidentsResponse incidents;
  ASSERT_TRUE(admin->ListIncidents(sdcd_->AdminContext().get(), {}, &incidents).ok());
  bool late = false;
  for (const v1::Incident& i : incidents.incidents()) {
    late = late || (i.confirmed() && i.explanation().find("decided in-band while sdcd was away") !=
                                         std::string::npos);
  }
  EXPECT_TRUE(late) << "the late results were judged after the fact";
}

// The EKS agent's relay path: each node's ranks attach to its sdc-agent,
// which carries them to sdcd on one stream. sdcd starts late, is killed
// mid-audit, comes back on a new port, and one node's agent is cut off.
TEST_F(AwayTest, ThroughTheRelaySdcdLateKilledMovedAndANodeCutOff) {
  ASSERT_NO_FATAL_FAILURE(StartRelays());
  StartJob("relayed");
  const std::map<protocol::Step, protocol::Rank> faults = {{10, 3}, {30, 0}};
  Run(1, 5, faults);
  ASSERT_NO_FATAL_FAILURE(StartSdcd());
  std::map<protocol::Step, Hooks> hooks;
  hooks[10].mid_audit = [this] { Restart(); };
  hooks[30].before_tiebreaks = [this] { Restart(/*new_port=*/true); };
  Run(6, 24, faults, hooks);
  proxies_[1]->Cut();  // node-b's agent.
  Run(25, 32, faults, hooks);
  proxies_[1]->Restore();
  Run(33, 40, faults);
  ExpectNothingLost(faults);
  sdc::testing::Run({"rm", "-rf", socket_dir_});
}

}  // namespace
}  // namespace sdc::testing
