// The checkpoint gate: the ledger of finalized verdicts per step
// (RecordVerdict, Rollback), the reasons a checkpoint must wait or is vetoed
// (CheckpointVeto), and the persisted decision (MayCheckpoint).

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::EchoJobId;
using internal::RankList;

void Coordinator::LedgerEntry::Add(const StepVerdict& v) {
  if (v.check == CheckKind::kNonFinite) {
    applied = applied || v.applied;
    nonfinite.insert(v.group);
  }
  if (v.check == CheckKind::kWeights) weights[v.group] = v;
  if (v.check == CheckKind::kReplay) {
    audits.insert(v.group);
    if (!v.complete && !v.failed) {
      incomplete_audits[v.group] = v;
    } else if (v.complete) {
      incomplete_audits.erase(v.group);  // Completed by results that came late.
    }
  }
  if (v.failed) failures.push_back(v);
}

void Coordinator::RecordVerdict(JobState& job, StepVerdict verdict, Txn& txn) {
  job.ledger[verdict.step].Add(verdict);
  while (job.ledger.size() > options_.ledger_steps) job.ledger.erase(job.ledger.begin());
  txn.mutation.step_verdicts.push_back(std::move(verdict));
}

void Coordinator::Rollback(JobState& job, Step from, Txn& txn) {
  bool any = false;
  for (auto it = job.ledger.lower_bound(from); it != job.ledger.end();) {
    it = job.ledger.erase(it);
    any = true;
  }
  if (any) txn.mutation.rollbacks.push_back({job.record.job_id, from});
}

