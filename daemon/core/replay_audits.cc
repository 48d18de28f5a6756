// Check 2, what happens when a replay mismatches: a replay audit's results
// are checked against its plan (ApplyAudit), attributed once every original
// and replay is in or the deadline passes (MaybeFinalizeAudit, with
// Attribute in attribution.cc), tie-breaks are sent and resolved, incidents
// are recorded, and suspects get targeted audits (ScheduleTargetedAudit).

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::KeyOf;
using internal::ToVector;

absl::StatusOr<ReplayPlan> Coordinator::PlanFor(const JobState& job, const GroupState& group,
                                                Step step, uint64_t plan_id) const {
  if (!AllAttached(job)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.record.job_id,
                     " has ranks that never said Hello; audit plans need every rank"));
  }
  if (plan_id == 0) {
    // The trainers' own schedule (protocol/replay_plan.h), not a copy of it.
    std::optional<ReplayPlan> scheduled =
        ScheduledAudit(step, job.record.audit_every, TopologyOf(job, group));
    if (!scheduled.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step, " is not a scheduled audit step (audits every ",
                       job.record.audit_every, " steps)"));
    }
    return *std::move(scheduled);
  }
  auto it = job.plans.find(plan_id);
  if (it == job.plans.end() || it->second.group != group.record.group) {
    return absl::InvalidArgumentError(absl::StrCat("unknown audit plan ", plan_id,
                                                   " for replica group ", group.record.group));
  }
  ReplayPlan plan;
  plan.assignments = it->second.assignments;
  plan.capability = TopologyOf(job, group).capability();
  plan.cross_domain = true;
  return plan;
}

