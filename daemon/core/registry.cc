// The registry of jobs and ranks: a rank's Hello (ValidateHello, Attach),
// the end of its stream (Detach), the limits on what one sdcd holds
// (MakeRoomForJob) and abandoned jobs (ExpireJobs), and what a restarted
// rank's previous incarnation leaves in open checks (DropContributions).

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::Echo;
using internal::kMaxJobIdLength;

namespace {

constexpr uint32_t kMaxWorldSize = 1u << 20;
constexpr size_t kMaxTensorNameLength = 1024;

}  // namespace

absl::Status Coordinator::ValidateHello(const Hello& h) const {
  if (h.job_id.empty() || h.job_id.size() > kMaxJobIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id must be 1 to ", kMaxJobIdLength, " characters"));
  }
  if (h.world_size == 0 || h.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", h.world_size, " is not in [1, ", kMaxWorldSize, "]"));
  }
  if (h.placement.rank >= h.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", h.placement.rank, " is not below the world size ", h.world_size));
  }
  if (!IsSafeNodeName(h.placement.node)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node name ", Echo(h.placement.node),
        " is not a node name ([A-Za-z0-9._-], 1 to 253 characters, not starting with '-')"));
  }
  if (!IsSafeGpuId(h.placement.gpu_uuid)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU id ", Echo(h.placement.gpu_uuid), " is not a GPU id ([A-Za-z0-9._:/-], 1 to ",
        kMaxGpuIdLength, " characters, not starting with '-')"));
  }
  if (h.weight_tensors.empty()) {
    return absl::InvalidArgumentError("the weight layout lists no tensors");
  }
  for (const std::string& name : h.weight_tensors) {
    if (name.empty() || name.size() > kMaxTensorNameLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a weight tensor name ", Echo(name), " is not 1 to ", kMaxTensorNameLength,
          " characters"));
    }
  }
  if (h.parameter_count > h.weight_tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter count ", h.parameter_count, " exceeds the ",
                     h.weight_tensors.size(), " weight tensors"));
  }
  auto job = jobs_.find(h.job_id);
  if (job == jobs_.end()) return absl::OkStatus();
  const JobRecord& rec = job->second.record;
  if (rec.world_size != h.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", h.job_id, " has world size ", rec.world_size, " but rank ",
                     h.placement.rank, " says ", h.world_size));
  }
  if (rec.audit_every != h.audit_every || rec.weight_check_every != h.weight_check_every) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", h.job_id, " audits every ", rec.audit_every, " and checks weights every ",
        rec.weight_check_every, " steps, but rank ", h.placement.rank, " says ",
        h.audit_every, " and ", h.weight_check_every));
  }
  auto group = job->second.groups.find(h.placement.replica_group);
  if (group != job->second.groups.end()) {
    const GroupRecord& g = group->second.record;
    if (g.layout_digest != h.layout_digest || g.weight_tensors != h.weight_tensors ||
        g.parameter_count != h.parameter_count) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d's model layout (%d tensors, digest %016x) differs from replica group "
          "%d's (%d tensors, digest %016x)",
          h.placement.rank, h.weight_tensors.size(), h.layout_digest, g.group,
          g.weight_tensors.size(), g.layout_digest));
    }
  }
  const auto& slot = job->second.ranks[h.placement.rank];
  if (slot.has_value() && h.incarnation < slot->record.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale hello: rank ", h.placement.rank, " is at incarnation ",
        slot->record.incarnation, ", this one is ", h.incarnation));
  }
  return absl::OkStatus();
}

