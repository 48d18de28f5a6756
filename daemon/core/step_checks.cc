// Check 1, every step: non-finite gradients (a rank's own, confirmed or
// cleared by another rank's in-band replay of its micro-batch) and the vote
// on the reduced-gradient digests; a job whose audits are off says so here.

#include "daemon/core/coordinator.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::Echo;
using internal::EchoJobId;
using internal::KeyOf;
using internal::RankList;
using internal::ToVector;

namespace {

std::vector<DigestBallot> BallotsOf(const std::map<uint64_t, std::vector<Rank>>& ranks,
                                    const std::map<uint64_t, const std::vector<Fingerprint>*>&
                                        tensors) {
  std::vector<DigestBallot> out;
  for (const auto& [digest, rs] : ranks) {
    auto t = tensors.find(digest);
    out.push_back({digest, rs, t == tensors.end() ? nullptr : t->second});
  }
  return out;
}

// The members, in order, that are not in `reported`.
std::vector<Rank> Unreported(const std::vector<Rank>& members,
                             const absl::flat_hash_set<Rank>& reported) {
  std::vector<Rank> m;
  for (Rank r : members) {
    if (!reported.count(r)) m.push_back(r);
  }
  return m;
}

}  // namespace

absl::Status Coordinator::ApplyStepReport(JobState& job, GroupState& group, const Report& r,
                                          const StepReport& s, Txn& txn) {
  RankRecord& rank = RankOf(job, r.rank);
  if (!replaying_ && rank.has_last_step && r.step <= rank.last_step) {
    if (r.step == rank.last_step) {
      return absl::AlreadyExistsError(absl::StrCat("step report for step ", r.step,
                                                   " from rank ", r.rank, " already received"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("out-of-order step: rank ", r.rank, " reported step ", r.step,
                     " after step ", rank.last_step));
  }
  if (!replaying_) txn.mutation.pending_added.push_back(r);
  if (!replaying_ && rank.resumed && r.step <= rank.last_step) {
    // A restarted rank resumes at or below its last step: the job rolled
    // back to a checkpoint, and the verdicts of the abandoned steps are void.
    Rollback(job, r.step, txn);
  }
  rank.resumed = false;
  rank.has_last_step = true;
  rank.last_step = r.step;

  auto [it, fresh] = job.steps.try_emplace({group.record.group, r.step});
  PendingStep& ps = it->second;
  if (fresh) {
    ps.first_seen = clock_->Now();
    // Every member reports once: no rehashing or regrowth on the way.
    ps.reported.reserve(group.members.size());
    ps.applied.reserve(group.members.size());
    ps.keys.reserve(group.members.size());
  }
  ps.reported.insert(r.rank);
  ps.reduced[s.reduced_digest].ranks.push_back(r.rank);
  if (s.local_nonfinite > 0) ps.local_nonfinite.insert(r.rank);
  if (s.reduced_nonfinite > 0) ps.reduced_nonfinite.insert(r.rank);
  (s.applied ? ps.applied : ps.skipped).insert(r.rank);
  if (!s.no_confirmation.empty() && ps.no_confirmation.empty()) {
    ps.no_confirmation = s.no_confirmation;
  }
  ps.keys.push_back(KeyOf(r));
  if (!s.audits_off.empty() && !replaying_) NoteAuditsOff(job, group, r.step, s.audits_off, txn);
  MaybeFinalizeStep(job, group, r.step, /*deadline=*/false, txn);
  return absl::OkStatus();
}

absl::Status Coordinator::ApplyConfirmation(JobState& job, GroupState& group, const Report& r,
                                            const AuditResult& a, Txn& txn) {
  if (a.subject == r.rank) {
    return absl::InvalidArgumentError("a confirmation replay must be of another rank");
  }
  auto ps = job.steps.find({group.record.group, r.step});
  if (ps != job.steps.end() && ps->second.confirms.count(a.subject) > 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "confirmation of rank ", a.subject, "'s micro-batch at step ", r.step,
        " already received"));
  }
  if (!replaying_) txn.mutation.pending_added.push_back(r);
  if (ps == job.steps.end()) {
    // The step was decided without it (deadline): nothing left to confirm.
    if (!replaying_) txn.mutation.pending_removed.push_back(KeyOf(r));
    return absl::OkStatus();
  }
  ps->second.confirms[a.subject] = {r.rank, a.nonfinite};
  ps->second.keys.push_back(KeyOf(r));
  MaybeFinalizeStep(job, group, r.step, /*deadline=*/false, txn);
  return absl::OkStatus();
}