absl::Status Coordinator::ApplyAudit(JobState& job, GroupState& group, const Report& r,
                                     const AuditResult& a, Txn& txn) {
  if (!a.gradients.empty() && a.gradients.size() != group.record.parameter_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "audit result from rank ", r.rank, " has ", a.gradients.size(),
        " gradient fingerprints; the layout has ", group.record.parameter_count,
        " parameters"));
  }
  if (a.subject >= job.record.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", a.subject, " is not in job ",
                                                   job.record.job_id, " of ",
                                                   job.record.world_size, " ranks"));
  }
  if (!AllAttached(job)) {
    // Before every rank said Hello the groups and so the plan are unknown:
    // ranks back from an outage come in any order. Held until the last
    // Hello (registry.cc), stored as pending meanwhile.
    if (Fresh()) txn.mutation.pending_added.push_back(r);
    job.held.push_back(r);
    return absl::OkStatus();
  }
  // members is ascending: O(log world) per audit result.
  if (!std::binary_search(group.members.begin(), group.members.end(), a.subject)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", a.subject,
                                                   " is not in rank ", r.rank,
                                                   "'s replica group"));
  }
  // Check 1's in-band replay of a lone NaN/Inf (see step_checks.cc).
  if (a.role == AuditRole::kConfirm) return ApplyConfirmation(job, group, r, a, txn);
  Evidence evidence{a.loss_bits, a.gradient_digest, a.gradients};
  const std::tuple<uint32_t, Step, uint64_t> key{group.record.group, r.step, a.plan_id};
  auto existing = job.audits.find(key);
  PendingAudit* pa = existing == job.audits.end() ? nullptr : &existing->second;
  // The plan is derived once per audit, on its first result.
  std::optional<PendingAudit> fresh;
  if (pa == nullptr) {
    // A step runs one audit (a targeted plan waits for a step without the
    // scheduled one): a result after its verdict, say one resent after a
    // deadline decided without it, must not open the audit again.
    auto decided = job.ledger.find(r.step);
    if (Forgotten(job, r.step) ||
        job.unfinished.count(key) > 0 ||
        (decided != job.ledger.end() && decided->second.audits.count(group.record.group) > 0)) {
      return ApplyLateAudit(job, group, r, a, std::move(evidence), txn);
    }
    absl::StatusOr<ReplayPlan> plan = PlanFor(job, group, r.step, a.plan_id);
    if (!plan.ok()) return plan.status();
    fresh.emplace();
    fresh->plan = *std::move(plan);
    fresh->subject_of.reserve(fresh->plan.assignments.size());
    fresh->subjects.reserve(fresh->plan.assignments.size());
    for (const Assignment& x : fresh->plan.assignments) {
      fresh->subject_of[x.replayer] = x.subject;
      fresh->subjects.insert(x.subject);
    }
    // One original per subject and one replay per replayer are coming.
    fresh->originals.reserve(fresh->subjects.size());
    fresh->replays.reserve(fresh->subject_of.size());
    fresh->keys.reserve(fresh->subjects.size() + fresh->subject_of.size());
  }
  const PendingAudit& view = pa != nullptr ? *pa : *fresh;
  switch (a.role) {
    case AuditRole::kOriginal: {
      if (a.subject != r.rank || !view.subjects.contains(r.rank)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r.rank, " sent an original result for rank ", a.subject,
            "; the plan of step ", r.step, " expects none from it"));
      }
      if (view.originals.contains(r.rank)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "original result of rank ", r.rank, " at step ", r.step, " already received"));
      }
      break;
    }
    case AuditRole::kReplay: {
      auto assigned = view.subject_of.find(r.rank);
      if (assigned == view.subject_of.end() || assigned->second != a.subject) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r.rank, " replayed rank ", a.subject, "'s micro-batch, but the plan of step ",
            r.step, " does not assign that pair"));
      }
      if (view.replays.contains(r.rank) || view.corrupted.count(r.rank) > 0) {
        return absl::AlreadyExistsError(absl::StrCat(
            "replay result of rank ", r.rank, " at step ", r.step, " already received"));
      }
      break;
    }
    case AuditRole::kTieBreak: {
      if (pa == nullptr) {
        // Before any other result of its audit (ranks resend in any order).
        pa = &job.audits.emplace(key, *std::move(fresh)).first->second;
        pa->first_seen = clock_->Now();
        pa->plan_id = a.plan_id;
        if (a.plan_id != 0) pa->suspect = job.plans[a.plan_id].suspect;
      }
      if (!pa->verdict.has_value()) {
        // Ranks derived this tie-break in-band from every rank's results;
        // sdcd derives it once they are all here (after an outage, ranks
        // resend in any order). Kept until then.
        const std::pair<Rank, Rank> id{r.rank, a.subject};
        if (pa->early_tiebreaks.count(id) > 0) {
          return absl::AlreadyExistsError(absl::StrCat(
              "tie-break result of rank ", r.rank, " at step ", r.step, " already received"));
        }
        pa->early_tiebreaks.emplace(id, std::move(evidence));
        if (Fresh()) txn.mutation.pending_added.push_back(r);
        pa->keys.push_back(KeyOf(r));
        return absl::OkStatus();
      }
      PendingTieBreak* tb = nullptr;
      for (PendingTieBreak& t : pa->tiebreaks) {
        if (t.tiebreak.tiebreaker == r.rank && t.tiebreak.subject == a.subject) tb = &t;
      }
      if (tb == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "no tie-break of rank ", a.subject, "'s micro-batch is assigned to rank ", r.rank,
            " at step ", r.step));
      }
      if (tb->result.has_value()) {
        return absl::AlreadyExistsError(absl::StrCat(
            "tie-break result of rank ", r.rank, " at step ", r.step, " already received"));
      }
      tb->result = evidence;
      if (Fresh()) txn.mutation.pending_added.push_back(r);
      pa->keys.push_back(KeyOf(r));
      MaybeFinalizeAudit(job, group, key, /*deadline=*/false, txn);
      return absl::OkStatus();
    }
    case AuditRole::kConfirm:
      break;  // Handled above.
  }
  if (pa == nullptr) {
    pa = &job.audits.emplace(key, *std::move(fresh)).first->second;
    pa->first_seen = clock_->Now();
    pa->plan_id = a.plan_id;
    if (a.plan_id != 0) pa->suspect = job.plans[a.plan_id].suspect;
  }
  if (a.role == AuditRole::kOriginal) {
    pa->originals[r.rank] = std::move(evidence);
  } else if (a.corrupted_transfer) {
    pa->corrupted.insert(r.rank);
  } else {
    pa->replays[r.rank] = std::move(evidence);
  }
  if (Fresh()) txn.mutation.pending_added.push_back(r);
  pa->keys.push_back(KeyOf(r));
  MaybeFinalizeAudit(job, group, key, /*deadline=*/false, txn);
  return absl::OkStatus();
}

