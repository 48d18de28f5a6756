// Attempts (issue 42): a job restarted by its launcher under the same job id.

#include <string>

#include "absl/strings/str_join.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/testing_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using testing::Cluster;
using testing::kJob;
using testing::Proven;

// Rank r's Hello in `attempt` (a new process: incarnation attempt + 1),
// resuming from `resume_step`.
Hello AttemptHello(const Cluster& cl, Rank r, uint64_t attempt, Step resume_step) {
  Hello h = cl.HelloOf(r, attempt + 1);
  h.attempt = attempt;
  h.resume_step = resume_step;
  return h;
}

absl::StatusOr<AttachResult> AttachInAttempt(Cluster& cl, Rank r, uint64_t attempt,
                                             Step resume_step) {
  const Hello h = AttemptHello(cl, r, attempt, resume_step);
  return cl.c().Attach(h, Proven(h));
}

void StepsInAttempt(Cluster& cl, uint64_t attempt, Step from, Step to) {
  for (Step s = from; s <= to; ++s) {
    for (Rank r = 0; r < cl.world(); ++r) {
      ASSERT_TRUE(cl.Send(r, s, StepReport{0, 0, 1.0, 1234, true, "", false}, attempt + 1).ok())
          << "rank " << r << " step " << s;
    }
  }
}

void WeightsInAttempt(Cluster& cl, uint64_t attempt, Step step) {
  for (Rank r = 0; r < cl.world(); ++r) {
    ASSERT_TRUE(cl.Send(r, step, Cluster::Weights(), attempt + 1).ok()) << r;
  }
}

std::string Notes(const Effects& e) { return absl::StrJoin(e.notes, "\n"); }

// Attempt 0 attaches and checkpoints at 10 and 20 (the gate at 20 makes
// 10 final; 20 stays provisional).
void CheckpointsAt10And20(Cluster& cl) {
  cl.AttachAll();
  StepsInAttempt(cl, 0, 1, 10);
  WeightsInAttempt(cl, 0, 10);
  ASSERT_TRUE(cl.c().MayCheckpoint(kJob, 10)->allowed);
  StepsInAttempt(cl, 0, 11, 20);
  WeightsInAttempt(cl, 0, 20);
  ASSERT_TRUE(cl.c().MayCheckpoint(kJob, 20)->allowed);
}

// Attempt 0 checkpoints at 10 and 20 (CheckpointsAt10And20)
// and is cut off with step 21 half reported.
void FirstAttempt(Cluster& cl) {
  ASSERT_NO_FATAL_FAILURE(CheckpointsAt10And20(cl));
  for (Rank r : {0u, 1u, 2u}) {
    ASSERT_TRUE(cl.Send(r, 21, StepReport{0, 0, 1.0, 1234, true, "", false}, 1).ok());
  }
}

TEST(AttemptsTest, ARestartedJobIsANewAttemptResumingFromAFinalCheckpoint) {
  Cluster cl(3, 2);
  FirstAttempt(cl);
  // torchrun restarts every rank; they resume from step 10 (latest_final()).
  absl::StatusOr<AttachResult> first = AttachInAttempt(cl, 0, 1, 10);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->attempt, 1u);
  EXPECT_EQ(first->resume_warning, "") << "step 10's checkpoint is final";
  EXPECT_THAT(Notes(first->effects),
              HasSubstr("attempt 1 (world size 6, resuming from step 10) replaces attempt 0; "
                        "closed 1 open checks of steps 21 to 21 undecided"));
  EXPECT_THAT(Notes(first->effects),
              HasSubstr("the provisional checkpoint of step 20 was abandoned"));
  for (Rank r = 1; r < 6; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 1, 10).ok()) << r;
  EXPECT_EQ(cl.store().pending_count(), 0u) << "step 21's three reports left with its check";

  // The ledger keeps the final checkpoint; the old attempt's provisional one
  // is neither confirmed nor revoked.
  absl::StatusOr<CheckpointResult> status = cl.c().CheckpointStatus(kJob);
  EXPECT_EQ(status->confirmed_through, 10u);
  EXPECT_THAT(status->revoked, IsEmpty());

  // Steps 11.. again: not resends of attempt 0's, and judged afresh.
  StepsInAttempt(cl, 1, 11, 20);
  WeightsInAttempt(cl, 1, 20);
  absl::StatusOr<CheckpointResult> d = cl.c().MayCheckpoint(kJob, 20);
  ASSERT_TRUE(d->allowed) << d->reason;
  EXPECT_EQ(d->confirmed_through, 10u) << "20 is the new attempt's, provisional";
  StepsInAttempt(cl, 1, 21, 30);
  WeightsInAttempt(cl, 1, 30);
  d = cl.c().MayCheckpoint(kJob, 30);
  ASSERT_TRUE(d->allowed) << d->reason;
  EXPECT_EQ(d->confirmed_through, 20u);
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  ASSERT_THAT(cl.c().ListJobs(), SizeIs(1));
  EXPECT_EQ(cl.c().ListJobs()[0].attempt, 1u);
  EXPECT_EQ(cl.c().ListJobs()[0].last_step, 30u);

  // The store keeps the attempt with what it closed.
  absl::StatusOr<Snapshot> snap = cl.store().Load();
  ASSERT_THAT(snap->attempts, SizeIs(1));
  EXPECT_EQ(snap->attempts[0].attempt, 1u);
  EXPECT_EQ(snap->attempts[0].resume_step, 10u);
  EXPECT_EQ(snap->attempts[0].closed_checks, 1u);
  EXPECT_EQ(snap->jobs.at(0).attempt, 1u);
}

