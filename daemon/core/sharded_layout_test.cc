// Issue 44, item 1: a sharded layout (an HSDP module on a replicate x shard
// mesh) at sdcd. Each replica group is the set of ranks that hold one shard;
// a rank's Hello says which shard it holds and which replica of it it is.
// The weight vote runs per shard (a strict majority of that shard's
// replicas), names the rank whose shard differs, and vetoes the checkpoint;
// Hellos whose shard coordinates contradict each other are refused.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/testing_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::core {
namespace {

using testing::Cluster;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::kJob;
using ::testing::SizeIs;

// A 3 x 2 mesh (replicate x shard) on 3 nodes of 2 ranks: rank r holds shard
// r % 2 as replica r / 2, so each shard's three replicas are on three nodes.
constexpr uint32_t kShards = 2;
Hello ShardedHello(const Cluster& cl, Rank r) {
  Hello h = cl.HelloOf(r);
  h.placement.replica_group = r % kShards;
  h.shard = {r % kShards, kShards, r / kShards};
  return h;
}

void AttachSharded(Cluster& cl) {
  for (Rank r = 0; r < cl.world(); ++r) {
    Hello h = ShardedHello(cl, r);
    ASSERT_TRUE(cl.c().Attach(h, testing::Proven(h)).ok()) << r;
  }
}

// Shards hold different tensors: shard s's report is Weights(10 + s), and
// `corrupt`'s differs from its shard's.
void ShardWeights(Cluster& cl, Step step, Rank corrupt = UINT32_MAX) {
  for (Rank r = 0; r < cl.world(); ++r) {
    const uint64_t salt = r == corrupt ? 99 : 10 + r % kShards;
    ASSERT_TRUE(cl.Send(r, step, Cluster::Weights(salt)).ok()) << r;
  }
}

TEST(ShardedLayoutTest, ShardsThatDifferFromEachOtherPassTheirOwnVotes) {
  Cluster cl(3, 2, /*audit_every=*/0, /*weight_every=*/10);
  AttachSharded(cl);
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  ShardWeights(cl, 10);
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  auto may = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(may.ok()) << may.status();
  EXPECT_TRUE(may->allowed) << may->reason;
}

TEST(ShardedLayoutTest, TheVoteOfOneShardNamesTheReplicaThatDiffers) {
  Cluster cl(3, 2, /*audit_every=*/0, /*weight_every=*/10);
  AttachSharded(cl);
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  ShardWeights(cl, 10, /*corrupt=*/3);  // Replica 1 of shard 1, on node-b.
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "faulty");
  EXPECT_THAT(incidents[0].gpus, ElementsAre("GPU-3"));
  EXPECT_THAT(incidents[0].explanation, HasSubstr("rank(s) 3 differ from the majority (2 of 3"));
  EXPECT_THAT(incidents[0].explanation,
              HasSubstr("replica group 1 holds shard 1/2 (rank 1 replica 0, rank 3 replica 1, "
                        "rank 5 replica 2)"));
  auto may = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(may.ok()) << may.status();
  EXPECT_FALSE(may->allowed);
}