// Every rank of a job that turns its audits off says so on the same step:
// one incident for the job (no GPU is named), so operators see that check 2
// no longer runs and why.
void Coordinator::NoteAuditsOff(JobState& job, GroupState& group, Step step,
                                const std::string& reason, Txn& txn) {
  for (const auto& [id, inc] : incidents_) {
    if (inc.job_id == job.record.job_id && inc.outcome == kAuditsOff) return;
  }
  const std::string explanation = absl::StrCat(
      "replay audits are off for this job from step ", step, ": ", Echo(reason),
      "; non-finite checks and weight votes go on");
  RecordIncident(job, group, step, CheckKind::kReplay, kAuditsOff, {}, /*confirmed=*/false,
                 explanation, {}, txn);
  txn.effects.notes.push_back(absl::StrCat("job ", EchoJobId(job.record.job_id), ": ", explanation));
}

// The failures one step's checks found, as its verdict lists them.
struct Coordinator::StepFailures {
  std::vector<std::string> failures;
  uint64_t first_incident = 0;

  void Note(const Incident& inc) {
    failures.push_back(absl::StrCat(inc.explanation, " (incident ", inc.id, ")"));
    if (first_incident == 0) first_incident = inc.id;
  }
};

void Coordinator::MaybeFinalizeStep(JobState& job, GroupState& group, Step step,
                                    bool deadline, Txn& txn) {
  auto it = job.steps.find({group.record.group, step});
  if (it == job.steps.end()) return;
  PendingStep& ps = it->second;
  // Group membership is known only once every rank of the job said Hello.
  const bool complete = AllAttached(job) && ps.reported.size() == group.members.size();
  if (!complete && !deadline) return;
  const std::vector<Rank> local = ToVector(ps.local_nonfinite);
  // A lone rank's local NaN/Inf waits for the in-band confirmation replay of
  // the highest such rank (the one every rank agreed on), unless a rank said
  // none comes.
  const bool subset = !local.empty() && local.size() < group.members.size();
  if (subset && !deadline && ps.no_confirmation.empty() &&
      ChooseConfirmer(TopologyOf(job, group), local.back(), step).has_value() &&
      ps.confirms.count(local.back()) == 0) {
    return;
  }

  StepVerdict verdict;
  verdict.job_id = job.record.job_id;
  verdict.group = group.record.group;
  verdict.step = step;
  verdict.check = CheckKind::kNonFinite;
  verdict.complete = complete;
  verdict.applied = !ps.applied.empty();
  StepFailures found;
  const absl::Duration latency = clock_->Now() - ps.first_seen;
  const VoteOutcome reduced = CheckReducedGradients(job, group, step, ps, latency, found, txn);
  CheckNonFinite(job, group, step, ps, local, reduced, latency, found, txn);
  if (!ps.skipped.empty()) ++txn.effects.skipped_steps;

  verdict.failed = !found.failures.empty();
  verdict.incident_id = found.first_incident;
  verdict.summary = !found.failures.empty() ? absl::StrJoin(found.failures, "; ")
                    : complete              ? "pass"
                                            : absl::StrCat("missing ranks ",
                                                           RankList(Unreported(group.members,
                                                                               ps.reported)));
  RecordVerdict(job, std::move(verdict), txn);
  txn.mutation.decided.push_back({job.record.job_id, group.record.group, step,
                                  CheckKind::kNonFinite, 0, std::move(ps.keys)});
  job.steps.erase(it);
}

