// Check 3, every weight_check_every steps: the vote of the replicas' weight
// digests (and optimizer state), tensor by tensor where no whole model has a
// majority.

#include "daemon/core/coordinator.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator_internal.h"
#include "kernels/model_digest.h"

namespace sdc::core {

using internal::KeyOf;
using internal::RankList;

namespace {

// The vote digest of a weight report: weights, and optimizer state when sent.
uint64_t WeightVoteDigest(const WeightReport& w) {
  return w.has_optimizer_digest ? kernels::Mix64(w.digest ^ kernels::Mix64(w.optimizer_digest))
                                : w.digest;
}

}  // namespace

absl::Status Coordinator::ApplyWeights(JobState& job, GroupState& group, const Report& r,
                                       const WeightReport& w, Txn& txn) {
  const uint32_t group_id = RankOf(job, r.rank).placement.replica_group;
  if (w.tensors_elided && !w.tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight report from rank ", r.rank, " says a relay elided its tensors but carries ",
        w.tensors.size()));
  }
  // Stored copies keep tensors only for the first report of each digest,
  // and a relay elides those of a digest it already carried.
  const bool digest_only = (replaying_ || w.tensors_elided) && w.tensors.empty();
  if (!digest_only && w.tensors.size() != group.record.weight_tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight report from rank ", r.rank, " has ", w.tensors.size(),
        " tensors; the layout of replica group ", group_id, " has ",
        group.record.weight_tensors.size()));
  }
  auto pending = job.weights.find({group_id, r.step});
  if (pending != job.weights.end() && pending->second.voted.count(r.rank) > 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "weight report for step ", r.step, " from rank ", r.rank, " already received"));
  }
  if (pending == job.weights.end() && !replaying_) {
    auto verdict = job.ledger.find(r.step);
    if (Forgotten(job, r.step) ||
        (verdict != job.ledger.end() && verdict->second.weights.count(group_id) > 0)) {
      ApplyLateWeights(job, group, r, w, txn);
      return absl::OkStatus();
    }
  }
  auto [it, fresh] = job.weights.try_emplace({group.record.group, r.step});
  PendingWeights& pw = it->second;
  if (fresh) {
    pw.first_seen = clock_->Now();
    pw.voted.reserve(group.members.size());
    pw.keys.reserve(group.members.size());
  }
  const uint64_t digest = WeightVoteDigest(w);
  Ballot& ballot = pw.ballots[digest];
  ballot.ranks.push_back(r.rank);
  // Ranks with the same digest hold the same tensors: keep (and persist)
  // one copy per distinct digest, from its first report that carries them
  // (a relay may have elided them from the others).
  const bool keep_tensors = ballot.tensors.empty() && !w.tensors.empty();
  if (!replaying_) {
    Report copy;
    copy.job_id = r.job_id;
    copy.rank = r.rank;
    copy.incarnation = r.incarnation;
    copy.sequence = r.sequence;
    copy.step = r.step;
    WeightReport stripped;
    stripped.digest = w.digest;
    stripped.checkpoint = w.checkpoint;
    stripped.has_optimizer_digest = w.has_optimizer_digest;
    stripped.optimizer_digest = w.optimizer_digest;
    stripped.tensors_elided = w.tensors_elided;
    if (keep_tensors) stripped.tensors = w.tensors;
    copy.body = std::move(stripped);
    txn.mutation.pending_added.push_back(std::move(copy));
  }
  if (keep_tensors) ballot.tensors = w.tensors;
  pw.voted.insert(r.rank);
  pw.keys.push_back(KeyOf(r));
  MaybeFinalizeWeights(job, group, r.step, /*deadline=*/false, txn);
  return absl::OkStatus();
}

void Coordinator::ApplyLateWeights(JobState& job, GroupState& group, const Report& r,
                                   const WeightReport& w, Txn& txn) {
  auto entry = job.ledger.find(r.step);
  const uint32_t g = group.record.group;
  if (entry == job.ledger.end() || entry->second.weight_majority.count(g) == 0) {
    NoteLate(job, r, "weight report of a vote decided without it; sdcd no longer holds the "
             "value it decided", txn);
    return;
  }
  NoteLate(job, r, "weight report of a vote decided without it, compared with the value it "
           "decided", txn);
  if (WeightVoteDigest(w) == entry->second.weight_majority.at(g)) return;
  // A minority of one, after the fact: as the vote would have named it.
  const Incident& inc = RecordIncident(
      job, group, r.step, CheckKind::kWeights, "faulty", {r.rank}, true,
      absl::StrCat("rank(s) ", r.rank, " differ from the majority in weights (its report of step ",
                   r.step, " came after the vote was decided without it: sdcd was away, or the "
                   "rank was cut off)"),
      {}, txn);
  StepVerdict verdict;
  verdict.job_id = job.record.job_id;
  verdict.group = g;
  verdict.step = r.step;
  verdict.check = CheckKind::kWeights;
  verdict.complete = true;
  verdict.failed = true;
  verdict.incident_id = inc.id;
  verdict.summary = absl::StrCat(inc.explanation, " (incident ", inc.id, ")");
  RecordVerdict(job, std::move(verdict), txn);
  WeightVerdictMessage msg;
  msg.step = r.step;
  msg.pass = false;
  msg.minority = {r.rank};
  msg.majority_source = group.members.front() == r.rank && group.members.size() > 1
                            ? group.members[1]
                            : group.members.front();
  msg.explanation = inc.explanation;
  txn.effects.messages.push_back({job.record.job_id, group.members, std::move(msg)});
}