TEST(ShardedLayoutTest, AShardOutOfRangeIsInvalid) {
  Cluster cl(3, 2);
  Hello h = ShardedHello(cl, 0);
  h.shard = {2, 2, 0};
  EXPECT_EQ(cl.c().Attach(h, testing::Proven(h)).status().code(),
            absl::StatusCode::kInvalidArgument);
  h.shard = {1, 0, 0};  // An index without a count.
  EXPECT_EQ(cl.c().Attach(h, testing::Proven(h)).status().code(),
            absl::StatusCode::kInvalidArgument);
  h.shard = {0, 7, 0};  // More shards than ranks.
  EXPECT_EQ(cl.c().Attach(h, testing::Proven(h)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShardedLayoutTest, ContradictoryShardCoordinatesAreRefused) {
  Cluster cl(3, 2, 0, 10);
  Hello first = ShardedHello(cl, 0);  // Shard 0, replica 0, group 0.
  ASSERT_TRUE(cl.c().Attach(first, testing::Proven(first)).ok());

  Hello other_shard = ShardedHello(cl, 2);
  other_shard.shard.index = 1;  // In group 0, which holds shard 0.
  absl::Status s = cl.c().Attach(other_shard, testing::Proven(other_shard)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("holds shard 1 but rank 0"));

  Hello same_replica = ShardedHello(cl, 2);
  same_replica.shard.replica = 0;
  s = cl.c().Attach(same_replica, testing::Proven(same_replica)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("both say they are replica 0 of shard 0"));

  Hello other_count = ShardedHello(cl, 1);
  other_count.shard = {1, 3, 0};
  s = cl.c().Attach(other_count, testing::Proven(other_count)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("has 3 shards but rank 0 said 2"));

  Hello full_replica = cl.HelloOf(3);  // DDP's Hello in a sharded job.
  s = cl.c().Attach(full_replica, testing::Proven(full_replica)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);

  Hello fine = ShardedHello(cl, 2);
  EXPECT_TRUE(cl.c().Attach(fine, testing::Proven(fine)).ok());
}

// FSDP without replicas (issue 44 item 3): every rank holds a shard of its
// own, a replica group of one. A buddy check's finding reaches sdcd as the
// reason of the step every rank skipped for it; the named rank's own report
// makes one incident naming it, and the skipped step's checkpoint is vetoed.
void AttachFsdp(Cluster& cl) {
  for (Rank r = 0; r < cl.world(); ++r) {
    Hello h = cl.HelloOf(r);
    h.placement.replica_group = r;
    h.shard = {r, cl.world(), 0};
    ASSERT_TRUE(cl.c().Attach(h, testing::Proven(h)).ok()) << r;
  }
}

// Rank 0's reduced shard carries the NaN the failing rank put in its first
// bucket (the in-band carrier of its failure): no all-reduce incident.
void SkippedFor(Cluster& cl, Step step, const std::string& reason) {
  for (Rank r = 0; r < cl.world(); ++r) {
    const uint64_t reduced_nonfinite = r == 0 ? 1 : 0;
    ASSERT_TRUE(
        cl.Send(r, step, StepReport{0, reduced_nonfinite, 1.0, 1234, false, reason, false}).ok())
        << r;
  }
}

TEST(ShardedLayoutTest, ABuddyFindingNamesTheRankAndVetoesTheCheckpoint) {
  Cluster cl(3, 2, /*audit_every=*/0, /*weight_every=*/0);
  AttachFsdp(cl);
  for (Step s = 1; s <= 2; ++s) cl.CleanStep(s);
  SkippedFor(cl, 3,
             "step 3 failed on rank 3 and was skipped on every rank: buddy check (faulty): "
             "rank 3's optimizer update of its shard at step 2 is wrong; ranks 5 and 0 "
             "recomputed it and agree");
  const auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kWeights);
  EXPECT_EQ(incidents[0].outcome, "faulty");
  EXPECT_THAT(incidents[0].ranks, ElementsAre(3u));
  EXPECT_TRUE(incidents[0].confirmed);
  EXPECT_THAT(incidents[0].explanation, HasSubstr("ranks 5 and 0 recomputed it"));
  auto may = cl.c().MayCheckpoint(kJob, 3);
  ASSERT_TRUE(may.ok()) << may.status();
  EXPECT_FALSE(may->allowed);
  EXPECT_THAT(may->reason, HasSubstr("buddy check (faulty)"));

  // Undecided, or a shard changed at rest: a suspect, not confirmed.
  SkippedFor(cl, 4,
             "step 4 failed on rank 1 and was skipped on every rank: buddy check (suspect): "
             "rank 1's stored shard changed at rest");
  const auto after = cl.c().ListIncidents(kJob);
  ASSERT_THAT(after, SizeIs(2));
  EXPECT_EQ(after[1].outcome, "suspect");
  EXPECT_THAT(after[1].ranks, ElementsAre(1u));
  EXPECT_FALSE(after[1].confirmed);

  // A sharded replay audit's finding (issue 44 item 4) goes the same way,
  // recorded as check 2's.
  SkippedFor(cl, 5,
             "step 5 failed on rank 2 and was skipped on every rank: buddy check (faulty): "
             "rank 2's forward/backward of its micro-batch at step 5 (replay audit) is wrong "
             "(its loss); ranks 4 and 0 replayed it and agree");
  const auto replayed = cl.c().ListIncidents(kJob);
  ASSERT_THAT(replayed, SizeIs(3));
  EXPECT_EQ(replayed[2].check, CheckKind::kReplay);
  EXPECT_THAT(replayed[2].ranks, ElementsAre(2u));
  EXPECT_TRUE(replayed[2].confirmed);
}

// No targeted audit follows an in-band suspect (FSDP's collectives cannot
// replay one rank alone), and on tp a replay names a tp group, never its
// faulty rank: the suspect blocks every later checkpoint of its job while it
// is in it, as a named GPU does, until an operator resolves the incident.
TEST(ShardedLayoutTest, AnInBandSuspectVetoesLaterCheckpointsUntilResolved) {
  Cluster cl(3, 2, /*audit_every=*/0, /*weight_every=*/0);
  AttachFsdp(cl);
  // A clean step with every rank's weight check (each rank its own group).
  auto checkpoint = [&cl](Step step) {
    cl.CleanStep(step);
    for (Rank r = 0; r < cl.world(); ++r) {
      EXPECT_TRUE(cl.Send(r, step, Cluster::Weights(r)).ok()) << r;
    }
    return cl.c().MayCheckpoint(kJob, step);
  };
  auto may = checkpoint(1);
  ASSERT_TRUE(may.ok()) << may.status();
  EXPECT_TRUE(may->allowed) << may->reason;
  SkippedFor(cl, 2,
             "step 2 failed on rank 0 and was skipped on every rank: buddy check (suspect): a tp "
             "group's replays differed together (replay audit): ranks 0, 1 (tp mixes "
             "activations: no replay tells which is wrong); rank 0's forward/backward");
  const auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kReplay);
  EXPECT_EQ(incidents[0].outcome, "suspect");
  for (Step s = 3; s <= 4; ++s) {
    may = checkpoint(s);
    ASSERT_TRUE(may.ok()) << may.status();
    EXPECT_FALSE(may->allowed) << s;
    EXPECT_FALSE(may->retryable) << "asking again changes nothing";
    EXPECT_THAT(may->reason,
                HasSubstr(absl::StrCat("is a suspect of incident ", incidents[0].id,
                                       " (replay check, step 2) that no targeted audit can "
                                       "clear on this layout, and is still in the job; replace ",
                                       cl.HelloOf(0).placement.node)));
  }
  ASSERT_TRUE(cl.c().ResolveIncident(incidents[0].id, "ops", "node drained and tested").ok());
  may = checkpoint(5);
  ASSERT_TRUE(may.ok()) << may.status();
  EXPECT_TRUE(may->allowed) << may->reason;
}

