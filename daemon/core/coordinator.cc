#include "daemon/core/coordinator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/model_digest.h"

namespace sdc::core {
namespace {

constexpr size_t kMaxJobIdLength = 128;
constexpr uint32_t kMaxWorldSize = 1u << 20;
constexpr size_t kMaxListedRanks = 8;
constexpr size_t kMaxTensorNameLength = 1024;
constexpr Step kMaxStep = Step{1} << 48;

// A value an error message echoes: quoted, at most 64 characters of it, with
// bytes outside printable ASCII escaped.
std::string Echo(absl::string_view value) {
  std::string out = "'";
  for (char c : value.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(c));
    }
  }
  out += "'";
  if (value.size() > 64) absl::StrAppend(&out, " (", value.size(), " characters)");
  return out;
}

// A job id as an error message may echo it: as it came, when it could be a
// valid one, else its first characters and its length (a 1 MB id must not
// make a 1 MB message).
std::string EchoJobId(const std::string& id) {
  if (id.size() <= kMaxJobIdLength) return id;
  return absl::StrCat(id.substr(0, 32), "... (", id.size(), " characters)");
}

// "3, 7, 9" or "3, 7, ... (12 ranks)".
std::string RankList(const std::vector<Rank>& ranks) {
  if (ranks.size() <= kMaxListedRanks) return absl::StrJoin(ranks, ", ");
  std::vector<Rank> head(ranks.begin(), ranks.begin() + kMaxListedRanks);
  return absl::StrCat(absl::StrJoin(head, ", "), ", ... (", ranks.size(), " ranks)");
}

std::vector<Rank> ToVector(const std::set<Rank>& s) { return {s.begin(), s.end()}; }

PendingKey KeyOf(const Report& r) { return {r.job_id, r.rank, r.incarnation, r.sequence}; }

// The check a pending report feeds, in group `group` (see DecidedCheck).
DecidedCheck CheckOf(const Report& r, uint32_t group) {
  DecidedCheck c{r.job_id, group, r.step, CheckKind::kNonFinite, 0, {}};
  if (std::holds_alternative<WeightReport>(r.body)) {
    c.check = CheckKind::kWeights;
  } else if (const auto* a = std::get_if<AuditResult>(&r.body);
             a != nullptr && a->role != AuditRole::kConfirm) {
    c.check = CheckKind::kReplay;
    c.plan_id = a->plan_id;
  }
  return c;
}

using CheckId = std::tuple<std::string, uint32_t, Step, CheckKind, uint64_t>;
CheckId IdOf(const DecidedCheck& c) { return {c.job_id, c.group, c.step, c.check, c.plan_id}; }

// The vote digest of a weight report: weights, and optimizer state when sent.
uint64_t WeightVoteDigest(const WeightReport& w) {
  return w.has_optimizer_digest ? kernels::Mix64(w.digest ^ kernels::Mix64(w.optimizer_digest))
                                : w.digest;
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

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, const Clock* clock, Store* store)
    : options_(std::move(options)),
      clock_(clock),
      store_(store),
      escalation_(options_.escalation) {}

// ---------------------------------------------------------------------------
// Registry

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

