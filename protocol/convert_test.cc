#include "protocol/convert.h"

#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace sdc::protocol {
namespace {

Hello SomeHello() {
  Hello h;
  h.job_id = "job-a";
  h.placement = {5, "node-b", 1, "GPU-5", 2};
  h.world_size = 8;
  h.incarnation = 3;
  h.weight_tensors = {"w", "b", "running_mean"};
  h.parameter_count = 2;
  h.layout_digest = 0xfeedull;
  h.deterministic = true;
  h.audit_every = 7;
  h.weight_check_every = 11;
  h.software = {"12040", "12.4", "120403", "2.11.0", "NVIDIA H100 80GB HBM3", ""};
  h.shard = {1, 3, 2};
  h.attempt = 4;
  h.resume_step = 300;
  return h;
}

TEST(ConvertTest, HelloRoundTrips) {
  const Hello h = SomeHello();
  const Hello back = FromProto(ToProto(h));
  EXPECT_EQ(back.job_id, "job-a");
  EXPECT_EQ(back.placement.rank, 5u);
  EXPECT_EQ(back.placement.node, "node-b");
  EXPECT_EQ(back.placement.local_rank, 1u);
  EXPECT_EQ(back.placement.gpu_uuid, "GPU-5");
  EXPECT_EQ(back.placement.replica_group, 2u);
  EXPECT_EQ(back.world_size, 8u);
  EXPECT_EQ(back.incarnation, 3u);
  EXPECT_EQ(back.weight_tensors, h.weight_tensors);
  EXPECT_EQ(back.parameter_count, 2u);
  EXPECT_EQ(back.layout_digest, 0xfeedull);
  EXPECT_TRUE(back.deterministic);
  EXPECT_EQ(back.audit_every, 7u);
  EXPECT_EQ(back.weight_check_every, 11u);
  EXPECT_EQ(back.software, h.software);
  EXPECT_EQ(back.shard, (ShardCoordinates{1, 3, 2}));
  EXPECT_EQ(back.shard.Describe(), "replica 2 of shard 1/3");
  EXPECT_EQ(Hello{}.shard.Describe(), "");
  EXPECT_EQ(back.attempt, 4u);
  EXPECT_EQ(back.resume_step, 300u);
  EXPECT_EQ(back.software.Describe(),
            "driver 12040, CUDA 12.4, cuBLAS 120403, torch 2.11.0, NVIDIA H100 80GB HBM3");
}

Report Envelope(decltype(Report::body) body) {
  return Report{"job-a", 5, 3, 42, 100, std::move(body)};
}

TEST(ConvertTest, EveryReportBodyRoundTrips) {
  StepReport s{1,    2,    3.5, 0xabcull, false, "NaN/Inf", true, "op without determinism",
                true, "2 micro-batches"};
  absl::StatusOr<Report> step = FromProto(ToProto(Envelope(s)));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->job_id, "job-a");
  EXPECT_EQ(step->rank, 5u);
  EXPECT_EQ(step->incarnation, 3u);
  EXPECT_EQ(step->sequence, 42u);
  EXPECT_EQ(step->step, 100u);
  const auto& sb = std::get<StepReport>(step->body);
  EXPECT_EQ(sb.local_nonfinite, 1u);
  EXPECT_EQ(sb.reduced_nonfinite, 2u);
  EXPECT_EQ(sb.reduced_sum_squares, 3.5);
  EXPECT_EQ(sb.reduced_digest, 0xabcull);
  EXPECT_FALSE(sb.applied);
  EXPECT_EQ(sb.skip_reason, "NaN/Inf");
  EXPECT_TRUE(sb.audit_unverified);
  EXPECT_EQ(sb.audits_off, "op without determinism");
  EXPECT_TRUE(sb.loss_scaled);
  EXPECT_EQ(sb.no_confirmation, "2 micro-batches");

  for (AuditRole role :
       {AuditRole::kOriginal, AuditRole::kReplay, AuditRole::kTieBreak, AuditRole::kConfirm}) {
    AuditResult a;
    a.role = role;
    a.plan_id = 9;
    a.subject = 4;
    a.loss_bits = 0x3ff0000000000001ull;
    a.gradients = {{16, 1, 2}, {32, 3, 4}};
    a.gradient_digest = 77;
    a.nonfinite = 6;
    absl::StatusOr<Report> audit = FromProto(ToProto(Envelope(a)));
    ASSERT_TRUE(audit.ok()) << audit.status();
    const auto& ab = std::get<AuditResult>(audit->body);
    EXPECT_EQ(ab.role, role) << AuditRoleName(role);
    EXPECT_EQ(ab.plan_id, 9u);
    EXPECT_EQ(ab.subject, 4u);
    EXPECT_EQ(ab.loss_bits, 0x3ff0000000000001ull);
    EXPECT_EQ(ab.gradients, a.gradients);
    EXPECT_EQ(ab.gradient_digest, 77u);
    EXPECT_EQ(ab.nonfinite, 6u);
  }

  WeightReport w;
  w.digest = 123;
  w.tensors = {{8, 5, 6}};
  w.checkpoint = true;
  w.has_optimizer_digest = true;
  w.optimizer_digest = 456;
  w.tensors_elided = true;
  absl::StatusOr<Report> weights = FromProto(ToProto(Envelope(w)));
  ASSERT_TRUE(weights.ok()) << weights.status();
  const auto& wb = std::get<WeightReport>(weights->body);
  EXPECT_EQ(wb.digest, 123u);
  EXPECT_EQ(wb.tensors, w.tensors);
  EXPECT_TRUE(wb.checkpoint);
  EXPECT_TRUE(wb.has_optimizer_digest);
  EXPECT_EQ(wb.optimizer_digest, 456u);
  EXPECT_TRUE(wb.tensors_elided);
}

