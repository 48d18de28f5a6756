#include "daemon/core/coordinator.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "daemon/core/testing_cluster.h"
#include "kernels/model_digest.h"

namespace sdc::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using testing::Cluster;
using testing::kJob;
using testing::kTensors;
using testing::Proven;

// ---------------------------------------------------------------------------
// Registry and bad input

TEST(CoordinatorTest, AttachRegistersJobAndRanks) {
  Cluster cl(3, 2);
  cl.AttachAll();
  auto jobs = cl.c().ListJobs();
  ASSERT_THAT(jobs, SizeIs(1));
  EXPECT_EQ(jobs[0].world_size, 6u);
  EXPECT_EQ(jobs[0].attached, 6u);
  EXPECT_EQ(jobs[0].nodes, 3u);
  auto ranks = cl.c().ListRanks(kJob);
  ASSERT_TRUE(ranks.ok());
  ASSERT_THAT(*ranks, SizeIs(6));
  EXPECT_EQ((*ranks)[5].placement.node, "node-c");
  EXPECT_EQ(cl.c().AttachedRanks(), 6u);
  cl.c().Detach(kJob, 5, 1);
  EXPECT_EQ(cl.c().AttachedRanks(), 5u);
  EXPECT_EQ(cl.c().ListRanks("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(CoordinatorTest, BadHellosAreRefusedWithSpecificCodes) {
  Cluster cl(3, 2);
  cl.AttachAll();
  struct Case {
    const char* name;
    std::function<void(Hello&)> mutate;
    absl::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"empty job", [](Hello& h) { h.job_id = ""; }, absl::StatusCode::kInvalidArgument,
       "job id"},
      {"rank beyond world", [](Hello& h) { h.placement.rank = 6; },
       absl::StatusCode::kInvalidArgument, "not below the world size"},
      {"no node", [](Hello& h) { h.placement.node = ""; }, absl::StatusCode::kInvalidArgument,
       "node name"},
      // Identities are bounded and plain (a 1 MB node name was stored before).
      {"huge node", [](Hello& h) { h.placement.node = std::string(1 << 20, 'n'); },
       absl::StatusCode::kInvalidArgument, "(1048576 characters) is not a node name"},
      {"node with a newline", [](Hello& h) { h.placement.node = "node-a\nrm -rf"; },
       absl::StatusCode::kInvalidArgument, "'node-a\\x0arm -rf' is not a node name"},
      {"node like a flag", [](Hello& h) { h.placement.node = "--all"; },
       absl::StatusCode::kInvalidArgument, "is not a node name"},
      {"no GPU", [](Hello& h) { h.placement.gpu_uuid = ""; },
       absl::StatusCode::kInvalidArgument, "is not a GPU id"},
      {"huge GPU", [](Hello& h) { h.placement.gpu_uuid = std::string(5 << 20, 'g'); },
       absl::StatusCode::kInvalidArgument, "is not a GPU id"},
      {"GPU with bytes", [](Hello& h) { h.placement.gpu_uuid = std::string("GPU-\xff\x01", 6); },
       absl::StatusCode::kInvalidArgument, "'GPU-\\xff\\x01' is not a GPU id"},
      {"huge tensor name", [](Hello& h) { h.weight_tensors[0] = std::string(4096, 't'); },
       absl::StatusCode::kInvalidArgument, "weight tensor name"},
      {"too many parameters", [](Hello& h) { h.parameter_count = 9; },
       absl::StatusCode::kInvalidArgument, "parameter count"},
      {"world size", [](Hello& h) { h.world_size = 12; h.placement.rank = 1; },
       absl::StatusCode::kFailedPrecondition, "world size 6"},
      {"cadence", [](Hello& h) { h.audit_every = 50; }, absl::StatusCode::kFailedPrecondition,
       "audits every 10"},
      {"layout", [](Hello& h) { h.layout_digest = 78; }, absl::StatusCode::kFailedPrecondition,
       "model layout"},
      {"stale incarnation", [](Hello& h) { h.incarnation = 0; },
       absl::StatusCode::kFailedPrecondition, "stale hello"},
  };
  for (const Case& c : cases) {
    Hello h = cl.HelloOf(1);
    c.mutate(h);
    absl::StatusOr<AttachResult> r = cl.c().Attach(h, Proven(h));
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status().code();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << c.name;
    EXPECT_LT(r.status().message().size(), 400u) << c.name << ": the echo is bounded";
  }
  // NVML's UUIDs and the CPU stand-in are GPU ids.
  for (const char* gpu : {"GPU-5f0e7a2c-1d2b-4c3a-9e8f-0123456789ab", "MIG-GPU-5f0e7a2c/1/0",
                          "cpu-node-a-1"}) {
    EXPECT_TRUE(IsSafeGpuId(gpu)) << gpu;
  }
  // Nothing changed: the job still has the same shape and accepts reports.
  EXPECT_EQ(cl.c().ListJobs()[0].world_size, 6u);
  EXPECT_TRUE(cl.Send(1, 1, StepReport{}).ok());
}

TEST(CoordinatorTest, BadReportsAreRefusedAndLeaveStateUnchanged) {
  Cluster cl(3, 2);
  cl.AttachAll();
  ASSERT_TRUE(cl.Send(0, 1, StepReport{}).ok());  // Rank 0 acked through seq 1.
  const size_t pending_before = cl.store().pending_count();

  auto ingest = [&](Report r) { return cl.c().Ingest(r); };
  auto report = [](Rank rank, uint64_t seq, Step step, decltype(Report::body) body) {
    Report r;
    r.job_id = kJob;
    r.rank = rank;
    r.incarnation = 1;
    r.sequence = seq;
    r.step = step;
    r.body = std::move(body);
    return r;
  };
  struct Case {
    const char* name;
    Report report;
    absl::StatusCode code;
    const char* message;
  };
  Report wrong_job = report(0, 2, 2, StepReport{});
  wrong_job.job_id = "other";
  Report stale = report(0, 2, 2, StepReport{});
  stale.incarnation = 0;
  WeightReport short_weights = Cluster::Weights();
  short_weights.tensors.pop_back();
  AuditResult not_audit_step;
  not_audit_step.subject = 0;
  AuditResult bad_pair;
  bad_pair.role = AuditRole::kReplay;
  bad_pair.subject = 0;  // Rank 0 replaying itself is never planned.
  AuditResult bad_gradients;
  bad_gradients.subject = 0;
  bad_gradients.gradients.resize(2);
  const std::vector<Case> cases = {
      {"unknown job", wrong_job, absl::StatusCode::kNotFound, "unknown job other"},
      {"unknown rank", report(9, 1, 1, StepReport{}), absl::StatusCode::kInvalidArgument,
       "unknown rank 9"},
      {"stale incarnation", stale, absl::StatusCode::kFailedPrecondition, "stale report"},
      {"sequence gap", report(0, 5, 2, StepReport{}), absl::StatusCode::kOutOfRange,
       "resend from 2"},
      {"duplicate step", report(0, 2, 1, StepReport{}), absl::StatusCode::kAlreadyExists,
       "step report for step 1 from rank 0 already received"},
      {"out of order step", report(0, 2, 0, StepReport{}), absl::StatusCode::kInvalidArgument,
       "out-of-order step"},
      {"wrong tensor count", report(0, 2, 10, short_weights),
       absl::StatusCode::kInvalidArgument, "has 3 tensors; the layout of replica group 0 has 4"},
      {"not an audit step", report(0, 2, 7, not_audit_step),
       absl::StatusCode::kInvalidArgument, "not a scheduled audit step"},
      {"unplanned pair", report(0, 2, 10, bad_pair), absl::StatusCode::kInvalidArgument,
       "does not assign that pair"},
      {"wrong gradient count", report(0, 2, 10, bad_gradients),
       absl::StatusCode::kInvalidArgument, "has 2 gradient fingerprints; the layout has 3"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Effects> e = ingest(c.report);
    EXPECT_EQ(e.status().code(), c.code) << c.name << ": " << e.status();
    EXPECT_THAT(std::string(e.status().message()), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(cl.store().pending_count(), pending_before) << c.name;
  }
  // A duplicate sequence is acknowledged again and changes nothing.
  absl::StatusOr<Effects> dup = ingest(report(0, 1, 1, StepReport{}));
  ASSERT_TRUE(dup.ok());
  EXPECT_TRUE(dup->duplicate);
  EXPECT_EQ(dup->acked_sequence, 1u);
  EXPECT_EQ(cl.store().pending_count(), pending_before);
  // The next report in sequence is still welcome: nothing moved.
  absl::StatusOr<Effects> next = ingest(report(0, 2, 2, StepReport{}));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->acked_sequence, 2u);
}

// ---------------------------------------------------------------------------
// Check 1

TEST(CoordinatorTest, CleanStepPassesAndFinalizes) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.CleanStep(1);
  ASSERT_THAT(cl.checks(), SizeIs(2));
  EXPECT_EQ(cl.checks()[0].check, CheckKind::kReducedGradients);
  EXPECT_EQ(cl.checks()[0].result, "pass");
  EXPECT_EQ(cl.checks()[1].result, "pass");
  EXPECT_EQ(cl.store().pending_count(), 0u);
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
}

// Issue 24, item 3: the rank that received different reduced gradients was
// confirmed faulty and its node sent to replacement, though the bad data may
// come from a sender or a link. It is a suspect now; a targeted audit of its
// own computation decides.
TEST(CoordinatorTest, RankWithDifferentReducedGradientsIsASuspectAuditedBeforeAnyRequest) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 1, StepReport{0, 0, 1.0, r == 4 ? 999u : 1234u, false, "agreement",
                                         false}).ok());
  }
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kReducedGradients);
  EXPECT_EQ(incidents[0].outcome, "suspect");
  EXPECT_THAT(incidents[0].ranks, ElementsAre(4));
  EXPECT_EQ(incidents[0].nodes[0], "node-c");
  EXPECT_FALSE(incidents[0].confirmed);
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  auto suspects = cl.c().ListSuspects();
  ASSERT_THAT(suspects, SizeIs(1));
  EXPECT_EQ(suspects[0].gpu, "GPU-4");
  auto plans = cl.MessagesOf<PlanMessage>();
  ASSERT_THAT(plans, SizeIs(1));
  EXPECT_THAT(plans[0].reason, HasSubstr("targeted audit of suspect rank 4"));
  // Its own computation is wrong: the targeted audit (and its tie-breaks)
  // confirm it, and only then is a request opened.
  cl.Audit(4, {4}, {4}, plans[0].plan_id, plans[0].assignments);
  cl.SettleTieBreaks(4, plans[0].plan_id);
  incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(2));
  EXPECT_EQ(incidents[1].outcome, "faulty");
  EXPECT_THAT(incidents[1].ranks, ElementsAre(4));
  auto requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].node, "node-c");
}

