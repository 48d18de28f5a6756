#include "client/step_core.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::client {
namespace {

int64_t Hi(uint64_t v) { return static_cast<int64_t>(v >> 32); }
int64_t Lo(uint64_t v) { return static_cast<int64_t>(v & 0xffffffffu); }

// A MAX over (kLowest - rank) of the ranks that say so is the lowest of them.
constexpr int64_t kLowest = int64_t{1} << 40;
int64_t LowestSlot(bool yes, uint32_t rank) { return yes ? kLowest - rank : 0; }
int64_t LowestRank(int64_t slot) { return slot > 0 ? kLowest - slot : -1; }
// A MAX over (rank + 1) of the ranks that say so is the highest of them.
int64_t HighestSlot(bool yes, uint32_t rank) { return yes ? static_cast<int64_t>(rank) + 1 : 0; }

// The kAgreementSlots slots every layout has.
std::vector<int64_t> BaseSlots(const LocalView& v, uint32_t rank) {
  return {
      v.local_nonfinite ? 1 : 0,
      v.local_nonfinite ? -1 : 0,  // MAX is -1 only if every rank had local NaN/Inf.
      v.local_nonfinite ? static_cast<int64_t>(rank) + 1 : 0,
      v.reduced_nonfinite ? 1 : 0,
      v.audit_mismatch ? 1 : 0,
      Hi(v.reduced_digest),
      -Hi(v.reduced_digest),
      Lo(v.reduced_digest),
      -Lo(v.reduced_digest),
      -static_cast<int64_t>(v.plans_held),
      -static_cast<int64_t>(v.repair_step),
      LowestSlot(v.failed, rank),
  };
}

// Below every digest half (in [0, 2^32)) and its negation: a shard's slots
// hold this after the MAX only if no rank holds that shard.
constexpr int64_t kNoShard = -(int64_t{1} << 40);

// Below -step for any step, in a group's repair slot of a rank outside it.
constexpr int64_t kNotInGroup = -(int64_t{1} << 62);

void AppendGroupSlots(const LocalView& v, uint32_t group_index, uint32_t group_count,
                      std::vector<int64_t>& out) {
  if (group_count <= 1) return;
  const size_t at = out.size();
  out.resize(at + group_count, kNotInGroup);
  out[at + group_index] = -static_cast<int64_t>(v.repair_step);
}

}  // namespace

std::vector<int64_t> EncodeAgreement(const LocalView& v, uint32_t rank, uint32_t shard_index,
                                     uint32_t shard_count, uint32_t group_index,
                                     uint32_t group_count) {
  std::vector<int64_t> out = BaseSlots(v, rank);
  if (shard_count <= 1) {
    AppendGroupSlots(v, group_index, group_count, out);
    return out;
  }
  // The whole-group digest slots (5..8) carry nothing: every rank leaves them 0.
  for (size_t i = 5; i <= 8; ++i) out[i] = 0;
  out.resize(kAgreementSlots + kAgreementShardSlots * shard_count, kNoShard);
  const size_t at = kAgreementSlots + kAgreementShardSlots * shard_index;
  out[at] = Hi(v.reduced_digest);
  out[at + 1] = -Hi(v.reduced_digest);
  out[at + 2] = Lo(v.reduced_digest);
  out[at + 3] = -Lo(v.reduced_digest);
  AppendGroupSlots(v, group_index, group_count, out);
  return out;
}

Agreement DecodeAgreement(absl::Span<const int64_t> all, uint32_t group_count) {
  const size_t groups = group_count > 1 ? group_count : 0;
  const absl::Span<const int64_t> m = all.subspan(0, all.size() - groups);
  Agreement a;
  a.any_local_nonfinite = m[0] != 0;
  a.all_local_nonfinite = m[1] == -1;
  a.highest_local_nonfinite_rank = m[2] - 1;
  a.any_reduced_nonfinite = m[3] != 0;
  a.audit_mismatch = m[4] != 0;
  a.reduced_digests_differ = m[5] != -m[6] || m[7] != -m[8];
  for (size_t at = kAgreementSlots, shard = 0; at + kAgreementShardSlots <= m.size();
       at += kAgreementShardSlots, ++shard) {
    if (m[at] == kNoShard) continue;
    if (m[at] != -m[at + 1] || m[at + 2] != -m[at + 3]) {
      a.reduced_digests_differ = true;
      if (a.reduced_differ_shard < 0) a.reduced_differ_shard = static_cast<int64_t>(shard);
    }
  }
  a.plans_held_by_all = static_cast<uint64_t>(-m[9]);
  a.repair_step_known_by_all = static_cast<uint64_t>(-m[10]);
  a.lowest_failed_rank = LowestRank(m[11]);
  if (groups == 0) {
    a.repair_step_by_group = {a.repair_step_known_by_all};
  } else {
    for (size_t g = 0; g < groups; ++g) {
      const int64_t slot = all[m.size() + g];
      a.repair_step_by_group.push_back(slot == kNotInGroup ? 0 : static_cast<uint64_t>(-slot));
    }
  }
  return a;
}

