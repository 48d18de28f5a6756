// Reports whose order is not the order of the checks they feed (issue 37):
// after sdcd was away (started late, restarted) or one node was cut off,
// ranks come back in any order and with backlogs. Reports that come early
// are held; those that come after their check was decided are taken and
// judged after the fact; none is refused for its timing, and a refused one
// is consumed so the rank's later reports flow on.

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/testing_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/attribution.h"
#include "protocol/replay_plan.h"

namespace sdc::core {
namespace {

using testing::Cluster;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::kJob;
using testing::Proven;
using ::testing::Not;
using ::testing::SizeIs;

// One rank's part of the scheduled audit of `step`, as the engine sends it.
struct AuditPart {
  Rank from = 0;
  AuditResult result;
};

// Every result of the scheduled audit of `step` on `cl`'s 3 x 2 layout (rank
// `faulty`'s own batch wrong), then the tie-breaks the ranks derive in-band
// from all of them, in the order a rank sends its own.
std::vector<AuditPart> ScheduledAudit(const Cluster& cl, Step step, std::optional<Rank> faulty) {
  Topology topology(cl.Members());
  const ReplayPlan plan = PlanFullAudit(topology, step / 10);
  std::vector<AuditPart> out;
  absl::flat_hash_map<Rank, Evidence> originals, replays;
  for (const Assignment& a : plan.assignments) {
    AuditResult o;
    o.role = AuditRole::kOriginal;
    o.subject = a.subject;
    o.loss_bits = o.gradient_digest =
        Cluster::BatchValue(a.subject) + (a.subject == faulty ? 1 : 0);
    out.push_back({a.subject, o});
    originals[a.subject] = {o.loss_bits, o.gradient_digest, {}};
  }
  for (const Assignment& a : plan.assignments) {
    AuditResult rp;
    rp.role = AuditRole::kReplay;
    rp.subject = a.subject;
    rp.loss_bits = rp.gradient_digest = Cluster::BatchValue(a.subject);
    out.push_back({a.replayer, rp});
    replays[a.replayer] = {rp.loss_bits, rp.gradient_digest, {}};
  }
  AuditInput in;
  in.plan = &plan;
  in.topology = &topology;
  in.originals = &originals;
  in.replays = &replays;
  in.compare_gradients = true;
  in.salt = step;
  for (const TieBreak& t : Attribute(in).tiebreaks) {
    AuditResult tb;
    tb.role = AuditRole::kTieBreak;
    tb.subject = t.subject;
    tb.loss_bits = tb.gradient_digest = Cluster::BatchValue(t.subject);
    out.push_back({t.tiebreaker, tb});
  }
  return out;
}

std::vector<Incident> Faulty(const std::vector<Incident>& incidents) {
  std::vector<Incident> out;
  for (const Incident& i : incidents) {
    if (i.confirmed) out.push_back(i);
  }
  return out;
}

// sdcd started after the job: the first ranks resend their audit results
// before the last rank's Hello, when groups (and so plans) are not known.
// They were refused (FailedPrecondition "audit plans need every rank"), and
// the client dropped or resent them forever.
TEST(LateReportsTest, AuditResultsBeforeEveryHelloAreHeldThenJudged) {
  Cluster cl(3, 2);
  for (Rank r = 0; r < 5; ++r) ASSERT_TRUE(cl.c().Attach(cl.HelloOf(r), Proven(cl.HelloOf(r))).ok());
  const std::vector<AuditPart> parts = ScheduledAudit(cl, 10, /*faulty=*/1);
  for (const AuditPart& p : parts) {
    if (p.from == 5) continue;
    auto e = cl.Send(p.from, 10, p.result);
    ASSERT_TRUE(e.ok()) << e.status();
  }
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  // Held reports survive a restart as pending ones.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  for (Rank r = 0; r < 5; ++r) ASSERT_TRUE(cl.c().Attach(cl.HelloOf(r), Proven(cl.HelloOf(r))).ok());
  ASSERT_TRUE(cl.c().Attach(cl.HelloOf(5), Proven(cl.HelloOf(5))).ok());
  for (const AuditPart& p : parts) {
    if (p.from != 5) continue;
    auto e = cl.Send(p.from, 10, p.result);
    ASSERT_TRUE(e.ok()) << e.status();
  }
  const std::vector<Incident> faulty = Faulty(cl.c().ListIncidents(kJob));
  ASSERT_THAT(faulty, SizeIs(1));
  EXPECT_THAT(faulty[0].ranks, ElementsAre(1));
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
  EXPECT_EQ(cl.store().pending_count(), 0u);
}

// After sdcd restarted, the tie-breaker reconnected first: its tie-break
// result came before other ranks' results, so before sdcd could derive the
// tie-break (InvalidArgument "no tie-break ... is assigned"): the fault of
// step 130 never became an incident.
TEST(LateReportsTest, ATieBreakResultBeforeItsAttributionWaitsForIt) {
  Cluster cl(3, 2);
  cl.AttachAll();
  std::vector<AuditPart> parts = ScheduledAudit(cl, 130, /*faulty=*/3);
  ASSERT_EQ(parts.back().result.role, AuditRole::kTieBreak);
  // Tie-breaks first, then the rest (a rank's stream has its own results
  // before its tie-break; sdcd does not rely on that).
  std::stable_partition(parts.begin(), parts.end(),
                        [](const AuditPart& p) { return p.result.role == AuditRole::kTieBreak; });
  for (const AuditPart& p : parts) {
    auto e = cl.Send(p.from, 130, p.result);
    ASSERT_TRUE(e.ok()) << e.status();
  }
  const std::vector<Incident> faulty = Faulty(cl.c().ListIncidents(kJob));
  ASSERT_THAT(faulty, SizeIs(1));
  EXPECT_THAT(faulty[0].ranks, ElementsAre(3));
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
  EXPECT_EQ(cl.store().pending_count(), 0u);
}

// One node cut off longer than the report deadline: its ranks' results of
// the audit that caught rank 4 came after the audit was decided without
// them. They complete it, and the fault is attributed as it would have been.
TEST(LateReportsTest, AnAuditDecidedWithoutACutOffNodeIsJudgedWhenItsResultsCome) {
  Cluster cl(3, 2);
  cl.AttachAll();
  const std::vector<AuditPart> parts = ScheduledAudit(cl, 10, /*faulty=*/4);
  const std::set<Rank> cut = {4, 5};  // node-c
  for (const AuditPart& p : parts) {
    if (cut.count(p.from) == 0) {
      ASSERT_TRUE(cl.Send(p.from, 10, p.result).ok());
    }
  }
  cl.clock().Advance(absl::Minutes(3));
  cl.Collect(cl.c().Tick());
  EXPECT_THAT(Faulty(cl.c().ListIncidents(kJob)), IsEmpty());
  for (const AuditPart& p : parts) {
    if (cut.count(p.from) == 0) continue;
    auto e = cl.Send(p.from, 10, p.result);
    ASSERT_TRUE(e.ok()) << e.status();
  }
  const std::vector<Incident> faulty = Faulty(cl.c().ListIncidents(kJob));
  ASSERT_THAT(faulty, SizeIs(1));
  EXPECT_THAT(faulty[0].ranks, ElementsAre(4));
  EXPECT_THAT(faulty[0].explanation, HasSubstr("decided in-band while sdcd was away"));
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
  // The checkpoint gate knows: the audit of step 10 failed.
  cl.CleanStep(10);
  auto d = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->allowed);
  // Resent (a reconnect before the acknowledgement): nothing twice.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  cl.AttachAll();
  EXPECT_THAT(Faulty(cl.c().ListIncidents(kJob)), SizeIs(1));
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
}

// Rank 5 (cut off) had the NaN; its confirmer's replay came in time, its own
// report after the step was decided without it.
TEST(LateReportsTest, ALateStepReportWithNaNIsJudgedWithTheReplayThatConfirmedIt) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 4; ++s) cl.CleanStep(s);
  const Rank confirmer = *ChooseConfirmer(Topology(cl.Members()), 5, 5);
  AuditResult c;
  c.role = AuditRole::kConfirm;
  c.subject = 5;
  c.nonfinite = 0;  // Finite when another GPU computes it.
  ASSERT_TRUE(cl.Send(confirmer, 5, c).ok());
  const StepReport skipped{0,    0, 1.0, 1234, false, "NaN/Inf in the local gradients of rank 5",
                           false};
  for (Rank r = 0; r < 5; ++r) ASSERT_TRUE(cl.Send(r, 5, skipped).ok());
  cl.clock().Advance(absl::Minutes(3));
  cl.Collect(cl.c().Tick());
  EXPECT_THAT(Faulty(cl.c().ListIncidents(kJob)), IsEmpty());
  StepReport own = skipped;
  own.local_nonfinite = 3;
  auto e = cl.Send(5, 5, own);
  ASSERT_TRUE(e.ok()) << e.status();
  const std::vector<Incident> faulty = Faulty(cl.c().ListIncidents(kJob));
  ASSERT_THAT(faulty, SizeIs(1));
  EXPECT_THAT(faulty[0].ranks, ElementsAre(5));
  EXPECT_EQ(faulty[0].check, CheckKind::kNonFinite);
  EXPECT_THAT(faulty[0].explanation, HasSubstr("decided without it"));
  EXPECT_THAT(cl.c().ListRequests(), SizeIs(1));
  // Nothing was reopened: no check waits for the other ranks again.
  auto d = cl.c().MayCheckpoint(kJob, 4);
  ASSERT_TRUE(d.ok());
  EXPECT_THAT(d->reason, Not(HasSubstr("awaits")));
}