struct Coordinator::AuditFindings {
  AuditOutcome outcome = AuditOutcome::kPass;
  std::set<Rank> faulty;
  std::set<Rank> suspects;
  std::set<Rank> software;  // Mismatches explained by a software stack (ExplainBySoftware).
  // "rank S's micro-batch reached rank K corrupted", one per corrupted transfer.
  std::vector<std::string> corrupted;
  // Every rank named was explained by software: the weights are not
  // suspect, so the step's verdict does not fail (no checkpoint veto).
  bool only_software() const { return !software.empty() && faulty.empty() && suspects.empty(); }
  std::vector<std::string> notes;  // Attribution's explanation, then the tie-breaks'.
};

void Coordinator::MaybeFinalizeAudit(JobState& job, GroupState& group,
                                     const std::tuple<uint32_t, Step, uint64_t>& key,
                                     bool deadline, Txn& txn) {
  auto it = job.audits.find(key);
  if (it == job.audits.end()) return;
  PendingAudit& pa = it->second;
  const Step step = std::get<1>(key);
  if (!pa.verdict.has_value()) {
    // Results are validated against the plan, so counts tell completeness.
    const bool all_in = pa.originals.size() == pa.subjects.size() &&
                        pa.replays.size() + pa.corrupted.size() == pa.subject_of.size();
    if (!all_in && !deadline) return;
  } else {
    bool resolved = true;
    for (const PendingTieBreak& t : pa.tiebreaks) resolved = resolved && t.result.has_value();
    if (!resolved && !deadline) return;
  }
  bool deterministic = true;
  for (Rank r : group.members) deterministic = deterministic && RankOf(job, r).deterministic;

  if (!pa.verdict.has_value() &&
      AttributeAudit(job, group, pa, step, deterministic, deadline, txn)) {
    return;  // Tie-breaks were sent.
  }
  bool resolved = true;
  for (const PendingTieBreak& t : pa.tiebreaks) resolved = resolved && t.result.has_value();
  if (!resolved && !deadline) return;

  // Final verdict.
  const AuditVerdict& v = *pa.verdict;
  AuditFindings findings = SettleAudit(pa, deterministic);
  ExplainBySoftware(job, pa, findings);
  const AuditOutcome outcome = findings.outcome;
  const std::set<Rank>& faulty = findings.faulty;
  const std::set<Rank>& suspects = findings.suspects;
  const std::vector<std::string> differing = TensorNames(group, v.differing_parameters);
  const std::string explanation = absl::StrJoin(findings.notes, "; ");

  StepVerdict verdict;
  verdict.job_id = job.record.job_id;
  verdict.group = group.record.group;
  verdict.step = step;
  verdict.check = CheckKind::kReplay;
  verdict.complete = v.missing.empty();
  verdict.failed = IsFailure(outcome) && !findings.only_software();
  verdict.incident_id =
      RecordAuditIncidents(job, group, step, findings, explanation, differing, txn);
  verdict.summary = IsFailure(outcome)
                        ? absl::StrCat(AuditOutcomeName(outcome), ": ", explanation,
                                       verdict.incident_id != 0
                                           ? absl::StrCat(" (incident ", verdict.incident_id, ")")
                                           : "")
                        : (findings.corrupted.empty() ? v.explanation : explanation);
  AuditVerdictMessage msg;
  msg.step = step;
  msg.outcome = outcome;
  msg.faulty = {faulty.begin(), faulty.end()};
  msg.suspects = ToVector(suspects);
  msg.differing_tensors = differing;
  msg.explanation = explanation;
  txn.effects.messages.push_back({job.record.job_id, group.members, std::move(msg)});
  txn.effects.checks.push_back(
      {CheckKind::kReplay, AuditOutcomeName(outcome), clock_->Now() - pa.first_seen});
  RecordVerdict(job, std::move(verdict), txn);

  if (pa.plan_id != 0) FinishTargetedAudit(job, group, pa.plan_id, faulty, txn);
  txn.mutation.decided.push_back({job.record.job_id, group.record.group, step,
                                  CheckKind::kReplay, pa.plan_id, std::move(pa.keys)});
  bool tiebreaks_in = true;
  for (const PendingTieBreak& t : pa.tiebreaks) tiebreaks_in = tiebreaks_in && t.result.has_value();
  bool awaits_results = !tiebreaks_in;
  for (Rank m : v.missing) awaits_results = awaits_results || !pa.corrupted.count(m);
  if (awaits_results) {
    // Decided without some results: when their ranks come back (from a
    // cut-off node, or with sdcd after an outage) the audit is judged
    // again on all of them, as it would have been (MaybeFinishLateAudit).
    for (PendingTieBreak& t : pa.tiebreaks) {
      if (t.result.has_value()) {
        pa.early_tiebreaks.emplace(std::make_pair(t.tiebreak.tiebreaker, t.tiebreak.subject),
                                   *std::move(t.result));
      }
    }
    pa.tiebreaks.clear();
    pa.verdict.reset();
    pa.keys.clear();
    job.unfinished[it->first] = std::move(pa);
    while (job.unfinished.size() > kMaxUnfinishedAudits) {
      job.unfinished.erase(job.unfinished.begin());
    }
  }
  job.audits.erase(it);
}