ReplicaGroups::ReplicaGroups(std::vector<uint32_t> group_of_rank)
    : group_of_rank_(std::move(group_of_rank)), ids_(group_of_rank_) {
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
}

uint32_t ReplicaGroups::index_of(uint32_t rank) const {
  const uint32_t id = group_of_rank_.at(rank);
  return static_cast<uint32_t>(std::lower_bound(ids_.begin(), ids_.end(), id) - ids_.begin());
}

std::vector<uint32_t> ReplicaGroups::members(uint32_t index) const {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < group_of_rank_.size(); ++r) {
    if (group_of_rank_[r] == ids_.at(index)) out.push_back(r);
  }
  return out;
}

RepairPlan PlanRepair(const std::vector<uint32_t>& members,
                      const std::vector<uint64_t>& digest_by_rank, uint32_t hint) {
  std::map<uint64_t, size_t> holders;
  for (uint32_t r : members) ++holders[digest_by_rank.at(r)];
  auto majority = [&](uint32_t r) { return holders[digest_by_rank.at(r)] * 2 > members.size(); };
  RepairPlan plan;
  if (std::find(members.begin(), members.end(), hint) != members.end() && majority(hint)) {
    plan.source = hint;
  } else {
    for (uint32_t r : members) {
      if (majority(r)) {
        plan.source = r;
        break;
      }
    }
  }
  if (!plan.source.has_value()) return plan;
  for (uint32_t r : members) {
    if (digest_by_rank.at(r) != digest_by_rank.at(*plan.source)) plan.receivers.push_back(r);
  }
  return plan;
}

Decision Decide(const Agreement& a, bool loss_scaled) {
  Decision d;
  std::vector<std::string> reasons;
  std::string nonfinite;
  if (a.any_local_nonfinite) {
    nonfinite = a.all_local_nonfinite ? "NaN/Inf in every rank's local gradients"
                                      : absl::StrCat("NaN/Inf in the local gradients of rank ",
                                                     a.highest_local_nonfinite_rank);
  } else if (a.any_reduced_nonfinite) {
    nonfinite = "NaN/Inf in the reduced gradients";
  }
  // Under a loss scaler NaN/Inf is the scaler's overflow, unless it reached
  // only some ranks through the all-reduce (then the reduced gradients
  // differ, which is a failed check of its own).
  d.overflow = loss_scaled && (a.any_local_nonfinite ||
                               (a.any_reduced_nonfinite && !a.reduced_digests_differ));
  if (d.overflow) {
    reasons.push_back(absl::StrCat("loss scaler overflow (", nonfinite, ")"));
  } else if (!nonfinite.empty()) {
    reasons.push_back(nonfinite);
    d.failed_check = true;
  }
  if (a.reduced_differ_shard >= 0) {
    reasons.push_back(absl::StrCat("the replicas of shard ", a.reduced_differ_shard,
                                   " received different reduced gradients"));
  } else if (a.reduced_digests_differ) {
    reasons.push_back("ranks received different reduced gradients");
  }
  if (a.audit_mismatch) reasons.push_back("replay audit mismatch");
  d.failed_check = d.failed_check || a.reduced_digests_differ || a.audit_mismatch;
  d.apply = reasons.empty();
  d.reason = absl::StrJoin(reasons, "; ");
  return d;
}

std::vector<int64_t> EncodeAuditGate(const AuditGateView& v, uint32_t rank) {
  return {v.nondeterministic ? 1 : 0, HighestSlot(v.preflight_loss, rank),
          HighestSlot(v.preflight_gradients, rank), HighestSlot(v.preflight_buffers, rank),
          LowestSlot(v.failed, rank)};
}

