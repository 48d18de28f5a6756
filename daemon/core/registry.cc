// The registry of jobs and ranks: a rank's Hello (ValidateHello, Prove,
// Attach), the end of its stream (Detach), the quotas on what one sdcd holds
// and what each identity holds of it (Admit), abandoned jobs (ExpireJobs,
// EvictJobsOf), and what a restarted rank's previous incarnation leaves in
// open checks (DropContributions).

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::Echo;
using internal::EchoJobId;
using internal::IdentityClass;
using internal::IdentityKey;
using internal::kMaxJobIdLength;
using internal::kMaxStep;

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
  const ShardCoordinates& shard = h.shard;
  if (!shard.sharded() && (shard.index != 0 || shard.replica != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard index ", shard.index, " and replica index ", shard.replica,
        " without a shard count (0: full replicas)"));
  }
  if (shard.sharded() && (shard.index >= shard.count || shard.count > h.world_size ||
                          shard.replica >= h.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", shard.index, " of ", shard.count, " (replica ", shard.replica,
        ") is not a shard of a job of world size ", h.world_size));
  }
  if (h.resume_step > kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume step ", h.resume_step, " is implausible (above 2^48)"));
  }
  auto job = jobs_.find(h.job_id);
  if (job == jobs_.end()) return absl::OkStatus();
  const JobRecord& rec = job->second.record;
  if (h.attempt < rec.attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale hello: job ", h.job_id, " is at attempt ", rec.attempt, ", rank ",
        h.placement.rank, " says attempt ", h.attempt));
  }
  // A new attempt starts over: its world, cadence and layout are its own.
  if (h.attempt > rec.attempt) return absl::OkStatus();
  if (absl::Status s = ValidateShard(job->second, h); !s.ok()) return s;
  if (rec.world_size != h.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", h.job_id, " has world size ", rec.world_size, " in attempt ", rec.attempt,
        " but rank ", h.placement.rank, " says ", h.world_size,
        " (a world size changes only with a new attempt: TORCHELASTIC_RESTART_COUNT or "
        "SDC_ATTEMPT)"));
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
  auto slot = job->second.ranks.find(h.placement.rank);
  if (slot != job->second.ranks.end() && h.incarnation < slot->second.record.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale hello: rank ", h.placement.rank, " is at incarnation ",
        slot->second.record.incarnation, ", this one is ", h.incarnation));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ValidateShard(const JobState& job, const Hello& h) const {
  // The weight vote and its attribution are per replica group: every rank of
  // one group must hold the same shard, each as a replica of its own, and
  // every rank of the job must cut the model into as many shards.
  for (const auto& [rank, other] : job.ranks) {
    if (rank == h.placement.rank || !other.shard_known) continue;
    const ShardCoordinates& theirs = other.shard;
    if (theirs.count != h.shard.count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", h.placement.rank, " says the model has ", h.shard.count,
          " shards but rank ", rank, " said ", theirs.count, " (0: full replicas)"));
    }
    if (other.record.placement.replica_group != h.placement.replica_group) continue;
    if (theirs.index != h.shard.index) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", h.placement.rank, " holds shard ", h.shard.index, " but rank ", rank,
          " of its replica group ", h.placement.replica_group, " holds shard ", theirs.index,
          ": the ranks of a replica group hold one shard"));
    }
    if (h.shard.sharded() && theirs.replica == h.shard.replica) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ranks ", rank, " and ", h.placement.rank, " both say they are replica ",
          h.shard.replica, " of shard ", h.shard.index));
    }
  }
  return absl::OkStatus();
}

namespace {

std::string ClassName(const std::string& identity_class) {
  return identity_class.empty() ? std::string("unauthenticated callers")
                                : absl::StrCat("node ", identity_class);
}

uint64_t LayoutBytes(const Hello& h) {
  uint64_t n = 0;
  for (const std::string& t : h.weight_tensors) n += t.size() + 1;
  return n;
}

}  // namespace