TEST(ShardedLayoutTest, OtherSkipReasonsNameNobody) {
  Cluster cl(3, 2, /*audit_every=*/0, /*weight_every=*/0);
  AttachFsdp(cl);
  cl.CleanStep(1);
  // Another check's failure, and a text that only looks like a finding.
  SkippedFor(cl, 2, "step 2 failed on rank 3 and was skipped on every rank: checksum alarm");
  SkippedFor(cl, 3, "step 3 failed on rank 3 and was skipped on every rank: buddy check "
                    "(maybe): rank 3");
  SkippedFor(cl, 4, "step 4 failed on rank x and was skipped on every rank: buddy check "
                    "(faulty): rank x");
  // Only rank 0's reduced NaN, as before: no rank is named for these.
  const auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(3));
  for (const auto& inc : incidents) {
    EXPECT_EQ(inc.check, CheckKind::kNonFinite);
    EXPECT_EQ(inc.outcome, "allreduce");
    EXPECT_THAT(inc.ranks, IsEmpty());
  }
}

// A NaN in one FSDP rank's local gradients: its replica group is itself,
// so "every rank of the group" is not every rank of the job. The rank is a
// suspect; the NaN FSDP's reduce-scatter carried into another shard's
// reduced gradients (rank 0's, reported first) is not an all-reduce fault.
// Every rank's local NaN/Inf is the model's or its data's: one incident.
TEST(ShardedLayoutTest, ALoneNaNUnderFsdpNamesItsRankAndEveryRanksNaNIsTheModels) {
  Cluster cl(3, 2, /*audit_every=*/0, /*weight_every=*/0);
  AttachFsdp(cl);
  cl.CleanStep(1);
  for (Rank r = 0; r < cl.world(); ++r) {
    const uint64_t local = r == 1 ? 1 : 0, reduced = r == 0 ? 1 : 0;
    ASSERT_TRUE(cl.Send(r, 2, StepReport{local, reduced, 1.0, 1234, false,
                                         "NaN/Inf in the local gradients of rank 1", false})
                    .ok())
        << r;
  }
  const auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kNonFinite);
  EXPECT_EQ(incidents[0].outcome, "suspect");
  EXPECT_THAT(incidents[0].ranks, ElementsAre(1u));

  for (Rank r = 0; r < cl.world(); ++r) {
    ASSERT_TRUE(cl.Send(r, 3, StepReport{1, 1, 1.0, 1234, false,
                                         "NaN/Inf in every rank's local gradients", false})
                    .ok())
        << r;
  }
  const auto after = cl.c().ListIncidents(kJob);
  ASSERT_THAT(after, SizeIs(2));
  EXPECT_EQ(after[1].outcome, "all_ranks");
  EXPECT_THAT(after[1].ranks, IsEmpty());
}