TEST(ConvertTest, MalformedReportsAreInvalidArgument) {
  v1::Report none = ToProto(Envelope(StepReport{}));
  none.clear_step_report();
  EXPECT_EQ(FromProto(none).status().code(), absl::StatusCode::kInvalidArgument);

  v1::Report audit = ToProto(Envelope(AuditResult{}));
  audit.mutable_audit()->add_gradients(1);  // Not a (length, s1, s2) triplet.
  EXPECT_EQ(FromProto(audit).status().code(), absl::StatusCode::kInvalidArgument);

  v1::Report weights = ToProto(Envelope(WeightReport{}));
  weights.mutable_weights()->add_tensors(1);
  weights.mutable_weights()->add_tensors(2);
  EXPECT_EQ(FromProto(weights).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConvertTest, CoordinatorMessagesCarryEveryField) {
  const v1::CoordinatorMessage plan =
      ToProto(CoordinatorMessage{PlanMessage{4, {{1, 2}, {2, 1}}, "targeted"}});
  ASSERT_TRUE(plan.has_audit_plan());
  EXPECT_EQ(plan.audit_plan().plan_id(), 4u);
  EXPECT_EQ(plan.audit_plan().reason(), "targeted");
  ASSERT_EQ(plan.audit_plan().assignments_size(), 2);
  EXPECT_EQ(plan.audit_plan().assignments(0).replayer(), 1u);
  EXPECT_EQ(plan.audit_plan().assignments(0).subject(), 2u);

  const v1::CoordinatorMessage verdict = ToProto(CoordinatorMessage{
      AuditVerdictMessage{30, AuditOutcome::kFaulty, {3}, {4, 5}, {"w"}, "rank 3 is faulty"}});
  ASSERT_TRUE(verdict.has_audit_verdict());
  EXPECT_EQ(verdict.audit_verdict().step(), 30u);
  EXPECT_EQ(verdict.audit_verdict().outcome(), v1::FAULTY);
  EXPECT_EQ(verdict.audit_verdict().faulty_ranks(0), 3u);
  EXPECT_EQ(verdict.audit_verdict().suspect_ranks_size(), 2);
  EXPECT_EQ(verdict.audit_verdict().differing_tensors(0), "w");
  EXPECT_EQ(verdict.audit_verdict().explanation(), "rank 3 is faulty");

  const v1::CoordinatorMessage tiebreak = ToProto(CoordinatorMessage{TieBreakMessage{30, 2, 6}});
  ASSERT_TRUE(tiebreak.has_tiebreak());
  EXPECT_EQ(tiebreak.tiebreak().step(), 30u);
  EXPECT_EQ(tiebreak.tiebreak().subject(), 2u);
  EXPECT_EQ(tiebreak.tiebreak().replayer(), 6u);

  const v1::CoordinatorMessage weights = ToProto(
      CoordinatorMessage{WeightVerdictMessage{40, false, {7}, {"b"}, 1, "rank 7 differs"}});
  ASSERT_TRUE(weights.has_weight_verdict());
  EXPECT_EQ(weights.weight_verdict().step(), 40u);
  EXPECT_FALSE(weights.weight_verdict().pass());
  EXPECT_EQ(weights.weight_verdict().minority_ranks(0), 7u);
  EXPECT_EQ(weights.weight_verdict().differing_tensors(0), "b");
  EXPECT_EQ(weights.weight_verdict().majority_source_rank(), 1u);
}

TEST(ConvertTest, IncompleteAuditsPassOnTheWire) {
  EXPECT_EQ(ToProto(AuditOutcome::kPass), v1::PASS);
  EXPECT_EQ(ToProto(AuditOutcome::kIncomplete), v1::PASS);
  EXPECT_EQ(ToProto(AuditOutcome::kTieBreakPending), v1::TIEBREAK_PENDING);
  EXPECT_EQ(ToProto(AuditOutcome::kSystemic), v1::SYSTEMIC);
  EXPECT_EQ(ToProto(AuditOutcome::kAttributionImpossible), v1::ATTRIBUTION_IMPOSSIBLE);
}

TEST(ConvertTest, UnixMillisSaysNeverWithZero) {
  EXPECT_EQ(UnixMillis(absl::InfinitePast()), 0);
  EXPECT_EQ(UnixMillis(absl::FromUnixMillis(1'800'000'000'123)), 1'800'000'000'123);
  // Rounded down, like absl::ToUnixMillis.
  EXPECT_EQ(UnixMillis(absl::FromUnixMillis(5) + absl::Microseconds(999)), 5);
  EXPECT_EQ(UnixMillis(absl::UnixEpoch()), 0);
  EXPECT_EQ(FromUnixMillis(1'800'000'000'123), absl::FromUnixMillis(1'800'000'000'123));
  // 0 reads back as the epoch: "never" does not survive a round trip.
  EXPECT_EQ(FromUnixMillis(UnixMillis(absl::InfinitePast())), absl::UnixEpoch());
}

}  // namespace
}  // namespace sdc::protocol