VoteOutcome Coordinator::CheckReducedGradients(JobState& job, GroupState& group, Step step,
                                               const PendingStep& ps, absl::Duration latency,
                                               StepFailures& found, Txn& txn) {
  std::map<uint64_t, std::vector<Rank>> by_digest;
  for (const auto& [digest, ballot] : ps.reduced) by_digest[digest] = ballot.ranks;
  const VoteResult reduced = Vote(group.members, BallotsOf(by_digest, {}));
  std::string reduced_result = "pass";
  if (reduced.outcome == VoteOutcome::kMinority) {
    // The rank that received bad data need not hold the bad hardware (a
    // sender, a link, a switch): the minority are suspects, and targeted
    // audits of their own computation confirm or clear them.
    reduced_result = "suspect";
    found.Note(RecordIncident(
        job, group, step, CheckKind::kReducedGradients, "suspect", reduced.minority,
        /*confirmed=*/false,
        absl::StrCat("rank(s) ", RankList(reduced.minority),
                     " received reduced gradients that differ from the majority's (",
                     by_digest[reduced.majority_digest].size(), " of ", group.members.size(),
                     " ranks agree); the bad data may come from elsewhere in the "
                     "all-reduce, so targeted audits decide"),
        {}, txn));
  } else if (reduced.outcome == VoteOutcome::kNoMajority) {
    reduced_result = "no_majority";
    found.Note(RecordIncident(job, group, step, CheckKind::kReducedGradients, "no_majority", {},
                              false,
                              absl::StrCat("reduced gradients differ across ranks and no value "
                                           "has a strict majority of ",
                                           group.members.size()),
                              {}, txn));
  } else if (reduced.outcome == VoteOutcome::kIncomplete) {
    reduced_result = "incomplete";
  }
  txn.effects.checks.push_back({CheckKind::kReducedGradients, reduced_result, latency});
  return reduced.outcome;
}

void Coordinator::CheckNonFinite(JobState& job, GroupState& group, Step step,
                                 const PendingStep& ps, const std::vector<Rank>& local,
                                 VoteOutcome reduced, absl::Duration latency,
                                 StepFailures& found, Txn& txn) {
  std::string nonfinite_result = "pass";
  if (!local.empty() && local.size() == group.members.size()) {
    nonfinite_result = "all_ranks";
    found.Note(RecordIncident(job, group, step, CheckKind::kNonFinite, "all_ranks", {}, false,
                              "every rank's local gradients had NaN/Inf: the model or its "
                              "data, not one GPU",
                              {}, txn));
  } else {
    for (Rank r : local) {
      auto c = ps.confirms.find(r);
      if (c != ps.confirms.end() && c->second.second == 0) {
        nonfinite_result = "faulty";
        found.Note(RecordIncident(
            job, group, step, CheckKind::kNonFinite, "faulty", {r}, true,
            absl::StrCat(Describe(job, r), " had NaN/Inf in its local gradients; ",
                         Describe(job, c->second.first),
                         " replayed its micro-batch and got finite gradients"),
            {}, txn));
      } else if (c != ps.confirms.end()) {
        if (nonfinite_result == "pass") nonfinite_result = "reproduced";
        found.Note(RecordIncident(
            job, group, step, CheckKind::kNonFinite, "reproduced", {}, false,
            absl::StrCat(Describe(job, c->second.first), " reproduced the NaN/Inf of rank ", r,
                         "'s micro-batch: the data or the software, not the GPU"),
            {}, txn));
      } else {
        if (nonfinite_result == "pass") nonfinite_result = "suspect";
        found.Note(RecordIncident(
            job, group, step, CheckKind::kNonFinite, "suspect", {r}, false,
            ps.no_confirmation.empty()
                ? absl::StrCat("NaN/Inf in the local gradients of ", Describe(job, r),
                               " only; no replay confirmed it")
                : absl::StrCat("NaN/Inf in the local gradients of ", Describe(job, r),
                               " only; no confirmation replay runs: ",
                               Echo(ps.no_confirmation), "; a suspect until audits decide"),
            {}, txn));
      }
    }
  }
  if (local.empty() && !ps.reduced_nonfinite.empty()) {
    if (ps.reduced_nonfinite.size() == group.members.size()) {
      nonfinite_result = "allreduce";
      found.Note(RecordIncident(job, group, step, CheckKind::kNonFinite, "allreduce", {}, false,
                                "every rank's reduced gradients had NaN/Inf but no rank's "
                                "local gradients did: the all-reduce produced them",
                                {}, txn));
    } else if (reduced != VoteOutcome::kMinority) {
      nonfinite_result = "suspect";
      const std::vector<Rank> ranks = ToVector(ps.reduced_nonfinite);
      found.Note(RecordIncident(job, group, step, CheckKind::kNonFinite, "suspect", ranks, false,
                                absl::StrCat("only rank(s) ", RankList(ranks),
                                             " received NaN/Inf from the all-reduce"),
                                {}, txn));
    }
  }
  txn.effects.checks.push_back({CheckKind::kNonFinite, nonfinite_result, latency});
}

}  // namespace sdc::core
