// What operators and actuators do: resolve an incident, approve or deny a
// replacement request, and run approved requests (StartApproved,
// FinishExecution). Escalation holds the requests' state machine.

#include "daemon/core/coordinator.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace sdc::core {

absl::StatusOr<std::pair<Incident, Effects>> Coordinator::ResolveIncident(
    uint64_t id, const std::string& op, const std::string& reason) {
  if (op.empty()) return absl::InvalidArgumentError("resolving an incident needs an operator");
  if (reason.empty()) return absl::InvalidArgumentError("resolving an incident needs a reason");
  absl::MutexLock lock(&mu_);
  auto it = incidents_.find(id);
  if (it == incidents_.end()) return absl::NotFoundError(absl::StrCat("no incident ", id));
  Incident& inc = it->second;
  if (!inc.resolved_by.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incident ", id, " was already resolved by ", inc.resolved_by, ": ", inc.resolution));
  }
  const ReplacementRequest* request = escalation_.Find(inc.request_id);
  if (request != nullptr && IsOpen(request->state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incident ", id, " has replacement request ", request->id, " (",
        RequestStateName(request->state), "): approve or deny it instead"));
  }
  Txn txn;
  for (const std::string& gpu : inc.gpus) {
    auto f = faulty_gpus_.find(gpu);
    if (f != faulty_gpus_.end() && f->second.incident_id == id) faulty_gpus_.erase(f);
    if (!inc.confirmed && suspects_.erase(gpu) > 0) txn.mutation.suspects_removed.push_back(gpu);
  }
  inc.resolved_by = op;
  inc.resolution = reason;
  inc.resolved = clock_->Now();
  txn.mutation.incidents.push_back(inc);
  txn.effects.notes.push_back(absl::StrCat("incident ", id, " resolved by ", op, ": ", reason));
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(inc, *std::move(effects));
}

absl::StatusOr<std::pair<ReplacementRequest, Effects>> Coordinator::Approve(
    uint64_t id, const std::string& op, const std::string& reason, bool force,
    bool dry_run) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ReplacementRequest> r =
      escalation_.Approve(id, op, reason, force, dry_run, clock_->Now());
  if (!r.ok()) return r.status();
  Txn txn;
  if (!dry_run) {
    txn.mutation.requests.push_back(*r);
    txn.effects.requests.push_back(*r);
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(*std::move(r), *std::move(effects));
}

absl::StatusOr<std::pair<ReplacementRequest, Effects>> Coordinator::Deny(
    uint64_t id, const std::string& op, const std::string& reason, bool force, bool dry_run) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ReplacementRequest> r =
      escalation_.Deny(id, op, reason, force, dry_run, clock_->Now());
  if (!r.ok()) return r.status();
  Txn txn;
  if (!dry_run) {
    // An operator who refuses the replacement judged the GPU healthy: it no
    // longer blocks checkpoints.
    for (auto it = faulty_gpus_.begin(); it != faulty_gpus_.end();) {
      auto inc = incidents_.find(it->second.incident_id);
      if (inc != incidents_.end() && inc->second.request_id == id) {
        it = faulty_gpus_.erase(it);
      } else {
        ++it;
      }
    }
    txn.mutation.requests.push_back(*r);
    txn.effects.requests.push_back(*r);
    UpdateWatches(txn);  // A refused replacement ends its GPU's watch.
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(*std::move(r), *std::move(effects));
}

std::pair<std::vector<ReplacementRequest>, Effects> Coordinator::StartApproved(
    const std::string& actuator) {
  absl::MutexLock lock(&mu_);
  Txn txn;
  std::vector<ReplacementRequest> started;
  for (uint64_t id : escalation_.ReadyToExecute()) {
    absl::StatusOr<ReplacementRequest> r =
        escalation_.StartExecution(id, actuator, clock_->Now());
    if (!r.ok()) continue;
    txn.mutation.requests.push_back(*r);
    txn.effects.requests.push_back(*r);
    started.push_back(*std::move(r));
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  return {started, effects.ok() ? *std::move(effects) : Effects{}};
}

absl::StatusOr<std::pair<ReplacementRequest, Effects>> Coordinator::FinishExecution(
    uint64_t id, bool ok, const std::string& detail) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ReplacementRequest> r =
      escalation_.FinishExecution(id, ok, detail, clock_->Now());
  if (!r.ok()) return r.status();
  Txn txn;
  txn.mutation.requests.push_back(*r);
  txn.effects.requests.push_back(*r);
  UpdateWatches(txn);  // Done or failed: the request no longer holds a watch.
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(*std::move(r), *std::move(effects));
}

}  // namespace sdc::core
