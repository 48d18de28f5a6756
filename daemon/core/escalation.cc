#include "daemon/core/escalation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/identity.h"

namespace sdc::core {

void Escalation::Restore(std::vector<ReplacementRequest> requests) {
  for (ReplacementRequest& r : requests) {
    next_id_ = std::max(next_id_, r.id + 1);
    requests_[r.id] = std::move(r);
  }
}

int Escalation::OpenCount() const {
  int n = 0;
  for (const auto& [id, r] : requests_) n += IsOpen(r.state) ? 1 : 0;
  return n;
}

int Escalation::ExecutedSince(absl::Time since) const {
  int n = 0;
  for (const auto& [id, r] : requests_) {
    for (const Transition& t : r.transitions) {
      n += (t.to == RequestState::kExecuting && t.at >= since) ? 1 : 0;
    }
  }
  return n;
}

int Escalation::CommittedExecutions(absl::Time now) const {
  int waiting = 0;
  for (const auto& [id, r] : requests_) waiting += r.state == RequestState::kApproved ? 1 : 0;
  return ExecutedSince(now - policy_.execution_window) + waiting;
}

void Escalation::Move(ReplacementRequest& r, RequestState to, const std::string& actor,
                      const std::string& reason, absl::Time now) {
  r.transitions.push_back({r.state, to, now, actor, reason});
  r.state = to;
  r.updated = now;
  // A refused or failed request approved again (with force) needs a fresh
  // set of approvals.
  if (to == RequestState::kDenied || to == RequestState::kExpired ||
      to == RequestState::kFailed) {
    r.approvals.clear();
  }
}

Escalation::OpenResult Escalation::Open(const std::string& node, const std::string& gpu,
                                        uint64_t incident_id, const std::string& reason,
                                        absl::Time now) {
  OpenResult result;
  if (policy_.never_replace.count(node) > 0) {
    result.suppressed = absl::StrCat("node ", node, " is marked never-replace");
    return result;
  }
  if (const std::string id = common::InstanceIdFromNodeName(node);
      !id.empty() && policy_.never_replace.count(id) > 0) {
    result.suppressed =
        absl::StrCat("node ", node, " is instance ", id, ", which is marked never-replace");
    return result;
  }
  for (auto& [id, r] : requests_) {
    if (r.node == node && IsOpen(r.state)) {
      if (std::find(r.gpus.begin(), r.gpus.end(), gpu) == r.gpus.end()) r.gpus.push_back(gpu);
      r.incident_ids.push_back(incident_id);
      r.updated = now;
      result.request = r;
      return result;
    }
  }
  if (OpenCount() >= policy_.max_open_requests) {
    result.suppressed = absl::StrCat("blast-radius cap: ", policy_.max_open_requests,
                                     " replacement requests are already open");
    return result;
  }
  ReplacementRequest r;
  r.id = next_id_++;
  r.node = node;
  r.gpus = {gpu};
  r.incident_ids = {incident_id};
  r.reason = reason;
  r.action = policy_.action;
  r.created = now;
  r.updated = now;
  r.approvals_required = static_cast<uint32_t>(std::max(1, policy_.approvals_required));
  r.transitions.push_back({RequestState::kPending, RequestState::kPending, now, "sdcd", reason});
  if (!policy_.require_approval) {
    if (CommittedExecutions(now) < policy_.max_executed_per_window) {
      Move(r, RequestState::kApproved, "sdcd (policy: auto-approve)",
           "approval not required by policy", now);
    } else {
      r.transitions.back().reason += " (auto-approval held back: execution cap reached)";
    }
  }
  result.request = r;
  result.opened = true;
  requests_[r.id] = std::move(r);
  return result;
}

absl::StatusOr<ReplacementRequest*> Escalation::Decidable(uint64_t id, const std::string& op,
                                                         const std::string& reason,
                                                         bool force) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("no replacement request ", id));
  }
  if (reason.empty()) return absl::InvalidArgumentError("a reason is required");
  if (op.empty()) return absl::InvalidArgumentError("the operator's identity is required");
  ReplacementRequest& r = it->second;
  if (r.state == RequestState::kExecuting || r.state == RequestState::kDone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", id, " is ", RequestStateName(r.state), ": it can no longer be decided"));
  }
  if (r.state != RequestState::kPending && !force) {
    const Transition& last = r.transitions.back();
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", id, " is already ", RequestStateName(r.state), " (by ", last.actor,
        ": ", last.reason, "); use --force to decide again"));
  }
  return &r;
}

