// Two faulty GPUs at the same step, end to end (6 trainer processes over
// Gloo, a real sdcd): whatever the placement, sdc-guard names faulty ranks or
// leaves them suspects with targeted re-audits; it never confirms a healthy
// rank faulty or opens a replacement request for a healthy node.

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "demo/launcher.h"
#include "demo/report.h"
#include "demo/scenarios.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/replay_plan.h"
#include "tests/testing/fast_cluster.h"

namespace sdc::demo {
namespace {

constexpr int kNodes = 3, kGpusPerNode = 2, kStep = 15;

protocol::Topology DemoTopology() {
  std::vector<protocol::PlanMember> members;
  for (protocol::Rank r = 0; r < kNodes * kGpusPerNode; ++r) {
    members.push_back({r, NodeName(static_cast<int>(r) / kGpusPerNode)});
  }
  return protocol::Topology(std::move(members));
}

// The full audit every rank runs at kStep (the fast cluster audits every 5).
protocol::ReplayPlan PlanAtStep() { return protocol::PlanFullAudit(DemoTopology(), kStep / 5); }

protocol::Rank ReplayerOf(const protocol::ReplayPlan& plan, protocol::Rank subject) {
  for (const protocol::Assignment& a : plan.assignments) {
    if (a.subject == subject) return a.replayer;
  }
  ADD_FAILURE() << "rank " << subject << " has no replayer";
  return 0;
}

protocol::Rank SubjectOf(const protocol::ReplayPlan& plan, protocol::Rank replayer) {
  for (const protocol::Assignment& a : plan.assignments) {
    if (a.replayer == replayer) return a.subject;
  }
  ADD_FAILURE() << "rank " << replayer << " replays nothing";
  return 0;
}

int NodeOf(protocol::Rank r) { return static_cast<int>(r) / kGpusPerNode; }

// Runs the cluster with `faulty_replays` corrupting the replays it computes
// for peers and `faulty_own` corrupting its forward pass (its own batch and
// its replays) at kStep, and checks the verdicts against the truth.
void ExpectNoHealthyRankBlamed(const std::string& name, protocol::Rank faulty_replays,
                               protocol::Rank faulty_own) {
  SCOPED_TRACE(absl::StrCat(name, ": rank ", faulty_replays, " corrupts replays, rank ",
                            faulty_own, " its forward pass"));
  const std::string fault =
      absl::StrCat("replay:", faulty_replays, ":step=", kStep, ",activation-scale:", faulty_own,
                   ":step=", kStep, ":10000");
  ClusterConfig c = ::sdc::testing::FastCluster(name, fault);
  c.nodes = kNodes;
  c.gpus_per_node = kGpusPerNode;
  absl::StatusOr<ClusterResult> r = RunCluster(c);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::set<protocol::Rank> truth = {faulty_replays, faulty_own};
  std::set<std::string> faulty_nodes;
  for (protocol::Rank f : truth) faulty_nodes.insert(NodeName(NodeOf(f)));

  // Detected: the step is skipped on every rank, and an incident names it.
  for (const auto& rank : r->ranks) {
    for (const StepRecord& s : rank) {
      if (s.step == kStep) EXPECT_FALSE(s.apply) << "step " << kStep << " was applied";
    }
  }
  std::set<protocol::Rank> confirmed, unconfirmed;
  for (const v1::Incident& i : r->incidents) {
    SCOPED_TRACE(absl::StrCat("incident ", i.id(), " (", i.outcome(), "): ", i.explanation()));
    EXPECT_NE(i.outcome(), "systemic") << "two GPUs are not a software change";
    for (uint32_t rank : i.ranks()) {
      (i.confirmed() ? confirmed : unconfirmed).insert(rank);
      if (i.confirmed()) EXPECT_TRUE(truth.count(rank)) << "healthy rank " << rank << " blamed";
    }
  }
  EXPECT_FALSE(confirmed.empty() && unconfirmed.empty()) << "nothing was reported";
  for (const v1::ReplacementRequest& q : r->requests) {
    EXPECT_TRUE(faulty_nodes.count(q.node_name())) << "replacement requested for healthy " << q.node_name();
  }
  // A faulty rank nobody confirmed stays under suspicion (targeted audits).
  for (protocol::Rank f : truth) {
    EXPECT_TRUE(confirmed.count(f) || unconfirmed.count(f)) << "faulty rank " << f << " unnamed";
  }
  const RunFacts facts = Analyze(*r, *FindScenario("clean"), c, -1);
  EXPECT_TRUE(facts.weights_identical);
  EXPECT_TRUE(facts.bad_checkpoints.empty());
}

// The worst case: a healthy rank h whose replayer corrupts replays and whose
// subject corrupts its own batch, all three on different nodes. h's two
// comparisons both mismatch, exactly as if h were the faulty one; the old
// rule 3 confirmed h and asked to replace its node.
TEST(TwoFaultsTest, HealthyRankBetweenFaultyRanksOnTwoOtherNodes) {
  const protocol::ReplayPlan plan = PlanAtStep();
  for (protocol::Rank h = 0; h < kNodes * kGpusPerNode; ++h) {
    const protocol::Rank f1 = ReplayerOf(plan, h), f2 = SubjectOf(plan, h);
    if (std::set<int>{NodeOf(h), NodeOf(f1), NodeOf(f2)}.size() == 3) {
      ExpectNoHealthyRankBlamed("two-faults-sandwich", f1, f2);
      return;
    }
  }
  FAIL() << "no rank of the plan sits between ranks of two other nodes";
}

// The faulty ranks side by side in the ring: one replays the other's batch.
TEST(TwoFaultsTest, AdjacentInTheRingOnTwoNodes) {
  const protocol::ReplayPlan plan = PlanAtStep();
  const protocol::Rank f1 = 0, f2 = SubjectOf(plan, 0);
  ASSERT_NE(NodeOf(f1), NodeOf(f2));
  ExpectNoHealthyRankBlamed("two-faults-adjacent", f1, f2);
}

// Both faulty GPUs in one node.
TEST(TwoFaultsTest, BothInOneNode) { ExpectNoHealthyRankBlamed("two-faults-one-node", 2, 3); }

}  // namespace
}  // namespace sdc::demo
