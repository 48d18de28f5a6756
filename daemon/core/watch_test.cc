// Issue 42 item 4: between its naming and its replacement a GPU is not
// trusted. While its replacement request is open its group runs a standing
// watch plan (a trusted rank of another node replays its micro-batch on
// every step), so a further corruption on a step no scheduled audit covers
// is a mismatch, settled by a tie-break that names the same GPU again. The
// watch ends with the request.

#include <set>
#include <string>
#include <vector>

#include "daemon/core/coordinator.h"
#include "daemon/core/testing_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::core {
namespace {

using testing::Cluster;
using testing::kJob;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::vector<PlanMessage> Watches(const Cluster& cl) {
  std::vector<PlanMessage> out;
  for (const PlanMessage& p : cl.MessagesOf<PlanMessage>()) {
    if (p.watch) out.push_back(p);
  }
  return out;
}

// Steps 1..10 clean, with the scheduled audit at 10 in which rank 3
// (node-b) computes every batch wrongly: rank 3 is named, node-b's request
// opens.
void NameRank3AtStep10(Cluster& cl) {
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  cl.Audit(10, {3}, {3});
  for (const TieBreakMessage& t : cl.MessagesOf<TieBreakMessage>()) {
    ASSERT_TRUE(cl.TieBreakResult(t.replayer, t.subject, 10, t.replayer == 3).ok());
  }
  cl.AllWeights(10);
}

TEST(WatchTest, ANamedGpuIsReplayedOnEveryStepUntilItsRequestCloses) {
  Cluster cl(3, 2);
  NameRank3AtStep10(cl);
  const std::vector<ReplacementRequest> requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].node, "node-b");

  // One watch plan: a rank of another node, itself trusted, replays rank 3.
  std::vector<PlanMessage> watches = Watches(cl);
  ASSERT_THAT(watches, SizeIs(1));
  const PlanMessage watch = watches[0];
  ASSERT_THAT(watch.assignments, SizeIs(1));
  EXPECT_EQ(watch.assignments[0].subject, 3u);
  EXPECT_NE(cl.NodeOf(watch.assignments[0].replayer), "node-b");
  EXPECT_THAT(watch.reason, HasSubstr("watch until replaced"));

  // Step 11, unscheduled: rank 3 corrupts again. Its watch replay
  // mismatches, the tie-break sides with the replayer, and rank 3 is named
  // again on the same request.
  const size_t incidents_before = cl.c().ListIncidents(kJob).size();
  cl.Audit(11, {3}, {}, watch.plan_id, watch.assignments);
  bool asked = false;
  for (const TieBreakMessage& t : cl.MessagesOf<TieBreakMessage>()) {
    if (t.step != 11) continue;
    asked = true;
    EXPECT_EQ(t.subject, 3u);
    ASSERT_TRUE(cl.TieBreakResult(t.replayer, t.subject, 11, false, watch.plan_id).ok());
  }
  EXPECT_TRUE(asked) << "a lone mismatch of the watch is settled by a tie-break";
  const std::vector<Incident> incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(incidents_before + 1));
  const Incident& again = incidents.back();
  EXPECT_EQ(again.step, 11u);
  EXPECT_TRUE(again.confirmed);
  EXPECT_EQ(again.ranks, std::vector<Rank>{3});
  EXPECT_EQ(again.request_id, requests[0].id);
  ASSERT_THAT(cl.c().ListRequests(), SizeIs(1)) << "the open request takes the new incident";

  // Step 12: the watch runs again (a standing plan, not a one-off); a clean
  // step passes and records nothing.
  cl.Audit(12, {}, {}, watch.plan_id, watch.assignments);
  EXPECT_THAT(cl.c().ListIncidents(kJob), SizeIs(incidents_before + 1));
  EXPECT_THAT(Watches(cl), SizeIs(1)) << "the watched set did not change";

  // The operator refuses the replacement: the watch ends with a plan
  // that assigns nothing.
  absl::StatusOr<std::pair<ReplacementRequest, Effects>> denied =
      cl.c().Deny(requests[0].id, "alice", "GPU passed the vendor diagnostics", false, false);
  ASSERT_TRUE(denied.ok()) << denied.status();
  cl.Collect(denied->second);
  watches = Watches(cl);
  ASSERT_THAT(watches, SizeIs(2));
  EXPECT_GT(watches[1].plan_id, watch.plan_id);
  EXPECT_THAT(watches[1].assignments, IsEmpty());
}