AuditGate DecodeAuditGate(absl::Span<const int64_t> m) {
  AuditGate g;
  g.nondeterministic = m[0] != 0;
  g.preflight_loss_rank = m[1] - 1;
  g.preflight_gradients_rank = m[2] - 1;
  g.preflight_buffers_rank = m[3] - 1;
  g.lowest_failed_rank = LowestRank(m[4]);
  return g;
}

std::string PreflightDifferences(const AuditGate& g) {
  std::vector<std::string> what;
  if (g.preflight_loss_rank >= 0) {
    what.push_back(absl::StrCat("the loss differs (rank ", g.preflight_loss_rank, ")"));
  }
  if (g.preflight_gradients_rank >= 0) {
    what.push_back(absl::StrCat("the gradients differ (rank ", g.preflight_gradients_rank, ")"));
  }
  if (g.preflight_buffers_rank >= 0) {
    what.push_back(absl::StrCat("the buffers the forward left differ (rank ",
                                g.preflight_buffers_rank, ")"));
  }
  return absl::StrJoin(what, "; ");
}

std::string PreflightFailure(const AuditGate& g, uint64_t step) {
  return absl::StrCat(
      "preflight at step ", step,
      ": replaying a rank's own first micro-batch with loss_fn did not reproduce what it trained "
      "on: ", PreflightDifferences(g),
      ". Every audit compares a peer's replay with those bits, so each would be skipped as "
      "systemic; the guard stops here instead. Likely causes, and the fix for each:\n"
      "  - autocast (or another precision context) around the forward but not inside loss_fn: "
      "put the `with torch.autocast(...)` inside loss_fn, so training and replays run it alike;\n"
      "  - a token-weighted loss (Hugging Face's num_items_in_batch, a sum divided by a count "
      "over every micro-batch or rank): carry the count in the batch and divide by it inside "
      "loss_fn;\n"
      "  - a loss term added outside loss_fn (an auxiliary or MoE load-balancing loss, a "
      "regulariser): add it inside loss_fn;\n"
      "  - a non-deterministic op, or randomness the guard does not capture (Python's random, "
      "NumPy, a torch.Generator of your own): draw from torch's default generator, and use ops "
      "that torch.use_deterministic_algorithms(True) accepts;\n"
      "  - gradients changed between backward and the end of the guarded step (a hook, "
      "clipping or unscaling inside the block): do it after the block.\n"
      "The loss passed to s.backward must be exactly loss_fn(model.module, batch) / "
      "micro_batches (times the GradScaler's scale, via scaler.scale).");
}

std::vector<int64_t> EncodeFailure(const absl::Status& status) {
  std::vector<int64_t> words(kFailureSlots, 0);
  const absl::string_view text = status.message().substr(0, kFailureTextBytes);
  words[0] = static_cast<int64_t>(status.code());
  words[1] = static_cast<int64_t>(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    words[2 + i / 8] |= static_cast<int64_t>(static_cast<uint8_t>(text[i])) << (8 * (i % 8));
  }
  return words;
}

absl::Status DecodeFailure(absl::Span<const int64_t> words) {
  if (words.size() < kFailureSlots) return absl::InternalError("a malformed failure");
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(words[1], 0)),
                                    kFailureTextBytes);
  std::string text(n, ' ');
  for (size_t i = 0; i < n; ++i) {
    text[i] = static_cast<char>((static_cast<uint64_t>(words[2 + i / 8]) >> (8 * (i % 8))) & 0xff);
  }
  const int code = static_cast<int>(words[0]);
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(text);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), text);
}

void PlanQueue::Add(uint64_t plan_id, uint32_t group, bool watch, bool empty) {
  if (plan_id == 0) return;
  plans_.emplace(plan_id, Held{group, watch, empty});
  while (plans_.count(held_ + 1) > 0) ++held_;
}