const Topology& Coordinator::TopologyOf(const JobState& job, const GroupState& group) const {
  if (group.topology == nullptr) {
    std::vector<PlanMember> members;
    for (Rank r : group.members) {
      members.push_back({r, job.ranks[r]->record.placement.node});
    }
    group.topology = std::make_unique<Topology>(std::move(members));
  }
  return *group.topology;
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
  slot->attached = true;
  if (!std::binary_search(group.members.begin(), group.members.end(), rank)) {
    group.members.insert(std::upper_bound(group.members.begin(), group.members.end(), rank),
                         rank);
    placement_changed = true;
  }
  if (placement_changed) group.topology.reset();
  txn.mutation.ranks.push_back(rec);

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

RankRecord& Coordinator::RankOf(JobState& job, Rank rank) { return job.ranks[rank]->record; }

bool Coordinator::AllAttached(const JobState& job) {
  return job.said_hello == job.record.world_size;
}

std::string Coordinator::Describe(const JobState& job, Rank rank) const {
  if (rank >= job.ranks.size() || !job.ranks[rank].has_value()) {
    return absl::StrCat("rank ", rank);
  }
  const Placement& p = job.ranks[rank]->record.placement;
  return absl::StrCat("rank ", rank, " (", p.gpu_uuid, " on ", p.node, ")");
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

// ---------------------------------------------------------------------------
// Ingestion

absl::Status Coordinator::ValidateReport(const JobState& job, const Report& r) const {
  if (r.rank >= job.record.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown rank ", r.rank, ": job ", r.job_id, " has world size ", job.record.world_size));
  }
  const auto& slot = job.ranks[r.rank];
  if (!slot.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", r.rank, " of job ", r.job_id, " has not said Hello"));
  }
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
  } else if (const auto* a = std::get_if<AuditResult>(&r.body)) {
    add(static_cast<uint64_t>(a->role));
    add(a->subject);
    add(a->plan_id);
    add(a->loss_bits);
    add(a->gradient_digest);
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
  RankState& state = *job.ranks[r.rank];
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
    // The report is pending in this mutation: the store may write this later.
    txn.mutation.progress.push_back(rank);
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  if (effects.ok()) effects->acked_sequence = rank.acked_sequence;
  return effects;
}

absl::Status Coordinator::Apply(JobState& job, const Report& r, Txn& txn) {
  const uint32_t group_id = RankOf(job, r.rank).placement.replica_group;
  GroupState& group = job.groups[group_id];
  if (const auto* s = std::get_if<StepReport>(&r.body)) {
    const RankRecord& rank = RankOf(job, r.rank);
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
    ApplyStepReport(job, group, r, *s, txn);
    return absl::OkStatus();
  }
  if (const auto* a = std::get_if<AuditResult>(&r.body)) {
    return ApplyAudit(job, group, r, *a, txn);
  }
  const auto& w = std::get<WeightReport>(r.body);
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
  if (pending == job.weights.end()) {
    auto verdict = job.ledger.find(r.step);
    if (verdict != job.ledger.end() && verdict->second.weights.count(group_id) > 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "the weight check of step ", r.step, " is already decided; rank ", r.rank,
          "'s report is late"));
    }
  }
  ApplyWeights(job, group, r, w, txn);
  return absl::OkStatus();
}

void Coordinator::Rollback(JobState& job, Step from, Txn& txn) {
  bool any = false;
  for (auto it = job.ledger.lower_bound(from); it != job.ledger.end();) {
    it = job.ledger.erase(it);
    any = true;
  }
  if (any) txn.mutation.rollbacks.push_back({job.record.job_id, from});
}

void Coordinator::DropContributions(JobState& job, Rank rank, uint64_t incarnation,
                                    Txn& txn) {
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
    it = pa.originals.empty() && pa.replays.empty() ? job.audits.erase(it) : std::next(it);
  }
}

