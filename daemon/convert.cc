#include "daemon/convert.h"

namespace sdc::daemon {

v1::CoordinatorMessage ToProto(const core::OutMessage& m) { return ToProto(m.body); }

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
  out.set_attempt(j.attempt);
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