// A cut-off rank's corrupted weights, reported after the vote: a minority of
// one, as the vote would have named it.
TEST(LateReportsTest, ALateWeightReportThatDiffersIsAMinorityOfOne) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Rank r = 0; r < 5; ++r) ASSERT_TRUE(cl.Send(r, 10, Cluster::Weights()).ok());
  cl.clock().Advance(absl::Minutes(3));
  cl.Collect(cl.c().Tick());
  EXPECT_THAT(cl.c().ListIncidents(kJob), IsEmpty());
  auto e = cl.Send(5, 10, Cluster::Weights(/*salt=*/1));
  ASSERT_TRUE(e.ok()) << e.status();
  const std::vector<Incident> faulty = Faulty(cl.c().ListIncidents(kJob));
  ASSERT_THAT(faulty, SizeIs(1));
  EXPECT_THAT(faulty[0].ranks, ElementsAre(5));
  EXPECT_EQ(faulty[0].check, CheckKind::kWeights);
  std::vector<WeightVerdictMessage> verdicts = cl.MessagesOf<WeightVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(2));
  EXPECT_THAT(verdicts[1].minority, ElementsAre(5));
  // An agreeing late report records nothing.
  ASSERT_TRUE(cl.Send(4, 20, Cluster::Weights()).ok());
  EXPECT_THAT(cl.c().ListIncidents(kJob), SizeIs(1));
}