struct Coordinator::Admission {
  std::string key;
  uint32_t capacity = 0;
};

absl::Status Coordinator::Prove(const Hello& h, const Caller& caller, RankRecord* out) {
  out->identity.clear();
  out->proof.clear();
  out->unproven.clear();
  if (caller.node.empty()) {
    out->unproven =
        "its caller proved no node identity (no node certificate, and no node agent relayed it)";
    return absl::OkStatus();
  }
  if (caller.node != h.placement.node) {
    return absl::PermissionDeniedError(absl::StrCat(
        "rank ", h.placement.rank, " says it runs on node ", Echo(h.placement.node),
        " but its caller proved to be node ", Echo(caller.node), " (", caller.proof,
        "): only a node speaks for itself"));
  }
  out->identity = caller.node;
  out->proof = caller.proof;
  if (!caller.gpus.empty() &&
      std::find(caller.gpus.begin(), caller.gpus.end(), h.placement.gpu_uuid) ==
          caller.gpus.end()) {
    out->unproven = absl::StrCat("GPU ", Echo(h.placement.gpu_uuid), " is not one of the ",
                                 caller.gpus.size(), " GPUs node ", caller.node,
                                 "'s agent listed");
  }
  return absl::OkStatus();
}

void Coordinator::MoveSlot(JobState& job, const std::string& from, const std::string& to,
                           uint32_t capacity) {
  held_ranks_ -= job.reserved;
  held_unauthenticated_ -= job.reserved_unauthenticated;
  if (!from.empty()) {
    auto it = job.identities.find(from);
    if (it != job.identities.end() && --it->second.slots == 0) {
      job.capacity -= it->second.capacity;
      if (IdentityClass(from).empty()) job.capacity_unauthenticated -= it->second.capacity;
      job.identities.erase(it);
    }
  }
  IdentityShare& share = job.identities[to];
  if (share.slots++ == 0) {
    share.capacity = capacity;
    job.capacity += capacity;
    if (IdentityClass(to).empty()) job.capacity_unauthenticated += capacity;
  }
  const uint64_t world = job.record.world_size;
  job.reserved = std::min(world, job.capacity);
  job.reserved_unauthenticated = std::min(world, job.capacity_unauthenticated);
  held_ranks_ += job.reserved;
  held_unauthenticated_ += job.reserved_unauthenticated;
}

