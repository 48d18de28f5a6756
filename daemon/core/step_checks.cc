// Check 1, every step: non-finite gradients (a rank's own, confirmed or
// cleared by another rank's in-band replay of its micro-batch) and the vote
// on the reduced-gradient digests; a job whose audits are off says so here.

#include "daemon/core/coordinator.h"

#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::Echo;
using internal::EchoJobId;
using internal::KeyOf;
using internal::RankList;
using internal::ToVector;

namespace {

// A step every rank skipped in-band for a finding of the buddy check of a
// sharded optimizer step (issue 44 item 3, client/python/sdc_guard/buddy.py).
// The engine words the reason "step N failed on rank R and was skipped on
// every rank: buddy check (OUTCOME): ...": R is the rank the finding names,
// OUTCOME "faulty" (three nodes' results say which rank is wrong) or
// "suspect" (undecided, or a stored shard that changed at rest).
struct BuddyFinding {
  Rank rank = 0;
  bool faulty = false;
};

std::optional<BuddyFinding> ParseBuddyFinding(absl::string_view reason) {
  constexpr absl::string_view kOn = " failed on rank ";
  const size_t at = reason.find(kOn);
  if (at == absl::string_view::npos) return std::nullopt;
  reason.remove_prefix(at + kOn.size());
  size_t digits = 0;
  while (digits < reason.size() && std::isdigit(static_cast<unsigned char>(reason[digits]))) {
    ++digits;
  }
  BuddyFinding f;
  if (digits == 0 || !absl::SimpleAtoi(reason.substr(0, digits), &f.rank)) return std::nullopt;
  reason.remove_prefix(digits);
  if (!absl::ConsumePrefix(&reason, internal::kBuddyCheckSkip)) return std::nullopt;
  if (absl::StartsWith(reason, "faulty)")) {
    f.faulty = true;
  } else if (!absl::StartsWith(reason, "suspect)")) {
    return std::nullopt;
  }
  return f;
}

// A step every rank skipped in-band for a failed every-step product
// checksum (issue 45, client/python/product_checks.h). The engine words the
// reason "step N failed on rank R and was skipped on every rank: checksum
// alarm at step N on rank R: OP SHAPES DTYPE in the PHASE, column J:
// discrepancy D > threshold T (transient|persistent: ...)": the rank whose
// product failed (both ranks the same; nullopt otherwise). A suspect, not
// a finding: the checksum is the detector, a replay the judge.
std::optional<Rank> ParseChecksumAlarm(absl::string_view reason) {
  constexpr absl::string_view kOn = " failed on rank ";
  constexpr absl::string_view kAlarm = " and was skipped on every rank: checksum alarm at step ";
  constexpr absl::string_view kRank = " on rank ";
  auto number = [](absl::string_view& text, Rank& out) {
    size_t digits = 0;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
      ++digits;
    }
    if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &out)) return false;
    text.remove_prefix(digits);
    return true;
  };
  const size_t at = reason.find(kOn);
  if (at == absl::string_view::npos) return std::nullopt;
  reason.remove_prefix(at + kOn.size());
  Rank failed = 0, alarmed = 0, step = 0;
  if (!number(reason, failed) || !absl::ConsumePrefix(&reason, kAlarm) ||
      !number(reason, step) || !absl::ConsumePrefix(&reason, kRank) ||
      !number(reason, alarmed) || !absl::StartsWith(reason, ":") || alarmed != failed) {
    return std::nullopt;
  }
  return failed;
}

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
  if (!replaying_ && job.awaiting_first_step) {
    // The first step of an attempt (or of a job sdcd knew nothing of):
    // whatever the ledger holds from this step on was another timeline's.
    Rollback(job, r.step, txn);
    if (r.step > 1) {
      const std::string forgot = ForgetOldRevocations(job, r.step - 1, txn);
      if (!forgot.empty()) {
        txn.effects.notes.push_back(absl::StrCat("job ", EchoJobId(job.record.job_id), ": ", forgot));
      }
    }
  }
  job.awaiting_first_step = false;
  if (!replaying_ && rank.resumed && r.step <= rank.last_step) {
    // A restarted rank resumes at or below its last step: the job rolled
    // back to a checkpoint, and the verdicts of the abandoned steps are void.
    Rollback(job, r.step, txn);
  }
  rank.resumed = false;
  rank.has_last_step = true;
  rank.last_step = r.step;
  if (!replaying_ && job.steps.count({group.record.group, r.step}) == 0) {
    auto decided = job.ledger.find(r.step);
    if (Forgotten(job, r.step) || (decided != job.ledger.end() &&
                                   decided->second.nonfinite.count(group.record.group) > 0)) {
      ApplyLateStepReport(job, group, r, s, txn);
      return absl::OkStatus();
    }
  }
  if (!replaying_) txn.mutation.pending_added.push_back(r);

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
  if (s.loss_scaled) ps.loss_scaled = true;
  if (s.reduced_nonfinite > 0) ps.reduced_nonfinite.insert(r.rank);
  (s.applied ? ps.applied : ps.skipped).insert(r.rank);
  if (!s.no_confirmation.empty() && ps.no_confirmation.empty()) {
    ps.no_confirmation = s.no_confirmation;
  }
  if (!s.applied && ps.buddy_finding.empty()) {
    // Only the named rank's own report counts: every rank sends the same
    // reason, and a rank can name no one but itself.
    std::optional<BuddyFinding> f = ParseBuddyFinding(s.skip_reason);
    if (f.has_value()) ps.in_band_carried = true;
    if (f.has_value() && f->rank == r.rank) {
      ps.buddy_finding = s.skip_reason;
      ps.buddy_rank = f->rank;
      ps.buddy_faulty = f->faulty;
    }
  }
  if (!s.applied && ps.checksum_alarm.empty()) {
    // The same: the alarmed rank's own report names it.
    const std::optional<Rank> alarmed = ParseChecksumAlarm(s.skip_reason);
    if (alarmed.has_value()) ps.in_band_carried = true;
    if (alarmed.has_value() && *alarmed == r.rank) {
      ps.checksum_alarm = s.skip_reason;
      ps.checksum_rank = *alarmed;
    }
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
  auto entry = job.ledger.find(r.step);
  const bool decided = Forgotten(job, r.step) ||
                       (entry != job.ledger.end() &&
                        entry->second.nonfinite.count(group.record.group) > 0);
  if (ps == job.steps.end() && !decided) {
    // Before any step report of its step (ranks resend in any order).
    ps = job.steps.try_emplace({group.record.group, r.step}).first;
    ps->second.first_seen = clock_->Now();
  }
  if (ps == job.steps.end()) {
    // The step was decided without it (deadline). If that decision saw the
    // subject's NaN/Inf unconfirmed, this replay decides it now; if the
    // subject's own report is late too, it finds this replay there.
    if (entry == job.ledger.end()) {
      NoteLate(job, r, "confirmation replay of a step sdcd no longer holds", txn);
      return absl::OkStatus();
    }
    LedgerEntry& e = entry->second;
    if (e.confirms.count(a.subject) > 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "confirmation of rank ", a.subject, "'s micro-batch at step ", r.step,
          " already received"));
    }
    e.confirms[a.subject] = {r.rank, a.nonfinite};
    NoteLate(job, r, "confirmation replay of a step decided without it", txn);
    if (e.local_nonfinite.count(a.subject) > 0) {
      const bool faulty = a.nonfinite == 0;
      const Incident& inc = RecordIncident(
          job, group, r.step, CheckKind::kNonFinite, faulty ? "faulty" : "reproduced",
          faulty ? std::vector<Rank>{a.subject} : std::vector<Rank>{}, faulty,
          absl::StrCat(faulty ? absl::StrCat(Describe(job, a.subject),
                                             " had NaN/Inf in its local gradients; ",
                                             Describe(job, r.rank),
                                             " replayed its micro-batch and got finite "
                                             "gradients")
                              : absl::StrCat(Describe(job, r.rank),
                                             " reproduced the NaN/Inf of rank ", a.subject,
                                             "'s micro-batch: the data or the software, not "
                                             "the GPU"),
                       " (the replay's report came after the step was decided without it: "
                       "decided in-band while sdcd was away)"),
          {}, txn);
      RecordLateVerdict(job, group, r.step, inc, txn);
    }
    return absl::OkStatus();
  }
  if (Fresh()) txn.mutation.pending_added.push_back(r);
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