void Coordinator::ApplyStepReport(JobState& job, GroupState& group, const Report& r,
                                  const StepReport& s, Txn& txn) {
  RankRecord& rank = RankOf(job, r.rank);
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
  ps.keys.push_back(KeyOf(r));
  if (!s.audits_off.empty() && !replaying_) NoteAuditsOff(job, group, r.step, s.audits_off, txn);
  MaybeFinalizeStep(job, group, r.step, /*deadline=*/false, txn);
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
  // the highest such rank (the one every rank agreed on).
  const bool subset = !local.empty() && local.size() < group.members.size();
  if (subset && !deadline &&
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
  std::vector<std::string> failures;
  uint64_t first_incident = 0;
  auto note = [&](const Incident& inc) {
    failures.push_back(absl::StrCat(inc.explanation, " (incident ", inc.id, ")"));
    if (first_incident == 0) first_incident = inc.id;
  };
  const absl::Duration latency = clock_->Now() - ps.first_seen;

  // Check 1, cross-rank part: did every rank receive the same reduced
  // gradients?
  std::map<uint64_t, std::vector<Rank>> by_digest;
  for (const auto& [digest, ballot] : ps.reduced) by_digest[digest] = ballot.ranks;
  const VoteResult reduced = Vote(group.members, BallotsOf(by_digest, {}));
  std::string reduced_result = "pass";
  if (reduced.outcome == VoteOutcome::kMinority) {
    // The rank that received bad data need not hold the bad hardware (a
    // sender, a link, a switch): the minority are suspects, and targeted
    // audits of their own computation confirm or clear them.
    reduced_result = "suspect";
    note(RecordIncident(
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
    note(RecordIncident(job, group, step, CheckKind::kReducedGradients, "no_majority", {},
                        false,
                        absl::StrCat("reduced gradients differ across ranks and no value has a "
                                     "strict majority of ",
                                     group.members.size()),
                        {}, txn));
  } else if (reduced.outcome == VoteOutcome::kIncomplete) {
    reduced_result = "incomplete";
  }
  txn.effects.checks.push_back({CheckKind::kReducedGradients, reduced_result, latency});

  // Check 1, local part.
  std::string nonfinite_result = "pass";
  if (!local.empty() && local.size() == group.members.size()) {
    nonfinite_result = "all_ranks";
    note(RecordIncident(job, group, step, CheckKind::kNonFinite, "all_ranks", {}, false,
                        "every rank's local gradients had NaN/Inf: the model or its data, "
                        "not one GPU",
                        {}, txn));
  } else {
    for (Rank r : local) {
      auto c = ps.confirms.find(r);
      if (c != ps.confirms.end() && c->second.second == 0) {
        nonfinite_result = "faulty";
        note(RecordIncident(
            job, group, step, CheckKind::kNonFinite, "faulty", {r}, true,
            absl::StrCat(Describe(job, r), " had NaN/Inf in its local gradients; ",
                         Describe(job, c->second.first),
                         " replayed its micro-batch and got finite gradients"),
            {}, txn));
      } else if (c != ps.confirms.end()) {
        if (nonfinite_result == "pass") nonfinite_result = "reproduced";
        note(RecordIncident(
            job, group, step, CheckKind::kNonFinite, "reproduced", {}, false,
            absl::StrCat(Describe(job, c->second.first), " reproduced the NaN/Inf of rank ", r,
                         "'s micro-batch: the data or the software, not the GPU"),
            {}, txn));
      } else {
        if (nonfinite_result == "pass") nonfinite_result = "suspect";
        note(RecordIncident(job, group, step, CheckKind::kNonFinite, "suspect", {r}, false,
                            absl::StrCat("NaN/Inf in the local gradients of ", Describe(job, r),
                                         " only; no replay confirmed it"),
                            {}, txn));
      }
    }
  }
  if (local.empty() && !ps.reduced_nonfinite.empty()) {
    if (ps.reduced_nonfinite.size() == group.members.size()) {
      nonfinite_result = "allreduce";
      note(RecordIncident(job, group, step, CheckKind::kNonFinite, "allreduce", {}, false,
                          "every rank's reduced gradients had NaN/Inf but no rank's local "
                          "gradients did: the all-reduce produced them",
                          {}, txn));
    } else if (reduced.outcome != VoteOutcome::kMinority) {
      nonfinite_result = "suspect";
      const std::vector<Rank> ranks = ToVector(ps.reduced_nonfinite);
      note(RecordIncident(job, group, step, CheckKind::kNonFinite, "suspect", ranks, false,
                          absl::StrCat("only rank(s) ", RankList(ranks),
                                       " received NaN/Inf from the all-reduce"),
                          {}, txn));
    }
  }
  txn.effects.checks.push_back({CheckKind::kNonFinite, nonfinite_result, latency});
  if (!ps.skipped.empty()) ++txn.effects.skipped_steps;

  verdict.failed = !failures.empty();
  verdict.incident_id = first_incident;
  verdict.summary = failures.empty() ? (complete ? "pass"
                                                 : absl::StrCat("missing ranks ",
                                                                RankList([&] {
                                                                  std::vector<Rank> m;
                                                                  for (Rank r : group.members)
                                                                    if (!ps.reported.count(r))
                                                                      m.push_back(r);
                                                                  return m;
                                                                }())))
                                     : absl::StrJoin(failures, "; ");
  RecordVerdict(job, std::move(verdict), txn);
  txn.mutation.decided.push_back({job.record.job_id, group.record.group, step,
                                  CheckKind::kNonFinite, 0, std::move(ps.keys)});
  job.steps.erase(it);
}

void Coordinator::ApplyWeights(JobState& job, GroupState& group, const Report& r,
                               const WeightReport& w, Txn& txn) {
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
                       what),
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
                       group.members.size(), " (", pw.ballots.size(), " distinct values)"),
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
  txn.mutation.decided.push_back({job.record.job_id, group.record.group, step,
                                  CheckKind::kWeights, 0, std::move(pw.keys)});
  job.weights.erase(it);
}

// ---------------------------------------------------------------------------
// Replay audits

absl::StatusOr<ReplayPlan> Coordinator::PlanFor(const JobState& job, const GroupState& group,
                                                Step step, uint64_t plan_id) const {
  if (!AllAttached(job)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.record.job_id,
                     " has ranks that never said Hello; audit plans need every rank"));
  }
  if (plan_id == 0) {
    if (job.record.audit_every == 0 || step % job.record.audit_every != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step, " is not a scheduled audit step (audits every ",
                       job.record.audit_every, " steps)"));
    }
    return PlanFullAudit(TopologyOf(job, group), step / job.record.audit_every);
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
  if (a.subject >= job.record.world_size ||
      // Ascending: a linear search here was O(world) per audit result.
      !std::binary_search(group.members.begin(), group.members.end(), a.subject)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", a.subject,
                                                   " is not in rank ", r.rank,
                                                   "'s replica group"));
  }
  Evidence evidence{a.loss_bits, a.gradient_digest, a.gradients};
  if (a.role == AuditRole::kConfirm) {
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

  const std::tuple<uint32_t, Step, uint64_t> key{group.record.group, r.step, a.plan_id};
  auto existing = job.audits.find(key);
  PendingAudit* pa = existing == job.audits.end() ? nullptr : &existing->second;
  // The plan is derived once per audit, on its first result.
  std::optional<PendingAudit> fresh;
  if (pa == nullptr && a.role != AuditRole::kTieBreak) {
    // A step runs one audit (a targeted plan waits for a step without the
    // scheduled one): a result after its verdict, say one resent after a
    // deadline decided without it, must not open the audit again.
    auto decided = job.ledger.find(r.step);
    if (decided != job.ledger.end() && decided->second.audits.count(group.record.group) > 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "the audit of step ", r.step, " is already decided; rank ", r.rank,
          "'s result is late"));
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
      if (view.replays.contains(r.rank)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "replay result of rank ", r.rank, " at step ", r.step, " already received"));
      }
      break;
    }
    case AuditRole::kTieBreak: {
      PendingTieBreak* tb = nullptr;
      if (pa != nullptr) {
        for (PendingTieBreak& t : pa->tiebreaks) {
          if (t.tiebreak.tiebreaker == r.rank && t.tiebreak.subject == a.subject) tb = &t;
        }
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
      if (!replaying_) txn.mutation.pending_added.push_back(r);
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
  } else {
    pa->replays[r.rank] = std::move(evidence);
  }
  if (!replaying_) txn.mutation.pending_added.push_back(r);
  pa->keys.push_back(KeyOf(r));
  MaybeFinalizeAudit(job, group, key, /*deadline=*/false, txn);
  return absl::OkStatus();
}

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
                        pa.replays.size() == pa.subject_of.size();
    if (!all_in && !deadline) return;
  } else {
    bool resolved = true;
    for (const PendingTieBreak& t : pa.tiebreaks) resolved = resolved && t.result.has_value();
    if (!resolved && !deadline) return;
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
    if (pa.verdict->outcome == AuditOutcome::kTieBreakPending) {
      for (const TieBreak& t : pa.verdict->tiebreaks) {
        pa.tiebreaks.push_back({t, std::nullopt});
        txn.effects.messages.push_back(
            {job.record.job_id, group.members, TieBreakMessage{step, t.subject, t.tiebreaker}});
      }
      if (!deadline) {
        AuditVerdictMessage interim;
        interim.step = step;
        interim.outcome = AuditOutcome::kTieBreakPending;
        interim.faulty = pa.verdict->faulty;
        interim.suspects = pa.verdict->suspects;
        interim.differing_tensors = TensorNames(group, pa.verdict->differing_parameters);
        interim.explanation = pa.verdict->explanation;
        txn.effects.messages.push_back({job.record.job_id, group.members, std::move(interim)});
        return;
      }
    }
  }
  bool resolved = true;
  for (const PendingTieBreak& t : pa.tiebreaks) resolved = resolved && t.result.has_value();
  if (!resolved && !deadline) return;

  // Final verdict.
  const AuditVerdict& v = *pa.verdict;
  std::set<Rank> faulty(v.faulty.begin(), v.faulty.end());
  std::set<Rank> suspects;
  std::vector<std::string> notes = {v.explanation};
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
  const std::vector<std::string> differing = TensorNames(group, v.differing_parameters);
  const std::string explanation = absl::StrJoin(notes, "; ");

  StepVerdict verdict;
  verdict.job_id = job.record.job_id;
  verdict.group = group.record.group;
  verdict.step = step;
  verdict.check = CheckKind::kReplay;
  verdict.complete = v.missing.empty();
  verdict.failed = IsFailure(outcome);
  switch (outcome) {
    case AuditOutcome::kFaulty: {
      for (Rank r : faulty) {
        const Incident& inc = RecordIncident(
            job, group, step, CheckKind::kReplay, "faulty", {r}, true,
            absl::StrCat(Describe(job, r), " is faulty: ", explanation), differing, txn);
        if (verdict.incident_id == 0) verdict.incident_id = inc.id;
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
      verdict.incident_id = inc.id;
      break;
    }
    case AuditOutcome::kSystemic: {
      const Incident& inc = RecordIncident(job, group, step, CheckKind::kReplay, "systemic",
                                           {}, false, explanation, differing, txn);
      verdict.incident_id = inc.id;
      break;
    }
    case AuditOutcome::kPass:
    case AuditOutcome::kIncomplete:
    case AuditOutcome::kTieBreakPending:
      break;
  }
  verdict.summary = verdict.failed
                        ? absl::StrCat(AuditOutcomeName(outcome), ": ", explanation,
                                       verdict.incident_id != 0
                                           ? absl::StrCat(" (incident ", verdict.incident_id, ")")
                                           : "")
                        : v.explanation;
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

  // A targeted audit is one of the suspect's chances to be cleared or
  // confirmed; schedule the next while chances remain.
  if (pa.plan_id != 0) {
    PlanRecord& plan = job.plans[pa.plan_id];
    plan.done = true;
    txn.mutation.plans.push_back(plan);
    const Rank suspect = plan.suspect;
    const std::string& gpu = RankOf(job, suspect).placement.gpu_uuid;
    auto s = suspects_.find(gpu);
    if (s != suspects_.end() && !faulty.count(suspect) && s->second.targeted_audits_left > 0) {
      ScheduleTargetedAudit(job, group, suspect, s->second.reason, txn);
    }
  }
  txn.mutation.decided.push_back({job.record.job_id, group.record.group, step,
                                  CheckKind::kReplay, pa.plan_id, std::move(pa.keys)});
  job.audits.erase(it);
}

