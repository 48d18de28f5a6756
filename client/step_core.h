#ifndef SDC_CLIENT_STEP_CORE_H_
#define SDC_CLIENT_STEP_CORE_H_

// The trainer-side step logic that decides things, as plain C++ (no torch,
// no process group): what a step checks, the in-band agreement every rank
// contributes to, and the single apply-or-skip decision every rank derives
// from it. client/guard.cc feeds it tensors' results and runs the
// collectives; tests drive it directly.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "protocol/attribution.h"
#include "protocol/replay_plan.h"

namespace sdc::client {

// What one rank saw in one step, before the agreement all-reduce.
struct LocalView {
  bool local_nonfinite = false;    // NaN/Inf in its local gradients.
  bool reduced_nonfinite = false;  // NaN/Inf in its reduced gradients.
  bool audit_mismatch = false;     // The in-band audit found a mismatch.
  uint64_t reduced_digest = 0;     // Digest of its reduced gradients.
  uint64_t plans_held = 0;         // Highest contiguous targeted plan id it holds.
  uint64_t repair_step = 0;        // Step of the newest weight minority verdict it holds.
  bool failed = false;             // An error on this rank in the step's checks (see Finish).
};

// What every rank agrees on after the all-reduce (MAX) of EncodeAgreement.
struct Agreement {
  bool any_local_nonfinite = false;
  bool all_local_nonfinite = false;
  int64_t highest_local_nonfinite_rank = -1;
  bool any_reduced_nonfinite = false;
  bool audit_mismatch = false;
  bool reduced_digests_differ = false;
  // Under a sharded layout: the lowest shard whose replicas received
  // different reduced gradients; -1 when none did (or not sharded).
  int64_t reduced_differ_shard = -1;
  uint64_t plans_held_by_all = 0;   // Minimum over ranks.
  uint64_t repair_step_known_by_all = 0;  // Minimum over ranks.
  // By replica group index (ReplicaGroups::index_of): the minimum over the
  // group's ranks of the newest weight-minority verdict each holds. One
  // entry (repair_step_known_by_all) when the job has one group; empty in a
  // default Agreement (no exchange ran: no repair).
  std::vector<uint64_t> repair_step_by_group;
  int64_t lowest_failed_rank = -1;  // The lowest rank whose checks failed this step; -1: none.
};

// The slots of the agreement all-reduce. Minimums travel negated so one MAX
// reduction carries both; digests travel as 32-bit halves so negation never
// overflows.
//
// Under a sharded layout (`shard_count` > 1: an HSDP module whose ranks hold
// `shard_count` different shards) only the replicas of one shard receive the
// same reduced gradients, so the digests are compared per shard: the
// encoding has kAgreementShardSlots more slots per shard, a rank fills its
// own shard's and leaves the others at a value below any digest half, and
// every rank still takes part in one all-reduce. Every rank of a job passes
// the same `shard_count`; DecodeAgreement reads it from the length.
//
// With several replica groups on one process group (`group_count` > 1,
// issue 39 case 6) each group repairs on its own verdicts, which sdcd sends
// to that group's ranks only: one more slot per group, after the shard
// slots, where a rank puts its newest verdict's step (negated) in its own
// group's slot and leaves the others below any step, so each group's slot
// ends as the minimum over that group's ranks. Every rank of a job passes
// the same `group_count`, and DecodeAgreement the same again.
inline constexpr size_t kAgreementSlots = 12;
inline constexpr size_t kAgreementShardSlots = 4;
std::vector<int64_t> EncodeAgreement(const LocalView& view, uint32_t rank,
                                     uint32_t shard_index = 0, uint32_t shard_count = 0,
                                     uint32_t group_index = 0, uint32_t group_count = 0);
Agreement DecodeAgreement(absl::Span<const int64_t> maxed, uint32_t group_count = 0);

// The replica groups of a job (SDC_REPLICA_GROUP, any 32-bit ids), as every
// rank learns them from the set-up's exchange: the group of each rank, and
// a dense index per group (the ids ascending), the same on every rank.
class ReplicaGroups {
 public:
  ReplicaGroups() = default;
  // `group_of_rank`: each rank's group id, by rank.
  explicit ReplicaGroups(std::vector<uint32_t> group_of_rank);
  size_t count() const { return ids_.size(); }
  // The dense index of rank `rank`'s group. REQUIRES: rank < ranks().
  uint32_t index_of(uint32_t rank) const;
  // The group id at a dense index.
  uint32_t id(uint32_t index) const { return ids_.at(index); }
  // The ranks of the group at dense index `index`, ascending.
  std::vector<uint32_t> members(uint32_t index) const;
  size_t ranks() const { return group_of_rank_.size(); }

