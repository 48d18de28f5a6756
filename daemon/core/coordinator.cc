// Coordinator's front door: construction, the route of every report
// (Ingest validates it, Apply hands it to the check it feeds), deadlines
// (Tick), the one Commit every call ends with, and the lookups the checks
// share. Each check lives in its own file:
//   registry.cc          Hello, detach, job expiry, a restarted rank's reports
//   step_checks.cc       check 1: non-finite values and reduced gradients
//   replay_audits.cc     check 2: replay audits, attribution, tie-breaks,
//                        targeted audits of suspects
//   weight_checks.cc     check 3: the weight vote
//   incidents.cc         what a failed check records; suspects; escalation
//   checkpoint_gate.cc   the verdict ledger and MayCheckpoint
//   operator_actions.cc  resolve, approve, deny; actuators
//   queries.cc           read-only listings
//   restore.cc           rebuilding state from the store

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator_internal.h"
#include "kernels/model_digest.h"

namespace sdc::core {

using internal::EchoJobId;
using internal::KeyOf;

using internal::kMaxStep;

Coordinator::Coordinator(CoordinatorOptions options, const Clock* clock, Store* store)
    : options_(std::move(options)),
      clock_(clock),
      store_(store),
      escalation_(options_.escalation) {}

const Topology& Coordinator::TopologyOf(const JobState& job, const GroupState& group) const {
  if (group.topology == nullptr) {
    std::vector<PlanMember> members;
    for (Rank r : group.members) {
      members.push_back({r, job.ranks.at(r).record.placement.node});
    }
    group.topology = std::make_unique<Topology>(std::move(members));
  }
  return *group.topology;
}

RankRecord& Coordinator::RankOf(JobState& job, Rank rank) { return job.ranks.at(rank).record; }

bool Coordinator::AllAttached(const JobState& job) {
  return job.said_hello == job.record.world_size;
}

std::string Coordinator::Describe(const JobState& job, Rank rank) const {
  auto slot = job.ranks.find(rank);
  if (slot == job.ranks.end()) return absl::StrCat("rank ", rank);
  const Placement& p = slot->second.record.placement;
  const protocol::ShardCoordinates& shard = slot->second.shard;
  return absl::StrCat("rank ", rank, " (", p.gpu_uuid, " on ", p.node,
                      shard.sharded() ? absl::StrCat(", ", shard.Describe()) : "", ")");
}

std::string Coordinator::ShardNote(const JobState& job, const GroupState& group) const {
  std::vector<std::string> replicas;
  protocol::ShardCoordinates shard;
  for (Rank r : group.members) {
    auto slot = job.ranks.find(r);
    if (slot == job.ranks.end() || !slot->second.shard.sharded()) return "";
    shard = slot->second.shard;
    replicas.push_back(absl::StrCat("rank ", r, " replica ", shard.replica));
  }
  if (replicas.empty()) return "";
  return absl::StrCat("; replica group ", group.record.group, " holds shard ", shard.index, "/",
                      shard.count, " (", absl::StrJoin(replicas, ", "), ")");
}

std::vector<std::string> Coordinator::TensorNames(const GroupState& group,
                                                  const std::vector<uint32_t>& indices) const {
  std::vector<std::string> names;
  for (uint32_t i : indices) {
    names.push_back(i < group.record.weight_tensors.size() ? group.record.weight_tensors[i]
                                                           : absl::StrCat("#", i));
  }
  return names;
}

absl::Status Coordinator::ValidateReport(const JobState& job, const Report& r) const {
  if (r.rank >= job.record.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown rank ", r.rank, ": job ", r.job_id, " has world size ", job.record.world_size));
  }
  auto found = job.ranks.find(r.rank);
  if (found == job.ranks.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", r.rank, " of job ", r.job_id, " has not said Hello"));
  }
  const RankState* slot = &found->second;
  if (r.incarnation != slot->record.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        r.incarnation < slot->record.incarnation ? "stale report" : "report from the future",
        ": rank ", r.rank, " is at incarnation ", slot->record.incarnation,
        ", the report says ", r.incarnation));
  }
  if (!replaying_ && r.sequence > slot->record.acked_sequence + 1) {
    return absl::OutOfRangeError(absl::StrCat(
        "sequence ", r.sequence, " from rank ", r.rank, " skips ahead: resend from ",
        slot->record.acked_sequence + 1));
  }
  if (r.sequence == 0) return absl::InvalidArgumentError("sequence numbers start at 1");
  if (r.step > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", r.step, " from rank ", r.rank, " is implausible (above 2^48)"));
  }
  if (const auto* s = std::get_if<StepReport>(&r.body)) {
    // A sum of squares is NaN or infinite only over non-finite gradients,
    // and never negative.
    const double sum = s->reduced_sum_squares;
    if (sum < 0 || (s->reduced_nonfinite == 0 && !std::isfinite(sum))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", r.step, " from rank ", r.rank, ": a sum of squares of ", sum,
          " over ", s->reduced_nonfinite, " non-finite gradient values is implausible"));
    }
  }
  return absl::OkStatus();
}