// ---------------------------------------------------------------------------
// Incidents, suspects, escalation

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
  if (inc.confirmed) {
    for (size_t i = 0; i < inc.ranks.size(); ++i) {
      Escalation::OpenResult opened = escalation_.Open(
          inc.nodes[i], inc.gpus[i], inc.id,
          absl::StrCat(CheckKindName(check), " check, step ", step, ": ", explanation), now);
      if (opened.request.has_value()) {
        if (inc.request_id == 0) inc.request_id = opened.request->id;
        txn.mutation.requests.push_back(*opened.request);
        txn.effects.requests.push_back(*opened.request);
      } else {
        inc.explanation += absl::StrCat(" (no replacement request: ", opened.suppressed, ")");
      }
      faulty_gpus_[inc.gpus[i]] = {job.record.job_id, inc.ranks[i], inc.nodes[i], step, inc.id};
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
                        outcome == "reproduced" || outcome == kAuditsOff;
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
    outstanding = outstanding || (!plan.done && plan.suspect == rank);
  }
  txn.mutation.suspects.push_back(s);
  if (!outstanding && (!had_chances || fresh) &&
      TopologyOf(job, group).capability() != AttributionCapability::kDetectOnly &&
      TopologyOf(job, group).capability() != AttributionCapability::kNone) {
    ScheduleTargetedAudit(job, group, rank, reason, txn);
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
      {job.record.job_id, group.members, PlanMessage{plan.plan_id, plan.assignments, plan.reason}});
}