TEST(AttemptsTest, TheOldAttemptIsStale) {
  Cluster cl(3, 2);
  FirstAttempt(cl);
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 1, 10).ok()) << r;
  // A Hello of attempt 0 (a straggler of the old processes) is refused...
  absl::StatusOr<AttachResult> old = cl.c().Attach(cl.HelloOf(3, 1), Proven(cl.HelloOf(3, 1)));
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("job job-a is at attempt 1"));
  // ...and so is a report an old process sent late: nothing double-counted.
  absl::StatusOr<Effects> late =
      cl.Send(3, 21, StepReport{0, 0, 1.0, 1234, true, "", false}, /*incarnation=*/1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("stale report"));
}

TEST(AttemptsTest, AWorldSizeChangesBetweenAttemptsOnly) {
  Cluster cl(3, 2);
  ASSERT_NO_FATAL_FAILURE(CheckpointsAt10And20(cl));

  // Within attempt 0 a different world size is an error.
  cl.set_shape(2, 2);
  Hello shrunk = cl.HelloOf(0, 5);
  absl::StatusOr<AttachResult> refused = cl.c().Attach(shrunk, Proven(shrunk));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("has world size 6 in attempt 0 but rank 0 says 4 (a world size "
                        "changes only with a new attempt"));

  // Attempt 1 shrinks to 4 ranks (node-c lost): a new topology and plans.
  for (Rank r = 0; r < 4; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 1, 10).ok()) << r;
  ASSERT_EQ(cl.c().ListRanks(kJob)->size(), 4u);
  StepsInAttempt(cl, 1, 11, 20);
  cl.Audit(20, {}, {}, 0, {}, {}, /*incarnation=*/2);  // The 4-rank plan: passes.
  WeightsInAttempt(cl, 1, 20);
  absl::StatusOr<CheckpointResult> d = cl.c().MayCheckpoint(kJob, 20);
  ASSERT_TRUE(d->allowed) << d->reason;
  EXPECT_EQ(d->confirmed_through, 10u);

  // Attempt 2 grows to 8 ranks, resuming from 20 (final once 30 is allowed;
  // provisional here: warned, not refused, by default).
  cl.set_shape(4, 2);
  for (Rank r = 0; r < 8; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 2, 20).ok()) << r;
  EXPECT_EQ(cl.c().ListJobs()[0].world_size, 8u);
  StepsInAttempt(cl, 2, 21, 30);
  cl.Audit(30, {}, {}, 0, {}, {}, /*incarnation=*/3);
  WeightsInAttempt(cl, 2, 30);
  d = cl.c().MayCheckpoint(kJob, 30);
  ASSERT_TRUE(d->allowed) << d->reason;
  EXPECT_EQ(d->confirmed_through, 20u);
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
}