bool Coordinator::AttributeAudit(JobState& job, GroupState& group, PendingAudit& pa, Step step,
                                 bool deterministic, bool deadline, Txn& txn) {
  AuditInput input;
  input.plan = &pa.plan;
  input.topology = &TopologyOf(job, group);
  input.originals = &pa.originals;
  input.replays = &pa.replays;
  input.compare_gradients = deterministic;
  input.salt = step;
  pa.verdict = Attribute(input);
  if (pa.verdict->outcome != AuditOutcome::kTieBreakPending) return false;
  for (const TieBreak& t : pa.verdict->tiebreaks) {
    pa.tiebreaks.push_back({t, std::nullopt});
    txn.effects.messages.push_back(
        {job.record.job_id, group.members, TieBreakMessage{step, t.subject, t.tiebreaker}});
  }
  // The ranks ran these tie-breaks in-band; results that came before the
  // last result sdcd needed are here already.
  if (ResolveEarlyTieBreaks(pa) || deadline) return false;
  AuditVerdictMessage interim;
  interim.step = step;
  interim.outcome = AuditOutcome::kTieBreakPending;
  interim.faulty = pa.verdict->faulty;
  interim.suspects = pa.verdict->suspects;
  interim.differing_tensors = TensorNames(group, pa.verdict->differing_parameters);
  interim.explanation = pa.verdict->explanation;
  txn.effects.messages.push_back({job.record.job_id, group.members, std::move(interim)});
  return true;
}

bool Coordinator::ResolveEarlyTieBreaks(PendingAudit& pa) {
  bool resolved = true;
  for (PendingTieBreak& t : pa.tiebreaks) {
    auto early = pa.early_tiebreaks.find({t.tiebreak.tiebreaker, t.tiebreak.subject});
    if (!t.result.has_value() && early != pa.early_tiebreaks.end()) {
      t.result = std::move(early->second);
      pa.early_tiebreaks.erase(early);
    }
    resolved = resolved && t.result.has_value();
  }
  return resolved;
}