absl::StatusOr<Coordinator::Admission> Coordinator::Admit(const Hello& h, const Caller& caller,
                                                          const RankRecord& proved, Txn& txn) {
  Admission a;
  RankRecord probe = proved;
  probe.placement = h.placement;
  a.key = IdentityKey(probe);
  const std::string identity_class = IdentityClass(a.key);
  a.capacity = !identity_class.empty() && !caller.gpus.empty()
                   ? static_cast<uint32_t>(caller.gpus.size())
                   : options_.max_ranks_per_node;
  auto job_it = jobs_.find(h.job_id);
  const JobState* job = job_it == jobs_.end() ? nullptr : &job_it->second;

  // What the job would hold after this Hello, from what it holds now.
  std::string old_key;
  if (job != nullptr) {
    auto slot = job->ranks.find(h.placement.rank);
    if (slot != job->ranks.end()) old_key = IdentityKey(slot->second.record);
  }
  uint32_t slots = 0;
  bool new_identity = true;
  if (job != nullptr) {
    auto share = job->identities.find(a.key);
    if (share != job->identities.end()) {
      slots = share->second.slots;
      new_identity = false;
      a.capacity = share->second.capacity;  // Fixed when the identity joined.
    }
  }
  if (old_key != a.key && slots + 1 > a.capacity) {
    const std::string who = identity_class.empty()
                                ? absl::StrCat("unauthenticated node ", Echo(h.placement.node))
                                : absl::StrCat("node ", identity_class);
    return absl::ResourceExhaustedError(absl::StrCat(
        who, " already holds ", slots, " ranks of job ", EchoJobId(h.job_id),
        ", as many as it can hold (", a.capacity,
        identity_class.empty() || caller.gpus.empty() ? ": --max_ranks_per_node"
                                                      : ": the GPUs its agent listed",
        ")"));
  }
  const bool new_group =
      job == nullptr || job->groups.find(h.placement.replica_group) == job->groups.end();
  if (new_group) {
    if (job != nullptr && job->groups.size() >= job->record.world_size) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", EchoJobId(h.job_id), " already has ", job->groups.size(),
          " replica groups, as many as its world size"));
    }
    const auto used = layout_bytes_.find(identity_class);
    const uint64_t before = used == layout_bytes_.end() ? 0 : used->second;
    if (before + LayoutBytes(h) > options_.max_layout_bytes_per_identity) {
      return absl::ResourceExhaustedError(absl::StrCat(
          ClassName(identity_class), " already holds ", before,
          " bytes of weight layouts; this group's ", LayoutBytes(h), " would pass ",
          options_.max_layout_bytes_per_identity, " (the quota per identity)"));
    }
  }
  const uint64_t world = h.world_size;
  uint64_t capacity = job == nullptr ? 0 : job->capacity;
  uint64_t capacity_unauthenticated = job == nullptr ? 0 : job->capacity_unauthenticated;
  if (new_identity) {
    capacity += a.capacity;
    if (identity_class.empty()) capacity_unauthenticated += a.capacity;
  }
  const uint64_t reserved_before = job == nullptr ? 0 : job->reserved;
  const uint64_t unauthenticated_before = job == nullptr ? 0 : job->reserved_unauthenticated;
  const uint64_t reserved = std::min(world, capacity);
  const uint64_t unauthenticated = std::min(world, capacity_unauthenticated);
  auto room = [&] {
    return (job != nullptr || jobs_.size() < options_.max_jobs) &&
           held_ranks_ - reserved_before + reserved <= options_.max_ranks &&
           held_unauthenticated_ - unauthenticated_before + unauthenticated <=
               options_.max_unauthenticated_ranks;
  };
  if (job == nullptr) {
    size_t held = 0;
    for (const auto& [id, j] : jobs_) {
      for (const auto& [key, share] : j.identities) {
        if (IdentityClass(key) == identity_class) {
          ++held;
          break;
        }
      }
    }
    if (held >= options_.max_jobs_per_identity) {
      EvictJobsOf(identity_class, txn);
      held = 0;
      for (const auto& [id, j] : jobs_) {
        for (const auto& [key, share] : j.identities) {
          if (IdentityClass(key) == identity_class) {
            ++held;
            break;
          }
        }
      }
      if (held >= options_.max_jobs_per_identity) {
        return absl::ResourceExhaustedError(absl::StrCat(
            ClassName(identity_class), " already holds ", held, " jobs with ranks attached ",
            "(the quota per identity, ", options_.max_jobs_per_identity, ")"));
      }
    }
  }
  if (!room()) ExpireJobs(txn);
  if (!room()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sdcd holds ", jobs_.size(), " jobs holding ", held_ranks_, " ranks (",
        held_unauthenticated_, " of them for unauthenticated callers); job ",
        EchoJobId(h.job_id), " would hold ", reserved, " (", unauthenticated,
        " unauthenticated) and pass a limit (--max_jobs ", options_.max_jobs, ", --max_ranks ",
        options_.max_ranks, ", --max_unauthenticated_ranks ", options_.max_unauthenticated_ranks,
        "); a job holds no more ranks than its nodes can, and expires ",
        absl::FormatDuration(options_.job_expiry), " after its last rank leaves"));
  }
  return a;
}