std::string Coordinator::CheckpointVeto(const JobState& job, Step step,
                                        bool* retryable) const {
  std::vector<std::string> waits;
  std::vector<std::string> vetoes;
  // 1. Every rank's step reports through `step`.
  // Slots are sparse (a claimed world of a million ranks holds only those
  // that said Hello): ranks without one are behind, counted, not walked.
  std::vector<Rank> named;  // The first few behind, as RankList names them.
  uint64_t behind = job.record.world_size - job.ranks.size();
  Rank gap = 0;  // Ranks below this without a slot are named already.
  auto name_gap_to = [&](Rank end) {
    for (; gap < end && named.size() <= 8; ++gap) named.push_back(gap);
    gap = std::max(gap, end);
  };
  for (const auto& [r, slot] : job.ranks) {
    name_gap_to(r);
    gap = r + 1;
    if (!slot.record.has_last_step || slot.record.last_step < step) {
      ++behind;
      if (named.size() <= 8) named.push_back(r);
    }
  }
  name_gap_to(job.record.world_size);
  if (behind > 0) {
    std::string list = RankList(named);
    if (behind > named.size()) {
      named.resize(std::min<size_t>(named.size(), 8));
      list = absl::StrCat(RankList(named), ", ... (", behind, " ranks)");
    }
    waits.push_back(
        absl::StrCat("checks of step ", step, " not yet reported by ranks ", list));
  }
  // 2. Nothing still open at or before `step`.
  for (const auto& [key, ps] : job.steps) {
    if (key.second > step) continue;
    std::vector<Rank> missing;
    for (Rank r : job.groups.at(key.first).members) {
      if (!ps.reported.count(r)) missing.push_back(r);
    }
    waits.push_back(missing.empty()
                        ? absl::StrCat("non-finite check of step ", key.second,
                                       " awaits a confirmation replay")
                        : absl::StrCat("non-finite check of step ", key.second,
                                       " awaits ranks ", RankList(missing)));
  }
  for (const auto& [key, pa] : job.audits) {
    if (std::get<1>(key) > step) continue;
    if (pa.verdict.has_value()) {
      std::vector<Rank> t;
      for (const PendingTieBreak& tb : pa.tiebreaks) {
        if (!tb.result.has_value()) t.push_back(tb.tiebreak.tiebreaker);
      }
      waits.push_back(absl::StrCat("replay audit of step ", std::get<1>(key),
                                   " awaits tie-break replays by ranks ", RankList(t)));
    } else {
      std::vector<Rank> missing;
      for (const Assignment& a : pa.plan.assignments) {
        if (!pa.originals.contains(a.subject)) missing.push_back(a.subject);
        if (!pa.replays.contains(a.replayer)) missing.push_back(a.replayer);
      }
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      waits.push_back(absl::StrCat("replay audit of step ", std::get<1>(key),
                                   " awaits results from ranks ", RankList(missing)));
    }
  }
  // 3. Failed checks: at this step, or applied to the weights before it.
  for (auto it = job.ledger.begin(); it != job.ledger.end() && it->first <= step; ++it) {
    for (const StepVerdict& f : it->second.failures) {
      if (it->first == step) {
        vetoes.push_back(absl::StrCat("step ", step, " failed the ", CheckKindName(f.check),
                                      " check: ", f.summary));
      } else if (it->second.applied && f.check != CheckKind::kWeights) {
        vetoes.push_back(absl::StrCat("step ", it->first, " applied gradients that failed the ",
                                      CheckKindName(f.check), " check (", f.summary,
                                      "); roll back to a checkpoint before step ", it->first));
      }
    }
  }
  // 4. A weight check at `step` that passed, in every replica group.
  auto entry = job.ledger.find(step);
  for (const auto& [gid, group] : job.groups) {
    auto pending = job.weights.find({gid, step});
    if (pending != job.weights.end()) {
      std::vector<Rank> missing;
      for (Rank r : group.members) {
        if (!pending->second.voted.count(r)) missing.push_back(r);
      }
      waits.push_back(absl::StrCat("weight check for step ", step, " missing from ranks ",
                                   RankList(missing)));
      continue;
    }
    if (entry == job.ledger.end() || entry->second.weights.count(gid) == 0) {
      waits.push_back(absl::StrCat("weight check for step ", step, " missing from ranks ",
                                   RankList(group.members)));
      continue;
    }
    const StepVerdict& w = entry->second.weights.at(gid);
    if (!w.complete) {
      vetoes.push_back(absl::StrCat("weight check for step ", step, " ", w.summary));
    }
    // Failed weight checks are listed under 3.
  }
  // 4b. The group's last audit at or before `step` has every result: an
  // audit some results never reached verified nothing, as an incomplete
  // weight check.
  for (const auto& [gid, group] : job.groups) {
    for (auto it = job.ledger.upper_bound(step); it != job.ledger.begin();) {
      --it;
      if (it->second.audits.count(gid) == 0) continue;
      auto incomplete = it->second.incomplete_audits.find(gid);
      if (incomplete != it->second.incomplete_audits.end()) {
        vetoes.push_back(absl::StrCat("the last replay audit before it (step ", it->first,
                                      ") is unverified: ", incomplete->second.summary));
      }
      break;
    }
  }
  // 5. A GPU attributed faulty is still in the job.
  for (const auto& [r, state] : job.ranks) {
    const RankState* slot = &state;
    auto f = faulty_gpus_.find(slot->record.placement.gpu_uuid);
    if (f == faulty_gpus_.end()) continue;
    // Unproven evidence blocks only the job it came from.
    if (!f->second.proven && f->second.job_id != job.record.job_id) continue;
    const auto inc = incidents_.find(f->second.incident_id);
    const uint64_t request = inc == incidents_.end() ? 0 : inc->second.request_id;
    vetoes.push_back(absl::StrCat(
        Describe(job, slot->record.placement.rank), " was attributed faulty at step ",
        f->second.step, " (incident ", f->second.incident_id, ") and is still in the job; ",
        request != 0
            ? absl::StrCat("replace ", f->second.node, " (approve request ", request,
                           ") or deny that request to clear it")
            : absl::StrCat("no replacement request was opened for it (see the incident); "
                           "once the GPU is dealt with, `sdcctl resolve incident ",
                           f->second.incident_id, " --reason=...` clears it")));
  }
  // 5b. A suspect of the sharded layouts' in-band checks is still in the
  // job. Those findings run no targeted audit (FSDP's collectives cannot
  // replay one rank alone), so nothing would ever confirm or clear the
  // suspect; and on tp a replay names a tp group, never its faulty rank, so
  // a GPU corrupting activations intermittently would train wrong values
  // into every later checkpoint. The suspect blocks them as a named GPU does
  // until an operator resolves its incident or the GPU leaves the job.
  const std::string in_band_suspect = absl::StrCat(internal::kBuddyCheckSkip, "suspect)");
  std::map<std::string, const Incident*> in_band;  // By GPU: its first such incident.
  for (const auto& [id, inc] : incidents_) {
    if (inc.job_id != job.record.job_id || inc.confirmed || !inc.resolved_by.empty() ||
        !absl::StrContains(inc.explanation, in_band_suspect)) {
      continue;
    }
    for (const std::string& gpu : inc.gpus) {
      if (suspects_.count(gpu) > 0) in_band.try_emplace(gpu, &inc);
    }
  }
  for (const auto& [r, state] : job.ranks) {
    auto s = in_band.find(state.record.placement.gpu_uuid);
    if (s == in_band.end()) continue;
    const Incident& inc = *s->second;
    vetoes.push_back(absl::StrCat(
        Describe(job, r), " is a suspect of incident ", inc.id, " (", CheckKindName(inc.check),
        " check, step ", inc.step, ") that no targeted audit can clear on this layout, and is "
        "still in the job; replace ", state.record.placement.node, ", or `sdcctl resolve incident ",
        inc.id, " --reason=...` once it is dealt with"));
  }
  // 6. A checkpoint of this step was revoked: asking again changes nothing.
  if (job.checkpoints.Of(step) == CheckpointLedger::Standing::kRevoked) {
    vetoes.push_back(absl::StrCat("the checkpoint of step ", step, " was revoked"));
  }
  *retryable = vetoes.empty() && !waits.empty();
  std::vector<std::string> all = vetoes;
  all.insert(all.end(), waits.begin(), waits.end());
  if (all.size() > 3) {
    const size_t more = all.size() - 3;
    all.resize(3);
    all.push_back(absl::StrCat("and ", more, " more"));
  }
  return absl::StrJoin(all, "; ");
}

absl::StatusOr<CheckpointResult> Coordinator::MayCheckpoint(const std::string& job_id,
                                                           Step step) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", EchoJobId(job_id)));
  JobState& job = it->second;
  CheckpointResult result;
  result.reason = CheckpointVeto(job, step, &result.retryable);
  result.allowed = result.reason.empty();
  if (result.allowed) result.reason = "every check through this step is in and passed";
  Txn txn;
  if (!result.retryable) {
    // A repeated question about the same step changes nothing.
    const bool repeat = result.allowed && job.checkpoints.provisional() == step;
    if (!repeat) {
      txn.mutation.checkpoint_decisions.push_back(
          {job_id, step, result.allowed, result.reason, clock_->Now()});
    }
    if (result.allowed) job.checkpoints.Allowed(step);
  }
  result.confirmed_through = job.checkpoints.confirmed_through();
  result.revoked = job.checkpoints.revoked();
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  result.effects = *std::move(effects);
  return result;
}

absl::StatusOr<CheckpointResult> Coordinator::CheckpointStatus(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", EchoJobId(job_id)));
  CheckpointResult result;
  result.reason = "status only: nothing decided";
  result.confirmed_through = it->second.checkpoints.confirmed_through();
  result.revoked = it->second.checkpoints.revoked();
  return result;
}

}  // namespace sdc::core