void Coordinator::LedgerEntry::Add(const StepVerdict& v) {
  if (v.check == CheckKind::kNonFinite) applied = applied || v.applied;
  if (v.check == CheckKind::kWeights) weights[v.group] = v;
  if (v.check == CheckKind::kReplay) {
    audits.insert(v.group);
    if (!v.complete && !v.failed) incomplete_audits[v.group] = v;
  }
  if (v.failed) failures.push_back(v);
}

void Coordinator::RecordVerdict(JobState& job, StepVerdict verdict, Txn& txn) {
  job.ledger[verdict.step].Add(verdict);
  while (job.ledger.size() > options_.ledger_steps) job.ledger.erase(job.ledger.begin());
  txn.mutation.step_verdicts.push_back(std::move(verdict));
}

// ---------------------------------------------------------------------------
// Checkpoint gate

std::string Coordinator::CheckpointVeto(const JobState& job, Step step,
                                        bool* retryable) const {
  std::vector<std::string> waits;
  std::vector<std::string> vetoes;
  // 1. Every rank's step reports through `step`.
  std::vector<Rank> behind;
  for (Rank r = 0; r < job.ranks.size(); ++r) {
    const auto& slot = job.ranks[r];
    if (!slot.has_value() || !slot->record.has_last_step || slot->record.last_step < step) {
      behind.push_back(r);
    }
  }
  if (!behind.empty()) {
    waits.push_back(absl::StrCat("checks of step ", step, " not yet reported by ranks ",
                                 RankList(behind)));
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
  for (const auto& slot : job.ranks) {
    if (!slot.has_value()) continue;
    auto f = faulty_gpus_.find(slot->record.placement.gpu_uuid);
    if (f == faulty_gpus_.end()) continue;
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

// ---------------------------------------------------------------------------
// Time, operators, actuators

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
  for (ReplacementRequest& r : escalation_.ExpireDue(now)) {
    txn.mutation.requests.push_back(r);
    txn.effects.requests.push_back(std::move(r));
  }
  ExpireJobs(txn);
  absl::StatusOr<Effects> effects = Commit(txn);
  return effects.ok() ? *std::move(effects) : Effects{};
}

absl::StatusOr<std::pair<Incident, Effects>> Coordinator::ResolveIncident(
    uint64_t id, const std::string& op, const std::string& reason) {
  if (op.empty()) return absl::InvalidArgumentError("resolving an incident needs an operator");
  if (reason.empty()) return absl::InvalidArgumentError("resolving an incident needs a reason");
  absl::MutexLock lock(&mu_);
  auto it = incidents_.find(id);
  if (it == incidents_.end()) return absl::NotFoundError(absl::StrCat("no incident ", id));
  Incident& inc = it->second;
  if (!inc.resolved_by.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incident ", id, " was already resolved by ", inc.resolved_by, ": ", inc.resolution));
  }
  const ReplacementRequest* request = escalation_.Find(inc.request_id);
  if (request != nullptr && IsOpen(request->state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incident ", id, " has replacement request ", request->id, " (",
        RequestStateName(request->state), "): approve or deny it instead"));
  }
  Txn txn;
  for (const std::string& gpu : inc.gpus) {
    auto f = faulty_gpus_.find(gpu);
    if (f != faulty_gpus_.end() && f->second.incident_id == id) faulty_gpus_.erase(f);
    if (!inc.confirmed && suspects_.erase(gpu) > 0) txn.mutation.suspects_removed.push_back(gpu);
  }
  inc.resolved_by = op;
  inc.resolution = reason;
  inc.resolved = clock_->Now();
  txn.mutation.incidents.push_back(inc);
  txn.effects.notes.push_back(absl::StrCat("incident ", id, " resolved by ", op, ": ", reason));
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(inc, *std::move(effects));
}

absl::StatusOr<std::pair<ReplacementRequest, Effects>> Coordinator::Approve(
    uint64_t id, const std::string& op, const std::string& reason, bool force,
    bool dry_run) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ReplacementRequest> r =
      escalation_.Approve(id, op, reason, force, dry_run, clock_->Now());
  if (!r.ok()) return r.status();
  Txn txn;
  if (!dry_run) {
    txn.mutation.requests.push_back(*r);
    txn.effects.requests.push_back(*r);
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(*std::move(r), *std::move(effects));
}

absl::StatusOr<std::pair<ReplacementRequest, Effects>> Coordinator::Deny(
    uint64_t id, const std::string& op, const std::string& reason, bool force, bool dry_run) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ReplacementRequest> r =
      escalation_.Deny(id, op, reason, force, dry_run, clock_->Now());
  if (!r.ok()) return r.status();
  Txn txn;
  if (!dry_run) {
    // An operator who refuses the replacement judged the GPU healthy: it no
    // longer blocks checkpoints.
    for (auto it = faulty_gpus_.begin(); it != faulty_gpus_.end();) {
      auto inc = incidents_.find(it->second.incident_id);
      if (inc != incidents_.end() && inc->second.request_id == id) {
        it = faulty_gpus_.erase(it);
      } else {
        ++it;
      }
    }
    txn.mutation.requests.push_back(*r);
    txn.effects.requests.push_back(*r);
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(*std::move(r), *std::move(effects));
}

std::pair<std::vector<ReplacementRequest>, Effects> Coordinator::StartApproved(
    const std::string& actuator) {
  absl::MutexLock lock(&mu_);
  Txn txn;
  std::vector<ReplacementRequest> started;
  for (uint64_t id : escalation_.ReadyToExecute()) {
    absl::StatusOr<ReplacementRequest> r =
        escalation_.StartExecution(id, actuator, clock_->Now());
    if (!r.ok()) continue;
    txn.mutation.requests.push_back(*r);
    txn.effects.requests.push_back(*r);
    started.push_back(*std::move(r));
  }
  absl::StatusOr<Effects> effects = Commit(txn);
  return {started, effects.ok() ? *std::move(effects) : Effects{}};
}

absl::StatusOr<std::pair<ReplacementRequest, Effects>> Coordinator::FinishExecution(
    uint64_t id, bool ok, const std::string& detail) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ReplacementRequest> r =
      escalation_.FinishExecution(id, ok, detail, clock_->Now());
  if (!r.ok()) return r.status();
  Txn txn;
  txn.mutation.requests.push_back(*r);
  txn.effects.requests.push_back(*r);
  absl::StatusOr<Effects> effects = Commit(txn);
  if (!effects.ok()) return effects.status();
  return std::make_pair(*std::move(r), *std::move(effects));
}

// ---------------------------------------------------------------------------
// Queries

std::vector<JobSummary> Coordinator::ListJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobSummary> out;
  for (const auto& [id, job] : jobs_) {
    JobSummary s;
    s.job_id = id;
    s.world_size = job.record.world_size;
    s.created = job.record.created;
    std::set<std::string> nodes;
    bool all = true;
    Step last = UINT64_MAX;
    for (const auto& slot : job.ranks) {
      if (!slot.has_value()) {
        all = false;
        continue;
      }
      nodes.insert(slot->record.placement.node);
      s.attached += slot->attached ? 1 : 0;
      if (!slot->record.has_last_step) all = false;
      last = std::min(last, slot->record.last_step);
    }
    s.last_step = all ? last : 0;
    s.nodes = static_cast<uint32_t>(nodes.size());
    for (const auto& [iid, inc] : incidents_) {
      s.open_incidents += inc.job_id == id ? 1 : 0;
    }
    out.push_back(s);
  }
  return out;
}

