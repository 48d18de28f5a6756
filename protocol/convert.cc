#include "protocol/convert.h"

#include <cstring>
#include <type_traits>

namespace sdc::protocol {
namespace {

AuditRole FromProto(v1::AuditRole role) {
  switch (role) {
    case v1::REPLAY:
      return AuditRole::kReplay;
    case v1::TIEBREAK:
      return AuditRole::kTieBreak;
    case v1::CONFIRM:
      return AuditRole::kConfirm;
    default:
      return AuditRole::kOriginal;
  }
}

v1::AuditRole ToProto(AuditRole role) {
  switch (role) {
    case AuditRole::kReplay:
      return v1::REPLAY;
    case AuditRole::kTieBreak:
      return v1::TIEBREAK;
    case AuditRole::kConfirm:
      return v1::CONFIRM;
    case AuditRole::kOriginal:
      return v1::ORIGINAL;
  }
  return v1::ORIGINAL;
}

}  // namespace

static_assert(sizeof(Fingerprint) == 3 * sizeof(uint64_t) &&
                  std::is_trivially_copyable_v<Fingerprint>,
              "Fingerprint is packed on the wire as three fixed64 words");

int64_t UnixMillis(absl::Time t) {
  return t == absl::InfinitePast() ? 0 : absl::ToUnixMillis(t);
}

absl::Time FromUnixMillis(int64_t ms) { return absl::FromUnixMillis(ms); }

Placement FromProto(const v1::RankPlacement& p) {
  return {p.rank(), p.node_name(), p.local_rank(), p.gpu_uuid(), p.replica_group()};
}

void ToProto(const Placement& p, v1::RankPlacement* out) {
  out->set_rank(p.rank);
  out->set_node_name(p.node);
  out->set_local_rank(p.local_rank);
  out->set_gpu_uuid(p.gpu_uuid);
  out->set_replica_group(p.replica_group);
}

Hello FromProto(const v1::Hello& h) {
  Hello out;
  out.job_id = h.job_id();
  out.placement = FromProto(h.placement());
  out.world_size = h.world_size();
  out.incarnation = h.incarnation();
  out.weight_tensors.assign(h.weight_tensors().begin(), h.weight_tensors().end());
  out.parameter_count = h.parameter_count();
  out.layout_digest = h.layout_digest();
  out.deterministic = h.deterministic();
  out.audit_every = h.audit_every();
  out.weight_check_every = h.weight_check_every();
  const v1::SoftwareStack& sw = h.software();
  out.software = {sw.driver(), sw.cuda(), sw.cublas(), sw.torch(), sw.device(), sw.isa()};
  out.shard = {h.shard_index(), h.shard_count(), h.replica_index()};
  out.attempt = h.attempt();
  out.resume_step = h.resume_step();
  return out;
}

v1::Hello ToProto(const Hello& h) {
  v1::Hello out;
  out.set_job_id(h.job_id);
  ToProto(h.placement, out.mutable_placement());
  out.set_world_size(h.world_size);
  out.set_incarnation(h.incarnation);
  for (const auto& t : h.weight_tensors) out.add_weight_tensors(t);
  out.set_parameter_count(h.parameter_count);
  out.set_layout_digest(h.layout_digest);
  out.set_deterministic(h.deterministic);
  out.set_audit_every(h.audit_every);
  out.set_weight_check_every(h.weight_check_every);
  out.set_attempt(h.attempt);
  out.set_resume_step(h.resume_step);
  if (!h.software.unknown()) {
    v1::SoftwareStack* sw = out.mutable_software();
    sw->set_driver(h.software.driver);
    sw->set_cuda(h.software.cuda);
    sw->set_cublas(h.software.cublas);
    sw->set_torch(h.software.torch);
    sw->set_device(h.software.device);
    sw->set_isa(h.software.isa);
  }
  out.set_shard_index(h.shard.index);
  out.set_shard_count(h.shard.count);
  out.set_replica_index(h.shard.replica);
  return out;
}

absl::StatusOr<Report> FromProto(const v1::Report& r) {
  Report out;
  out.job_id = r.job_id();
  out.rank = r.rank();
  out.incarnation = r.incarnation();
  out.sequence = r.sequence();
  out.step = r.step();
  switch (r.body_case()) {
    case v1::Report::kStepReport: {
      const v1::StepReport& s = r.step_report();
      out.body = StepReport{s.local_nonfinite(),     s.reduced_nonfinite(),
                            s.reduced_sum_squares(), s.reduced_digest(),
                            s.applied(),             s.skip_reason(),
                            s.audit_unverified(),    s.audits_off(),
                            s.loss_scaled(),         s.no_confirmation()};
      break;
    }
    case v1::Report::kAudit: {
      const v1::AuditResult& a = r.audit();
      AuditResult c;
      c.role = FromProto(a.role());
      c.plan_id = a.plan_id();
      c.subject = a.subject();
      c.loss_bits = a.loss_bits();
      c.gradient_digest = a.gradient_digest();
      c.nonfinite = a.nonfinite();
      c.corrupted_transfer = a.corrupted_transfer();
      if (a.gradients_size() % 3 != 0) {
        return absl::InvalidArgumentError("gradient fingerprints must be (length, s1, s2) triplets");
      }
      c.gradients.resize(a.gradients_size() / 3);
      std::memcpy(static_cast<void*>(c.gradients.data()), a.gradients().data(),
                  a.gradients_size() * sizeof(uint64_t));
      out.body = std::move(c);
      break;
    }
    case v1::Report::kWeights: {
      const v1::WeightReport& w = r.weights();
      WeightReport c;
      c.digest = w.digest();
      c.checkpoint = w.checkpoint();
      c.has_optimizer_digest = w.has_optimizer_digest();
      c.optimizer_digest = w.optimizer_digest();
      c.tensors_elided = w.tensors_elided();
      if (w.tensors_size() % 3 != 0) {
        return absl::InvalidArgumentError("weight fingerprints must be (length, s1, s2) triplets");
      }
      c.tensors.resize(w.tensors_size() / 3);
      std::memcpy(static_cast<void*>(c.tensors.data()), w.tensors().data(),
                  w.tensors_size() * sizeof(uint64_t));
      out.body = std::move(c);
      break;
    }
    case v1::Report::BODY_NOT_SET:
      return absl::InvalidArgumentError("report has no body");
  }
  return out;
}

v1::Report ToProto(const Report& r) {
  v1::Report out;
  out.set_job_id(r.job_id);
  out.set_rank(r.rank);
  out.set_incarnation(r.incarnation);
  out.set_sequence(r.sequence);
  out.set_step(r.step);
  if (const auto* s = std::get_if<StepReport>(&r.body)) {
    v1::StepReport* p = out.mutable_step_report();
    p->set_local_nonfinite(s->local_nonfinite);
    p->set_reduced_nonfinite(s->reduced_nonfinite);
    p->set_reduced_sum_squares(s->reduced_sum_squares);
    p->set_reduced_digest(s->reduced_digest);
    p->set_applied(s->applied);
    p->set_skip_reason(s->skip_reason);
    p->set_audit_unverified(s->audit_unverified);
    p->set_audits_off(s->audits_off);
    p->set_loss_scaled(s->loss_scaled);
    p->set_no_confirmation(s->no_confirmation);
  } else if (const auto* a = std::get_if<AuditResult>(&r.body)) {
    v1::AuditResult* p = out.mutable_audit();
    p->set_role(ToProto(a->role));
    p->set_plan_id(a->plan_id);
    p->set_subject(a->subject);
    p->set_loss_bits(a->loss_bits);
    p->set_gradient_digest(a->gradient_digest);
    p->set_nonfinite(a->nonfinite);
    p->set_corrupted_transfer(a->corrupted_transfer);
    p->mutable_gradients()->Resize(static_cast<int>(3 * a->gradients.size()), 0);
    std::memcpy(p->mutable_gradients()->mutable_data(), a->gradients.data(),
                a->gradients.size() * sizeof(Fingerprint));
  } else {
    const auto& w = std::get<WeightReport>(r.body);
    v1::WeightReport* p = out.mutable_weights();
    p->set_digest(w.digest);
    p->set_checkpoint(w.checkpoint);
    p->set_has_optimizer_digest(w.has_optimizer_digest);
    p->set_optimizer_digest(w.optimizer_digest);
    p->set_tensors_elided(w.tensors_elided);
    p->mutable_tensors()->Resize(static_cast<int>(3 * w.tensors.size()), 0);
    std::memcpy(p->mutable_tensors()->mutable_data(), w.tensors.data(),
                w.tensors.size() * sizeof(Fingerprint));
  }
  return out;
}

v1::VerdictOutcome ToProto(AuditOutcome o) {
  switch (o) {
    case AuditOutcome::kPass:
    case AuditOutcome::kIncomplete:
      return v1::PASS;
    case AuditOutcome::kFaulty:
      return v1::FAULTY;
    case AuditOutcome::kTieBreakPending:
      return v1::TIEBREAK_PENDING;
    case AuditOutcome::kInconclusive:
      return v1::INCONCLUSIVE;
    case AuditOutcome::kSystemic:
      return v1::SYSTEMIC;
    case AuditOutcome::kAttributionImpossible:
      return v1::ATTRIBUTION_IMPOSSIBLE;
  }
  return v1::VERDICT_OUTCOME_UNSPECIFIED;
}

v1::AuditPlan ToProto(const PlanMessage& p) {
  v1::AuditPlan out;
  out.set_plan_id(p.plan_id);
  out.set_reason(p.reason);
  out.set_watch(p.watch);
  out.set_group(p.group);
  for (const auto& a : p.assignments) {
    v1::Assignment* x = out.add_assignments();
    x->set_replayer(a.replayer);
    x->set_subject(a.subject);
  }
  return out;
}

v1::CoordinatorMessage ToProto(const CoordinatorMessage& m) {
  v1::CoordinatorMessage out;
  if (const auto* p = std::get_if<PlanMessage>(&m)) {
    *out.mutable_audit_plan() = ToProto(*p);
  } else if (const auto* v = std::get_if<AuditVerdictMessage>(&m)) {
    v1::AuditVerdict* x = out.mutable_audit_verdict();
    x->set_step(v->step);
    x->set_outcome(ToProto(v->outcome));
    for (auto r : v->faulty) x->add_faulty_ranks(r);
    for (auto r : v->suspects) x->add_suspect_ranks(r);
    for (const auto& t : v->differing_tensors) x->add_differing_tensors(t);
    x->set_explanation(v->explanation);
  } else if (const auto* t = std::get_if<TieBreakMessage>(&m)) {
    v1::TieBreakRequest* x = out.mutable_tiebreak();
    x->set_step(t->step);
    x->set_subject(t->subject);
    x->set_replayer(t->replayer);
  } else {
    const auto& w = std::get<WeightVerdictMessage>(m);
    v1::WeightVerdict* x = out.mutable_weight_verdict();
    x->set_step(w.step);
    x->set_pass(w.pass);
    for (auto r : w.minority) x->add_minority_ranks(r);
    for (const auto& d : w.differing_tensors) x->add_differing_tensors(d);
    x->set_majority_source_rank(w.majority_source);
    x->set_explanation(w.explanation);
  }
  return out;
}

}  // namespace sdc::protocol