// Issue 45 item 2: a failed every-step product checksum reaches sdcd as the
// reason of the step every rank skipped for it; the alarmed rank's own
// report makes it a suspect (targeted replay audits judge it), never a
// rank named faulty, and the NaN carrying it is not an all-reduce fault.
TEST(ShardedLayoutTest, AChecksumAlarmMakesTheRankASuspect) {
  Cluster cl(3, 2, /*audit_every=*/0, /*weight_every=*/0);
  cl.AttachAll();
  cl.CleanStep(1);
  // DDP: every rank's reduced gradients hold the NaN the alarmed rank put
  // in its first bucket.
  auto SkippedFor = [&cl](Step step, const std::string& reason) {
    for (Rank r = 0; r < cl.world(); ++r) {
      ASSERT_TRUE(cl.Send(r, step, StepReport{0, 1, 1.0, 1234, false, reason, false}).ok()) << r;
    }
  };
  SkippedFor(2,
             "step 2 failed on rank 4 and was skipped on every rank: checksum alarm at step 2 on "
             "rank 4: aten::mm [96, 64] x [64, 32] Float in the backward (AddmmBackward0), "
             "column 8: discrepancy -1.64917e-05 > threshold 3.45265e-07 (transient: "
             "recomputed differently)");
  const auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kReplay);
  EXPECT_EQ(incidents[0].outcome, "suspect");
  EXPECT_THAT(incidents[0].ranks, ElementsAre(4u));
  EXPECT_FALSE(incidents[0].confirmed);
  EXPECT_THAT(incidents[0].explanation,
              HasSubstr("discrepancy -1.64917e-05 > threshold 3.45265e-07 (transient"));

  // The rank in the alarm must be the one that failed the step.
  SkippedFor(3,
             "step 3 failed on rank 4 and was skipped on every rank: checksum alarm at step 3 on "
             "rank 2: aten::mm");
  const auto after = cl.c().ListIncidents(kJob);
  ASSERT_THAT(after, SizeIs(2));
  EXPECT_EQ(after[1].outcome, "allreduce");
  EXPECT_THAT(after[1].ranks, IsEmpty());
}

}  // namespace
}  // namespace sdc::core
