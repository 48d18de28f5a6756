// Attempts: a job restarted by its launcher (torchrun --max-restarts,
// HyperPod auto-resume, a Slurm requeue) under the same job id. Every rank
// of the new attempt is a new process; the old attempt's open checks can
// never complete, its topology may not be the new one's, and the checkpoint
// it resumes from should be final. See docs/ARCHITECTURE.md, "Attempts".

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::EchoJobId;

std::string Coordinator::DoubtfulResume(const JobState& job, const Hello& h) const {
  if (h.resume_step == 0) return "";
  const CheckpointLedger& ledger = job.checkpoints;
  const Step step = h.resume_step;
  switch (ledger.Of(step)) {
    case CheckpointLedger::Standing::kFinal:
      return "";
    case CheckpointLedger::Standing::kRevoked:
      return absl::StrCat("it resumes from step ", step,
                          ", whose checkpoint was revoked (a GPU of the job was found faulty "
                          "before a later checkpoint confirmed it); resume from step ",
                          ledger.confirmed_through(), " or earlier (latest_final())");
    case CheckpointLedger::Standing::kProvisional:
      break;
  }
  const bool allowed = ledger.provisional() == step;
  return absl::StrCat("it resumes from step ", step, ", whose checkpoint is ",
                      allowed ? "provisional (no later checkpoint confirmed it)"
                              : "not one the gate allowed",
                      "; the newest final one is step ", ledger.confirmed_through(),
                      " (latest_final())");
}

