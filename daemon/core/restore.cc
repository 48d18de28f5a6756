// Restore: rebuilds the coordinator from the store's snapshot, replays the
// reports of checks not yet decided through the same code as live ones, and
// fails requests whose actuator was running when sdcd stopped.

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_set.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::KeyOf;

namespace {

// The check a pending report feeds, in group `group` (see DecidedCheck).
DecidedCheck CheckOf(const Report& r, uint32_t group) {
  DecidedCheck c{r.job_id, group, r.step, CheckKind::kNonFinite, 0, {}};
  if (std::holds_alternative<WeightReport>(r.body)) {
    c.check = CheckKind::kWeights;
  } else if (const auto* a = std::get_if<AuditResult>(&r.body);
             a != nullptr && a->role != AuditRole::kConfirm) {
    c.check = CheckKind::kReplay;
    c.plan_id = a->plan_id;
  }
  return c;
}

using CheckId = std::tuple<std::string, uint32_t, Step, CheckKind, uint64_t>;
CheckId IdOf(const DecidedCheck& c) { return {c.job_id, c.group, c.step, c.check, c.plan_id}; }

}  // namespace

absl::Status Coordinator::Restore() {
  absl::StatusOr<Snapshot> snap = store_->Load();
  if (!snap.ok()) return snap.status();
  absl::MutexLock lock(&mu_);
  for (const JobRecord& j : snap->jobs) {
    JobState& job = jobs_[j.job_id];
    job.record = j;
    job.last_seen = clock_->Now();  // A full expiry period from the restart.
    // An attempt that did not say its resume step and has no step report
    // yet still rolls back at its first (cleared below when a rank has one).
    job.awaiting_first_step = j.attempt > 0 && j.resume_step == 0;
  }
  for (const GroupRecord& g : snap->groups) {
    auto it = jobs_.find(g.job_id);
    if (it != jobs_.end()) it->second.groups[g.group].record = g;
  }
  for (const RankRecord& r : snap->ranks) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end() || r.placement.rank >= it->second.record.world_size) continue;
    JobState& job = it->second;
    auto [slot, fresh] = job.ranks.try_emplace(r.placement.rank);
    if (fresh) ++job.said_hello;
    // Quotas restart from what the records hold: each identity with the
    // per-node capacity (its agent's GPU count arrives with its next Hello).
    MoveSlot(job, fresh ? "" : internal::IdentityKey(slot->second.record), internal::IdentityKey(r),
             options_.max_ranks_per_node);
    slot->second = RankState();  // Detached; software and shard come with its next Hello.
    slot->second.record = r;
    if (r.has_last_step) job.awaiting_first_step = false;
    job.groups[r.placement.replica_group].members.push_back(r.placement.rank);
  }
  for (auto& [id, job] : jobs_) {
    for (auto& [gid, group] : job.groups) {
      std::sort(group.members.begin(), group.members.end());
      group.topology.reset();
    }
  }
  for (const PlanRecord& p : snap->plans) {
    auto it = jobs_.find(p.job_id);
    if (it != jobs_.end()) it->second.plans[p.plan_id] = p;
  }
  for (const StepVerdict& v : snap->step_verdicts) {
    auto it = jobs_.find(v.job_id);
    if (it == jobs_.end()) continue;
    it->second.ledger[v.step].Add(v);
  }
  escalation_.Restore(snap->requests);
  for (const Incident& inc : snap->incidents) {
    next_incident_id_ = std::max(next_incident_id_, inc.id + 1);
    incidents_[inc.id] = inc;
    if (!inc.confirmed || !inc.resolved_by.empty()) continue;
    const ReplacementRequest* r = escalation_.Find(inc.request_id);
    if (r != nullptr && r->state == RequestState::kDenied) continue;
    for (size_t i = 0; i < inc.ranks.size(); ++i) {
      faulty_gpus_[inc.gpus[i]] = {inc.job_id, inc.ranks[i], inc.nodes[i],
                                   inc.step,   inc.id,       !inc.unproven_evidence};
    }
  }
  for (const Suspect& s : snap->suspects) suspects_[s.gpu] = s;
  for (const CheckpointDecision& d : snap->checkpoint_decisions) {
    auto it = jobs_.find(d.job_id);
    if (it == jobs_.end()) continue;
    CheckpointLedger& ledger = it->second.checkpoints;
    if (d.abandoned && d.revocation) {
      ledger.ForgetRevocation(d.step);  // Of an earlier attempt's timeline.
    } else if (d.abandoned) {
      ledger.AbandonProvisional();
    } else if (d.revocation) {
      ledger.Learn(0, {d.step});
    } else if (d.allowed) {
      ledger.Allowed(d.step);
    }
  }

  // Reports not yet finalized go through the same code again, in arrival
  // order; their decisions were never written, so nothing is decided twice.
  // Reports of a check already decided (its mark is still there: the store
  // had not removed them yet) are removed instead.
  absl::flat_hash_set<CheckId> decided;
  for (const DecidedCheck& c : snap->decided) decided.insert(IdOf(c));
  Txn settle;
  settle.mutation.decided_cleared = snap->decided;
  // A rank's stored record may predate its pending reports (the store
  // writes progress late, Mutation::progress): they carry it.
  absl::flat_hash_set<std::pair<std::string, Rank>> progressed;
  replaying_ = true;
  for (const Report& r : snap->pending) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end() || it->second.ranks.count(r.rank) == 0) continue;
    RankRecord& rank = RankOf(it->second, r.rank);
    const bool current = r.incarnation == rank.incarnation;
    if (current) {
      rank.acked_sequence = std::max(rank.acked_sequence, r.sequence);
      progressed.insert({r.job_id, r.rank});
    }
    if (!decided.empty() && decided.contains(IdOf(CheckOf(r, rank.placement.replica_group)))) {
      if (current && std::holds_alternative<StepReport>(r.body)) {
        // What ApplyStepReport would have recorded.
        if (!rank.has_last_step || r.step > rank.last_step) rank.last_step = r.step;
        rank.has_last_step = true;
        rank.resumed = false;
      }
      settle.mutation.pending_removed.push_back(KeyOf(r));
      continue;
    }
    Txn txn;
    if (Apply(it->second, r, txn).ok()) {
      absl::StatusOr<Effects> effects = Commit(txn);
      if (!effects.ok()) {
        replaying_ = false;
        return effects.status();
      }
    }
  }
  replaying_ = false;
  // Written before any of the reports that carry it leaves the store.
  for (const auto& [job_id, r] : progressed) {
    settle.mutation.progress.push_back(RankOf(jobs_.at(job_id), r));
  }
  if (!settle.mutation.empty()) {
    if (absl::StatusOr<Effects> effects = Commit(settle); !effects.ok()) return effects.status();
  }

  // A request that was Executing when sdcd stopped: whether its actuator
  // finished is unknown, and running it again could replace a node twice.
  // It fails, saying so; an operator checks the node and approves it again
  // with force to retry.
  for (const ReplacementRequest& r : escalation_.List()) {
    if (r.state != RequestState::kExecuting) continue;
    absl::StatusOr<ReplacementRequest> failed = escalation_.FinishExecution(
        r.id, false,
        "sdcd stopped while the actuator ran; its outcome is unknown: check the node, then "
        "approve again with --force to retry",
        clock_->Now());
    if (!failed.ok()) return failed.status();
    Txn txn;
    txn.mutation.requests.push_back(*failed);
    if (absl::StatusOr<Effects> effects = Commit(txn); !effects.ok()) return effects.status();
  }
  return absl::OkStatus();
}

}  // namespace sdc::core