absl::StatusOr<AttachResult> Coordinator::Attach(const Hello& h) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = ValidateHello(h); !s.ok()) return s;
  const absl::Time now = clock_->Now();
  Txn txn;
  if (jobs_.find(h.job_id) == jobs_.end()) {
    if (absl::Status s = MakeRoomForJob(h.world_size, txn); !s.ok()) return s;
  }
  auto [it, new_job] = jobs_.try_emplace(h.job_id);
  JobState& job = it->second;
  if (new_job) {
    job.record = {h.job_id, h.world_size, h.audit_every, h.weight_check_every, now, 1};
    job.ranks.resize(h.world_size);
    held_ranks_ += h.world_size;
    txn.mutation.jobs.push_back(job.record);
  }
  job.last_seen = now;
  const uint32_t group_id = h.placement.replica_group;
  auto [git, new_group] = job.groups.try_emplace(group_id);
  GroupState& group = git->second;
  if (new_group) {
    group.record = {h.job_id, group_id, h.weight_tensors, h.parameter_count, h.layout_digest};
    txn.mutation.groups.push_back(group.record);
  }
  const Rank rank = h.placement.rank;
  std::optional<RankState>& slot = job.ranks[rank];
  bool placement_changed = true;
  if (!slot.has_value()) {
    slot.emplace();
    slot->record.job_id = h.job_id;
    ++job.said_hello;
  } else {
    const Placement& old = slot->record.placement;
    placement_changed = old.node != h.placement.node || old.replica_group != group_id ||
                        old.gpu_uuid != h.placement.gpu_uuid;
    if (old.replica_group != group_id) {
      auto& m = job.groups[old.replica_group].members;
      m.erase(std::remove(m.begin(), m.end(), rank), m.end());
      job.groups[old.replica_group].topology.reset();
    }
  }
  RankRecord& rec = slot->record;
  if (h.incarnation > rec.incarnation && !new_job) {
    // A new process: sequences restart, and its steps may restart too (a
    // rollback to a checkpoint). What the old process contributed to checks
    // still open is void.
    DropContributions(job, rank, rec.incarnation, txn);
    rec.acked_sequence = 0;
    rec.resumed = rec.resumed || rec.has_last_step;
    rec.has_last_step = false;
  }
  rec.incarnation = h.incarnation;
  rec.placement = h.placement;
  rec.deterministic = h.deterministic;
  slot->software = h.software;
  slot->attached = true;
  if (!std::binary_search(group.members.begin(), group.members.end(), rank)) {
    group.members.insert(std::upper_bound(group.members.begin(), group.members.end(), rank),
                         rank);
    placement_changed = true;
  }
  if (placement_changed) group.topology.reset();
  txn.mutation.ranks.push_back(rec);
  // The last rank's first Hello completes the groups: what came before it
  // (ranks back from an outage in any order) can be judged now.
  if (AllAttached(job) && !job.held.empty()) ApplyHeld(job, txn);

  AttachResult result;
  result.acked_sequence = rec.acked_sequence;
  for (const auto& [id, plan] : job.plans) {
    if (!plan.done && plan.group == group_id) {
      result.pending_plans.push_back({plan.plan_id, plan.assignments, plan.reason});
    }
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  result.effects = *std::move(effects);
  result.effects.acked_sequence = rec.acked_sequence;
  return result;
}

void Coordinator::Detach(const std::string& job_id, Rank rank, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || rank >= it->second.ranks.size()) return;
  auto& slot = it->second.ranks[rank];
  if (slot.has_value() && slot->record.incarnation == incarnation) slot->attached = false;
  it->second.last_seen = clock_->Now();
}

absl::Status Coordinator::MakeRoomForJob(uint32_t world_size, Txn& txn) {
  auto full = [&] {
    return jobs_.size() >= options_.max_jobs || held_ranks_ + world_size > options_.max_ranks;
  };
  if (!full()) return absl::OkStatus();
  ExpireJobs(txn);
  if (!full()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "sdcd holds ", jobs_.size(), " jobs of ", held_ranks_, " ranks in all; a new job of ",
      world_size, " ranks would pass its limits (--max_jobs ", options_.max_jobs,
      ", --max_ranks ", options_.max_ranks, "); jobs expire ",
      absl::FormatDuration(options_.job_expiry), " after their last rank leaves"));
}