absl::StatusOr<std::vector<RankSummary>> Coordinator::ListRanks(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", EchoJobId(job_id)));
  std::vector<RankSummary> out;
  for (const auto& slot : it->second.ranks) {
    if (!slot.has_value()) continue;
    out.push_back({job_id, slot->record.placement, slot->attached, slot->record.last_step,
                   slot->record.incarnation});
  }
  return out;
}

std::vector<Incident> Coordinator::ListIncidents(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<Incident> out;
  for (const auto& [id, inc] : incidents_) {
    if (job_id.empty() || inc.job_id == job_id) out.push_back(inc);
  }
  return out;
}

std::vector<Suspect> Coordinator::ListSuspects() const {
  absl::MutexLock lock(&mu_);
  std::vector<Suspect> out;
  for (const auto& [gpu, s] : suspects_) out.push_back(s);
  return out;
}

std::vector<ReplacementRequest> Coordinator::ListRequests() const {
  absl::MutexLock lock(&mu_);
  return escalation_.List();
}

absl::StatusOr<ReplacementRequest> Coordinator::GetRequest(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  const ReplacementRequest* r = escalation_.Find(id);
  if (r == nullptr) return absl::NotFoundError(absl::StrCat("no replacement request ", id));
  return *r;
}

absl::StatusOr<Incident> Coordinator::GetIncident(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = incidents_.find(id);
  if (it == incidents_.end()) return absl::NotFoundError(absl::StrCat("no incident ", id));
  return it->second;
}