absl::Status Coordinator::ApplyLateAudit(JobState& job, GroupState& group, const Report& r,
                                         const AuditResult& a, Evidence evidence, Txn& txn) {
  const std::tuple<uint32_t, Step, uint64_t> key{group.record.group, r.step, a.plan_id};
  auto it = job.unfinished.find(key);
  if (it == job.unfinished.end()) {
    // Decided with every result it needed, or its evidence is gone (a
    // restart, or more unfinished audits than sdcd keeps): taken, noted.
    NoteLate(job, r,
             absl::StrCat(AuditRoleName(a.role), " result of an audit decided without it; "
                          "sdcd holds no evidence left to judge it with"),
             txn);
    return absl::OkStatus();
  }
  PendingAudit& pa = it->second;
  switch (a.role) {
    case AuditRole::kOriginal:
      if (a.subject != r.rank || !pa.subjects.contains(r.rank)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r.rank, " sent an original result for rank ", a.subject,
            "; the plan of step ", r.step, " expects none from it"));
      }
      if (!pa.originals.contains(r.rank)) pa.originals[r.rank] = std::move(evidence);
      break;
    case AuditRole::kReplay: {
      auto assigned = pa.subject_of.find(r.rank);
      if (assigned == pa.subject_of.end() || assigned->second != a.subject) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r.rank, " replayed rank ", a.subject, "'s micro-batch, but the plan of step ",
            r.step, " does not assign that pair"));
      }
      if (a.corrupted_transfer) {
        pa.corrupted.insert(r.rank);
      } else if (!pa.replays.contains(r.rank)) {
        pa.replays[r.rank] = std::move(evidence);
      }
      break;
    }
    case AuditRole::kTieBreak:
      pa.early_tiebreaks.emplace(std::make_pair(r.rank, a.subject), std::move(evidence));
      break;
    case AuditRole::kConfirm:
      break;  // Routed to check 1 before this.
  }
  NoteLate(job, r,
           absl::StrCat(AuditRoleName(a.role), " result of an audit decided without it at the "
                        "deadline; judged again once complete"),
           txn);
  MaybeFinishLateAudit(job, group, key, txn);
  return absl::OkStatus();
}

void Coordinator::MaybeFinishLateAudit(JobState& job, GroupState& group,
                                       const std::tuple<uint32_t, Step, uint64_t>& key,
                                       Txn& txn) {
  auto it = job.unfinished.find(key);
  if (it == job.unfinished.end()) return;
  PendingAudit& pa = it->second;
  const Step step = std::get<1>(key);
  if (pa.originals.size() < pa.subjects.size() ||
      pa.replays.size() + pa.corrupted.size() < pa.subject_of.size()) {
    return;
  }
  bool deterministic = true;
  for (Rank r : group.members) deterministic = deterministic && RankOf(job, r).deterministic;
  if (!pa.verdict.has_value()) {
    AuditInput input;
    input.plan = &pa.plan;
    input.topology = &TopologyOf(job, group);
    input.originals = &pa.originals;
    input.replays = &pa.replays;
    input.compare_gradients = deterministic;
    input.salt = step;
    pa.verdict = Attribute(input);
    for (const TieBreak& t : pa.verdict->tiebreaks) pa.tiebreaks.push_back({t, std::nullopt});
  }
  // The ranks ran the tie-breaks in-band when the step happened; their
  // results come (or came) with the rest.
  if (!ResolveEarlyTieBreaks(pa)) return;
  AuditFindings findings = SettleAudit(pa, deterministic);
  ExplainBySoftware(job, pa, findings);
  const std::vector<std::string> differing = TensorNames(group, pa.verdict->differing_parameters);
  const std::string explanation = absl::StrCat(
      "decided in-band while sdcd was away (results of this audit arrived after it was decided "
      "without them at the deadline), judged now: ",
      absl::StrJoin(findings.notes, "; "));
  StepVerdict verdict;
  verdict.job_id = job.record.job_id;
  verdict.group = group.record.group;
  verdict.step = step;
  verdict.check = CheckKind::kReplay;
  verdict.complete = true;
  verdict.failed = IsFailure(findings.outcome) && !findings.only_software();
  verdict.incident_id =
      RecordAuditIncidents(job, group, step, findings, explanation, differing, txn);
  verdict.summary = IsFailure(findings.outcome)
                        ? absl::StrCat(AuditOutcomeName(findings.outcome), ": ", explanation,
                                       verdict.incident_id != 0
                                           ? absl::StrCat(" (incident ", verdict.incident_id, ")")
                                           : "")
                        : absl::StrCat("completed late: ", pa.verdict->explanation);
  AuditVerdictMessage msg;
  msg.step = step;
  msg.outcome = findings.outcome;
  msg.faulty = {findings.faulty.begin(), findings.faulty.end()};
  msg.suspects = ToVector(findings.suspects);
  msg.differing_tensors = differing;
  msg.explanation = explanation;
  txn.effects.messages.push_back({job.record.job_id, group.members, std::move(msg)});
  txn.effects.checks.push_back(
      {CheckKind::kReplay, AuditOutcomeName(findings.outcome), clock_->Now() - pa.first_seen});
  txn.effects.notes.push_back(absl::StrCat("job ", job.record.job_id, ": the audit of step ",
                                           step, ", decided at the deadline without every "
                                           "result, is complete now: ",
                                           AuditOutcomeName(findings.outcome)));
  RecordVerdict(job, std::move(verdict), txn);
  job.unfinished.erase(it);
}