absl::StatusOr<AttachResult> Coordinator::Attach(const Hello& h, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = ValidateHello(h); !s.ok()) return s;
  RankRecord proved;
  if (absl::Status s = Prove(h, caller, &proved); !s.ok()) return s;
  auto existing = jobs_.find(h.job_id);
  const bool new_attempt = existing != jobs_.end() && h.attempt > existing->second.record.attempt;
  if (new_attempt && proved.identity.empty()) {
    for (const auto& [r, slot] : existing->second.ranks) {
      if (slot.record.identity.empty()) continue;
      return absl::PermissionDeniedError(absl::StrCat(
          "job ", EchoJobId(h.job_id), "'s ranks were proven (rank ", r, " by node ",
          slot.record.identity, "); an unauthenticated Hello cannot start a new attempt of it"));
    }
  }
  std::string warning;
  if (new_attempt) {
    warning = DoubtfulResume(existing->second, h);
    if (!warning.empty() && options_.resume_policy == CoordinatorOptions::ResumePolicy::kRefuse) {
      return absl::FailedPreconditionError(absl::StrCat(
          "attempt ", h.attempt, " of job ", EchoJobId(h.job_id), " is refused (sdcd "
          "--resume_policy=refuse): ", warning));
    }
  }
  if (existing != jobs_.end() && !new_attempt && proved.identity.empty()) {
    auto slot = existing->second.ranks.find(h.placement.rank);
    if (slot != existing->second.ranks.end() && !slot->second.record.identity.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "rank ", h.placement.rank, " of job ", EchoJobId(h.job_id),
          " is held by a caller proven to be node ", slot->second.record.identity, " (",
          slot->second.record.proof, "); an unauthenticated Hello cannot take it over"));
    }
  }
  const absl::Time now = clock_->Now();
  Txn txn;
  if (new_attempt) StartAttempt(existing->second, h, warning, txn);
  absl::StatusOr<Admission> admitted = Admit(h, caller, proved, txn);
  if (!admitted.ok()) {
    // The attempt stands (its old one is over either way); this rank waits.
    if (new_attempt) {
      if (absl::StatusOr<Effects> e = Commit(txn); !e.ok()) return e.status();
    }
    return admitted.status();
  }
  auto [it, new_job] = jobs_.try_emplace(h.job_id);
  JobState& job = it->second;
  if (new_job) {
    job.record = {h.job_id, h.world_size, h.audit_every, h.weight_check_every, now, 1,
                  h.attempt, h.resume_step};
    txn.mutation.jobs.push_back(job.record);
    if (h.attempt > 0 || h.resume_step > 0) {
      // sdcd never saw the earlier attempts (a new sdcd, or the job expired).
      txn.mutation.attempts.push_back(
          {h.job_id, h.attempt, h.world_size, h.resume_step, now, 0,
           "first attempt this sdcd saw of the job"});
      if (h.resume_step > 0) {
        job.resume_warning = absl::StrCat(
            "sdcd holds no checkpoint decisions of job ", EchoJobId(h.job_id),
            ": it cannot say whether step ", h.resume_step, "'s checkpoint is final");
        txn.effects.notes.push_back(job.resume_warning);
      }
    }
  }
  job.last_seen = now;
  const uint32_t group_id = h.placement.replica_group;
  auto [git, new_group] = job.groups.try_emplace(group_id);
  GroupState& group = git->second;
  if (new_group) {
    group.record = {h.job_id, group_id, h.weight_tensors, h.parameter_count, h.layout_digest};
    group.creator = IdentityClass(admitted->key);
    group.layout_bytes = LayoutBytes(h);
    layout_bytes_[group.creator] += group.layout_bytes;
    txn.mutation.groups.push_back(group.record);
  }
  const Rank rank = h.placement.rank;
  auto [sit, new_slot] = job.ranks.try_emplace(rank);
  RankState& slot = sit->second;
  bool placement_changed = true;
  std::string old_key;
  if (new_slot) {
    slot.record.job_id = h.job_id;
    ++job.said_hello;
  } else {
    old_key = IdentityKey(slot.record);
    const Placement& old = slot.record.placement;
    placement_changed = old.node != h.placement.node || old.replica_group != group_id ||
                        old.gpu_uuid != h.placement.gpu_uuid;
    if (old.replica_group != group_id) {
      auto& m = job.groups[old.replica_group].members;
      m.erase(std::remove(m.begin(), m.end(), rank), m.end());
      job.groups[old.replica_group].topology.reset();
    }
  }
  if (old_key != admitted->key) MoveSlot(job, old_key, admitted->key, admitted->capacity);
  RankRecord& rec = slot.record;
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
  rec.identity = proved.identity;
  rec.proof = proved.proof;
  rec.unproven = proved.unproven;
  slot.software = h.software;
  slot.shard = h.shard;
  slot.shard_known = true;
  slot.attached = true;
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
  result.attempt = job.record.attempt;
  result.resume_warning = job.resume_warning;
  // Every group's plans: the rank keeps plan ids contiguous with them
  // (v1::AuditPlan::group).
  for (const auto& [id, plan] : job.plans) {
    if (!plan.done) {
      result.pending_plans.push_back(
          {plan.plan_id, plan.assignments, plan.reason, plan.watch, plan.group});
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
  if (it == jobs_.end()) return;
  auto slot = it->second.ranks.find(rank);
  if (slot == it->second.ranks.end()) return;
  if (slot->second.record.incarnation == incarnation) slot->second.attached = false;
  it->second.last_seen = clock_->Now();
}

std::vector<Rank> Coordinator::UnprovenMembers(const JobState& job,
                                               const GroupState& group) const {
  std::vector<Rank> out;
  for (Rank r : group.members) {
    auto slot = job.ranks.find(r);
    if (slot == job.ranks.end() || !slot->second.record.unproven.empty()) out.push_back(r);
  }
  return out;
}

namespace {

// No rank attached, no check open (open checks finish at their deadline
// first, Tick, so an expired job leaves no pending report behind).
template <typename Job>
bool Abandoned(const Job& job) {
  const bool attached = std::any_of(job.ranks.begin(), job.ranks.end(),
                                    [](const auto& r) { return r.second.attached; });
  const bool open = !job.steps.empty() || !job.weights.empty() || !job.audits.empty();
  return !attached && !open;
}

}  // namespace

void Coordinator::DropJob(std::map<std::string, JobState>::iterator it, Txn& txn) {
  JobState& job = it->second;
  held_ranks_ -= job.reserved;
  held_unauthenticated_ -= job.reserved_unauthenticated;
  for (const auto& [gid, group] : job.groups) {
    auto used = layout_bytes_.find(group.creator);
    if (used == layout_bytes_.end()) continue;
    used->second -= std::min(used->second, group.layout_bytes);
    if (used->second == 0) layout_bytes_.erase(used);
  }
  txn.mutation.jobs_removed.push_back(it->first);
  txn.effects.expired_jobs.push_back(it->first);
  jobs_.erase(it);
}

void Coordinator::ExpireJobs(Txn& txn) {
  const absl::Time now = clock_->Now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    auto next = std::next(it);
    if (Abandoned(it->second) && now - it->second.last_seen >= options_.job_expiry) {
      DropJob(it, txn);
    }
    it = next;
  }
}

void Coordinator::EvictJobsOf(const std::string& identity_class, Txn& txn) {
  std::vector<std::pair<absl::Time, std::string>> candidates;
  size_t held = 0;
  for (const auto& [id, job] : jobs_) {
    const bool mine = std::any_of(job.identities.begin(), job.identities.end(),
                                  [&](const auto& s) { return IdentityClass(s.first) == identity_class; });
    if (!mine) continue;
    ++held;
    if (Abandoned(job)) candidates.push_back({job.last_seen, id});
  }
  std::sort(candidates.begin(), candidates.end());
  for (const auto& [seen, id] : candidates) {
    if (held < options_.max_jobs_per_identity) break;
    DropJob(jobs_.find(id), txn);
    --held;
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