bool Coordinator::EveryGroupReported(const JobState& job, Step step) {
  const auto decided = job.ledger.find(step);
  for (const auto& [id, g] : job.groups) {
    if (decided != job.ledger.end() && decided->second.nonfinite.count(id) > 0) continue;
    const auto p = job.steps.find({id, step});
    if (p == job.steps.end() || p->second.reported.size() < g.members.size()) return false;
  }
  return true;
}

std::set<Rank> Coordinator::JobLocalNonFinite(const JobState& job, Step step) {
  std::set<Rank> out;
  if (const auto e = job.ledger.find(step); e != job.ledger.end()) out = e->second.local_nonfinite;
  for (const auto& [key, ps] : job.steps) {
    if (key.second == step) out.insert(ps.local_nonfinite.begin(), ps.local_nonfinite.end());
  }
  return out;
}

void Coordinator::MaybeFinalizeStep(JobState& job, GroupState& group, Step step,
                                    bool deadline, Txn& txn, bool revisit) {
  auto it = job.steps.find({group.record.group, step});
  if (it == job.steps.end()) return;
  PendingStep& ps = it->second;
  // Group membership is known only once every rank of the job said Hello.
  const bool complete = AllAttached(job) && ps.reported.size() == group.members.size();
  if (!complete && !deadline) return;
  const bool several_groups = job.groups.size() > 1;
  if (several_groups && !deadline &&
      (!ps.local_nonfinite.empty() || !ps.reduced_nonfinite.empty()) &&
      !EveryGroupReported(job, step)) {
    return;  // Decided with the whole job's reports (EveryGroupReported).
  }
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
  const bool overflow = CheckNonFinite(job, group, step, ps, local, reduced, latency, found, txn);
  if (!ps.buddy_finding.empty()) {
    // The sharded replay audit's findings (shard_replay.py) travel the same
    // way, marked "(replay audit)": check 2's incidents, not check 3's.
    const CheckKind check = absl::StrContains(ps.buddy_finding, "(replay audit)")
                                ? CheckKind::kReplay
                                : CheckKind::kWeights;
    found.Note(RecordIncident(job, group, step, check,
                              ps.buddy_faulty ? "faulty" : "suspect", {ps.buddy_rank},
                              ps.buddy_faulty, ps.buddy_finding, {}, txn));
  }
  if (!ps.checksum_alarm.empty()) {
    // A suspect (RecordIncident schedules its targeted replay audits): the
    // replay, not the checksum, names a faulty GPU.
    found.Note(RecordIncident(job, group, step, CheckKind::kReplay, "suspect",
                              {ps.checksum_rank}, false,
                              absl::StrCat(ps.checksum_alarm,
                                           "; a suspect until a replay audit decides"),
                              {}, txn));
  }
  if (!ps.skipped.empty()) ++txn.effects.skipped_steps;

  verdict.failed = !found.failures.empty();
  verdict.incident_id = found.first_incident;
  verdict.summary = !found.failures.empty() ? absl::StrJoin(found.failures, "; ")
                    : overflow ? "the loss scaler's overflow: the scaler skipped the step"
                    : complete              ? "pass"
                                            : absl::StrCat("missing ranks ",
                                                           RankList(Unreported(group.members,
                                                                               ps.reported)));
  RecordVerdict(job, std::move(verdict), txn);
  // What a report coming after this decision is judged against.
  if (auto e = job.ledger.find(step); e != job.ledger.end()) {
    e->second.local_nonfinite.insert(ps.local_nonfinite.begin(), ps.local_nonfinite.end());
    e->second.confirms.insert(ps.confirms.begin(), ps.confirms.end());
    size_t most = 0;
    for (const auto& [digest, ballot] : ps.reduced) {
      if (ballot.ranks.size() > most) {
        most = ballot.ranks.size();
        e->second.reduced_majority[group.record.group] = digest;
      }
    }
  }
  txn.mutation.decided.push_back({job.record.job_id, group.record.group, step,
                                  CheckKind::kNonFinite, 0, std::move(ps.keys)});
  job.steps.erase(it);
  if (revisit && several_groups && !deadline && EveryGroupReported(job, step)) {
    // The last group's reports are in: the groups that waited for them.
    for (auto& [id, other] : job.groups) {
      if (job.steps.count({id, step}) > 0) {
        MaybeFinalizeStep(job, other, step, false, txn, /*revisit=*/false);
      }
    }
  }
}