Coordinator::AuditFindings Coordinator::SettleAudit(const PendingAudit& pa, bool deterministic) {
  const AuditVerdict& v = *pa.verdict;
  AuditFindings out;
  std::set<Rank>& faulty = out.faulty;
  std::set<Rank>& suspects = out.suspects;
  std::vector<std::string>& notes = out.notes;
  faulty.insert(v.faulty.begin(), v.faulty.end());
  notes.push_back(v.explanation);
  AuditOutcome outcome = v.outcome;
  if (outcome == AuditOutcome::kTieBreakPending || outcome == AuditOutcome::kInconclusive ||
      outcome == AuditOutcome::kFaulty) {
    // Suspects left by rule 4 without a tie-break (no third domain).
    std::set<Rank> tiebroken;
    for (const PendingTieBreak& t : pa.tiebreaks) {
      tiebroken.insert(t.tiebreak.subject);
      tiebroken.insert(t.tiebreak.disputed);
    }
    for (Rank r : v.suspects) {
      if (!tiebroken.count(r)) suspects.insert(r);
    }
    for (const PendingTieBreak& t : pa.tiebreaks) {
      const TieBreak& tb = t.tiebreak;
      if (!t.result.has_value()) {
        suspects.insert(tb.subject);
        suspects.insert(tb.disputed);
        notes.push_back(absl::StrCat("tie-break result from rank ", tb.tiebreaker,
                                     " never arrived"));
        continue;
      }
      switch (ResolveTieBreak(pa.originals.at(tb.subject), pa.replays.at(tb.disputed),
                              *t.result, deterministic)) {
        case TieBreakOutcome::kSubjectFaulty:
          faulty.insert(tb.subject);
          notes.push_back(absl::StrCat("rank ", tb.tiebreaker, " agrees with rank ",
                                       tb.disputed, "'s replay: rank ", tb.subject,
                                       "'s own result was wrong"));
          break;
        case TieBreakOutcome::kReplayerFaulty:
          faulty.insert(tb.disputed);
          notes.push_back(absl::StrCat("rank ", tb.tiebreaker, " agrees with rank ",
                                       tb.subject, "'s original: rank ", tb.disputed,
                                       "'s replay was wrong"));
          break;
        case TieBreakOutcome::kInconclusive:
          suspects.insert(tb.subject);
          suspects.insert(tb.disputed);
          notes.push_back(absl::StrCat("rank ", tb.tiebreaker, " agrees with neither rank ",
                                       tb.subject, " nor rank ", tb.disputed));
          break;
      }
    }
    for (Rank r : faulty) suspects.erase(r);
    outcome = !faulty.empty() ? AuditOutcome::kFaulty : AuditOutcome::kInconclusive;
  } else if (outcome == AuditOutcome::kAttributionImpossible) {
    suspects.insert(v.suspects.begin(), v.suspects.end());
  }
  out.outcome = outcome;
  for (const auto& [replayer, subject] : pa.subject_of) {
    if (pa.corrupted.count(replayer)) {
      out.corrupted.push_back(absl::StrCat("rank ", subject, "'s micro-batch reached rank ",
                                           replayer, " corrupted"));
    }
  }
  std::sort(out.corrupted.begin(), out.corrupted.end());
  for (const std::string& c : out.corrupted) {
    notes.push_back(absl::StrCat(c, " (checksum mismatch): not compared, no replayer named"));
  }
  return out;
}