TEST(CoordinatorTest, LocalNanConfirmedByAFiniteReplayBlamesTheRank) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 3, StepReport{r == 2 ? 5u : 0u, 6, NAN, 1, false, "nonfinite",
                                         false}).ok());
  }
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty()) << "waits for the confirmation replay";
  AuditResult confirm;
  confirm.role = AuditRole::kConfirm;
  confirm.subject = 2;
  confirm.nonfinite = 0;
  ASSERT_TRUE(cl.Send(4, 3, confirm).ok());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kNonFinite);
  EXPECT_EQ(incidents[0].outcome, "faulty");
  EXPECT_THAT(incidents[0].ranks, ElementsAre(2));
  EXPECT_THAT(incidents[0].explanation, HasSubstr("got finite gradients"));
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
}

TEST(CoordinatorTest, LocalNanReproducedByAnotherGpuBlamesNobody) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 3, StepReport{r == 2 ? 5u : 0u, 6, NAN, 1, false, "nonfinite",
                                         false}).ok());
  }
  AuditResult confirm;
  confirm.role = AuditRole::kConfirm;
  confirm.subject = 2;
  confirm.nonfinite = 5;
  ASSERT_TRUE(cl.Send(4, 3, confirm).ok());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "reproduced");
  EXPECT_THAT(incidents[0].ranks, IsEmpty());
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty());
}

TEST(CoordinatorTest, UnconfirmedLocalNanMakesASuspectWithTargetedAudits) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 3, StepReport{r == 2 ? 5u : 0u, 6, NAN, 1, false, "nonfinite",
                                         false}).ok());
  }
  cl.clock().Advance(absl::Seconds(121));
  cl.Collect(cl.c().Tick());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "suspect");
  EXPECT_FALSE(incidents[0].confirmed);
  auto suspects = cl.c().ListSuspects();
  ASSERT_THAT(suspects, SizeIs(1));
  EXPECT_EQ(suspects[0].gpu, "GPU-2");
  auto plans = cl.MessagesOf<PlanMessage>();
  ASSERT_THAT(plans, SizeIs(1));
  EXPECT_EQ(plans[0].plan_id, 1u);
  EXPECT_THAT(plans[0].reason, HasSubstr("targeted audit of suspect rank 2"));
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
}

// Issue 39, case 7: under gradient accumulation (or with audits off) the
// trainers run no confirmation replay of a lone NaN/Inf, and sdcd waited
// for one until the deadline, vetoing checkpoints meanwhile. The step
// report says none comes: the step is decided at once, no clock advance.
TEST(CoordinatorTest, NoConfirmationComingDecidesALoneNanAtOnce) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 2; ++s) cl.CleanStep(s);
  for (Rank r = 0; r < 6; ++r) {
    StepReport rep{r == 2 ? 5u : 0u, 6, NAN, 1, false, "nonfinite", false};
    rep.no_confirmation = "the step accumulated 4 micro-batches";
    ASSERT_TRUE(cl.Send(r, 3, rep).ok());
  }
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1)) << "decided without waiting for the deadline";
  EXPECT_EQ(incidents[0].check, CheckKind::kNonFinite);
  EXPECT_EQ(incidents[0].outcome, "suspect");
  EXPECT_FALSE(incidents[0].confirmed);
  EXPECT_THAT(incidents[0].ranks, ElementsAre(2));
  EXPECT_THAT(incidents[0].explanation,
              HasSubstr("no confirmation replay runs: 'the step accumulated 4 micro-batches'"));
  ASSERT_THAT(cl.c().ListSuspects(), SizeIs(1));
  ASSERT_THAT(cl.MessagesOf<PlanMessage>(), SizeIs(1)) << "a targeted audit of the suspect";
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  auto d = cl.c().MayCheckpoint(kJob, 3);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->allowed);
  EXPECT_FALSE(d->retryable) << d->reason;
  EXPECT_THAT(d->reason, Not(HasSubstr("awaits a confirmation replay")));
  EXPECT_THAT(d->reason, HasSubstr("failed the nonfinite check"));
  // Without the note the step still waits for the replay.
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 4, StepReport{r == 2 ? 5u : 0u, 6, NAN, 1, false, "n", false}).ok());
  }
  EXPECT_THAT(cl.c().ListIncidents(kJob), SizeIs(1));
  EXPECT_THAT(cl.c().MayCheckpoint(kJob, 4)->reason, HasSubstr("awaits a confirmation replay"));
}