PlanQueue::Choice PlanQueue::Take(uint64_t held_by_all, uint32_t group) {
  const uint64_t limit = std::min(held_by_all, held_);
  while (cursor_ < limit) {
    const uint64_t id = ++cursor_;
    const Held& h = plans_.at(id);
    if (!h.watch) {
      one_offs_[h.group].push_back(id);
    } else if (h.empty) {
      watches_.erase(h.group);
    } else {
      watches_[h.group] = id;
    }
  }
  Choice c;
  std::set<uint32_t> groups;
  for (const auto& [g, q] : one_offs_) groups.insert(g);
  for (const auto& [g, w] : watches_) groups.insert(g);
  for (uint32_t g : groups) {
    uint64_t id = 0;
    auto q = one_offs_.find(g);
    if (q != one_offs_.end() && !q->second.empty()) {
      id = q->second.front();
      q->second.pop_front();
    } else if (auto w = watches_.find(g); w != watches_.end()) {
      id = w->second;
    }
    if (id == 0) continue;
    c.audit = true;
    if (g == group) c.plan_id = id;
  }
  return c;
}

uint64_t PlanQueue::watch(uint32_t group) const {
  auto w = watches_.find(group);
  return w == watches_.end() ? 0 : w->second;
}

bool IsExchangeStep(uint64_t step, uint32_t audit_every) {
  const uint32_t every = audit_every > 0 ? audit_every : kExchangeEveryWithoutAudits;
  return step % every == 0;
}

StepPlan PlanStep(uint64_t step, uint32_t audit_every, uint32_t weight_check_every,
                  uint64_t activated_plan) {
  StepPlan p;
  p.scheduled_audit = protocol::IsScheduledAuditStep(step, audit_every);
  if (!p.scheduled_audit) p.targeted_plan = activated_plan;
  p.weight_check = weight_check_every > 0 && step % weight_check_every == 0;
  return p;
}

std::vector<int64_t> EncodeAudit(const AuditExchange& a) {
  return {static_cast<int64_t>(a.original_loss_bits), static_cast<int64_t>(a.original_digest),
          a.replay_subject, static_cast<int64_t>(a.replay_loss_bits),
          static_cast<int64_t>(a.replay_digest), a.has_original ? 1 : 0, a.failed ? 1 : 0};
}

std::vector<AuditExchange> DecodeAudits(absl::Span<const int64_t> g, uint32_t world) {
  std::vector<AuditExchange> out(world);
  for (uint32_t r = 0; r < world; ++r) {
    const int64_t* s = g.data() + kAuditSlots * r;
    out[r] = {static_cast<uint64_t>(s[0]), static_cast<uint64_t>(s[1]), s[2],
              static_cast<uint64_t>(s[3]), static_cast<uint64_t>(s[4]), s[5] != 0, s[6] != 0};
  }
  return out;
}

bool MismatchesFollowStacks(const std::vector<AuditExchange>& audits,
                            const std::vector<uint64_t>& stack_digests) {
  auto stack = [&](size_t r) -> uint64_t {
    return r < stack_digests.size() ? stack_digests[r] : 0;
  };
  bool any = false;
  for (size_t k = 0; k < audits.size(); ++k) {
    const int64_t s = audits[k].replay_subject;
    if (s < 0 || static_cast<size_t>(s) >= audits.size() || !audits[s].has_original) continue;
    const AuditExchange& o = audits[s];
    if (audits[k].replay_loss_bits == o.original_loss_bits &&
        audits[k].replay_digest == o.original_digest) {
      continue;
    }
    any = true;
    const uint64_t a = stack(k), b = stack(static_cast<size_t>(s));
    if (a == 0 || b == 0 || a == b) return false;
  }
  return any;
}

protocol::AuditVerdict InBandVerdict(const protocol::ReplayPlan& plan,
                                     const protocol::Topology& topology,
                                     const std::vector<AuditExchange>& audits, bool deterministic,
                                     uint64_t step) {
  absl::flat_hash_map<protocol::Rank, protocol::Evidence> originals, replays;
  for (uint32_t r = 0; r < audits.size(); ++r) {
    if (audits[r].has_original) {
      originals[r] = {audits[r].original_loss_bits, audits[r].original_digest, {}};
    }
    if (audits[r].replay_subject >= 0) {
      replays[r] = {audits[r].replay_loss_bits, audits[r].replay_digest, {}};
    }
  }
  protocol::AuditInput in;
  in.plan = &plan;
  in.topology = &topology;
  in.originals = &originals;
  in.replays = &replays;
  in.compare_gradients = deterministic;
  in.salt = step;  // The coordinator salts its tie-breaker choice with the step too.
  return protocol::Attribute(in);
}

}  // namespace sdc::client
