// What a failed check records: an incident, which for a confirmed fault opens
// (or joins) a replacement request through Escalation, blocks the job's
// checkpoints while the GPU stays and revokes a provisional checkpoint; an
// unconfirmed one makes its GPUs suspects, whose audit rate rises.

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::RankList;

Incident& Coordinator::RecordIncident(JobState& job, GroupState& group, Step step,
                                      CheckKind check, const std::string& outcome,
                                      std::vector<Rank> ranks, bool confirmed,
                                      const std::string& explanation,
                                      std::vector<std::string> differing, Txn& txn) {
  const absl::Time now = clock_->Now();
  Incident inc;
  inc.id = next_incident_id_++;
  inc.job_id = job.record.job_id;
  inc.step = step;
  inc.check = check;
  inc.outcome = outcome;
  inc.ranks = std::move(ranks);
  for (Rank r : inc.ranks) {
    inc.nodes.push_back(RankOf(job, r).placement.node);
    inc.gpus.push_back(RankOf(job, r).placement.gpu_uuid);
  }
  inc.confirmed = confirmed && !inc.ranks.empty();
  inc.explanation = explanation;
  inc.differing_tensors = std::move(differing);
  inc.created = now;
  // Evidence about a node counts only from callers proven to be the nodes
  // they name: a group with an unproven member (any of them may have forged
  // what blamed another) opens no request.
  const std::vector<Rank> unproven = UnprovenMembers(job, group);
  inc.unproven_evidence = !unproven.empty();
  if (inc.unproven_evidence) {
    const RankRecord& first = RankOf(job, unproven.front());
    inc.explanation += absl::StrCat(
        " (evidence not proven: the placement of rank", unproven.size() > 1 ? "s " : " ",
        RankList(unproven), " is not proven, rank ", unproven.front(), " because ",
        first.unproven, "; unproven evidence never opens a replacement request)");
  }
  if (inc.confirmed) {
    const int per_job = options_.max_open_requests_per_job > 0
                            ? options_.max_open_requests_per_job
                            : std::max(1, escalation_.policy().max_open_requests / 2);
    std::set<uint64_t> open_for_job;
    for (const auto& [id, other] : incidents_) {
      if (other.job_id != job.record.job_id || other.request_id == 0) continue;
      const ReplacementRequest* r = escalation_.Find(other.request_id);
      if (r != nullptr && IsOpen(r->state)) open_for_job.insert(r->id);
    }
    for (size_t i = 0; i < inc.ranks.size(); ++i) {
      std::string suppressed;
      if (inc.unproven_evidence) {
        suppressed = "its evidence is not proven";
      } else if (static_cast<int>(open_for_job.size()) >= per_job &&
                 escalation_.OpenFor(inc.nodes[i]) == nullptr) {
        suppressed = absl::StrCat("job ", job.record.job_id, " already has ", open_for_job.size(),
                                  " replacement requests open, its share (",
                                  "--max_open_requests_per_job ", per_job, ")");
      } else {
        Escalation::OpenResult opened = escalation_.Open(
            inc.nodes[i], inc.gpus[i], inc.id,
            absl::StrCat(CheckKindName(check), " check, step ", step, ": ", explanation), now);
        if (opened.request.has_value()) {
          if (inc.request_id == 0) inc.request_id = opened.request->id;
          open_for_job.insert(opened.request->id);
          txn.mutation.requests.push_back(*opened.request);
          txn.effects.requests.push_back(*opened.request);
        } else {
          suppressed = opened.suppressed;
        }
      }
      if (!suppressed.empty() && !inc.unproven_evidence) {
        inc.explanation += absl::StrCat(" (no replacement request: ", suppressed, ")");
      }
      faulty_gpus_[inc.gpus[i]] = {job.record.job_id, inc.ranks[i], inc.nodes[i],
                                   step,              inc.id,       !inc.unproven_evidence};
      if (suspects_.erase(inc.gpus[i]) > 0) {
        txn.mutation.suspects_removed.push_back(inc.gpus[i]);
      }
    }
  }
  // Outcomes that point at the model, the data or the software (every rank
  // alike) say nothing about the weights before; every other incident means
  // some hardware produced wrong values, maybe silently on unaudited steps
  // before the provisional checkpoint too: it is not trusted any more.
  const bool software = outcome == "systemic" || outcome == "all_ranks" ||
                        outcome == "reproduced" || outcome == kAuditsOff ||
                        outcome == kSoftwareMismatch || outcome == kCorruptedTransfer;
  if (const std::optional<Step> revoked =
          software ? std::nullopt : job.checkpoints.RevokeProvisional()) {
    txn.mutation.checkpoint_decisions.push_back(
        {job.record.job_id, *revoked, false,
         absl::StrCat("revoked by incident ", inc.id, " (", CheckKindName(check), " check, step ",
                      step, ", ", outcome, ") before a later checkpoint confirmed it"),
         now, /*revocation=*/true});
  }
  auto [it, inserted] = incidents_.emplace(inc.id, inc);
  txn.mutation.incidents.push_back(inc);
  txn.effects.incidents.push_back(inc);
  if (!inc.confirmed && outcome != "systemic") {
    for (Rank r : inc.ranks) AddSuspect(job, group, r, explanation, txn);
  }
  // A GPU named with its request open is watched until it is replaced.
  if (inc.confirmed) UpdateWatch(job, group, txn);
  return it->second;
}

void Coordinator::AddSuspect(JobState& job, GroupState& group, Rank rank,
                             const std::string& reason, Txn& txn) {
  const Placement& p = RankOf(job, rank).placement;
  if (faulty_gpus_.count(p.gpu_uuid) > 0) return;  // Already attributed.
  auto [it, fresh] = suspects_.try_emplace(p.gpu_uuid);
  Suspect& s = it->second;
  if (fresh) {
    s.gpu = p.gpu_uuid;
    s.since = clock_->Now();
  }
  s.node = p.node;
  s.job_id = job.record.job_id;
  s.rank = rank;
  s.reason = reason;
  ++s.incidents;
  // Faults recur intermittently: suspicion raises the rank's audit rate
  // instead of being forgotten.
  const bool had_chances = s.targeted_audits_left > 0;
  s.targeted_audits_left = std::max(s.targeted_audits_left, options_.targeted_audits_per_suspect);
  bool outstanding = false;
  for (const auto& [id, plan] : job.plans) {
    outstanding = outstanding || (!plan.done && !plan.watch && plan.suspect == rank);
  }
  txn.mutation.suspects.push_back(s);
  if (!outstanding && (!had_chances || fresh) &&
      TopologyOf(job, group).capability() != AttributionCapability::kDetectOnly &&
      TopologyOf(job, group).capability() != AttributionCapability::kNone) {
    ScheduleTargetedAudit(job, group, rank, reason, txn);
  }
}

}  // namespace sdc::core