void Coordinator::ExpireJobs(Txn& txn) {
  const absl::Time now = clock_->Now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const JobState& job = it->second;
    const bool attached = std::any_of(job.ranks.begin(), job.ranks.end(), [](const auto& r) {
      return r.has_value() && r->attached;
    });
    // Open checks finish at their deadline first (Tick), so an expired job
    // leaves no pending report behind.
    const bool open = !job.steps.empty() || !job.weights.empty() || !job.audits.empty();
    if (attached || open || now - job.last_seen < options_.job_expiry) {
      ++it;
      continue;
    }
    held_ranks_ -= job.record.world_size;
    txn.mutation.jobs_removed.push_back(it->first);
    txn.effects.expired_jobs.push_back(it->first);
    it = jobs_.erase(it);
  }
}

void Coordinator::ApplyHeld(JobState& job, Txn& txn) {
  std::vector<Report> held;
  held.swap(job.held);
  reapplying_ = true;  // Stored as pending when they came.
  for (const Report& r : held) {
    if (absl::Status s = Apply(job, r, txn); !s.ok()) {
      txn.mutation.pending_removed.push_back(internal::KeyOf(r));
      txn.effects.notes.push_back(absl::StrCat(
          "job ", internal::EchoJobId(job.record.job_id), ": ", Describe(job, r.rank),
          "'s audit result of step ", r.step, ", held until every rank said Hello, is refused: ",
          s.message()));
    }
  }
  reapplying_ = false;
}

void Coordinator::DropContributions(JobState& job, Rank rank, uint64_t incarnation,
                                    Txn& txn) {
  auto held_stale = [&](const Report& r) { return r.rank == rank && r.incarnation <= incarnation; };
  for (const Report& r : job.held) {
    if (held_stale(r)) txn.mutation.pending_removed.push_back(internal::KeyOf(r));
  }
  job.held.erase(std::remove_if(job.held.begin(), job.held.end(), held_stale), job.held.end());
  auto stale = [&](std::vector<PendingKey>& keys) {
    auto mine = [&](const PendingKey& k) { return k.rank == rank && k.incarnation <= incarnation; };
    for (const PendingKey& k : keys) {
      if (mine(k)) txn.mutation.pending_removed.push_back(k);
    }
    keys.erase(std::remove_if(keys.begin(), keys.end(), mine), keys.end());
  };
  auto unvote = [&](std::map<uint64_t, Ballot>& ballots) {
    for (auto it = ballots.begin(); it != ballots.end();) {
      auto& rs = it->second.ranks;
      rs.erase(std::remove(rs.begin(), rs.end(), rank), rs.end());
      it = rs.empty() ? ballots.erase(it) : std::next(it);
    }
  };
  for (auto it = job.steps.begin(); it != job.steps.end();) {
    PendingStep& ps = it->second;
    stale(ps.keys);
    unvote(ps.reduced);
    for (auto* set : {&ps.reported, &ps.applied, &ps.skipped}) set->erase(rank);
    for (auto* set : {&ps.local_nonfinite, &ps.reduced_nonfinite}) set->erase(rank);
    for (auto c = ps.confirms.begin(); c != ps.confirms.end();) {
      c = (c->first == rank || c->second.first == rank) ? ps.confirms.erase(c) : std::next(c);
    }
    it = ps.reported.empty() ? job.steps.erase(it) : std::next(it);
  }
  for (auto it = job.weights.begin(); it != job.weights.end();) {
    PendingWeights& pw = it->second;
    stale(pw.keys);
    unvote(pw.ballots);
    pw.voted.erase(rank);
    it = pw.voted.empty() ? job.weights.erase(it) : std::next(it);
  }
  for (auto it = job.audits.begin(); it != job.audits.end();) {
    PendingAudit& pa = it->second;
    if (pa.verdict.has_value()) {  // Decided; its tie-breaks end at the deadline.
      ++it;
      continue;
    }
    stale(pa.keys);
    pa.originals.erase(rank);
    pa.replays.erase(rank);
    for (auto t = pa.early_tiebreaks.begin(); t != pa.early_tiebreaks.end();) {
      t = t->first.first == rank ? pa.early_tiebreaks.erase(t) : std::next(t);
    }
    it = pa.originals.empty() && pa.replays.empty() ? job.audits.erase(it) : std::next(it);
  }
}

}  // namespace sdc::core