TEST(CoordinatorTest, NanOnEveryRankIsTheModelNotAGpu) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 3, StepReport{1, 6, NAN, 1, false, "nonfinite", false}).ok());
  }
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "all_ranks");
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty());
}

// Issue 40, item 1: under a loss scaler NaN/Inf is the scaler's overflow.
StepReport Scaled(uint64_t local_nonfinite, uint64_t reduced_nonfinite) {
  StepReport s{local_nonfinite, reduced_nonfinite, NAN, 1, false, "loss scaler overflow", false};
  s.loss_scaled = true;
  return s;
}

TEST(CoordinatorTest, AnOverflowOnEveryRankUnderALossScalerIsNoIncident) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.Send(r, 3, Scaled(1, 6)).ok());
  // A compression hook's fp16 sum overflowing on every rank is the same.
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.Send(r, 4, Scaled(0, 6)).ok());
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty());
  // Without the scaler the same reports are the model's or the all-reduce's.
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 5, StepReport{1, 6, NAN, 1, false, "nonfinite", false}).ok());
  }
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "all_ranks");
}

TEST(CoordinatorTest, ALoneOverflowUnderALossScalerNamesNobodyUnlessAReplayIsFinite) {
  Cluster cl(3, 2);
  cl.AttachAll();
  // Step 3: rank 2's overflow, reproduced on another node: the data.
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.Send(r, 3, Scaled(r == 2 ? 5 : 0, 6)).ok());
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty()) << "waits for the confirmation replay";
  AuditResult confirm;
  confirm.role = AuditRole::kConfirm;
  confirm.subject = 2;
  confirm.nonfinite = 5;
  ASSERT_TRUE(cl.Send(4, 3, confirm).ok());
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  // Step 4: rank 2's overflow under accumulation, never replayed: no suspect.
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.Send(r, 4, Scaled(r == 2 ? 5 : 0, 6)).ok());
  cl.clock().Advance(absl::Seconds(121));
  cl.Collect(cl.c().Tick());
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty());
  // Step 5: a replay on another node comes out finite: the GPU is named.
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.Send(r, 5, Scaled(r == 2 ? 5 : 0, 6)).ok());
  confirm.nonfinite = 0;
  ASSERT_TRUE(cl.Send(4, 5, confirm).ok());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "faulty");
  EXPECT_THAT(incidents[0].ranks, ElementsAre(2));
  EXPECT_THAT(incidents[0].explanation, HasSubstr("under a loss scaler"));
}

// Issue 27, item 5: values no healthy rank sends are refused, not stored.
TEST(CoordinatorTest, ImplausibleValuesAreRefused) {
  Cluster cl(3, 2);
  cl.AttachAll();
  auto refused = cl.Send(0, UINT64_MAX, StepReport{});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("is implausible (above 2^48)"));
  for (double sum : {static_cast<double>(NAN), static_cast<double>(INFINITY), -1.0}) {
    refused = cl.Send(0, 1, StepReport{0, 0, sum, 1, true, "", false});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << sum;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("sum of squares")) << sum;
  }
  // Over non-finite gradients a NaN sum is what a rank computes.
  EXPECT_TRUE(cl.Send(0, 1, StepReport{0, 3, NAN, 1, false, "nonfinite", false}).ok());
  EXPECT_EQ(cl.store().pending_count(), 1u) << "only the plausible report is stored";
}

// Issue 27, item 5: a resend must repeat what was acknowledged. The same
// sequence number with other content was taken for a duplicate; it is
// refused now (sdcd logs it), and a true resend is still acknowledged.
TEST(CoordinatorTest, ASequenceResentWithOtherContentIsRefused) {
  Cluster cl(3, 2);
  cl.AttachAll();
  Report rep;
  rep.job_id = kJob;
  rep.rank = 1;
  rep.incarnation = 1;
  rep.sequence = 1;
  rep.step = 1;
  rep.body = StepReport{0, 0, 1.0, 1234, true, "", false};
  ASSERT_TRUE(cl.c().Ingest(rep).ok());
  absl::StatusOr<Effects> again = cl.c().Ingest(rep);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate);
  Report other = rep;
  other.body = StepReport{0, 0, 1.0, 4321, true, "", false};  // Another reduced digest.
  absl::StatusOr<Effects> conflict = cl.c().Ingest(other);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(conflict.status().message()),
              HasSubstr("rank 1 of job job-a sent sequence 1 again with different content"));
  other = rep;
  other.step = 2;
  EXPECT_EQ(cl.c().Ingest(other).status().code(), absl::StatusCode::kAlreadyExists);
}

// Whoever reaches the trainer port cannot make sdcd hold jobs without bound:
// a new job beyond --max_jobs or --max_ranks is refused until abandoned jobs
// expire, and an expired job leaves memory and the store (its incidents stay).
TEST(CoordinatorTest, JobsAreBoundedAndAbandonedOnesExpire) {
  CoordinatorOptions options;
  options.max_jobs = 2;
  options.max_ranks = 10;
  options.job_expiry = absl::Hours(1);
  Cluster cl(3, 2, 10, 10, options);
  cl.AttachAll();  // job-a: 6 ranks.
  cl.Audit(10, {}, {1});  // A lone mismatch: an incident to keep.
  auto job_of = [&](const std::string& id, uint32_t world, Rank r) {
    Hello h = cl.HelloOf(r);
    h.job_id = id;
    h.world_size = world;
    return h;
  };
  ASSERT_TRUE(cl.c().Attach(job_of("job-b", 4, 0), Proven(job_of("job-b", 4, 0))).ok());
  absl::StatusOr<AttachResult> refused = cl.c().Attach(job_of("job-c", 1, 0), Proven(job_of("job-c", 1, 0)));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--max_jobs 2"));
  // job-b leaves; an hour later it is abandoned and job-c fits.
  cl.c().Detach("job-b", 0, 1);
  cl.clock().Advance(absl::Minutes(59));
  EXPECT_EQ(cl.c().Attach(job_of("job-c", 1, 0), Proven(job_of("job-c", 1, 0))).status().code(),
            absl::StatusCode::kResourceExhausted) << "not abandoned yet";
  cl.clock().Advance(absl::Minutes(2));
  ASSERT_TRUE(cl.c().Attach(job_of("job-c", 1, 0), Proven(job_of("job-c", 1, 0))).ok());
  // The rank budget: 6 + 1 held, 4 more would pass 10.
  EXPECT_THAT(std::string(cl.c().Attach(job_of("job-d", 4, 0), Proven(job_of("job-d", 4, 0))).status().message()),
              HasSubstr("--max_ranks 10"));
  absl::StatusOr<Snapshot> snap = cl.store().Load();
  ASSERT_TRUE(snap.ok());
  std::set<std::string> stored;
  for (const JobRecord& j : snap->jobs) stored.insert(j.job_id);
  EXPECT_THAT(stored, ElementsAre("job-a", "job-c"));
  for (const RankRecord& r : snap->ranks) EXPECT_NE(r.job_id, "job-b");
  // Attached jobs never expire; a detached one goes at the timer's tick,
  // logged as an effect, and keeps its incidents.
  cl.clock().Advance(absl::Hours(5));
  EXPECT_THAT(cl.c().Tick().expired_jobs, IsEmpty());
  for (Rank r = 0; r < 6; ++r) cl.c().Detach(kJob, r, 1);
  cl.clock().Advance(absl::Hours(2));
  EXPECT_THAT(cl.c().Tick().expired_jobs, ElementsAre(kJob));
  EXPECT_THAT(cl.c().ListIncidents(kJob), SizeIs(1));
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  ASSERT_THAT(cl.c().ListJobs(), SizeIs(1));
  EXPECT_EQ(cl.c().ListJobs()[0].job_id, "job-c");
}