void Coordinator::RecordLateVerdict(JobState& job, GroupState& group, Step step,
                                    const Incident& inc, Txn& txn) {
  StepVerdict verdict;
  verdict.job_id = job.record.job_id;
  verdict.group = group.record.group;
  verdict.step = step;
  verdict.check = inc.check == CheckKind::kReplay ? CheckKind::kReplay : CheckKind::kNonFinite;
  verdict.complete = true;
  verdict.failed = true;
  verdict.incident_id = inc.id;
  verdict.summary = absl::StrCat(inc.explanation, " (incident ", inc.id, ")");
  RecordVerdict(job, std::move(verdict), txn);
}

void Coordinator::ApplyLateStepReport(JobState& job, GroupState& group, const Report& r,
                                      const StepReport& s, Txn& txn) {
  NoteLate(job, r, "step report of a step whose check was decided without it", txn);
  auto entry = job.ledger.find(r.step);
  LedgerEntry* e = entry == job.ledger.end() ? nullptr : &entry->second;
  const std::string late =
      " (its report came after the step's check was decided without it: decided in-band "
      "while sdcd was away, or while the rank was cut off)";
  const Incident* inc = nullptr;
  if (s.local_nonfinite > 0) {
    if (e != nullptr && e->local_nonfinite.count(r.rank) > 0) return;  // Judged already.
    if (e != nullptr) e->local_nonfinite.insert(r.rank);
    auto c = e == nullptr ? decltype(e->confirms)::iterator() : e->confirms.find(r.rank);
    const bool confirmed = e != nullptr && c != e->confirms.end();
    if (confirmed && c->second.second == 0) {
      inc = &RecordIncident(job, group, r.step, CheckKind::kNonFinite, "faulty", {r.rank}, true,
                            absl::StrCat(Describe(job, r.rank),
                                         " had NaN/Inf in its local gradients; ",
                                         Describe(job, c->second.first),
                                         " replayed its micro-batch and got finite gradients",
                                         late),
                            {}, txn);
    } else if (confirmed) {
      inc = &RecordIncident(job, group, r.step, CheckKind::kNonFinite, "reproduced", {}, false,
                            absl::StrCat(Describe(job, c->second.first),
                                         " reproduced the NaN/Inf of rank ", r.rank,
                                         "'s micro-batch: the data or the software, not the GPU",
                                         late),
                            {}, txn);
    } else {
      inc = &RecordIncident(job, group, r.step, CheckKind::kNonFinite, "suspect", {r.rank}, false,
                            absl::StrCat("NaN/Inf in the local gradients of ",
                                         Describe(job, r.rank), " only; no replay confirmed it",
                                         late),
                            {}, txn);
    }
  } else if (s.reduced_nonfinite > 0 && (e == nullptr || e->failures.empty())) {
    inc = &RecordIncident(job, group, r.step, CheckKind::kNonFinite, "suspect", {r.rank}, false,
                          absl::StrCat("only ", Describe(job, r.rank),
                                       " received NaN/Inf from the all-reduce", late),
                          {}, txn);
  } else if (e != nullptr && e->reduced_majority.count(group.record.group) > 0 &&
             e->reduced_majority.at(group.record.group) != s.reduced_digest) {
    inc = &RecordIncident(
        job, group, r.step, CheckKind::kReducedGradients, "suspect", {r.rank}, false,
        absl::StrCat(Describe(job, r.rank),
                     " received reduced gradients that differ from those most ranks got; the "
                     "bad data may come from elsewhere in the all-reduce, so targeted audits "
                     "decide",
                     late),
        {}, txn);
  } else if (!s.applied) {
    // Skipped in-band for a reason no incident records yet: the evidence
    // sdcd would attribute with (a replay audit's results) is either on
    // its way (an unfinished audit waits for it) or gone.
    for (const auto& [key, pa] : job.unfinished) {
      if (std::get<0>(key) == group.record.group && std::get<1>(key) == r.step) return;
    }
    for (const auto& [key, pa] : job.audits) {
      if (std::get<0>(key) == group.record.group && std::get<1>(key) == r.step) return;
    }
    for (const auto& [id, other] : incidents_) {
      if (other.job_id == job.record.job_id && other.step == r.step) return;
    }
    inc = &RecordIncident(
        job, group, r.step, CheckKind::kReplay, "decided_inband", {}, false,
        absl::StrCat("step ", r.step, " was skipped on every rank in-band (", Echo(s.skip_reason),
                     ") while sdcd was away; the results it would attribute it with reached "
                     "sdcd after the step's checks were decided, or never did: nobody is "
                     "blamed, see the trainers' logs for the step"),
        {}, txn);
  }
  if (inc != nullptr) RecordLateVerdict(job, group, r.step, *inc, txn);
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

bool Coordinator::CheckNonFinite(JobState& job, GroupState& group, Step step,
                                 const PendingStep& ps, const std::vector<Rank>& local,
                                 VoteOutcome reduced, absl::Duration latency,
                                 StepFailures& found, Txn& txn) {
  // Under a loss scaler (fp16's GradScaler) NaN/Inf is how the scaler finds
  // its scale too high: it skips the step and backs off, several times at
  // the start of every run. That is the scaler's business, so it names
  // nobody unless a replay on another domain shows a GPU computed NaN/Inf
  // where a healthy one computes finite values.
  const bool scaled = ps.loss_scaled;
  std::string nonfinite_result = "pass";
  auto note = [&](const std::string& result) {
    if (nonfinite_result == "pass") nonfinite_result = result;
  };
  // Several groups (shards): every rank means every rank of the job, and
  // its one incident is recorded by the group of the lowest such rank.
  const bool several_groups = job.groups.size() > 1;
  const std::set<Rank> job_local =
      several_groups ? JobLocalNonFinite(job, step) : std::set<Rank>(local.begin(), local.end());
  const bool every_rank = !local.empty() && local.size() == group.members.size() &&
                          (!several_groups || job_local.size() >= job.ranks.size());
  if (every_rank) {
    if (scaled) {
      nonfinite_result = "overflow";
    } else {
      nonfinite_result = "all_ranks";
      if (!several_groups || *job_local.begin() == local.front()) {
        found.Note(RecordIncident(job, group, step, CheckKind::kNonFinite, "all_ranks", {},
                                  false,
                                  "every rank's local gradients had NaN/Inf: the model or its "
                                  "data, not one GPU",
                                  {}, txn));
      }
    }
  } else {
    for (Rank r : local) {
      auto c = ps.confirms.find(r);
      if (c != ps.confirms.end() && c->second.second == 0) {
        nonfinite_result = "faulty";
        found.Note(RecordIncident(
            job, group, step, CheckKind::kNonFinite, "faulty", {r}, true,
            absl::StrCat(Describe(job, r), " had NaN/Inf in its local gradients",
                         scaled ? " (under a loss scaler)" : "", "; ",
                         Describe(job, c->second.first),
                         " replayed its micro-batch and got finite gradients"),
            {}, txn));
      } else if (scaled) {
        // Reproduced on another GPU, or never replayed (accumulated
        // micro-batches): the scaler's overflow until a replay says otherwise.
        note("overflow");
      } else if (c != ps.confirms.end()) {
        note("reproduced");
        found.Note(RecordIncident(
            job, group, step, CheckKind::kNonFinite, "reproduced", {}, false,
            absl::StrCat(Describe(job, c->second.first), " reproduced the NaN/Inf of rank ", r,
                         "'s micro-batch: the data or the software, not the GPU"),
            {}, txn));
      } else {
        note("suspect");
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
    if (several_groups && !job_local.empty()) {
      // Another shard's rank had NaN/Inf in its local gradients: FSDP's
      // reduce-scatter carried it here; that rank's group names it.
      nonfinite_result = "carried";
    } else if (ps.reduced_nonfinite.size() == group.members.size() && scaled) {
      // A compression hook's sum (fp16) overflowed like the scaler's own.
      nonfinite_result = "overflow";
    } else if (ps.reduced_nonfinite.size() == group.members.size() && ps.in_band_carried) {
      // The NaN the named rank put in its first gradient bucket to carry
      // the buddy check's finding or its checksum alarm to every rank
      // in-band (StepPipeline::ScanLocalBucket), not an all-reduce fault:
      // the finding's (or the suspect's) incident is the named rank's.
      nonfinite_result = "carried";
    } else if (ps.reduced_nonfinite.size() == group.members.size()) {
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
  return nonfinite_result == "overflow";
}

}  // namespace sdc::core
