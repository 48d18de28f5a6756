#include "client/step_core.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sdc::client {
namespace {

// The agreement is an all-reduce (MAX) of every rank's encoding.
Agreement Agree(const std::vector<LocalView>& views) {
  std::vector<int64_t> m;
  for (uint32_t r = 0; r < views.size(); ++r) {
    const std::vector<int64_t> e = EncodeAgreement(views[r], r);
    if (m.empty()) m = e;
    for (size_t i = 0; i < e.size(); ++i) m[i] = std::max(m[i], e[i]);
  }
  EXPECT_EQ(m.size(), kAgreementSlots);
  return DecodeAgreement(m);
}

// The same over a sharded layout: rank r holds shard r % shards.
Agreement AgreeSharded(const std::vector<LocalView>& views, uint32_t shards) {
  std::vector<int64_t> m;
  for (uint32_t r = 0; r < views.size(); ++r) {
    const std::vector<int64_t> e = EncodeAgreement(views[r], r, r % shards, shards);
    EXPECT_EQ(e.size(), kAgreementSlots + kAgreementShardSlots * shards);
    if (m.empty()) m = e;
    for (size_t i = 0; i < e.size(); ++i) m[i] = std::max(m[i], e[i]);
  }
  return DecodeAgreement(m);
}

TEST(StepCoreTest, ShardsCompareReducedDigestsAmongTheirOwnReplicas) {
  // 3 x 2 (replicate x shard): the two shards' gradients differ, as they do.
  std::vector<LocalView> v(6);
  for (uint32_t r = 0; r < 6; ++r) v[r].reduced_digest = r % 2 ? 0xfeedface12345678ull : 0x42;
  Agreement a = AgreeSharded(v, 2);
  EXPECT_FALSE(a.reduced_digests_differ);
  EXPECT_EQ(a.reduced_differ_shard, -1);
  EXPECT_TRUE(Decide(a).apply);

  // One replica of shard 1 received other gradients: every rank skips.
  v[3].reduced_digest = 0xfeedface12345679ull;
  a = AgreeSharded(v, 2);
  EXPECT_TRUE(a.reduced_digests_differ);
  EXPECT_EQ(a.reduced_differ_shard, 1);
  const Decision d = Decide(a);
  EXPECT_FALSE(d.apply);
  EXPECT_TRUE(d.failed_check);
  EXPECT_EQ(d.reason, "the replicas of shard 1 received different reduced gradients");

  // Only the upper halves differ, in shard 0.
  v[3].reduced_digest = 0xfeedface12345678ull;
  v[4].reduced_digest = 0x42 | (uint64_t{7} << 32);
  EXPECT_EQ(AgreeSharded(v, 2).reduced_differ_shard, 0);
}

TEST(StepCoreTest, OneShardIsTheUnshardedEncoding) {
  LocalView v;
  v.reduced_digest = 0x1234;
  EXPECT_EQ(EncodeAgreement(v, 3, 0, 1), EncodeAgreement(v, 3));
  EXPECT_EQ(EncodeAgreement(v, 3, 0, 0).size(), kAgreementSlots);
}

// Issue 39, case 6: one repair slot per replica group, each the minimum
// over its own ranks only; one group keeps the base slot.
TEST(StepCoreTest, EachReplicaGroupAgreesOnItsOwnRepairStep) {
  // Groups by rank: index 0, 1, 0, 1, 0, 1; group 0 holds verdicts 40, 45,
  // 40 (minimum 40), group 1 holds 0, 30, 30 (rank 1 has none yet).
  const uint64_t held[6] = {40, 0, 45, 30, 40, 30};
  std::vector<int64_t> m;
  for (uint32_t r = 0; r < 6; ++r) {
    LocalView v;
    v.repair_step = held[r];
    const std::vector<int64_t> e = EncodeAgreement(v, r, 0, 0, r % 2, 2);
    ASSERT_EQ(e.size(), kAgreementSlots + 2);
    if (m.empty()) m = e;
    for (size_t i = 0; i < e.size(); ++i) m[i] = std::max(m[i], e[i]);
  }
  Agreement a = DecodeAgreement(m, 2);
  EXPECT_EQ(a.repair_step_by_group, (std::vector<uint64_t>{40, 0}));
  EXPECT_EQ(a.repair_step_known_by_all, 0u);
  EXPECT_TRUE(Decide(a).apply) << "the group slots are not read as digests";

  LocalView v;
  v.repair_step = 12;
  EXPECT_EQ(EncodeAgreement(v, 0, 0, 0, 0, 1), EncodeAgreement(v, 0));
  EXPECT_EQ(DecodeAgreement(EncodeAgreement(v, 0)).repair_step_by_group,
            (std::vector<uint64_t>{12}));
  EXPECT_TRUE(Agreement().repair_step_by_group.empty()) << "no exchange, no repair";
}

TEST(StepCoreTest, ReplicaGroupsAreIndexedByAscendingId) {
  ReplicaGroups g({300, 7, 300, 7, 4096});
  EXPECT_EQ(g.count(), 3u);
  EXPECT_EQ(g.index_of(0), 1u);
  EXPECT_EQ(g.index_of(1), 0u);
  EXPECT_EQ(g.index_of(4), 2u);
  EXPECT_EQ(g.id(1), 300u);
  EXPECT_EQ(g.members(0), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(g.members(1), (std::vector<uint32_t>{0, 2}));
}

TEST(StepCoreTest, ARepairCopiesFromAStrictMajorityOfTheGroupToThoseWhoDiffer) {
  // Ranks 1, 3, 5 are the group; ranks 0, 2, 4 (another group) hold other
  // digests and never count.
  const std::vector<uint32_t> members = {1, 3, 5};
  RepairPlan p = PlanRepair(members, {9, 5, 9, 5, 9, 6}, /*hint=*/3);
  ASSERT_TRUE(p.source.has_value());
  EXPECT_EQ(*p.source, 3u);
  EXPECT_EQ(p.receivers, (std::vector<uint32_t>{5}));
  // The hint went bad since the vote: the group's lowest majority holder.
  p = PlanRepair(members, {9, 5, 9, 7, 9, 5}, 3);
  ASSERT_TRUE(p.source.has_value());
  EXPECT_EQ(*p.source, 1u);
  EXPECT_EQ(p.receivers, (std::vector<uint32_t>{3}));
  // A hint outside the group is not taken, even where its digest matches.
  p = PlanRepair(members, {5, 5, 9, 5, 9, 6}, 0);
  ASSERT_TRUE(p.source.has_value());
  EXPECT_EQ(*p.source, 1u);
  // No strict majority of the group (the other group's 9s do not count).
  p = PlanRepair(members, {9, 5, 9, 7, 9, 6}, 1);
  EXPECT_FALSE(p.source.has_value());
  EXPECT_TRUE(p.receivers.empty());
  // Nothing differs any more: a source and nobody to copy to.
  p = PlanRepair(members, {0, 5, 0, 5, 0, 5}, 5);
  EXPECT_EQ(p.source, std::optional<uint32_t>(5));
  EXPECT_TRUE(p.receivers.empty());
}

TEST(StepCoreTest, CleanStepApplies) {
  std::vector<LocalView> v(4);
  for (auto& x : v) x.reduced_digest = 0x1234567890abcdefull;
  const Agreement a = Agree(v);
  EXPECT_FALSE(a.any_local_nonfinite);
  EXPECT_FALSE(a.reduced_digests_differ);
  EXPECT_EQ(a.highest_local_nonfinite_rank, -1);
  const Decision d = Decide(a);
  EXPECT_TRUE(d.apply);
  EXPECT_EQ(d.reason, "");
}

TEST(StepCoreTest, LoneLocalNanNamesTheHighestRank) {
  std::vector<LocalView> v(6);
  v[1].local_nonfinite = true;
  v[4].local_nonfinite = true;
  const Agreement a = Agree(v);
  EXPECT_TRUE(a.any_local_nonfinite);
  EXPECT_FALSE(a.all_local_nonfinite);
  EXPECT_EQ(a.highest_local_nonfinite_rank, 4);
  const Decision d = Decide(a);
  EXPECT_FALSE(d.apply);
  EXPECT_EQ(d.reason, "NaN/Inf in the local gradients of rank 4");
}

TEST(StepCoreTest, NanOnEveryRank) {
  std::vector<LocalView> v(3);
  for (auto& x : v) x.local_nonfinite = true;
  const Agreement a = Agree(v);
  EXPECT_TRUE(a.all_local_nonfinite);
  EXPECT_EQ(Decide(a).reason, "NaN/Inf in every rank's local gradients");
}

TEST(StepCoreTest, DifferentReducedGradientsSkip) {
  // Digests differing only in the high or only in the low half.
  for (uint64_t other : {0x1234567890abcdeeull, 0x1234567790abcdefull}) {
    std::vector<LocalView> v(3);
    for (auto& x : v) x.reduced_digest = 0x1234567890abcdefull;
    v[2].reduced_digest = other;
    const Agreement a = Agree(v);
    EXPECT_TRUE(a.reduced_digests_differ) << std::hex << other;
    EXPECT_EQ(Decide(a).reason, "ranks received different reduced gradients");
  }
}

TEST(StepCoreTest, ReasonsCombineAndMinimumsTravel) {
  std::vector<LocalView> v(3);
  v[0].reduced_nonfinite = true;
  v[1].audit_mismatch = true;
  v[0].plans_held = 5;
  v[1].plans_held = 3;
  v[2].plans_held = 4;
  v[0].repair_step = 20;
  v[1].repair_step = 20;
  v[2].repair_step = 10;
  const Agreement a = Agree(v);
  EXPECT_EQ(Decide(a).reason, "NaN/Inf in the reduced gradients; replay audit mismatch");
  EXPECT_EQ(a.plans_held_by_all, 3u);
  EXPECT_EQ(a.repair_step_known_by_all, 10u);
}

// Issue 42 item 4: sdcd's watch of a rank named faulty runs on every step
// that runs no other audit, once every rank holds it, until a later watch
// replaces it; one-off targeted plans still run, once each, in order.
TEST(PlanQueueTest, WatchesStandOneOffsRunOnceInOrder) {
  PlanQueue q;
  auto take = [&](uint64_t held_by_all) {
    const PlanQueue::Choice c = q.Take(held_by_all, 0);
    EXPECT_EQ(c.audit, c.plan_id != 0) << "one group: it audits exactly when it runs a plan";
    return c.plan_id;
  };
  EXPECT_EQ(take(0), 0u);
  q.Add(1, 0, /*watch=*/false, /*empty=*/false);
  q.Add(3, 0, /*watch=*/false, /*empty=*/false);  // 2 missing: held stays 1.
  EXPECT_EQ(q.held(), 1u);
  EXPECT_EQ(take(1), 1u);
  EXPECT_EQ(take(1), 0u) << "a one-off runs once";
  q.Add(2, 0, /*watch=*/true, /*empty=*/false);
  EXPECT_EQ(q.held(), 3u);
  // Until every rank holds plan 2, no watch.
  EXPECT_EQ(take(1), 0u);
  // Every rank holds 2 and 3: the one-off 3 first, then the watch (in
  // force from then on) on every step.
  EXPECT_EQ(take(3), 3u);
  EXPECT_EQ(q.watch(0), 2u);
  EXPECT_EQ(take(3), 2u);
  EXPECT_EQ(take(3), 2u);
  // A new watch replaces the old; an empty one ends watching.
  q.Add(4, 0, /*watch=*/true, /*empty=*/false);
  EXPECT_EQ(take(3), 2u) << "4 is not held by every rank yet";
  EXPECT_EQ(take(4), 4u);
  q.Add(5, 0, /*watch=*/true, /*empty=*/true);
  q.Add(5, 0, /*watch=*/false, /*empty=*/false);  // A resend changes nothing.
  EXPECT_EQ(take(5), 0u);
  EXPECT_EQ(q.watch(0), 0u);
  EXPECT_EQ(take(5), 0u);
  // An agreed minimum past what this rank holds cannot happen (it is a
  // minimum over ranks); it is clamped all the same.
  EXPECT_EQ(take(9), 0u);
}

// Issue 39, case 6: replica groups 1 and 257 on one process group. sdcd
// numbers plans per job and sends every group's plans to every rank: the
// ranks of both groups hold ids 1..3 contiguously, so the one agreement over
// the process group lets them run (before, each group held only its own
// plans, the minimum stayed 0 and none ran). On every step both groups
// audit alike (the audit's all-gather spans the process group); each
// group's ranks run their own group's plan, the others join with none.
TEST(PlanQueueTest, EachReplicaGroupRunsItsOwnPlansOnTheSameSteps) {
  PlanQueue a, b;  // A rank of group 1, a rank of group 257.
  for (PlanQueue* q : {&a, &b}) {
    q->Add(1, 1, /*watch=*/false, /*empty=*/false);    // Group 1's suspect.
    q->Add(2, 257, /*watch=*/false, /*empty=*/false);  // Group 257's suspect.
    q->Add(3, 257, /*watch=*/true, /*empty=*/false);   // Group 257's watch.
    EXPECT_EQ(q->held(), 3u);
  }
  // Step 1: group 1 runs plan 1, group 257 plan 2, both audit.
  PlanQueue::Choice ca = a.Take(3, 1), cb = b.Take(3, 257);
  EXPECT_TRUE(ca.audit);
  EXPECT_TRUE(cb.audit);
  EXPECT_EQ(ca.plan_id, 1u);
  EXPECT_EQ(cb.plan_id, 2u);
  // Step 2 on: group 257's watch; group 1 has nothing of its own but
  // audits with the rest (nothing to replay).
  for (int step = 0; step < 3; ++step) {
    ca = a.Take(3, 1);
    cb = b.Take(3, 257);
    EXPECT_TRUE(ca.audit);
    EXPECT_EQ(ca.plan_id, 0u);
    EXPECT_TRUE(cb.audit);
    EXPECT_EQ(cb.plan_id, 3u);
  }
  // Group 257's watch ends: nobody audits.
  for (PlanQueue* q : {&a, &b}) q->Add(4, 257, /*watch=*/true, /*empty=*/true);
  EXPECT_FALSE(a.Take(4, 1).audit);
  EXPECT_FALSE(b.Take(4, 257).audit);
}

TEST(StepCoreTest, ExchangeStepsAreTheAuditScheduleOrEveryHundredth) {
  EXPECT_TRUE(IsExchangeStep(20, 10));
  EXPECT_FALSE(IsExchangeStep(21, 10));
  EXPECT_FALSE(IsExchangeStep(10, 0));
  EXPECT_TRUE(IsExchangeStep(kExchangeEveryWithoutAudits * 3, 0));
  EXPECT_FALSE(IsExchangeStep(kExchangeEveryWithoutAudits * 3 + 1, 0));
}

TEST(StepCoreTest, PlanStep) {
  EXPECT_TRUE(PlanStep(100, 100, 10, 0).scheduled_audit);
  EXPECT_TRUE(PlanStep(100, 100, 10, 0).weight_check);
  EXPECT_FALSE(PlanStep(101, 100, 10, 0).scheduled_audit);
  EXPECT_EQ(PlanStep(101, 100, 10, 7).targeted_plan, 7u);
  // A scheduled audit takes precedence; the targeted plan waits.
  EXPECT_EQ(PlanStep(200, 100, 10, 7).targeted_plan, 0u);
  EXPECT_FALSE(PlanStep(5, 0, 0, 0).scheduled_audit);
  EXPECT_FALSE(PlanStep(5, 0, 0, 0).weight_check);
}

// Issue 39, case 3, in-band: a ring audit of 6 ranks (rank r replays rank
// r+2's micro-batch) in which `wrong` ranks compute every batch otherwise.
std::vector<AuditExchange> RingAudit(const std::set<int>& wrong) {
  std::vector<AuditExchange> a(6);
  for (int r = 0; r < 6; ++r) {
    a[r].has_original = true;
    a[r].original_loss_bits = 100 + r + (wrong.count(r) ? 1 : 0);
    a[r].original_digest = a[r].original_loss_bits;
    const int s = (r + 2) % 6;
    a[r].replay_subject = s;
    a[r].replay_loss_bits = 100 + s + (wrong.count(r) ? 1 : 0);
    a[r].replay_digest = a[r].replay_loss_bits;
  }
  return a;
}

TEST(StepCoreTest, AMismatchOnlyAcrossSoftwareStacksIsNotAFailureInBand) {
  // Ranks 4 and 5 (node-c) run another stack; everyone else the fleet's.
  const std::vector<uint64_t> upgraded = {7, 7, 7, 7, 9, 9};
  // Node-c's ranks compute differently: every mismatching comparison pairs
  // a node-c rank with a fleet rank.
  EXPECT_TRUE(MismatchesFollowStacks(RingAudit({4, 5}), upgraded));
  // No mismatch: nothing to explain.
  EXPECT_FALSE(MismatchesFollowStacks(RingAudit({}), upgraded));
  // Rank 1, on the fleet's stack, is wrong: rank 5's replay of it
  // mismatches across stacks, but its own replay of rank 3 mismatches
  // between equal stacks: a failure.
  EXPECT_FALSE(MismatchesFollowStacks(RingAudit({1}), upgraded));
  // One stack everywhere: never software.
  EXPECT_FALSE(MismatchesFollowStacks(RingAudit({4, 5}), {7, 7, 7, 7, 7, 7}));
  // An unknown stack (0: a trainer that did not say) never differs.
  EXPECT_FALSE(MismatchesFollowStacks(RingAudit({4, 5}), {7, 7, 0, 0, 9, 9}));
  EXPECT_FALSE(MismatchesFollowStacks(RingAudit({4, 5}), {}));
}

TEST(StepCoreTest, SoftwareStackDigests) {
  protocol::SoftwareStack unknown;
  EXPECT_EQ(unknown.Digest(), 0u);
  protocol::SoftwareStack a{"535.104", "12.2", "120201", "2.11.0", "H100", ""};
  protocol::SoftwareStack b = a;
  EXPECT_EQ(a.Digest(), b.Digest());
  EXPECT_NE(a.Digest(), 0u);
  b.driver = "550.54";
  EXPECT_NE(a.Digest(), b.Digest());
  // Field boundaries count: "12" + "2" is not "1" + "22".
  protocol::SoftwareStack c{"", "12", "2", "", "", ""};
  protocol::SoftwareStack d{"", "1", "22", "", "", ""};
  EXPECT_NE(c.Digest(), d.Digest());
}

TEST(StepCoreTest, AuditExchangeRoundTripsAndFindsTheFaultyRank) {
  std::vector<protocol::PlanMember> members;
  for (protocol::Rank r = 0; r < 6; ++r) {
    members.push_back({r, std::string("n") + char('0' + r / 2)});
  }
  const protocol::Topology t(members);
  const protocol::ReplayPlan plan = protocol::PlanFullAudit(t, 3);
  std::vector<int64_t> gathered;
  for (protocol::Rank r = 0; r < 6; ++r) {
    AuditExchange a;
    a.has_original = true;
    a.original_loss_bits = 1000 + r + (r == 4 ? 1 : 0);
    a.original_digest = ~0ull - r - (r == 4 ? 1 : 0);  // Above INT64_MAX: survives int64.
    for (const protocol::Assignment& x : plan.assignments) {
      if (x.replayer == r) {
        a.replay_subject = x.subject;
        a.replay_loss_bits = 1000 + x.subject + (r == 4 ? 9 : 0);
        a.replay_digest = ~0ull - x.subject - (r == 4 ? 9 : 0);
      }
    }
    const std::vector<int64_t> e = EncodeAudit(a);
    ASSERT_EQ(e.size(), kAuditSlots);
    gathered.insert(gathered.end(), e.begin(), e.end());
  }
  const std::vector<AuditExchange> audits = DecodeAudits(gathered, 6);
  EXPECT_EQ(audits[5].original_digest, ~0ull - 5);
  const protocol::AuditVerdict v = InBandVerdict(plan, t, audits, true, 30);
  // Rank 4's two comparisons mismatch; two partners are not proof, so both
  // go to tie-breaks in a third domain (every rank derives the same list).
  EXPECT_EQ(v.outcome, protocol::AuditOutcome::kTieBreakPending);
  EXPECT_TRUE(v.faulty.empty());
  ASSERT_EQ(v.tiebreaks.size(), 2u);
  for (const protocol::TieBreak& tb : v.tiebreaks) {
    EXPECT_TRUE(tb.subject == 4 || tb.disputed == 4);
    EXPECT_NE(t.DomainOf(tb.tiebreaker), t.DomainOf(4));
  }
}

// Issue 40, item 1: under a loss scaler NaN/Inf is the scaler's overflow:
// skipped (the scaler skips too), the gradients kept for it, no failed check.
TEST(StepCoreTest, UnderALossScalerNanIsTheScalersOverflow) {
  std::vector<LocalView> v(6);
  v[3].local_nonfinite = true;
  for (auto& x : v) x.reduced_nonfinite = true;
  Agreement a = Agree(v);
  Decision d = Decide(a, /*loss_scaled=*/true);
  EXPECT_FALSE(d.apply);
  EXPECT_TRUE(d.overflow);
  EXPECT_FALSE(d.failed_check);
  EXPECT_EQ(d.reason, "loss scaler overflow (NaN/Inf in the local gradients of rank 3)");
  // Without a scaler the same step is a failed check.
  d = Decide(a);
  EXPECT_FALSE(d.overflow);
  EXPECT_TRUE(d.failed_check);
  // An fp16 compression hook's sum overflowing: every rank's reduced
  // gradients alike, no local NaN.
  std::vector<LocalView> reduced(6);
  for (auto& x : reduced) x.reduced_nonfinite = true;
  d = Decide(Agree(reduced), true);
  EXPECT_TRUE(d.overflow);
  EXPECT_FALSE(d.failed_check);
  // NaN/Inf that reached only some ranks through the all-reduce is not the
  // scaler's: the reduced gradients differ.
  reduced[2].reduced_digest = 99;
  d = Decide(Agree(reduced), true);
  EXPECT_FALSE(d.overflow);
  EXPECT_TRUE(d.failed_check);
  // An overflow and an audit mismatch: the scaler still finds its NaN/Inf,
  // and the check failed.
  v[0].audit_mismatch = true;
  d = Decide(Agree(v), true);
  EXPECT_TRUE(d.overflow);
  EXPECT_TRUE(d.failed_check);
  EXPECT_EQ(d.reason, "loss scaler overflow (NaN/Inf in the local gradients of rank 3); replay "
                      "audit mismatch");
}

// Issue 40, item 3: a failure on any rank reaches every rank, which all
// name the same (lowest) failing rank.
TEST(StepCoreTest, TheAgreementCarriesTheLowestFailingRank) {
  std::vector<LocalView> v(6);
  EXPECT_EQ(Agree(v).lowest_failed_rank, -1);
  v[4].failed = true;
  v[2].failed = true;
  EXPECT_EQ(Agree(v).lowest_failed_rank, 2);
  v[0].failed = true;
  EXPECT_EQ(Agree(v).lowest_failed_rank, 0);
}

TEST(StepCoreTest, TheAuditGateCarriesAlertsPreflightsAndFailures) {
  auto gate = [](const std::vector<AuditGateView>& views) {
    std::vector<int64_t> m;
    for (uint32_t r = 0; r < views.size(); ++r) {
      const std::vector<int64_t> e = EncodeAuditGate(views[r], r);
      EXPECT_EQ(e.size(), kAuditGateSlots);
      if (m.empty()) m = e;
      for (size_t i = 0; i < e.size(); ++i) m[i] = std::max(m[i], e[i]);
    }
    return DecodeAuditGate(m);
  };
  std::vector<AuditGateView> v(4);
  AuditGate g = gate(v);
  EXPECT_FALSE(g.nondeterministic);
  EXPECT_FALSE(g.preflight_failed());
  EXPECT_EQ(g.lowest_failed_rank, -1);
  v[1].preflight_loss = true;
  v[3].preflight_loss = true;
  v[2].preflight_gradients = true;
  v[3].failed = true;
  v[0].nondeterministic = true;
  g = gate(v);
  EXPECT_TRUE(g.nondeterministic);
  EXPECT_TRUE(g.preflight_failed());
  EXPECT_EQ(g.preflight_loss_rank, 3);
  EXPECT_EQ(g.preflight_gradients_rank, 2);
  EXPECT_EQ(g.preflight_buffers_rank, -1);
  EXPECT_EQ(g.lowest_failed_rank, 3);
  const std::string text = PreflightFailure(g, 12);
  EXPECT_EQ(text.rfind("preflight at step 12: ", 0), 0u) << text;
  for (const char* part : {"the loss differs (rank 3)", "the gradients differ (rank 2)",
                           "autocast", "num_items_in_batch", "auxiliary",
                           "non-deterministic op", "loss_fn(model.module, batch) / micro_batches"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part;
  }
}

TEST(StepCoreTest, AFailureRoundTripsThroughItsWords) {
  const absl::Status s = absl::InternalError("replaying rank 4's micro-batch: libtorch: boom");
  const std::vector<int64_t> words = EncodeFailure(s);
  ASSERT_EQ(words.size(), kFailureSlots);
  EXPECT_EQ(DecodeFailure(words), s);
  // A long message is cut to what the words hold; an OK status is no failure.
  const absl::Status long_one = absl::UnavailableError(std::string(500, 'x'));
  const absl::Status cut = DecodeFailure(EncodeFailure(long_one));
  EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(cut.message(), std::string(kFailureTextBytes, 'x'));
  EXPECT_EQ(DecodeFailure(EncodeFailure(absl::OkStatus())).code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace sdc::client