// ---------------------------------------------------------------------------
// Check 2

TEST(CoordinatorTest, ReplayAuditAttributesAFaultyRank) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.Audit(10, {3}, {3});
  // Two mismatches with two partners: two other faulty ranks could explain
  // them, so tie-breaks in third domains decide before anyone is named.
  auto verdicts = cl.MessagesOf<AuditVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_EQ(verdicts[0].outcome, AuditOutcome::kTieBreakPending);
  EXPECT_THAT(verdicts[0].faulty, IsEmpty());
  ASSERT_THAT(cl.MessagesOf<TieBreakMessage>(), SizeIs(2));
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  cl.SettleTieBreaks(10);
  verdicts = cl.MessagesOf<AuditVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(2));
  EXPECT_EQ(verdicts[1].outcome, AuditOutcome::kFaulty);
  EXPECT_THAT(verdicts[1].faulty, ElementsAre(3));
  EXPECT_THAT(verdicts[1].suspects, IsEmpty());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kReplay);
  EXPECT_THAT(incidents[0].gpus, ElementsAre("GPU-3"));
  auto requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].node, "node-b");
  EXPECT_EQ(cl.store().pending_count(), 0u);
}

// A result that arrives after its audit's verdict (a rank resending after
// a reconnect, say) is taken and acknowledged, before and after a restart,
// without opening the audit again and deciding it a second time at its
// deadline (issue 37: a refused report blocked the rank's every later one).
TEST(CoordinatorTest, AResultAfterTheAuditsVerdictIsTakenWithoutOpeningItAgain) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.Audit(10, {}, {});
  ASSERT_THAT(cl.MessagesOf<AuditVerdictMessage>(), SizeIs(1));
  AuditResult late;
  late.role = AuditRole::kOriginal;
  late.subject = 0;
  late.loss_bits = Cluster::BatchValue(0);
  late.gradient_digest = late.loss_bits;
  auto taken = cl.Send(0, 10, late);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_THAT(taken->notes, Contains(HasSubstr("taken after its check was decided")));
  cl.clock().Advance(absl::Minutes(10));
  cl.Collect(cl.c().Tick());
  EXPECT_THAT(cl.MessagesOf<AuditVerdictMessage>(), SizeIs(1));
  EXPECT_EQ(cl.store().pending_count(), 0u);

  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  cl.AttachAll();
  taken = cl.Send(0, 10, late);
  ASSERT_TRUE(taken.ok()) << taken.status();
  cl.clock().Advance(absl::Minutes(10));
  cl.Collect(cl.c().Tick());
  EXPECT_THAT(cl.MessagesOf<AuditVerdictMessage>(), SizeIs(1));
  EXPECT_EQ(cl.store().pending_count(), 0u);
}

TEST(CoordinatorTest, LoneMismatchIsSettledByATieBreak) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.Audit(10, /*wrong_own=*/{1}, {});
  auto tiebreaks = cl.MessagesOf<TieBreakMessage>();
  ASSERT_THAT(tiebreaks, SizeIs(1));
  EXPECT_EQ(tiebreaks[0].subject, 1u);
  Topology t(cl.Members());
  EXPECT_NE(t.DomainOf(tiebreaks[0].replayer), t.DomainOf(1));
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  auto veto = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(veto.ok());
  EXPECT_THAT(veto->reason, HasSubstr("awaits tie-break replays by ranks"));
  ASSERT_TRUE(cl.TieBreakResult(tiebreaks[0].replayer, 1, 10).ok());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_THAT(incidents[0].ranks, ElementsAre(1));
  EXPECT_THAT(incidents[0].explanation, HasSubstr("own result was wrong"));
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
}

TEST(CoordinatorTest, TwoNodesDetectButNameNobody) {
  Cluster cl(2, 2);
  cl.AttachAll();
  cl.Audit(10, {1}, {1});
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "attribution_impossible");
  EXPECT_FALSE(incidents[0].confirmed);
  EXPECT_THAT(incidents[0].explanation, HasSubstr("attribution needs 3"));
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  EXPECT_THAT(cl.MessagesOf<PlanMessage>(), IsEmpty()) << "targeted audits cannot help";
}

TEST(CoordinatorTest, SystemicMismatchBlamesNobody) {
  Cluster cl(4, 2);
  cl.AttachAll();
  std::set<Rank> all;
  for (Rank r = 0; r < 8; ++r) all.insert(r);
  cl.Audit(10, {}, all);
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "systemic");
  EXPECT_THAT(incidents[0].ranks, IsEmpty());
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty());
}

TEST(CoordinatorTest, TargetedAuditOfASuspectConfirmsIt) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 3, StepReport{r == 2 ? 5u : 0u, 6, NAN, 1, false, "nonfinite",
                                         false}).ok());
  }
  cl.clock().Advance(absl::Seconds(121));
  cl.Collect(cl.c().Tick());
  auto plans = cl.MessagesOf<PlanMessage>();
  ASSERT_THAT(plans, SizeIs(1));
  cl.Audit(4, {2}, {2}, plans[0].plan_id, plans[0].assignments);
  EXPECT_THAT(cl.c().ListIncidents(kJob), SizeIs(1)) << "two partners: tie-breaks decide";
  cl.SettleTieBreaks(4, plans[0].plan_id);
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(2));
  EXPECT_EQ(incidents[1].outcome, "faulty");
  EXPECT_THAT(incidents[1].ranks, ElementsAre(2));
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty()) << "a confirmed GPU is no longer a suspect";
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
}

TEST(CoordinatorTest, ClearedTargetedAuditSchedulesTheNextUntilChancesRunOut) {
  CoordinatorOptions options;
  options.targeted_audits_per_suspect = 2;
  Cluster cl(3, 2, 10, 10, options);
  cl.AttachAll();
  for (Rank r = 0; r < 6; ++r) {
    ASSERT_TRUE(cl.Send(r, 3, StepReport{r == 2 ? 5u : 0u, 6, NAN, 1, false, "n", false}).ok());
  }
  cl.clock().Advance(absl::Seconds(121));
  cl.Collect(cl.c().Tick());
  auto plans = cl.MessagesOf<PlanMessage>();
  ASSERT_THAT(plans, SizeIs(1));
  cl.Audit(4, {}, {}, plans[0].plan_id, plans[0].assignments);
  plans = cl.MessagesOf<PlanMessage>();
  ASSERT_THAT(plans, SizeIs(2));
  EXPECT_EQ(plans[1].plan_id, 2u);
  cl.Audit(5, {}, {}, plans[1].plan_id, plans[1].assignments);
  EXPECT_THAT(cl.MessagesOf<PlanMessage>(), SizeIs(2)) << "no chances left";
  auto suspects = cl.c().ListSuspects();
  ASSERT_THAT(suspects, SizeIs(1));
  EXPECT_EQ(suspects[0].targeted_audits_left, 0u);
}

// ---------------------------------------------------------------------------
// Check 3 and the checkpoint gate