void Coordinator::ExplainBySoftware(const JobState& job, const PendingAudit& pa,
                                    AuditFindings& findings) const {
  if (findings.faulty.empty() && findings.suspects.empty()) return;
  static const protocol::SoftwareStack kUnknown;
  auto stack = [&](Rank r) -> const protocol::SoftwareStack& {
    auto it = job.ranks.find(r);
    return it != job.ranks.end() ? it->second.software : kUnknown;
  };
  auto node = [&](Rank r) -> std::string {
    auto it = job.ranks.find(r);
    return it != job.ranks.end() ? it->second.record.placement.node : "?";
  };
  // Who was compared with whom in this audit.
  std::map<Rank, std::set<Rank>> partners;
  auto pair = [&](Rank a, Rank b) {
    if (a == b) return;
    partners[a].insert(b);
    partners[b].insert(a);
  };
  for (const Assignment& x : pa.plan.assignments) pair(x.subject, x.replayer);
  for (const PendingTieBreak& t : pa.tiebreaks) {
    pair(t.tiebreak.subject, t.tiebreak.tiebreaker);
    pair(t.tiebreak.disputed, t.tiebreak.tiebreaker);
  }
  auto explained = [&](Rank r) {
    const protocol::SoftwareStack& own = stack(r);
    auto p = partners.find(r);
    if (own.unknown() || p == partners.end()) return false;
    for (Rank other : p->second) {
      const protocol::SoftwareStack& theirs = stack(other);
      if (theirs.unknown() || theirs == own) return false;
    }
    return true;
  };
  std::vector<std::string> notes;
  for (const std::set<Rank>* named : {&findings.faulty, &findings.suspects}) {
    for (Rank r : *named) {
      if (!explained(r)) continue;
      findings.software.insert(r);
      const Rank other = *partners[r].begin();
      notes.push_back(absl::StrCat(
          "software mismatch: node ", node(r), " (rank ", r, ") runs ",
          stack(r).Describe(), "; the ranks it was compared with run another "
          "stack (rank ", other, ": ", stack(other).Describe(),
          "): results that differ across stacks blame no GPU"));
    }
  }
  if (findings.software.empty()) return;
  for (Rank r : findings.software) {
    findings.faulty.erase(r);
    findings.suspects.erase(r);
  }
  findings.notes.insert(findings.notes.end(), notes.begin(), notes.end());
  if (findings.faulty.empty() && findings.suspects.empty()) {
    findings.outcome = AuditOutcome::kSystemic;
  } else if (findings.faulty.empty() && findings.outcome == AuditOutcome::kFaulty) {
    findings.outcome = AuditOutcome::kInconclusive;
  }
}