 private:
  std::vector<uint32_t> group_of_rank_;
  std::vector<uint32_t> ids_;  // Distinct, ascending.
};

// Who copies to whom when a replica group repairs (issue 39, cases 6 and 8),
// from every member's digest now (weights, and optimizer state, combined):
// the source is `hint` (the verdict's majority rank) if a strict majority of
// `members` holds its digest, else the lowest member that holds such a
// digest, else nobody (no strict majority: no copy). The receivers are the
// members whose digest differs from the source's (none need a copy
// otherwise; a healthy replica's own buffers and state stay its own).
struct RepairPlan {
  std::optional<uint32_t> source;
  std::vector<uint32_t> receivers;  // Ascending; empty without a source.
};
// REQUIRES: every member < digest_by_rank.size().
RepairPlan PlanRepair(const std::vector<uint32_t>& members,
                      const std::vector<uint64_t>& digest_by_rank, uint32_t hint);

struct Decision {
  bool apply = true;
  std::string reason;  // Why the step is skipped; empty when applied.
  // Under a loss scaler: NaN/Inf the scaler overflowed into (in some rank's
  // local gradients, or in every rank's reduced ones alike). The scaler
  // skips the step and backs off, so the gradients keep their NaN/Inf for
  // it to find.
  bool overflow = false;
  // A check failed: anything but the scaler's overflow. The in-band
  // checkpoint fallback vetoes the next checkpoint.
  bool failed_check = false;
};

// The same on every rank, because it reads only the agreement (and whether
// the step ran under a loss scaler, which every rank of a job does alike).
Decision Decide(const Agreement& a, bool loss_scaled = false);

// The gate of an audit step, one MAX all-reduce before any replay
// exchange: did a rank run an op without a deterministic implementation,
// did a rank's preflight replay of its own micro-batch differ from what it
// trained on (and in what), did a rank's checks already fail this step.
struct AuditGateView {
  bool nondeterministic = false;
  bool preflight_loss = false;       // The loss bits differ.
  bool preflight_gradients = false;  // The gradients' fingerprints differ.
  bool preflight_buffers = false;    // The buffers after the forward differ.
  bool failed = false;
};
struct AuditGate {
  bool nondeterministic = false;
  // The highest rank whose preflight found each difference; -1: none.
  int64_t preflight_loss_rank = -1;
  int64_t preflight_gradients_rank = -1;
  int64_t preflight_buffers_rank = -1;
  int64_t lowest_failed_rank = -1;
  bool preflight_failed() const {
    return preflight_loss_rank >= 0 || preflight_gradients_rank >= 0 ||
           preflight_buffers_rank >= 0;
  }
};
inline constexpr size_t kAuditGateSlots = 5;
std::vector<int64_t> EncodeAuditGate(const AuditGateView& view, uint32_t rank);
AuditGate DecodeAuditGate(absl::Span<const int64_t> maxed);

// What a failed preflight found, on which rank: "the loss differs (rank 2);
// the gradients differ (rank 2)".
std::string PreflightDifferences(const AuditGate& gate);
// What every rank says when a preflight failed (the same text on every
// rank): what differed, on which rank, the likely causes and how to fix each.
std::string PreflightFailure(const AuditGate& gate, uint64_t step);

// A rank's error, as the words every rank all-gathers once the agreement
// says a rank failed, so every rank raises the same error: the status code
// and up to kFailureTextBytes of its message.
inline constexpr size_t kFailureSlots = 32;
inline constexpr size_t kFailureTextBytes = (kFailureSlots - 2) * 8;
std::vector<int64_t> EncodeFailure(const absl::Status& status);
absl::Status DecodeFailure(absl::Span<const int64_t> words);

// Which checks run at a step.
struct StepPlan {
  // protocol::IsScheduledAuditStep, the schedule sdcd checks results
  // against; its plan is protocol::ScheduledAudit.
  bool scheduled_audit = false;
  uint64_t targeted_plan = 0;  // Non-zero: run this targeted plan.
  bool weight_check = false;
};

// The plans sdcd sent, numbered per job from 1: one-off targeted audits and
// standing watches (v1::AuditPlan::watch, issue 42 item 4), each for one
// replica group. Every rank holds every group's plans (so ids stay
// contiguous) and gets the same agreed minimum, so every rank of the
// process group decides alike whether a step audits, and the ranks of each
// group which of their group's plans it runs (issue 39, case 6: with one
// minimum over groups that each held only their own plans, none ran).
class PlanQueue {
 public:
  // Plan `plan_id` of replica group `group`; `watch`: a standing watch,
  // `empty`: it assigns nothing (a watch that ends the group's previous
  // one). A repeat is ignored.
  void Add(uint64_t plan_id, uint32_t group, bool watch, bool empty);
  // The highest contiguous plan id held (the agreement's input).
  uint64_t held() const { return held_; }