// A report sdcd refuses (a contradiction, not a matter of timing) is
// consumed: the rank's watermark moves past it, and what follows is taken.
TEST(LateReportsTest, ARefusedReportIsConsumedAndTheNextIsTaken) {
  Cluster cl(3, 2);
  cl.AttachAll();
  WeightReport short_one = Cluster::Weights();
  short_one.tensors.pop_back();
  Report bad;
  bad.job_id = kJob;
  bad.rank = 2;
  bad.incarnation = 1;
  bad.sequence = 1;
  bad.step = 10;
  bad.body = short_one;
  auto refused = cl.c().Ingest(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  auto consumed = cl.c().Consume(bad, refused.status());
  ASSERT_TRUE(consumed.ok()) << consumed.status();
  EXPECT_EQ(consumed->acked_sequence, 1u);
  EXPECT_THAT(consumed->notes, Contains(HasSubstr("refused report 1 of rank 2")));
  // Survives a restart: the rank record carries it.
  cl.Reset();
  ASSERT_TRUE(cl.c().Restore().ok());
  auto attached = cl.c().Attach(cl.HelloOf(2), Proven(cl.HelloOf(2)));
  ASSERT_TRUE(attached.ok());
  EXPECT_EQ(attached->acked_sequence, 1u);
  Report next = bad;
  next.sequence = 2;
  next.body = Cluster::Weights();
  EXPECT_TRUE(cl.c().Ingest(next).ok());
  // Only the next report can be consumed.
  Report gap = bad;
  gap.sequence = 9;
  EXPECT_EQ(cl.c().Consume(gap, refused.status()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sdc::core