void Coordinator::StartAttempt(JobState& job, const Hello& h, const std::string& warning,
                               Txn& txn) {
  const absl::Time now = clock_->Now();
  const std::string& id = job.record.job_id;
  AttemptRecord attempt{id, h.attempt, h.world_size, h.resume_step, now, 0, ""};

  // 1. The old attempt's open checks: their ranks' processes are gone, so
  // they would only finish at their deadline with ranks missing. Closed
  // now, undecided (no verdict, no incident), and their pending reports
  // removed.
  auto drop = [&txn](const std::vector<PendingKey>& keys) {
    txn.mutation.pending_removed.insert(txn.mutation.pending_removed.end(), keys.begin(),
                                        keys.end());
  };
  for (const auto& [key, ps] : job.steps) drop(ps.keys);
  for (const auto& [key, pw] : job.weights) drop(pw.keys);
  for (const auto& [key, pa] : job.audits) drop(pa.keys);
  for (const auto& [key, pa] : job.unfinished) drop(pa.keys);
  for (const Report& r : job.held) txn.mutation.pending_removed.push_back(internal::KeyOf(r));
  Step first = 0;
  Step last = 0;
  auto count = [&](Step step) {
    first = attempt.closed_checks == 0 ? step : std::min(first, step);
    last = std::max(last, step);
    ++attempt.closed_checks;
  };
  for (const auto& [key, ps] : job.steps) count(key.second);
  for (const auto& [key, pw] : job.weights) count(key.second);
  for (const auto& [key, pa] : job.audits) count(std::get<1>(key));
  job.steps.clear();
  job.weights.clear();
  job.audits.clear();
  job.unfinished.clear();
  job.held.clear();
  job.plans.clear();  // Targeted plans name the old attempt's ranks.
  std::string note = absl::StrCat("attempt ", h.attempt, " (world size ", h.world_size,
                                  h.resume_step > 0
                                      ? absl::StrCat(", resuming from step ", h.resume_step)
                                      : std::string(", no resume step said"),
                                  ") replaces attempt ", job.record.attempt);
  if (attempt.closed_checks > 0) {
    absl::StrAppend(&note, "; closed ", attempt.closed_checks, " open checks of steps ", first,
                    " to ", last, " undecided: their ranks' processes ended with attempt ",
                    job.record.attempt);
  }

  // 2. Ranks and replica groups: the new attempt's Hellos build its
  // topology (and so its replay plans) again, with their quotas.
  held_ranks_ -= job.reserved;
  held_unauthenticated_ -= job.reserved_unauthenticated;
  job.reserved = job.reserved_unauthenticated = 0;
  job.capacity = job.capacity_unauthenticated = 0;
  job.identities.clear();
  for (const auto& [gid, group] : job.groups) {
    auto used = layout_bytes_.find(group.creator);
    if (used == layout_bytes_.end()) continue;
    used->second -= std::min(used->second, group.layout_bytes);
    if (used->second == 0) layout_bytes_.erase(used);
  }
  job.groups.clear();
  job.ranks.clear();
  job.said_hello = 0;

  // 3. Verdicts of steps after the resume belong to the abandoned timeline
  // (without a resume step, the attempt's first step report rolls back
  // from its own step).
  if (h.resume_step > 0) Rollback(job, h.resume_step + 1, txn);
  job.awaiting_first_step = h.resume_step == 0;

  // 4. The checkpoint ledger keeps what was final and what was revoked. A
  // provisional checkpoint after the resume step is abandoned: nothing of
  // the new attempt confirms it.
  const std::optional<Step> provisional = job.checkpoints.provisional();
  if (provisional.has_value() && (h.resume_step == 0 || *provisional > h.resume_step)) {
    job.checkpoints.AbandonProvisional();
    const std::string why = absl::StrCat("abandoned by attempt ", h.attempt, ", which resumed ",
                                         h.resume_step > 0
                                             ? absl::StrCat("from step ", h.resume_step)
                                             : std::string("without saying from where"));
    CheckpointDecision d{id, *provisional, false, why, now};
    d.abandoned = true;
    txn.mutation.checkpoint_decisions.push_back(std::move(d));
    absl::StrAppend(&note, "; the provisional checkpoint of step ", *provisional,
                    " was abandoned (neither confirmed nor revoked)");
  }
  // A checkpoint revoked after the resume step was of the abandoned
  // timeline (without a resume step: at the attempt's first step report).
  if (h.resume_step > 0) {
    const std::string forgot = ForgetOldRevocations(job, h.resume_step, txn);
    if (!forgot.empty()) absl::StrAppend(&note, "; ", forgot);
  }
  job.resume_warning = warning;
  if (!warning.empty()) absl::StrAppend(&note, "; warning: ", warning);

  job.record.attempt = h.attempt;
  job.record.resume_step = h.resume_step;
  job.record.world_size = h.world_size;
  job.record.audit_every = h.audit_every;
  job.record.weight_check_every = h.weight_check_every;
  job.last_seen = now;
  attempt.note = note;
  txn.mutation.attempts.push_back(std::move(attempt));
  txn.mutation.jobs.push_back(job.record);
  txn.effects.notes.push_back(absl::StrCat("job ", EchoJobId(id), ": ", note));
}


std::string Coordinator::ForgetOldRevocations(JobState& job, Step resume, Txn& txn) {
  // The new attempt's own checkpoint of such a step holds other weights and
  // is judged afresh; the revocation stays in the job's history (its
  // decision row is kept, and this one marks it of an abandoned timeline).
  std::vector<Step> forgotten;
  const std::vector<Step> revoked = job.checkpoints.revoked();
  for (Step step : revoked) {
    if (step <= resume || !job.checkpoints.ForgetRevocation(step)) continue;
    CheckpointDecision d{job.record.job_id, step, false,
                         absl::StrCat("a revocation of an earlier attempt's timeline; attempt ",
                                      job.record.attempt, " resumed from step ", resume),
                         clock_->Now()};
    d.revocation = true;
    d.abandoned = true;
    txn.mutation.checkpoint_decisions.push_back(std::move(d));
    forgotten.push_back(step);
  }
  if (forgotten.empty()) return "";
  return absl::StrCat("the revocation of step ", absl::StrJoin(forgotten, ", "),
                      "'s checkpoint belongs to the old timeline");
}

}  // namespace sdc::core
