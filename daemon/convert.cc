#include "daemon/convert.h"

#include <cstring>

namespace sdc::daemon {
namespace {

core::Placement FromProto(const v1::RankPlacement& p) {
  return {p.rank(), p.node_name(), p.local_rank(), p.gpu_uuid(), p.replica_group()};
}

void ToProto(const core::Placement& p, v1::RankPlacement* out) {
  out->set_rank(p.rank);
  out->set_node_name(p.node);
  out->set_local_rank(p.local_rank);
  out->set_gpu_uuid(p.gpu_uuid);
  out->set_replica_group(p.replica_group);
}

core::AuditRole FromProto(v1::AuditRole role) {
  switch (role) {
    case v1::REPLAY:
      return core::AuditRole::kReplay;
    case v1::TIEBREAK:
      return core::AuditRole::kTieBreak;
    case v1::CONFIRM:
      return core::AuditRole::kConfirm;
    default:
      return core::AuditRole::kOriginal;
  }
}

v1::AuditRole ToProto(core::AuditRole role) {
  switch (role) {
    case core::AuditRole::kReplay:
      return v1::REPLAY;
    case core::AuditRole::kTieBreak:
      return v1::TIEBREAK;
    case core::AuditRole::kConfirm:
      return v1::CONFIRM;
    case core::AuditRole::kOriginal:
      return v1::ORIGINAL;
  }
  return v1::ORIGINAL;
}

static_assert(sizeof(core::Fingerprint) == 3 * sizeof(uint64_t),
              "Fingerprint is packed on the wire as three fixed64 words");

}  // namespace

int64_t UnixMillis(absl::Time t) { return absl::ToUnixMillis(t); }
absl::Time FromUnixMillis(int64_t ms) { return absl::FromUnixMillis(ms); }

core::Hello FromProto(const v1::Hello& h) {
  core::Hello out;
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
  return out;
}

v1::Hello ToProto(const core::Hello& h) {
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
  return out;
}

absl::StatusOr<core::Report> FromProto(const v1::Report& r) {
  core::Report out;
  out.job_id = r.job_id();
  out.rank = r.rank();
  out.incarnation = r.incarnation();
  out.sequence = r.sequence();
  out.step = r.step();
  switch (r.body_case()) {
    case v1::Report::kStepReport: {
      const v1::StepReport& s = r.step_report();
      out.body = core::StepReport{s.local_nonfinite(),  s.reduced_nonfinite(),
                                  s.reduced_sum_squares(), s.reduced_digest(),
                                  s.applied(),          s.skip_reason(),
                                  s.audit_unverified(),  s.audits_off()};
      break;
    }
    case v1::Report::kAudit: {
      const v1::AuditResult& a = r.audit();
      core::AuditResult c;
      c.role = FromProto(a.role());
      c.plan_id = a.plan_id();
      c.subject = a.subject();
      c.loss_bits = a.loss_bits();
      c.gradient_digest = a.gradient_digest();
      c.nonfinite = a.nonfinite();
      if (a.gradients_size() % 3 != 0) {
        return absl::InvalidArgumentError("gradient fingerprints must be (length, s1, s2) triplets");
      }
      c.gradients.resize(a.gradients_size() / 3);
      std::memcpy(c.gradients.data(), a.gradients().data(), a.gradients_size() * sizeof(uint64_t));
      out.body = std::move(c);
      break;
    }
    case v1::Report::kWeights: {
      const v1::WeightReport& w = r.weights();
      core::WeightReport c;
      c.digest = w.digest();
      c.checkpoint = w.checkpoint();
      c.has_optimizer_digest = w.has_optimizer_digest();
      c.optimizer_digest = w.optimizer_digest();
      c.tensors_elided = w.tensors_elided();
      if (w.tensors_size() % 3 != 0) {
        return absl::InvalidArgumentError("weight fingerprints must be (length, s1, s2) triplets");
      }
      c.tensors.resize(w.tensors_size() / 3);
      std::memcpy(c.tensors.data(), w.tensors().data(), w.tensors_size() * sizeof(uint64_t));
      out.body = std::move(c);
      break;
    }
    case v1::Report::BODY_NOT_SET:
      return absl::InvalidArgumentError("report has no body");
  }
  return out;
}

v1::Report ToProto(const core::Report& r) {
  v1::Report out;
  out.set_job_id(r.job_id);
  out.set_rank(r.rank);
  out.set_incarnation(r.incarnation);
  out.set_sequence(r.sequence);
  out.set_step(r.step);
  if (const auto* s = std::get_if<core::StepReport>(&r.body)) {
    v1::StepReport* p = out.mutable_step_report();
    p->set_local_nonfinite(s->local_nonfinite);
    p->set_reduced_nonfinite(s->reduced_nonfinite);
    p->set_reduced_sum_squares(s->reduced_sum_squares);
    p->set_reduced_digest(s->reduced_digest);
    p->set_applied(s->applied);
    p->set_skip_reason(s->skip_reason);
    p->set_audit_unverified(s->audit_unverified);
    p->set_audits_off(s->audits_off);
  } else if (const auto* a = std::get_if<core::AuditResult>(&r.body)) {
    v1::AuditResult* p = out.mutable_audit();
    p->set_role(ToProto(a->role));
    p->set_plan_id(a->plan_id);
    p->set_subject(a->subject);
    p->set_loss_bits(a->loss_bits);
    p->set_gradient_digest(a->gradient_digest);
    p->set_nonfinite(a->nonfinite);
    p->mutable_gradients()->Resize(static_cast<int>(3 * a->gradients.size()), 0);
    std::memcpy(p->mutable_gradients()->mutable_data(), a->gradients.data(),
                a->gradients.size() * sizeof(core::Fingerprint));
  } else {
    const auto& w = std::get<core::WeightReport>(r.body);
    v1::WeightReport* p = out.mutable_weights();
    p->set_digest(w.digest);
    p->set_checkpoint(w.checkpoint);
    p->set_has_optimizer_digest(w.has_optimizer_digest);
    p->set_optimizer_digest(w.optimizer_digest);
    p->set_tensors_elided(w.tensors_elided);
    p->mutable_tensors()->Resize(static_cast<int>(3 * w.tensors.size()), 0);
    std::memcpy(p->mutable_tensors()->mutable_data(), w.tensors.data(),
                w.tensors.size() * sizeof(core::Fingerprint));
  }
  return out;
}

v1::VerdictOutcome ToProto(core::AuditOutcome o) {
  switch (o) {
    case core::AuditOutcome::kPass:
    case core::AuditOutcome::kIncomplete:
      return v1::PASS;
    case core::AuditOutcome::kFaulty:
      return v1::FAULTY;
    case core::AuditOutcome::kTieBreakPending:
      return v1::TIEBREAK_PENDING;
    case core::AuditOutcome::kInconclusive:
      return v1::INCONCLUSIVE;
    case core::AuditOutcome::kSystemic:
      return v1::SYSTEMIC;
    case core::AuditOutcome::kAttributionImpossible:
      return v1::ATTRIBUTION_IMPOSSIBLE;
  }
  return v1::VERDICT_OUTCOME_UNSPECIFIED;
}

v1::AuditPlan ToProto(const core::PlanMessage& p) {
  v1::AuditPlan out;
  out.set_plan_id(p.plan_id);
  out.set_reason(p.reason);
  for (const auto& a : p.assignments) {
    v1::Assignment* x = out.add_assignments();
    x->set_replayer(a.replayer);
    x->set_subject(a.subject);
  }
  return out;
}

v1::CoordinatorMessage ToProto(const core::OutMessage& m) {
  v1::CoordinatorMessage out;
  if (const auto* p = std::get_if<core::PlanMessage>(&m.body)) {
    *out.mutable_audit_plan() = ToProto(*p);
  } else if (const auto* v = std::get_if<core::AuditVerdictMessage>(&m.body)) {
    v1::AuditVerdict* x = out.mutable_audit_verdict();
    x->set_step(v->step);
    x->set_outcome(ToProto(v->outcome));
    for (auto r : v->faulty) x->add_faulty_ranks(r);
    for (auto r : v->suspects) x->add_suspect_ranks(r);
    for (const auto& t : v->differing_tensors) x->add_differing_tensors(t);
    x->set_explanation(v->explanation);
  } else if (const auto* t = std::get_if<core::TieBreakMessage>(&m.body)) {
    v1::TieBreakRequest* x = out.mutable_tiebreak();
    x->set_step(t->step);
    x->set_subject(t->subject);
    x->set_replayer(t->replayer);
  } else {
    const auto& w = std::get<core::WeightVerdictMessage>(m.body);
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

v1::RequestState ToProto(core::RequestState s) {
  switch (s) {
    case core::RequestState::kPending:
      return v1::PENDING;
    case core::RequestState::kApproved:
      return v1::APPROVED;
    case core::RequestState::kExecuting:
      return v1::EXECUTING;
    case core::RequestState::kDone:
      return v1::DONE;
    case core::RequestState::kFailed:
      return v1::FAILED;
    case core::RequestState::kDenied:
      return v1::DENIED;
    case core::RequestState::kExpired:
      return v1::EXPIRED;
  }
  return v1::REQUEST_STATE_UNSPECIFIED;
}

core::RequestState FromProto(v1::RequestState s) {
  switch (s) {
    case v1::APPROVED:
      return core::RequestState::kApproved;
    case v1::EXECUTING:
      return core::RequestState::kExecuting;
    case v1::DONE:
      return core::RequestState::kDone;
    case v1::FAILED:
      return core::RequestState::kFailed;
    case v1::DENIED:
      return core::RequestState::kDenied;
    case v1::EXPIRED:
      return core::RequestState::kExpired;
    default:
      return core::RequestState::kPending;
  }
}

v1::CheckKind ToProto(core::CheckKind k) {
  switch (k) {
    case core::CheckKind::kNonFinite:
      return v1::CHECK_NONFINITE;
    case core::CheckKind::kReducedGradients:
      return v1::CHECK_REDUCED_GRADIENTS;
    case core::CheckKind::kReplay:
      return v1::CHECK_REPLAY;
    case core::CheckKind::kWeights:
      return v1::CHECK_WEIGHTS;
  }
  return v1::CHECK_KIND_UNSPECIFIED;
}

core::CheckKind FromProto(v1::CheckKind k) {
  switch (k) {
    case v1::CHECK_REDUCED_GRADIENTS:
      return core::CheckKind::kReducedGradients;
    case v1::CHECK_REPLAY:
      return core::CheckKind::kReplay;
    case v1::CHECK_WEIGHTS:
      return core::CheckKind::kWeights;
    default:
      return core::CheckKind::kNonFinite;
  }
}

core::Incident FromProto(const v1::Incident& i) {
  core::Incident out;
  out.id = i.id();
  out.job_id = i.job_id();
  out.step = i.step();
  out.check = FromProto(i.check());
  out.outcome = i.outcome();
  out.ranks.assign(i.ranks().begin(), i.ranks().end());
  out.nodes.assign(i.node_names().begin(), i.node_names().end());
  out.gpus.assign(i.gpu_uuids().begin(), i.gpu_uuids().end());
  out.confirmed = i.confirmed();
  out.unproven_evidence = i.unproven_evidence();
  out.explanation = i.explanation();
  out.differing_tensors.assign(i.differing_tensors().begin(), i.differing_tensors().end());
  out.created = FromUnixMillis(i.created_unix_ms());
  out.request_id = i.request_id();
  out.resolved_by = i.resolved_by();
  out.resolution = i.resolution();
  if (!out.resolved_by.empty()) out.resolved = FromUnixMillis(i.resolved_unix_ms());
  return out;
}

core::ReplacementRequest FromProto(const v1::ReplacementRequest& r) {
  core::ReplacementRequest out;
  out.id = r.id();
  out.node = r.node_name();
  out.state = FromProto(r.state());
  out.gpus.assign(r.gpu_uuids().begin(), r.gpu_uuids().end());
  out.incident_ids.assign(r.incident_ids().begin(), r.incident_ids().end());
  out.reason = r.reason();
  out.action = r.action();
  out.created = FromUnixMillis(r.created_unix_ms());
  out.updated = FromUnixMillis(r.updated_unix_ms());
  for (const auto& t : r.transitions()) {
    out.transitions.push_back({FromProto(t.from()), FromProto(t.to()),
                               FromUnixMillis(t.at_unix_ms()), t.actor(), t.reason()});
  }
  out.actuator = r.actuator();
  out.actuator_result = r.actuator_result();
  out.cap_override = r.cap_override();
  for (const auto& a : r.approvals()) {
    out.approvals.push_back(
        {a.operator_(), a.reason(), FromUnixMillis(a.at_unix_ms()), a.force()});
  }
  // Stored before two-person approval existed: one approval sufficed.
  out.approvals_required = r.approvals_required() == 0 ? 1 : r.approvals_required();
  return out;
}

core::Suspect FromProto(const v1::Suspect& s) {
  core::Suspect out;
  out.gpu = s.gpu_uuid();
  out.node = s.node_name();
  out.job_id = s.job_id();
  out.rank = s.rank();
  out.reason = s.reason();
  out.incidents = s.incidents();
  out.targeted_audits_left = s.targeted_audits_left();
  out.since = FromUnixMillis(s.since_unix_ms());
  return out;
}

v1::Incident ToProto(const core::Incident& i) {
  v1::Incident out;
  out.set_id(i.id);
  out.set_job_id(i.job_id);
  out.set_step(i.step);
  out.set_check(ToProto(i.check));
  out.set_outcome(i.outcome);
  for (auto r : i.ranks) out.add_ranks(r);
  for (const auto& n : i.nodes) out.add_node_names(n);
  for (const auto& g : i.gpus) out.add_gpu_uuids(g);
  out.set_confirmed(i.confirmed);
  out.set_unproven_evidence(i.unproven_evidence);
  out.set_explanation(i.explanation);
  for (const auto& t : i.differing_tensors) out.add_differing_tensors(t);
  out.set_created_unix_ms(UnixMillis(i.created));
  out.set_request_id(i.request_id);
  if (!i.resolved_by.empty()) {
    out.set_resolved_by(i.resolved_by);
    out.set_resolution(i.resolution);
    out.set_resolved_unix_ms(UnixMillis(i.resolved));
  }
  return out;
}

v1::ReplacementRequest ToProto(const core::ReplacementRequest& r) {
  v1::ReplacementRequest out;
  out.set_id(r.id);
  out.set_node_name(r.node);
  out.set_state(ToProto(r.state));
  for (const auto& g : r.gpus) out.add_gpu_uuids(g);
  for (auto i : r.incident_ids) out.add_incident_ids(i);
  out.set_reason(r.reason);
  out.set_created_unix_ms(UnixMillis(r.created));
  out.set_updated_unix_ms(UnixMillis(r.updated));
  for (const auto& t : r.transitions) {
    v1::Transition* x = out.add_transitions();
    x->set_from(ToProto(t.from));
    x->set_to(ToProto(t.to));
    x->set_at_unix_ms(UnixMillis(t.at));
    x->set_actor(t.actor);
    x->set_reason(t.reason);
  }
  out.set_action(r.action);
  out.set_actuator(r.actuator);
  out.set_actuator_result(r.actuator_result);
  out.set_cap_override(r.cap_override);
  for (const auto& a : r.approvals) {
    v1::Approval* x = out.add_approvals();
    x->set_operator_(a.op);
    x->set_reason(a.reason);
    x->set_at_unix_ms(UnixMillis(a.at));
    x->set_force(a.force);
  }
  out.set_approvals_required(r.approvals_required);
  return out;
}

v1::Suspect ToProto(const core::Suspect& s) {
  v1::Suspect out;
  out.set_gpu_uuid(s.gpu);
  out.set_node_name(s.node);
  out.set_job_id(s.job_id);
  out.set_rank(s.rank);
  out.set_reason(s.reason);
  out.set_incidents(s.incidents);
  out.set_targeted_audits_left(s.targeted_audits_left);
  out.set_since_unix_ms(UnixMillis(s.since));
  return out;
}

v1::Job ToProto(const core::JobSummary& j) {
  v1::Job out;
  out.set_job_id(j.job_id);
  out.set_world_size(j.world_size);
  out.set_attached_ranks(j.attached);
  out.set_last_step(j.last_step);
  out.set_created_unix_ms(UnixMillis(j.created));
  out.set_open_incidents(j.open_incidents);
  out.set_nodes(j.nodes);
  return out;
}

v1::Rank ToProto(const core::RankSummary& r) {
  v1::Rank out;
  out.set_job_id(r.job_id);
  ToProto(r.placement, out.mutable_placement());
  out.set_attached(r.attached);
  out.set_checks_through_step(r.checks_through);
  out.set_incarnation(r.incarnation);
  out.set_identity(r.identity);
  out.set_proof(r.proof);
  out.set_unproven(r.unproven);
  return out;
}

}  // namespace sdc::daemon