absl::StatusOr<ReplacementRequest> Escalation::Approve(uint64_t id, const std::string& op,
                                                       const std::string& reason, bool force,
                                                       bool dry_run, absl::Time now) {
  absl::StatusOr<ReplacementRequest*> r = Decidable(id, op, reason, force);
  if (!r.ok()) return r.status();
  if ((*r)->state == RequestState::kApproved) {
    return absl::FailedPreconditionError(absl::StrCat("request ", id, " is already Approved"));
  }
  const int committed = CommittedExecutions(now);
  if (committed >= policy_.max_executed_per_window && !force) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "blast-radius cap: %d replacements executed or approved in the last %s (cap %d); "
        "use --force",
        committed, absl::FormatDuration(policy_.execution_window),
        policy_.max_executed_per_window));
  }
  if (!IsOpen((*r)->state)) {
    // Re-deciding a closed request must not give its node a second open one.
    for (const auto& [other_id, other] : requests_) {
      if (other_id != id && other.node == (*r)->node && IsOpen(other.state)) {
        return absl::FailedPreconditionError(
            absl::StrCat("node ", other.node, " already has open request ", other_id));
      }
    }
  }
  ReplacementRequest copy = **r;
  const uint32_t required = static_cast<uint32_t>(std::max(1, policy_.approvals_required));
  // Force is two-person whatever `required` is.
  const uint32_t needed = force ? std::max<uint32_t>(2, required) : required;
  copy.approvals_required = required;
  for (const Approval& a : copy.approvals) {
    if (a.op == op) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request ", id, " already has ", op, "'s approval; it needs ", needed,
          force ? " forced" : "", " approvals from distinct operators: another operator must ",
          force ? "approve with --force" : "approve"));
    }
  }
  copy.approvals.push_back({op, reason, now, force});
  const uint32_t counted =
      force ? static_cast<uint32_t>(std::count_if(copy.approvals.begin(), copy.approvals.end(),
                                                  [](const Approval& a) { return a.force; }))
            : static_cast<uint32_t>(copy.approvals.size());
  if (counted < needed) {
    copy.transitions.push_back(
        {copy.state, copy.state, now, op,
         absl::StrCat(force ? "forced approval " : "approval ", counted, " of ", needed,
                      force ? " (force needs two people)" : "", ": ", reason)});
    copy.updated = now;
  } else {
    copy.cap_override = force;
    Move(copy, RequestState::kApproved, op, reason, now);
  }
  if (!dry_run) **r = copy;
  return copy;
}

absl::StatusOr<ReplacementRequest> Escalation::Deny(uint64_t id, const std::string& op,
                                                    const std::string& reason, bool force,
                                                    bool dry_run, absl::Time now) {
  absl::StatusOr<ReplacementRequest*> r = Decidable(id, op, reason, force);
  if (!r.ok()) return r.status();
  if ((*r)->state == RequestState::kDenied) {
    return absl::FailedPreconditionError(absl::StrCat("request ", id, " is already Denied"));
  }
  ReplacementRequest copy = **r;
  Move(copy, RequestState::kDenied, op, reason, now);
  if (!dry_run) **r = copy;
  return copy;
}

absl::StatusOr<ReplacementRequest> Escalation::StartExecution(uint64_t id,
                                                              const std::string& actuator,
                                                              absl::Time now) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  if (it->second.state != RequestState::kApproved) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", id, " is ", RequestStateName(it->second.state), ", not Approved"));
  }
  if (!it->second.cap_override &&
      ExecutedSince(now - policy_.execution_window) >= policy_.max_executed_per_window) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", id, " waits: the execution cap (", policy_.max_executed_per_window,
        " per ", absl::FormatDuration(policy_.execution_window), ") is reached"));
  }
  it->second.actuator = actuator;
  Move(it->second, RequestState::kExecuting, absl::StrCat("actuator:", actuator),
       absl::StrCat(it->second.action, " ", it->second.node), now);
  return it->second;
}

absl::StatusOr<ReplacementRequest> Escalation::FinishExecution(uint64_t id, bool ok,
                                                               const std::string& detail,
                                                               absl::Time now) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  if (it->second.state != RequestState::kExecuting) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", id, " is ", RequestStateName(it->second.state), ", not Executing"));
  }
  it->second.actuator_result = detail;
  Move(it->second, ok ? RequestState::kDone : RequestState::kFailed,
       absl::StrCat("actuator:", it->second.actuator), detail, now);
  return it->second;
}

std::vector<ReplacementRequest> Escalation::ExpireDue(absl::Time now) {
  std::vector<ReplacementRequest> expired;
  for (auto& [id, r] : requests_) {
    if (r.state == RequestState::kPending && now - r.created >= policy_.request_ttl) {
      Move(r, RequestState::kExpired, "sdcd",
           absl::StrCat("nobody decided within ", absl::FormatDuration(policy_.request_ttl)),
           now);
      expired.push_back(r);
    }
  }
  return expired;
}

const ReplacementRequest* Escalation::Find(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

const ReplacementRequest* Escalation::OpenFor(const std::string& node) const {
  for (const auto& [id, r] : requests_) {
    if (r.node == node && IsOpen(r.state)) return &r;
  }
  return nullptr;
}

std::vector<ReplacementRequest> Escalation::List() const {
  std::vector<ReplacementRequest> out;
  for (const auto& [id, r] : requests_) out.push_back(r);
  return out;
}

std::vector<uint64_t> Escalation::ReadyToExecute() const {
  std::vector<uint64_t> out;
  for (const auto& [id, r] : requests_) {
    if (r.state == RequestState::kApproved) out.push_back(id);
  }
  return out;
}

}  // namespace sdc::core