TEST(CoordinatorTest, WeightMinorityIsNamedWithItsTensors) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.AllWeights(10, /*corrupt=*/5);
  auto verdicts = cl.MessagesOf<WeightVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_FALSE(verdicts[0].pass);
  EXPECT_THAT(verdicts[0].minority, ElementsAre(5));
  EXPECT_THAT(verdicts[0].differing_tensors, ElementsAre("layers.0.w"));
  EXPECT_EQ(verdicts[0].majority_source, 0u);
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].check, CheckKind::kWeights);
  EXPECT_THAT(incidents[0].differing_tensors, ElementsAre("layers.0.w"));
  EXPECT_THAT(incidents[0].explanation, HasSubstr("5 of 6 replicas"));
}

// Issue 24, item 9: two corrupt replicas of four ended 'no_majority' with
// nobody named; the per-tensor vote names both and the healthy source.
TEST(CoordinatorTest, TwoCorruptReplicasOfFourAreNamedByTheirTensors) {
  Cluster cl(2, 2);
  cl.AttachAll();
  auto weights = [](size_t bad_tensor) {
    WeightReport w = Cluster::Weights();
    if (bad_tensor < w.tensors.size()) w.tensors[bad_tensor].s1 ^= 0xbad;
    std::vector<kernels::NamedFingerprint> named;
    for (size_t t = 0; t < kTensors.size(); ++t) named.push_back({kTensors[t], w.tensors[t]});
    w.digest = kernels::ModelDigest(named);
    return w;
  };
  for (Rank r = 0; r < 4; ++r) {
    ASSERT_TRUE(cl.Send(r, 10, weights(r == 1 ? 1 : r == 2 ? 3 : 99)).ok());
  }
  auto verdicts = cl.MessagesOf<WeightVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_FALSE(verdicts[0].pass);
  EXPECT_THAT(verdicts[0].minority, ElementsAre(1, 2));
  EXPECT_THAT(verdicts[0].differing_tensors, ElementsAre("layers.0.w", "norm.weight"));
  EXPECT_EQ(verdicts[0].majority_source, 0u);
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "faulty");
  EXPECT_THAT(incidents[0].ranks, ElementsAre(1, 2));
  EXPECT_THAT(incidents[0].explanation, HasSubstr("the majority of each tensor"));
}

// A relay sends a digest's tensors once and the rest of its ranks'
// reports of that digest as `tensors_elided` (agent/weight_elision.h).
WeightReport Elided(const WeightReport& w) {
  WeightReport e = w;
  e.tensors.clear();
  e.tensors_elided = true;
  return e;
}

TEST(CoordinatorTest, ElidedWeightReportsVoteAndTheCarriedTensorsNameTheMinority) {
  Cluster cl(3, 2);
  cl.AttachAll();
  // Rank 1 carries the majority's tensors, rank 5 its own; the rest are
  // elided, including rank 0's, which arrives before any carried copy.
  ASSERT_TRUE(cl.Send(0, 10, Elided(Cluster::Weights())).ok());
  ASSERT_TRUE(cl.Send(1, 10, Cluster::Weights()).ok());
  for (Rank r : {2u, 3u, 4u}) ASSERT_TRUE(cl.Send(r, 10, Elided(Cluster::Weights())).ok());
  ASSERT_TRUE(cl.Send(5, 10, Cluster::Weights(1)).ok());
  auto verdicts = cl.MessagesOf<WeightVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_THAT(verdicts[0].minority, ElementsAre(5));
  EXPECT_THAT(verdicts[0].differing_tensors, ElementsAre("layers.0.w"));
  EXPECT_EQ(verdicts[0].majority_source, 0u);
}

TEST(CoordinatorTest, AMinorityWhoseTensorsNeverCameIsNotBlamedOnTheOptimizer) {
  Cluster cl(3, 2);
  cl.AttachAll();
  // The report that carried rank 5's digest was lost on its way (the relay
  // elides the next ones all the same).
  for (Rank r = 0; r < 5; ++r) ASSERT_TRUE(cl.Send(r, 10, Cluster::Weights()).ok());
  ASSERT_TRUE(cl.Send(5, 10, Elided(Cluster::Weights(1))).ok());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_THAT(incidents[0].ranks, ElementsAre(5));
  EXPECT_THAT(incidents[0].differing_tensors, IsEmpty());
  EXPECT_THAT(incidents[0].explanation, HasSubstr("not compared tensor by tensor"));
  EXPECT_THAT(incidents[0].explanation, Not(HasSubstr("optimizer")));
}

TEST(CoordinatorTest, AnElidedReportMustBeEmpty) {
  Cluster cl(3, 2);
  cl.AttachAll();
  WeightReport both = Cluster::Weights();
  both.tensors_elided = true;
  auto e = cl.Send(0, 10, both);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("elided"));
  // Without the flag, an empty report is still a wrong layout.
  WeightReport none = Cluster::Weights();
  none.tensors.clear();
  EXPECT_EQ(cl.Send(0, 10, none).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, ARestartKeepsTheCarriedTensorsOfElidedVotes) {
  Cluster cl(3, 2);
  cl.AttachAll();
  // The carried copy comes after an elided one; the store must keep it.
  ASSERT_TRUE(cl.Send(0, 10, Elided(Cluster::Weights(1))).ok());
  ASSERT_TRUE(cl.Send(1, 10, Cluster::Weights(1)).ok());
  ASSERT_TRUE(cl.Send(2, 10, Cluster::Weights()).ok());
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.c().Attach(cl.HelloOf(r), Proven(cl.HelloOf(r))).ok());
  for (Rank r : {3u, 4u, 5u}) ASSERT_TRUE(cl.Send(r, 10, Elided(Cluster::Weights())).ok());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_THAT(incidents[0].ranks, ElementsAre(0, 1));
  EXPECT_THAT(incidents[0].differing_tensors, ElementsAre("layers.0.w"));
}

TEST(CoordinatorTest, CheckpointGateGivesPreciseReasons) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  // Weights of step 10 from all ranks but 3 and 5.
  for (Rank r : {0u, 1u, 2u, 4u}) ASSERT_TRUE(cl.Send(r, 10, Cluster::Weights()).ok());
  auto d = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->allowed);
  EXPECT_TRUE(d->retryable);
  EXPECT_EQ(d->reason, "weight check for step 10 missing from ranks 3, 5");
  for (Rank r : {3u, 5u}) ASSERT_TRUE(cl.Send(r, 10, Cluster::Weights()).ok());
  d = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->reason, "every check through this step is in and passed");
  EXPECT_TRUE(d->allowed);
  // Step 11 is not reported yet.
  d = cl.c().MayCheckpoint(kJob, 11);
  EXPECT_THAT(d->reason, HasSubstr("checks of step 11 not yet reported by ranks 0, 1, 2, 3, 4, 5"));
  EXPECT_EQ(cl.c().MayCheckpoint("nope", 1).status().code(), absl::StatusCode::kNotFound);
}

// Issue 24, item 10: an audit whose results never all arrived verified
// nothing; it passed as if complete and let the next checkpoint through. It
// now vetoes that checkpoint, as an incomplete weight check does, until a
// later complete audit.
TEST(CoordinatorTest, AnIncompleteAuditVetoesTheCheckpointAfterIt) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  cl.Audit(10, {}, {}, 0, {}, /*silent=*/{4});
  cl.AllWeights(10);
  cl.clock().Advance(absl::Seconds(121));
  cl.Collect(cl.c().Tick());
  auto d = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->allowed);
  EXPECT_FALSE(d->retryable);
  EXPECT_THAT(d->reason, HasSubstr("the last replay audit before it (step 10) is unverified: "
                                   "no mismatch, but no results from ranks 4"));
  // A complete audit later verifies again.
  for (Step s = 11; s <= 20; ++s) cl.CleanStep(s);
  cl.Audit(20, {}, {});
  cl.AllWeights(20);
  d = cl.c().MayCheckpoint(kJob, 20);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->allowed) << d->reason;
  // Also after a restart (the ledger comes back from the verdicts).
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  EXPECT_THAT(cl.c().MayCheckpoint(kJob, 10)->reason, HasSubstr("is unverified"));
}