uint64_t Coordinator::RecordAuditIncidents(JobState& job, GroupState& group, Step step,
                                           const AuditFindings& findings,
                                           const std::string& explanation,
                                           const std::vector<std::string>& differing, Txn& txn) {
  const AuditOutcome outcome = findings.outcome;
  const std::set<Rank>& faulty = findings.faulty;
  const std::set<Rank>& suspects = findings.suspects;
  uint64_t incident_id = 0;
  if (!findings.corrupted.empty()) {
    const Incident& inc = RecordIncident(
        job, group, step, CheckKind::kReplay, kCorruptedTransfer, {}, false,
        absl::StrCat(absl::StrJoin(findings.corrupted, "; "),
                     ": checksum mismatch, so the transfer (a link, a NIC, host memory), not a "
                     "GPU's computation; those comparisons are left out"),
        {}, txn);
    if (outcome == AuditOutcome::kPass || outcome == AuditOutcome::kIncomplete) incident_id = inc.id;
  }
  if (!findings.software.empty()) {
    // No GPU named: the incident names the nodes and their stacks.
    std::vector<std::string> stacks;
    for (Rank r : findings.software) {
      stacks.push_back(absl::StrCat("node ", RankOf(job, r).placement.node, " (rank ", r,
                                    "): ", job.ranks.at(r).software.Describe()));
    }
    const Incident& inc = RecordIncident(
        job, group, step, CheckKind::kReplay, kSoftwareMismatch, {}, false,
        absl::StrCat("software mismatch on ", absl::StrJoin(stacks, "; "), ": ", explanation),
        differing, txn);
    incident_id = inc.id;
    if (outcome == AuditOutcome::kSystemic) return incident_id;
  }
  switch (outcome) {
    case AuditOutcome::kFaulty: {
      for (Rank r : faulty) {
        const Incident& inc = RecordIncident(
            job, group, step, CheckKind::kReplay, "faulty", {r}, true,
            absl::StrCat(Describe(job, r), " is faulty: ", explanation), differing, txn);
        if (incident_id == 0) incident_id = inc.id;
      }
      if (!suspects.empty()) {
        RecordIncident(job, group, step, CheckKind::kReplay, "suspect", ToVector(suspects),
                       false, explanation, differing, txn);
      }
      break;
    }
    case AuditOutcome::kInconclusive:
    case AuditOutcome::kAttributionImpossible: {
      const Incident& inc = RecordIncident(
          job, group, step, CheckKind::kReplay,
          outcome == AuditOutcome::kInconclusive ? "inconclusive" : "attribution_impossible",
          ToVector(suspects), false, explanation, differing, txn);
      incident_id = inc.id;
      break;
    }
    case AuditOutcome::kSystemic: {
      const Incident& inc = RecordIncident(job, group, step, CheckKind::kReplay, "systemic",
                                           {}, false, explanation, differing, txn);
      incident_id = inc.id;
      break;
    }
    case AuditOutcome::kPass:
    case AuditOutcome::kIncomplete:
    case AuditOutcome::kTieBreakPending:
      break;
  }
  return incident_id;
}

// A targeted audit is one of the suspect's chances to be cleared or
// confirmed; schedule the next while chances remain.
void Coordinator::FinishTargetedAudit(JobState& job, GroupState& group, uint64_t plan_id,
                                      const std::set<Rank>& faulty, Txn& txn) {
  PlanRecord& plan = job.plans[plan_id];
  if (plan.watch) return;  // Standing: runs again next step (watch.cc).
  plan.done = true;
  txn.mutation.plans.push_back(plan);
  const Rank suspect = plan.suspect;
  const std::string& gpu = RankOf(job, suspect).placement.gpu_uuid;
  auto s = suspects_.find(gpu);
  if (s != suspects_.end() && !faulty.count(suspect) && s->second.targeted_audits_left > 0) {
    ScheduleTargetedAudit(job, group, suspect, s->second.reason, txn);
  }
}

void Coordinator::ScheduleTargetedAudit(JobState& job, GroupState& group, Rank suspect,
                                        const std::string& reason, Txn& txn) {
  const std::string& gpu = RankOf(job, suspect).placement.gpu_uuid;
  Suspect& s = suspects_[gpu];
  if (s.targeted_audits_left == 0) return;
  --s.targeted_audits_left;
  txn.mutation.suspects.push_back(s);
  PlanRecord plan;
  plan.job_id = job.record.job_id;
  plan.group = group.record.group;
  plan.plan_id = job.record.next_plan_id++;
  plan.assignments = PlanTargetedAudit(TopologyOf(job, group), suspect, plan.plan_id).assignments;
  plan.reason = absl::StrCat("targeted audit of suspect ", Describe(job, suspect), ": ", reason);
  plan.suspect = suspect;
  job.plans[plan.plan_id] = plan;
  txn.mutation.plans.push_back(plan);
  txn.mutation.jobs.push_back(job.record);
  txn.effects.messages.push_back(
      {job.record.job_id, JobRanks(job),
       PlanMessage{plan.plan_id, plan.assignments, plan.reason, false, plan.group}});
}

}  // namespace sdc::core