void Coordinator::MaybeFinalizeWeights(JobState& job, GroupState& group, Step step,
                                       bool deadline, Txn& txn) {
  auto it = job.weights.find({group.record.group, step});
  if (it == job.weights.end()) return;
  PendingWeights& pw = it->second;
  if ((!AllAttached(job) || pw.voted.size() < group.members.size()) && !deadline) return;
  std::vector<DigestBallot> ballots;
  for (const auto& [digest, b] : pw.ballots) {
    ballots.push_back({digest, b.ranks, b.tensors.empty() ? nullptr : &b.tensors});
  }
  const VoteResult vote = Vote(group.members, ballots);
  const std::vector<std::string> differing = TensorNames(group, vote.differing_tensors);

  StepVerdict verdict;
  verdict.job_id = job.record.job_id;
  verdict.group = group.record.group;
  verdict.step = step;
  verdict.check = CheckKind::kWeights;
  verdict.complete = vote.missing.empty();
  WeightVerdictMessage msg;
  msg.step = step;
  msg.majority_source = vote.majority_source;
  msg.minority = vote.minority;
  msg.differing_tensors = differing;
  switch (vote.outcome) {
    case VoteOutcome::kPass:
      verdict.summary = "pass";
      msg.explanation = absl::StrCat("all ", group.members.size(), " replicas agree");
      break;
    case VoteOutcome::kMinority: {
      const std::string what =
          !differing.empty() ? absl::StrCat("tensor(s) ", absl::StrJoin(differing, ", "))
          : vote.uncompared  ? std::string("weights (not compared tensor by tensor: no report "
                                           "of one of the digests carried its tensors)")
                             : std::string("optimizer state");
      const std::string majority =
          vote.per_tensor
              ? absl::StrCat("the majority of each tensor (no whole model is held by a majority "
                             "of the ", group.members.size(), " replicas; rank ",
                             vote.majority_source, " holds every tensor's majority value)")
              : absl::StrCat("the majority (", pw.ballots[vote.majority_digest].ranks.size(),
                             " of ", group.members.size(), " replicas)");
      const Incident& inc = RecordIncident(
          job, group, step, CheckKind::kWeights, "faulty", vote.minority, true,
          absl::StrCat("rank(s) ", RankList(vote.minority), " differ from ", majority, " in ",
                       what, ShardNote(job, group)),
          differing, txn);
      verdict.failed = true;
      verdict.incident_id = inc.id;
      verdict.summary = absl::StrCat(inc.explanation, " (incident ", inc.id, ")");
      msg.explanation = inc.explanation;
      break;
    }
    case VoteOutcome::kNoMajority: {
      const Incident& inc = RecordIncident(
          job, group, step, CheckKind::kWeights, "no_majority", {}, false,
          absl::StrCat("replicas disagree and no value has a strict majority of ",
                       group.members.size(), " (", pw.ballots.size(), " distinct values)",
                       ShardNote(job, group)),
          differing, txn);
      verdict.failed = true;
      verdict.incident_id = inc.id;
      verdict.summary = absl::StrCat(inc.explanation, " (incident ", inc.id, ")");
      msg.explanation = inc.explanation;
      break;
    }
    case VoteOutcome::kIncomplete:
      verdict.summary = absl::StrCat("missing from ranks ", RankList(vote.missing));
      msg.explanation = absl::StrCat("no weights from ranks ", RankList(vote.missing));
      break;
  }
  msg.pass = vote.outcome == VoteOutcome::kPass;
  txn.effects.checks.push_back(
      {CheckKind::kWeights, VoteOutcomeName(vote.outcome), clock_->Now() - pw.first_seen});
  txn.effects.messages.push_back({job.record.job_id, group.members, std::move(msg)});
  RecordVerdict(job, std::move(verdict), txn);
  auto decided = pw.ballots.find(vote.majority_digest);
  if (!vote.per_tensor && decided != pw.ballots.end() &&
      2 * decided->second.ranks.size() > group.members.size()) {
    // What a report coming after this decision is compared with.
    if (auto e = job.ledger.find(step); e != job.ledger.end()) {
      e->second.weight_majority[group.record.group] = vote.majority_digest;
    }
  }
  txn.mutation.decided.push_back({job.record.job_id, group.record.group, step,
                                  CheckKind::kWeights, 0, std::move(pw.keys)});
  job.weights.erase(it);
}

}  // namespace sdc::core