TEST(CoordinatorTest, CheckpointVetoedWhileAFaultyGpuStaysAndClearedByDenial) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  cl.AllWeights(10, /*corrupt=*/5);
  auto d = cl.c().MayCheckpoint(kJob, 10);
  EXPECT_FALSE(d->allowed);
  EXPECT_FALSE(d->retryable);
  EXPECT_THAT(d->reason, HasSubstr("step 10 failed the weights check"));
  for (Step s = 11; s <= 20; ++s) cl.CleanStep(s);
  cl.AllWeights(20);
  d = cl.c().MayCheckpoint(kJob, 20);
  EXPECT_FALSE(d->allowed);
  EXPECT_THAT(d->reason, HasSubstr("rank 5 (GPU-5 on node-c) was attributed faulty at step 10"));
  const uint64_t request = cl.c().ListRequests()[0].id;
  ASSERT_TRUE(cl.c().Deny(request, "alice", "known bad sensor", false, false).ok());
  d = cl.c().MayCheckpoint(kJob, 20);
  EXPECT_TRUE(d->allowed) << d->reason;
}

// Issue 24, item 12: a faulty GPU whose request was suppressed (here its node
// is never replaced) vetoed its job's checkpoints for good, and the veto told
// the operator to deny a request that did not exist. The veto now says how to
// clear it, and resolving the incident (audited, persisted) does.
TEST(CoordinatorTest, ASuppressedRequestsIncidentIsResolvedByAnOperator) {
  CoordinatorOptions options;
  options.escalation.never_replace = {"node-c"};
  Cluster cl(3, 2, 10, 10, options);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  cl.AllWeights(10, /*corrupt=*/5);
  ASSERT_THAT(cl.c().ListRequests(), IsEmpty());
  const Incident inc = cl.c().ListIncidents(kJob).at(0);
  EXPECT_TRUE(inc.confirmed);
  EXPECT_THAT(inc.explanation, HasSubstr("no replacement request"));
  for (Step s = 11; s <= 20; ++s) cl.CleanStep(s);
  cl.AllWeights(20);
  auto d = cl.c().MayCheckpoint(kJob, 20);
  EXPECT_FALSE(d->allowed);
  EXPECT_THAT(d->reason, HasSubstr(absl::StrCat("no replacement request was opened for it (see "
                                                "the incident); once the GPU is dealt with, "
                                                "`sdcctl resolve incident ", inc.id)));
  EXPECT_THAT(d->reason, Not(HasSubstr("deny")));
  // Who and why are required; then it clears, once.
  EXPECT_EQ(cl.c().ResolveIncident(inc.id, "", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cl.c().ResolveIncident(inc.id, "alice", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cl.c().ResolveIncident(999, "alice", "x").status().code(),
            absl::StatusCode::kNotFound);
  auto resolved = cl.c().ResolveIncident(inc.id, "alice", "GPU 5 of node-c drained by hand");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->first.resolved_by, "alice");
  EXPECT_EQ(resolved->second.notes.size(), 1u);
  EXPECT_EQ(cl.c().ResolveIncident(inc.id, "bob", "again").status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (Step s = 21; s <= 30; ++s) cl.CleanStep(s);
  cl.AllWeights(30);
  d = cl.c().MayCheckpoint(kJob, 30);
  EXPECT_TRUE(d->allowed) << d->reason;
  // Persisted: a restart does not bring the veto back.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  EXPECT_EQ(cl.c().ListIncidents(kJob).at(0).resolution, "GPU 5 of node-c drained by hand");
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.c().Attach(cl.HelloOf(r), Proven(cl.HelloOf(r))).ok());
  for (Step s = 31; s <= 40; ++s) cl.CleanStep(s);
  cl.AllWeights(40);
  d = cl.c().MayCheckpoint(kJob, 40);
  EXPECT_TRUE(d->allowed) << d->reason;
}

TEST(CoordinatorTest, AnIncidentWithAnOpenRequestIsDecidedThroughIt) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.AllWeights(10, /*corrupt=*/5);
  const Incident inc = cl.c().ListIncidents(kJob).at(0);
  ASSERT_NE(inc.request_id, 0u);
  auto refused = cl.c().ResolveIncident(inc.id, "alice", "x");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("approve or deny it instead"));
}

TEST(CoordinatorTest, AppliedFailureVetoesUntilRollback) {
  Cluster cl(3, 2, /*audit_every=*/10, /*weight_every=*/10);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);  // Step 10 applied...
  cl.Audit(10, {}, {}); // ...and its audit passed: fine.
  // Step 20: a systemic audit failure, but the ranks applied the step.
  for (Step s = 11; s <= 20; ++s) cl.CleanStep(s);
  std::set<Rank> all = {0, 1, 2, 3, 4, 5};
  cl.Audit(20, {}, all);
  for (Step s = 21; s <= 30; ++s) cl.CleanStep(s);
  cl.AllWeights(30);
  auto d = cl.c().MayCheckpoint(kJob, 30);
  EXPECT_FALSE(d->allowed);
  EXPECT_THAT(d->reason, HasSubstr("step 20 applied gradients that failed the replay check"));
  EXPECT_THAT(d->reason, HasSubstr("roll back to a checkpoint before step 20"));
  // Every rank restarts from a checkpoint at step 10.
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.c().Attach(cl.HelloOf(r, 2), Proven(cl.HelloOf(r, 2))).ok());
  for (Step s = 11; s <= 20; ++s) {
    for (Rank r = 0; r < 6; ++r) {
      ASSERT_TRUE(cl.Send(r, s, StepReport{0, 0, 1, 1234, true, "", false}, 2).ok());
    }
  }
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.Send(r, 20, Cluster::Weights(), 2).ok());
  d = cl.c().MayCheckpoint(kJob, 20);
  EXPECT_TRUE(d->allowed) << d->reason;
}