std::pair<std::vector<Incident>, std::vector<ReplacementRequest>> Coordinator::History(
    const std::string& gpu, const std::string& node) const {
  absl::MutexLock lock(&mu_);
  std::pair<std::vector<Incident>, std::vector<ReplacementRequest>> out;
  for (const auto& [id, inc] : incidents_) {
    const bool match =
        (!gpu.empty() && std::find(inc.gpus.begin(), inc.gpus.end(), gpu) != inc.gpus.end()) ||
        (!node.empty() && std::find(inc.nodes.begin(), inc.nodes.end(), node) != inc.nodes.end());
    if (match) out.first.push_back(inc);
  }
  for (const ReplacementRequest& r : escalation_.List()) {
    const bool match =
        (!gpu.empty() && std::find(r.gpus.begin(), r.gpus.end(), gpu) != r.gpus.end()) ||
        (!node.empty() && r.node == node);
    if (match) out.second.push_back(r);
  }
  return out;
}

uint32_t Coordinator::AttachedRanks() const {
  absl::MutexLock lock(&mu_);
  uint32_t n = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& slot : job.ranks) n += slot.has_value() && slot->attached ? 1 : 0;
  }
  return n;
}

// ---------------------------------------------------------------------------
// Persistence

absl::StatusOr<Effects> Coordinator::Commit(Txn& txn) {
  if (!txn.mutation.empty()) {
    absl::StatusOr<uint64_t> ticket = store_->Apply(std::move(txn.mutation));
    if (!ticket.ok()) return ticket.status();
    txn.effects.ticket = *ticket;
  }
  return std::move(txn.effects);
}