  struct Choice {
    // Some group runs a plan: every rank of the process group audits (the
    // audit's all-gather spans it), with nothing to replay where its own
    // group runs none.
    bool audit = false;
    uint64_t plan_id = 0;  // The plan of `group`'s ranks; 0: none.
  };
  // The choice of a step without a scheduled audit, given that every rank
  // holds the plans up to `held_by_all`, for a rank of `group`: per group,
  // its oldest one-off not yet taken (taken by this call), else its newest
  // watch unless empty. Every rank must call it at the same steps.
  Choice Take(uint64_t held_by_all, uint32_t group);
  // `group`'s watch in force (0: none).
  uint64_t watch(uint32_t group) const;

 private:
  struct Held {
    uint32_t group = 0;
    bool watch = false;
    bool empty = false;
  };
  std::map<uint64_t, Held> plans_;
  uint64_t held_ = 0;
  uint64_t cursor_ = 0;  // Plans up to here were queued (one-offs) or seen (watches).
  std::map<uint32_t, std::deque<uint64_t>> one_offs_;  // By group, not yet taken.
  std::map<uint32_t, uint64_t> watches_;               // By group, in force.
};

// Whether every rank runs the agreement all-reduce at `step` whatever its
// buckets held: the scheduled audit steps (audits on or off), or every
// kExchangeEveryWithoutAudits-th step when the job schedules none. Between
// them an ordinary step issues no collective of the guard's own (see
// docs/ARCHITECTURE.md, "Ordinary steps"): the agreement also runs at any
// step whose reduced gradients hold NaN/Inf, which every rank sees alike.
// Targeted plans and weight repairs wait for the next exchange step.
inline constexpr uint32_t kExchangeEveryWithoutAudits = 100;
bool IsExchangeStep(uint64_t step, uint32_t audit_every);

// REQUIRES: audit_every/weight_check_every as in the job's options.
// `activated_plan` is a targeted plan all ranks hold, not yet run.
StepPlan PlanStep(uint64_t step, uint32_t audit_every, uint32_t weight_check_every,
                  uint64_t activated_plan);

// One rank's audit results as exchanged in-band (all-gathered int64s).
struct AuditExchange {
  uint64_t original_loss_bits = 0;
  uint64_t original_digest = 0;
  int64_t replay_subject = -1;  // -1: this rank replayed nobody.
  uint64_t replay_loss_bits = 0;
  uint64_t replay_digest = 0;
  bool has_original = false;
  bool failed = false;  // This rank's exchange or replay raised: no verdict this step.
};

inline constexpr size_t kAuditSlots = 7;
std::vector<int64_t> EncodeAudit(const AuditExchange& a);
std::vector<AuditExchange> DecodeAudits(absl::Span<const int64_t> gathered, uint32_t world);

// Issue 39, case 3, in-band: true when the audit has a mismatch and every
// mismatching comparison (a replayer's result against its subject's
// original) is between two ranks whose software stacks differ
// (`stack_digests`, by rank: SoftwareStack::Digest; 0, unknown, never
// differs). Such a step is not failed in-band: two stacks compute
// different, equally correct results, and the weights are not suspect. A
// mismatch between ranks on one stack still fails it. The same weakness as
// sdcd's rule (ExplainBySoftware): a real fault of a rank whose every
// partner is on another stack passes as software until the fleet is on one
// stack again.
bool MismatchesFollowStacks(const std::vector<AuditExchange>& audits,
                            const std::vector<uint64_t>& stack_digests);

// The in-band verdict every rank computes from the exchanged digests, with
// the coordinator's own rules (protocol::Attribute): identical on every rank.
protocol::AuditVerdict InBandVerdict(const protocol::ReplayPlan& plan,
                                     const protocol::Topology& topology,
                                     const std::vector<AuditExchange>& audits, bool deterministic,
                                     uint64_t step);

}  // namespace sdc::client

#endif  // SDC_CLIENT_STEP_CORE_H_