namespace {

// What a resent duplicate must repeat: its step, kind and the values the
// checks use (not the per-parameter fingerprints).
uint64_t ContentDigest(const Report& r) {
  uint64_t h = kernels::Mix64(r.step ^ (uint64_t{r.body.index()} << 60));
  auto add = [&h](uint64_t v) { h = kernels::Mix64(h ^ v) + 0x9e3779b97f4a7c15ull; };
  if (const auto* s = std::get_if<StepReport>(&r.body)) {
    uint64_t sum_bits;
    std::memcpy(&sum_bits, &s->reduced_sum_squares, sizeof(sum_bits));
    add(s->local_nonfinite);
    add(s->reduced_nonfinite);
    add(sum_bits);
    add(s->reduced_digest);
    add(s->applied);
    add(s->loss_scaled);
  } else if (const auto* a = std::get_if<AuditResult>(&r.body)) {
    add(static_cast<uint64_t>(a->role));
    add(a->subject);
    add(a->plan_id);
    add(a->loss_bits);
    add(a->gradient_digest);
    add(a->corrupted_transfer);
  } else if (const auto* w = std::get_if<WeightReport>(&r.body)) {
    add(w->digest);
    add(w->checkpoint);
  }
  return h;
}

}  // namespace

absl::StatusOr<Effects> Coordinator::Ingest(const Report& r) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(r.job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown job ", EchoJobId(r.job_id), ": send Hello first"));
  }
  JobState& job = it->second;
  if (absl::Status s = ValidateReport(job, r); !s.ok()) return s;
  job.last_seen = clock_->Now();
  RankState& state = job.ranks.at(r.rank);
  RankRecord& rank = state.record;
  const uint64_t digest = ContentDigest(r);
  auto& recent = state.recent[r.sequence % state.recent.size()];
  if (!replaying_ && r.sequence <= rank.acked_sequence) {
    if (recent.first == r.sequence && recent.second != digest) {
      // Not a resend: the rank is confused (or lying) about what it said.
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", r.rank, " of job ", r.job_id, " sent sequence ", r.sequence,
          " again with different content (step ", r.step,
          "): refused; a resent report must be identical"));
    }
    Effects dup;
    dup.duplicate = true;
    dup.acked_sequence = rank.acked_sequence;
    return dup;
  }
  Txn txn;
  if (absl::Status s = Apply(job, r, txn); !s.ok()) return s;
  recent = {r.sequence, digest};
  if (!replaying_) {
    rank.acked_sequence = r.sequence;
    // The report is pending in this mutation: the store may write this
    // later. One taken late is not: its progress goes with what it decided.
    (txn.taken_late ? txn.mutation.ranks : txn.mutation.progress).push_back(rank);
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  if (effects.ok()) effects->acked_sequence = rank.acked_sequence;
  return effects;
}