TEST(CoordinatorTest, CheckpointsAreProvisionalUntilTheNextAndRevokedByAFault) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  cl.AllWeights(10);
  auto d = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(d->allowed) << d->reason;
  EXPECT_EQ(d->confirmed_through, 0u) << "the first checkpoint is provisional";
  d = cl.c().MayCheckpoint(kJob, 10);  // Asking again confirms nothing.
  EXPECT_EQ(d->confirmed_through, 0u);
  for (Step s = 11; s <= 20; ++s) cl.CleanStep(s);
  cl.AllWeights(20);
  d = cl.c().MayCheckpoint(kJob, 20);
  ASSERT_TRUE(d->allowed) << d->reason;
  EXPECT_EQ(d->confirmed_through, 10u);
  EXPECT_THAT(d->revoked, IsEmpty());
  // Rank 5 is caught at step 25: checkpoint 20 may hold its earlier, unseen
  // corruption.
  for (Step s = 21; s <= 25; ++s) cl.CleanStep(s);
  cl.AllWeights(25, /*corrupt=*/5);
  auto status = cl.c().CheckpointStatus(kJob);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->confirmed_through, 10u);
  EXPECT_THAT(status->revoked, ElementsAre(20u));
  EXPECT_FALSE(status->allowed);
  // The revocation is durable and asking again never revives it.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  status = cl.c().CheckpointStatus(kJob);
  EXPECT_EQ(status->confirmed_through, 10u);
  EXPECT_THAT(status->revoked, ElementsAre(20u));
  const uint64_t request = cl.c().ListRequests()[0].id;
  ASSERT_TRUE(cl.c().Deny(request, "alice", "known bad sensor", false, false).ok());
  d = cl.c().MayCheckpoint(kJob, 20);
  EXPECT_FALSE(d->allowed);
  EXPECT_THAT(d->reason, HasSubstr("the checkpoint of step 20 was revoked"));
  EXPECT_EQ(cl.c().CheckpointStatus("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(CoordinatorTest, ASystemicFailureRevokesNoCheckpoint) {
  Cluster cl(3, 2, /*audit_every=*/10, /*weight_every=*/10);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  cl.Audit(10, {}, {});
  cl.AllWeights(10);
  ASSERT_TRUE(cl.c().MayCheckpoint(kJob, 10)->allowed);
  for (Step s = 11; s <= 20; ++s) cl.CleanStep(s);
  cl.Audit(20, {}, {0, 1, 2, 3, 4, 5});  // Every replay differs: the software.
  auto status = cl.c().CheckpointStatus(kJob);
  EXPECT_THAT(status->revoked, IsEmpty());
}

// Issue 39, case 2: two faulty GPUs of three single-GPU nodes (or opposite
// in a ring of four) make every comparison mismatch with no rank in all of
// them. That was "systemic": nobody suspected, no targeted audit, and the
// provisional checkpoint stayed to become final. Now every rank is a
// suspect with a targeted audit, the provisional checkpoint is revoked, and
// still no GPU is named (non-determinism looks the same).
TEST(CoordinatorTest, TwoFaultyGpusOfASmallRingRevokeTheCheckpointAndAreAudited) {
  for (int nodes : {3, 4}) {
    SCOPED_TRACE(absl::StrCat(nodes, " nodes"));
    Cluster cl(nodes, 1, /*audit_every=*/10, /*weight_every=*/10);
    cl.AttachAll();
    for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
    cl.Audit(10, {}, {});
    cl.AllWeights(10);
    ASSERT_TRUE(cl.c().MayCheckpoint(kJob, 10)->allowed);
    for (Step s = 11; s <= 20; ++s) cl.CleanStep(s);
    // Rank 0 and, along step 20's ring, its subject (three nodes) or the
    // rank opposite (four): both corrupt their own and others' batches.
    std::map<Rank, Rank> subject_of;
    for (const Assignment& a : PlanFullAudit(Topology(cl.Members()), 2).assignments) {
      subject_of[a.replayer] = a.subject;
    }
    const Rank f2 = nodes == 3 ? subject_of.at(0) : subject_of.at(subject_of.at(0));
    cl.Audit(20, {0, f2}, {0, f2});
    auto incidents = cl.c().ListIncidents(kJob);
    ASSERT_THAT(incidents, SizeIs(1));
    EXPECT_EQ(incidents[0].outcome, "inconclusive");
    EXPECT_FALSE(incidents[0].confirmed);
    EXPECT_THAT(incidents[0].ranks, SizeIs(nodes));
    EXPECT_THAT(incidents[0].explanation, HasSubstr("two faulty GPUs or non-determinism"));
    EXPECT_THAT(cl.MessagesOf<TieBreakMessage>(), IsEmpty());
    EXPECT_THAT(cl.c().ListRequests(), IsEmpty()) << "no GPU is named";
    EXPECT_THAT(cl.c().ListSuspects(), SizeIs(nodes));
    auto plans = cl.MessagesOf<PlanMessage>();
    ASSERT_THAT(plans, SizeIs(nodes)) << "a targeted audit for every suspect";
    EXPECT_THAT(plans[0].reason, HasSubstr("targeted audit of suspect rank 0"));
    auto status = cl.c().CheckpointStatus(kJob);
    ASSERT_TRUE(status.ok());
    EXPECT_THAT(status->revoked, ElementsAre(10u));
    EXPECT_EQ(status->confirmed_through, 0u);
    EXPECT_FALSE(cl.c().MayCheckpoint(kJob, 20)->allowed);
  }
}

// ---------------------------------------------------------------------------
// Deadlines, restarts, operators

TEST(CoordinatorTest, DeadlineFinalizesWithMissingRanksNamed) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  for (Rank r = 0; r < 5; ++r) ASSERT_TRUE(cl.Send(r, 10, Cluster::Weights()).ok());
  cl.clock().Advance(absl::Seconds(119));
  cl.Collect(cl.c().Tick());
  EXPECT_THAT(cl.MessagesOf<WeightVerdictMessage>(), IsEmpty());
  cl.clock().Advance(absl::Seconds(2));
  cl.Collect(cl.c().Tick());
  auto verdicts = cl.MessagesOf<WeightVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_THAT(verdicts[0].explanation, HasSubstr("no weights from ranks 5"));
  auto d = cl.c().MayCheckpoint(kJob, 10);
  EXPECT_FALSE(d->allowed);
  EXPECT_FALSE(d->retryable);
  EXPECT_THAT(d->reason, HasSubstr("weight check for step 10 missing from ranks 5"));
}

TEST(CoordinatorTest, RestartRebuildsStateAndNothingIsDecidedTwice) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.CleanStep(1);
  // Half an audit and half a weight vote, then the coordinator restarts.
  for (Rank r = 0; r < 3; ++r) ASSERT_TRUE(cl.Send(r, 10, Cluster::Weights(r == 1)).ok());
  const size_t pending = cl.store().pending_count();
  EXPECT_EQ(pending, 3u);
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  for (Rank r = 0; r < 6; ++r) ASSERT_TRUE(cl.c().Attach(cl.HelloOf(r), Proven(cl.HelloOf(r))).ok());
  // Acknowledged reports stay acknowledged.
  Report again;
  again.job_id = kJob;
  again.rank = 0;
  again.incarnation = 1;
  again.sequence = 2;
  again.step = 10;
  again.body = Cluster::Weights();
  auto dup = cl.c().Ingest(again);
  ASSERT_TRUE(dup.ok());
  EXPECT_TRUE(dup->duplicate);
  // The vote completes with the other half.
  for (Rank r = 3; r < 6; ++r) ASSERT_TRUE(cl.Send(r, 10, Cluster::Weights()).ok());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_THAT(incidents[0].ranks, ElementsAre(1));
  EXPECT_EQ(cl.store().pending_count(), 0u);
  // A second restart: the incident and the request are there once.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  EXPECT_THAT(cl.c().ListIncidents(kJob), SizeIs(1));
  auto requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].state, RequestState::kPending);
}

TEST(CoordinatorTest, OperatorsAndActuatorsDriveRequests) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.AllWeights(10, 5);
  const uint64_t id = cl.c().ListRequests()[0].id;
  auto dry = cl.c().Approve(id, "alice", "confirmed", false, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok());
  EXPECT_EQ(dry->first.state, RequestState::kApproved);
  EXPECT_EQ(cl.c().GetRequest(id)->state, RequestState::kPending);
  ASSERT_TRUE(cl.c().Approve(id, "alice", "confirmed", false, false).ok());
  auto again = cl.c().Approve(id, "bob", "me too", false, false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  auto [started, effects] = cl.c().StartApproved("dry-run");
  ASSERT_THAT(started, SizeIs(1));
  EXPECT_EQ(started[0].state, RequestState::kExecuting);
  ASSERT_TRUE(cl.c().FinishExecution(id, true, "labelled node-c").ok());
  auto done = cl.c().GetRequest(id);
  EXPECT_EQ(done->state, RequestState::kDone);
  EXPECT_EQ(done->actuator_result, "labelled node-c");
  EXPECT_EQ(cl.c().GetRequest(99).status().code(), absl::StatusCode::kNotFound);
  auto history = cl.c().History("GPU-5", "");
  EXPECT_THAT(history.first, SizeIs(1));
  EXPECT_THAT(history.second, SizeIs(1));
  EXPECT_THAT(cl.c().History("", "node-c").second, SizeIs(1));
  EXPECT_THAT(cl.c().History("GPU-0", "").first, IsEmpty());
}