TEST(AttemptsTest, AResumeFromAProvisionalCheckpointIsWarnedByDefault) {
  Cluster cl(3, 2);
  cl.AttachAll();
  StepsInAttempt(cl, 0, 1, 10);
  WeightsInAttempt(cl, 0, 10);
  ASSERT_TRUE(cl.c().MayCheckpoint(kJob, 10)->allowed);  // Provisional: nothing after it.
  absl::StatusOr<AttachResult> a = AttachInAttempt(cl, 0, 1, 10);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->resume_warning,
              HasSubstr("it resumes from step 10, whose checkpoint is provisional (no later "
                        "checkpoint confirmed it); the newest final one is step 0"));
  EXPECT_THAT(Notes(a->effects), HasSubstr("warning: it resumes from step 10"));
  // Every rank of the attempt hears it.
  absl::StatusOr<AttachResult> b = AttachInAttempt(cl, 5, 1, 10);
  EXPECT_EQ(b->resume_warning, a->resume_warning);
  // The provisional checkpoint it resumed from stays provisional.
  EXPECT_EQ(cl.c().CheckpointStatus(kJob)->confirmed_through, 0u);
}

TEST(AttemptsTest, AResumeFromANonFinalCheckpointIsRefusedWhenAsked) {
  CoordinatorOptions options;
  options.resume_policy = CoordinatorOptions::ResumePolicy::kRefuse;
  Cluster cl(3, 2, 10, 10, options);
  ASSERT_NO_FATAL_FAILURE(CheckpointsAt10And20(cl));
  // Rank 5 is caught at step 25: checkpoint 20 is revoked.
  StepsInAttempt(cl, 0, 21, 25);
  cl.AllWeights(25, /*corrupt=*/5);
  ASSERT_THAT(cl.c().CheckpointStatus(kJob)->revoked, ElementsAre(20u));

  absl::StatusOr<AttachResult> revoked = AttachInAttempt(cl, 0, 1, 20);
  EXPECT_EQ(revoked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(revoked.status().message()),
              HasSubstr("attempt 1 of job job-a is refused (sdcd --resume_policy=refuse): it "
                        "resumes from step 20, whose checkpoint was revoked"));
  absl::StatusOr<AttachResult> never = AttachInAttempt(cl, 0, 1, 15);
  EXPECT_EQ(never.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(never.status().message()), HasSubstr("not one the gate allowed"));
  EXPECT_EQ(cl.c().ListJobs()[0].attempt, 0u) << "a refused attempt starts nothing";
  // From the final one it starts.
  absl::StatusOr<AttachResult> ok = AttachInAttempt(cl, 0, 1, 10);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->resume_warning, "");
}

TEST(AttemptsTest, PerGpuHistoryFollowsTheGpuAcrossAttempts) {
  Cluster cl(3, 2);
  cl.AttachAll();
  StepsInAttempt(cl, 0, 1, 10);
  cl.AllWeights(10, /*corrupt=*/5);  // GPU-5 on node-c is attributed faulty.
  ASSERT_THAT(cl.c().ListIncidents(kJob), SizeIs(1));
  // Node-c is replaced: attempt 1 runs ranks 4 and 5 on node-z's GPUs.
  for (Rank r = 0; r < 6; ++r) {
    Hello h = AttemptHello(cl, r, 1, 0);
    if (r >= 4) {
      h.placement.node = "node-z";
      h.placement.gpu_uuid = absl::StrCat("GPU-z", r);
    }
    ASSERT_TRUE(cl.c().Attach(h, Proven(h)).ok()) << r;
  }
  StepsInAttempt(cl, 1, 1, 10);
  WeightsInAttempt(cl, 1, 10);
  absl::StatusOr<CheckpointResult> d = cl.c().MayCheckpoint(kJob, 10);
  EXPECT_TRUE(d->allowed) << "the faulty GPU left with its node: " << d->reason;
  // The old GPU keeps its incident; the new one starts clean.
  EXPECT_THAT(cl.c().History("GPU-5", "").first, SizeIs(1));
  EXPECT_THAT(cl.c().History("GPU-z5", "").first, IsEmpty());
}