TEST(WatchTest, TheWatchOutlivesACoordinatorRestartAndEndsWhenTheReplacementIsDone) {
  Cluster cl(3, 2);
  NameRank3AtStep10(cl);
  ASSERT_THAT(Watches(cl), SizeIs(1));
  const PlanMessage watch = Watches(cl)[0];
  // A restarted sdcd hands a reconnecting rank the watch (a standing plan
  // is never done), marked as a watch.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  absl::StatusOr<AttachResult> welcome =
      cl.c().Attach(cl.HelloOf(0), testing::Proven(cl.HelloOf(0)));
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  bool found = false;
  for (const PlanMessage& p : welcome->pending_plans) {
    if (p.plan_id == watch.plan_id) {
      found = true;
      EXPECT_TRUE(p.watch);
      EXPECT_EQ(p.assignments.size(), 1u);
    }
  }
  EXPECT_TRUE(found) << "the watch plan is pending for a reconnecting rank";
  for (Rank r = 1; r < cl.world(); ++r) {
    ASSERT_TRUE(cl.c().Attach(cl.HelloOf(r), testing::Proven(cl.HelloOf(r))).ok());
  }
  // Approved, executed, done: the GPU left the job, the watch ends.
  const uint64_t id = cl.c().ListRequests()[0].id;
  ASSERT_TRUE(cl.c().Approve(id, "alice", "replace node-b", false, false).ok());
  ASSERT_THAT(cl.c().StartApproved("local").first, SizeIs(1));
  absl::StatusOr<std::pair<ReplacementRequest, Effects>> done =
      cl.c().FinishExecution(id, true, "node-b swapped");
  ASSERT_TRUE(done.ok()) << done.status();
  bool ended = false;
  for (const OutMessage& m : done->second.messages) {
    if (const PlanMessage* p = std::get_if<PlanMessage>(&m.body)) {
      ended = ended || (p->watch && p->assignments.empty() && p->plan_id > watch.plan_id);
    }
  }
  EXPECT_TRUE(ended) << "the replacement done ends the watch";
}

// Issue 39, case 6: with two replica groups on one process group a plan
// goes to every rank of the job, tagged with its group, so every rank
// holds every plan id and the in-band agreement (one minimum over the
// process group) lets each group run its own.
TEST(WatchTest, PlansOfEveryReplicaGroupReachEveryRankOfTheJob) {
  Cluster cl(3, 2);
  // Groups 1 (ranks 0, 2, 4) and 257 (ranks 1, 3, 5): one rank per node each.
  auto group_of = [](Rank r) -> uint32_t { return r % 2 == 0 ? 1 : 257; };
  for (Rank r = 0; r < cl.world(); ++r) {
    Hello h = cl.HelloOf(r);
    h.placement.replica_group = group_of(r);
    ASSERT_TRUE(cl.c().Attach(h, testing::Proven(h)).ok()) << r;
  }
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  // Group 257's scheduled audit at step 10 names rank 3: its watch plan.
  std::vector<protocol::PlanMember> members;
  for (Rank r : {1u, 3u, 5u}) members.push_back({r, cl.NodeOf(r)});
  const std::vector<Assignment> ring =
      protocol::PlanFullAudit(protocol::Topology(members), 10 / 10).assignments;
  cl.Audit(10, {3}, {3}, 0, ring);
  for (const TieBreakMessage& t : cl.MessagesOf<TieBreakMessage>()) {
    ASSERT_TRUE(cl.TieBreakResult(t.replayer, t.subject, 10, t.replayer == 3).ok());
  }
  std::vector<Rank> recipients;
  PlanMessage watch;
  for (const OutMessage& m : cl.messages()) {
    if (const PlanMessage* p = std::get_if<PlanMessage>(&m.body); p != nullptr && p->watch) {
      recipients = m.ranks;
      watch = *p;
    }
  }
  ASSERT_FALSE(recipients.empty()) << "rank 3 named in group 257 is watched";
  EXPECT_EQ(watch.group, 257u);
  ASSERT_THAT(watch.assignments, SizeIs(1));
  EXPECT_EQ(group_of(watch.assignments[0].replayer), 257u) << "its replayer is of its group";
  EXPECT_EQ(recipients, (std::vector<Rank>{0, 1, 2, 3, 4, 5})) << "every rank of the job";
  // A reconnecting rank of the other group gets it in its Welcome too.
  Hello h0 = cl.HelloOf(0, 2);
  h0.placement.replica_group = 1;
  absl::StatusOr<AttachResult> welcome = cl.c().Attach(h0, testing::Proven(h0));
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  bool found = false;
  for (const PlanMessage& p : welcome->pending_plans) {
    found = found || (p.plan_id == watch.plan_id && p.group == 257u && p.watch);
  }
  EXPECT_TRUE(found) << "group 1's rank holds group 257's watch id";
}

}  // namespace
}  // namespace sdc::core