absl::Status Coordinator::Restore() {
  absl::StatusOr<Snapshot> snap = store_->Load();
  if (!snap.ok()) return snap.status();
  absl::MutexLock lock(&mu_);
  for (const JobRecord& j : snap->jobs) {
    JobState& job = jobs_[j.job_id];
    job.record = j;
    job.ranks.resize(j.world_size);
    job.last_seen = clock_->Now();  // A full expiry period from the restart.
    held_ranks_ += j.world_size;
  }
  for (const GroupRecord& g : snap->groups) {
    auto it = jobs_.find(g.job_id);
    if (it != jobs_.end()) it->second.groups[g.group].record = g;
  }
  for (const RankRecord& r : snap->ranks) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end() || r.placement.rank >= it->second.ranks.size()) continue;
    JobState& job = it->second;
    if (!job.ranks[r.placement.rank].has_value()) ++job.said_hello;
    job.ranks[r.placement.rank] = RankState{r, false};
    job.groups[r.placement.replica_group].members.push_back(r.placement.rank);
  }
  for (auto& [id, job] : jobs_) {
    for (auto& [gid, group] : job.groups) {
      std::sort(group.members.begin(), group.members.end());
      group.topology.reset();
    }
  }
  for (const PlanRecord& p : snap->plans) {
    auto it = jobs_.find(p.job_id);
    if (it != jobs_.end()) it->second.plans[p.plan_id] = p;
  }
  for (const StepVerdict& v : snap->step_verdicts) {
    auto it = jobs_.find(v.job_id);
    if (it == jobs_.end()) continue;
    it->second.ledger[v.step].Add(v);
  }
  escalation_.Restore(snap->requests);
  for (const Incident& inc : snap->incidents) {
    next_incident_id_ = std::max(next_incident_id_, inc.id + 1);
    incidents_[inc.id] = inc;
    if (!inc.confirmed || !inc.resolved_by.empty()) continue;
    const ReplacementRequest* r = escalation_.Find(inc.request_id);
    if (r != nullptr && r->state == RequestState::kDenied) continue;
    for (size_t i = 0; i < inc.ranks.size(); ++i) {
      faulty_gpus_[inc.gpus[i]] = {inc.job_id, inc.ranks[i], inc.nodes[i], inc.step, inc.id};
    }
  }
  for (const Suspect& s : snap->suspects) suspects_[s.gpu] = s;
  for (const CheckpointDecision& d : snap->checkpoint_decisions) {
    auto it = jobs_.find(d.job_id);
    if (it == jobs_.end()) continue;
    CheckpointLedger& ledger = it->second.checkpoints;
    if (d.revocation) {
      ledger.Learn(0, {d.step});
    } else if (d.allowed) {
      ledger.Allowed(d.step);
    }
  }

  // Reports not yet finalized go through the same code again, in arrival
  // order; their decisions were never written, so nothing is decided twice.
  // Reports of a check already decided (its mark is still there: the store
  // had not removed them yet) are removed instead.
  absl::flat_hash_set<CheckId> decided;
  for (const DecidedCheck& c : snap->decided) decided.insert(IdOf(c));
  Txn settle;
  settle.mutation.decided_cleared = snap->decided;
  // A rank's stored record may predate its pending reports (the store
  // writes progress late, Mutation::progress): they carry it.
  absl::flat_hash_set<std::pair<std::string, Rank>> progressed;
  replaying_ = true;
  for (const Report& r : snap->pending) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end() || r.rank >= it->second.ranks.size() ||
        !it->second.ranks[r.rank].has_value()) {
      continue;
    }
    RankRecord& rank = RankOf(it->second, r.rank);
    const bool current = r.incarnation == rank.incarnation;
    if (current) {
      rank.acked_sequence = std::max(rank.acked_sequence, r.sequence);
      progressed.insert({r.job_id, r.rank});
    }
    if (!decided.empty() && decided.contains(IdOf(CheckOf(r, rank.placement.replica_group)))) {
      if (current && std::holds_alternative<StepReport>(r.body)) {
        // What ApplyStepReport would have recorded.
        if (!rank.has_last_step || r.step > rank.last_step) rank.last_step = r.step;
        rank.has_last_step = true;
        rank.resumed = false;
      }
      settle.mutation.pending_removed.push_back(KeyOf(r));
      continue;
    }
    Txn txn;
    if (Apply(it->second, r, txn).ok()) {
      absl::StatusOr<Effects> effects = Commit(txn);
      if (!effects.ok()) {
        replaying_ = false;
        return effects.status();
      }
    }
  }
  replaying_ = false;
  // Written before any of the reports that carry it leaves the store.
  for (const auto& [job_id, r] : progressed) {
    settle.mutation.progress.push_back(RankOf(jobs_.at(job_id), r));
  }
  if (!settle.mutation.empty()) {
    if (absl::StatusOr<Effects> effects = Commit(settle); !effects.ok()) return effects.status();
  }

  // A request that was Executing when sdcd stopped: whether its actuator
  // finished is unknown, and running it again could replace a node twice.
  // It fails, saying so; an operator checks the node and approves it again
  // with force to retry.
  for (const ReplacementRequest& r : escalation_.List()) {
    if (r.state != RequestState::kExecuting) continue;
    absl::StatusOr<ReplacementRequest> failed = escalation_.FinishExecution(
        r.id, false,
        "sdcd stopped while the actuator ran; its outcome is unknown: check the node, then "
        "approve again with --force to retry",
        clock_->Now());
    if (!failed.ok()) return failed.status();
    Txn txn;
    txn.mutation.requests.push_back(*failed);
    if (absl::StatusOr<Effects> effects = Commit(txn); !effects.ok()) return effects.status();
  }
  return absl::OkStatus();
}

}  // namespace sdc::core