// A checkpoint revoked after the step a new attempt resumed from was of
// the abandoned timeline: the attempt's own checkpoint of that step holds
// other weights and is not vetoed as "revoked" (found by the Slurm loop).
TEST(AttemptsTest, ARevocationAfterTheResumeStepDoesNotVetoTheNewTimeline) {
  Cluster cl(3, 2);
  ASSERT_NO_FATAL_FAILURE(CheckpointsAt10And20(cl));  // 20 confirms 10.
  StepsInAttempt(cl, 0, 21, 25);
  cl.AllWeights(25, /*corrupt=*/5);
  ASSERT_THAT(cl.c().CheckpointStatus(kJob)->revoked, ElementsAre(20u));
  absl::StatusOr<AttachResult> a = AttachInAttempt(cl, 0, 1, 10);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(Notes(a->effects),
              HasSubstr("the revocation of step 20's checkpoint belongs to the old timeline"));
  EXPECT_TRUE(cl.c().CheckpointStatus(kJob)->revoked.empty());
  EXPECT_EQ(cl.c().CheckpointStatus(kJob)->confirmed_through, 10u);
  for (Rank r = 1; r < 6; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 1, 10).ok()) << r;
  StepsInAttempt(cl, 1, 11, 20);
  WeightsInAttempt(cl, 1, 20);
  absl::StatusOr<CheckpointResult> d = cl.c().MayCheckpoint(kJob, 20);
  ASSERT_TRUE(d.ok()) << d.status();
  // Rank 5's GPU is still in the job and still vetoes; the old revocation does not.
  EXPECT_THAT(d->reason, Not(HasSubstr("was revoked")));
  EXPECT_THAT(d->reason, HasSubstr("rank 5"));
}

TEST(AttemptsTest, AFaultyGpuThatStaysInTheNewAttemptStillVetoes) {
  Cluster cl(3, 2);
  cl.AttachAll();
  StepsInAttempt(cl, 0, 1, 10);
  cl.AllWeights(10, /*corrupt=*/5);
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 1, 0).ok()) << r;
  StepsInAttempt(cl, 1, 1, 10);
  WeightsInAttempt(cl, 1, 10);
  absl::StatusOr<CheckpointResult> d = cl.c().MayCheckpoint(kJob, 10);
  EXPECT_FALSE(d->allowed);
  EXPECT_THAT(d->reason, HasSubstr("rank 5 (GPU-5 on node-c) was attributed faulty at step 10"));
}

TEST(AttemptsTest, AnImplausibleResumeStepIsRefused) {
  Cluster cl(3, 2);
  cl.AttachAll();
  absl::StatusOr<AttachResult> a = AttachInAttempt(cl, 0, 1, Step{1} << 49);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("is implausible"));
  EXPECT_EQ(cl.c().ListJobs()[0].attempt, 0u);
}

TEST(AttemptsTest, AnUnauthenticatedHelloCannotRestartAProvenJob) {
  Cluster cl(3, 2);
  cl.AttachAll();
  const Hello h = AttemptHello(cl, 0, 1, 0);
  absl::StatusOr<AttachResult> a = cl.c().Attach(h, Caller{});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(cl.c().ListJobs()[0].attempt, 0u);
}

TEST(AttemptsTest, AttemptsSurviveARestartOfSdcd) {
  Cluster cl(3, 2);
  FirstAttempt(cl);
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 1, 10).ok()) << r;
  StepsInAttempt(cl, 1, 11, 15);
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  EXPECT_EQ(cl.c().ListJobs()[0].attempt, 1u);
  EXPECT_EQ(cl.c().CheckpointStatus(kJob)->confirmed_through, 10u);
  // The ranks reconnect in attempt 1 and go on; the abandoned checkpoint of
  // step 20 stays abandoned: attempt 1's 30 confirms only its own 20... and
  // a checkpoint at 25 confirms nothing of attempt 0.
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(AttachInAttempt(cl, r, 1, 10).ok()) << r;
  StepsInAttempt(cl, 1, 16, 25);
  WeightsInAttempt(cl, 1, 25);
  absl::StatusOr<CheckpointResult> d = cl.c().MayCheckpoint(kJob, 25);
  ASSERT_TRUE(d->allowed) << d->reason;
  EXPECT_EQ(d->confirmed_through, 10u);
  EXPECT_THAT(d->revoked, IsEmpty());
}

}  // namespace
}  // namespace sdc::core