absl::StatusOr<Effects> Coordinator::Consume(const Report& r, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(r.job_id);
  if (it == jobs_.end() || !it->second.ranks.contains(r.rank)) {
    return absl::FailedPreconditionError("no attached rank sent this report");
  }
  JobState& job = it->second;
  RankRecord& rank = job.ranks.at(r.rank).record;
  if (r.incarnation != rank.incarnation || r.sequence == 0 ||
      r.sequence > rank.acked_sequence + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report ", r.sequence, " of rank ", r.rank, " is not the next one (",
        rank.acked_sequence + 1, ") of its incarnation: not consumed"));
  }
  Txn txn;
  if (r.sequence == rank.acked_sequence + 1) {
    rank.acked_sequence = r.sequence;
    // Written now: nothing pending carries this progress.
    txn.mutation.ranks.push_back(rank);
  }
  txn.effects.notes.push_back(absl::StrCat("job ", EchoJobId(r.job_id), ": refused report ",
                                           r.sequence, " of rank ", r.rank, " (step ", r.step,
                                           "): ", why.message()));
  absl::StatusOr<Effects> effects = Commit(txn);
  if (effects.ok()) effects->acked_sequence = rank.acked_sequence;
  return effects;
}

bool Coordinator::Forgotten(const JobState& job, Step step) const {
  return !job.ledger.empty() && job.ledger.size() >= options_.ledger_steps &&
         step < job.ledger.begin()->first;
}

void Coordinator::NoteLate(JobState& job, const Report& r, const std::string& what, Txn& txn) {
  txn.taken_late = true;
  const uint64_t n = ++job.late_reports;
  uint64_t power = 1;
  while (power * 10 <= n) power *= 10;
  if (n != power) return;
  txn.effects.notes.push_back(absl::StrCat(
      "job ", EchoJobId(job.record.job_id), ": ", n,
      n == 1 ? " report" : " reports", " taken after its check was decided (sdcd was away or "
      "the rank was cut off longer than --report_deadline); the latest: ",
      Describe(job, r.rank), " step ", r.step, ": ", what));
}

absl::Status Coordinator::Apply(JobState& job, const Report& r, Txn& txn) {
  GroupState& group = job.groups[RankOf(job, r.rank).placement.replica_group];
  if (const auto* s = std::get_if<StepReport>(&r.body)) {
    return ApplyStepReport(job, group, r, *s, txn);
  }
  if (const auto* a = std::get_if<AuditResult>(&r.body)) {
    return ApplyAudit(job, group, r, *a, txn);
  }
  return ApplyWeights(job, group, r, std::get<WeightReport>(r.body), txn);
}

Effects Coordinator::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  Txn txn;
  for (auto& [id, job] : jobs_) {
    std::vector<std::pair<uint32_t, Step>> steps, weights;
    std::vector<std::tuple<uint32_t, Step, uint64_t>> audits;
    for (const auto& [k, v] : job.steps) {
      if (now - v.first_seen >= options_.report_deadline) steps.push_back(k);
    }
    for (const auto& [k, v] : job.weights) {
      if (now - v.first_seen >= options_.report_deadline) weights.push_back(k);
    }
    for (const auto& [k, v] : job.audits) {
      if (now - v.first_seen >= options_.report_deadline) audits.push_back(k);
    }
    for (const auto& k : steps) MaybeFinalizeStep(job, job.groups[k.first], k.second, true, txn);
    for (const auto& k : weights) {
      MaybeFinalizeWeights(job, job.groups[k.first], k.second, true, txn);
    }
    for (const auto& k : audits) MaybeFinalizeAudit(job, job.groups[std::get<0>(k)], k, true, txn);
  }
  bool expired = false;
  for (ReplacementRequest& r : escalation_.ExpireDue(now)) {
    txn.mutation.requests.push_back(r);
    txn.effects.requests.push_back(std::move(r));
    expired = true;
  }
  if (expired) UpdateWatches(txn);
  ExpireJobs(txn);
  absl::StatusOr<Effects> effects = Commit(txn);
  return effects.ok() ? *std::move(effects) : Effects{};
}

absl::StatusOr<Effects> Coordinator::Commit(Txn& txn) {
  if (!txn.mutation.empty()) {
    absl::StatusOr<uint64_t> ticket = store_->Apply(std::move(txn.mutation));
    if (!ticket.ok()) return ticket.status();
    txn.effects.ticket = *ticket;
  }
  return std::move(txn.effects);
}

}  // namespace sdc::core