TEST(CoordinatorTest, ARequestExecutingWhenSdcdStoppedFailsAndCanBeRetried) {
  Cluster cl(3, 2);
  cl.AttachAll();
  cl.AllWeights(10, 5);
  const uint64_t id = cl.c().ListRequests()[0].id;
  ASSERT_TRUE(cl.c().Approve(id, "alice", "confirmed", false, false).ok());
  ASSERT_THAT(cl.c().StartApproved("eks").first, SizeIs(1));
  cl.Reset();  // sdcd dies while kubectl runs.
  ASSERT_TRUE(cl.c().Restore().ok());
  auto r = cl.c().GetRequest(id);
  EXPECT_EQ(r->state, RequestState::kFailed);
  EXPECT_THAT(r->actuator_result, HasSubstr("outcome is unknown"));
  EXPECT_THAT(cl.c().StartApproved("eks").first, IsEmpty()) << "never run twice by itself";
  EXPECT_EQ(cl.c().Approve(id, "alice", "retry", false, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A retry is forced: two people's word.
  ASSERT_TRUE(cl.c().Approve(id, "alice", "node checked: retry", /*force=*/true, false).ok());
  EXPECT_THAT(cl.c().StartApproved("eks").first, IsEmpty());
  ASSERT_TRUE(cl.c().Approve(id, "bob", "agreed: retry", /*force=*/true, false).ok());
  EXPECT_THAT(cl.c().StartApproved("eks").first, SizeIs(1));
  // And the failure was stored: another restart finds it.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  EXPECT_EQ(cl.c().GetRequest(id)->state, RequestState::kFailed);
}

TEST(CoordinatorTest, PendingRequestsExpire) {
  CoordinatorOptions options;
  options.escalation.request_ttl = absl::Hours(1);
  Cluster cl(3, 2, 10, 10, options);
  cl.AttachAll();
  cl.AllWeights(10, 5);
  cl.clock().Advance(absl::Minutes(59));
  cl.c().Tick();
  EXPECT_EQ(cl.c().ListRequests()[0].state, RequestState::kPending);
  cl.clock().Advance(absl::Minutes(2));
  cl.c().Tick();
  EXPECT_EQ(cl.c().ListRequests()[0].state, RequestState::kExpired);
}

// ---------------------------------------------------------------------------
// Trust (issue 38): each test is an attack that worked before node
// identities; it fails now.

// Finding 1: anyone who reaches the trainer port places a rank on any node.
// A forged job whose Hellos name nodes its caller never proved to be, and
// whose weight reports make node-a's rank the minority, gets an incident
// (recorded, saying why its evidence is not proven) but no replacement
// request for node-a. A caller proven to be another node (an agent on node-c
// relaying) cannot place a rank on node-a at all.
TEST(CoordinatorTrustTest, AForgedPlacementOpensNoReplacementRequest) {
  Cluster cl(3, 1);
  cl.AttachAllUnauthenticated();
  cl.AllWeights(10, /*corrupt=*/0);
  const std::vector<Incident> incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_THAT(incidents[0].nodes, ElementsAre("node-a"));
  EXPECT_TRUE(incidents[0].unproven_evidence);
  EXPECT_THAT(incidents[0].explanation,
              HasSubstr("unproven evidence never opens a replacement request"));
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty()) << "forged evidence replaced node-a";

  Hello h = cl.HelloOf(0);
  h.job_id = "job-b";
  const absl::StatusOr<AttachResult> redirected =
      cl.c().Attach(h, Caller{"node-c", "relay", {}});
  EXPECT_EQ(redirected.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(redirected.status().message()),
              HasSubstr("says it runs on node 'node-a' but its caller proved to be node 'node-c'"));
}

// A proven rank cannot be taken over by an unauthenticated Hello with a
// higher incarnation (before, the higher incarnation simply won).
TEST(CoordinatorTrustTest, AnUnauthenticatedHelloCannotTakeOverAProvenRank) {
  Cluster cl(3, 1);
  cl.AttachAll();
  const absl::StatusOr<AttachResult> taken = cl.c().Attach(cl.HelloOf(0, /*incarnation=*/9), Caller{});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(taken.status().message()),
              HasSubstr("an unauthenticated Hello cannot take it over"));
}

// Finding 4, the lock-out: one Hello claiming the largest world size sdcd
// takes (--max_ranks) used all of --max_ranks, and an attached job never
// expires, so every real job was refused. A job now holds only what its
// nodes can hold: the forged one 16 ranks (one unauthenticated node), and
// the real job attaches.
TEST(CoordinatorTrustTest, AWorldSizeClaimDoesNotLockOthersOut) {
  CoordinatorOptions options;
  options.max_ranks = 1000;
  Cluster cl(3, 2, 10, 10, options);
  Hello forged = cl.HelloOf(0);
  forged.job_id = "job-forged";
  forged.world_size = 1000;
  ASSERT_TRUE(cl.c().Attach(forged, Caller{}).ok());
  Hello proven_forged = forged;
  proven_forged.job_id = "job-forged-too";
  ASSERT_TRUE(cl.c().Attach(proven_forged, Proven(proven_forged)).ok())
      << "a proven node holds no more than its capacity either";
  cl.AttachAll();
  EXPECT_THAT(cl.c().ListJobs(), SizeIs(3));
  // Nor can the claim be grown by the same caller: one node holds at most
  // --max_ranks_per_node ranks of a job.
  for (Rank r = 1; r < 16; ++r) {
    forged.placement.rank = r;
    ASSERT_TRUE(cl.c().Attach(forged, Caller{}).ok()) << r;
  }
  forged.placement.rank = 16;
  const absl::StatusOr<AttachResult> more = cl.c().Attach(forged, Caller{});
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(more.status().message()), HasSubstr("--max_ranks_per_node"));
}

// Finding 4, the crowding: four forged incidents filled
// --max_open_requests (4), and a real incident then got no request.
// Unproven evidence opens none, and one job (even of proven nodes) opens at
// most its share (half), so a real job's incident still gets its request.
TEST(CoordinatorTrustTest, ForgedOrOneJobsRequestsCannotCrowdOutARealOne) {
  Cluster cl(4, 1);
  cl.set_job("job-forged");
  cl.AttachAllUnauthenticated();
  for (Rank r = 0; r < 4; ++r) cl.AllWeights(10 * (r + 1), r);
  EXPECT_THAT(cl.c().ListIncidents("job-forged"), SizeIs(4));
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());

  cl.set_job("job-greedy");
  cl.AttachAll();
  for (Rank r = 0; r < 3; ++r) cl.AllWeights(10 * (r + 1), r);
  EXPECT_THAT(cl.c().ListIncidents("job-greedy"), SizeIs(3));
  ASSERT_THAT(cl.c().ListRequests(), SizeIs(2)) << "one job's share is 2 of 4";
  EXPECT_THAT(cl.c().ListIncidents("job-greedy")[2].explanation,
              HasSubstr("--max_open_requests_per_job 2"));

  cl.set_job(kJob);
  cl.AttachAll();
  cl.AllWeights(10, 3);
  const std::vector<ReplacementRequest> requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(3));
  EXPECT_EQ(requests[2].node, "node-d");
}

}  // namespace
}  // namespace sdc::core
