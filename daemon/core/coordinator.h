#ifndef SDC_DAEMON_CORE_COORDINATOR_H_
#define SDC_DAEMON_CORE_COORDINATOR_H_

// The coordinator's decision-making heart: registry of jobs and ranks, the
// step ledger, check 1's cross-rank analysis, the replay audit's attribution,
// the weight vote, the checkpoint gate and escalation, behind one entry point
// per input. No gRPC, files, flags or wall clock: time comes from a Clock and
// every state change goes to a Store as one Mutation per call.
//
// Thread-safe: one mutex serializes every call (each is short; the vote of
// 16,384 ranks is a few milliseconds).

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/core/escalation.h"
#include "daemon/core/records.h"
#include "daemon/core/store.h"
#include "daemon/core/types.h"
#include "daemon/core/weight_vote.h"

namespace sdc::core {

struct CoordinatorOptions {
  // A step's checks finalize when every rank of the group reported, or after
  // this long with what arrived (missing ranks are named). Default: 120s.
  absl::Duration report_deadline = absl::Seconds(120);
  // Targeted audits scheduled for an unconfirmed suspect. Default: 3.
  uint32_t targeted_audits_per_suspect = 3;
  // Finalized per-step verdicts kept per job for the checkpoint gate.
  // Default: 4096 steps.
  size_t ledger_steps = 4096;
  // What one sdcd holds, whoever reaches its trainer port: at most this many
  // jobs, and this many ranks over all of them (the sum of their world
  // sizes). A Hello for a new job beyond either is refused
  // (ResourceExhausted) after abandoned jobs expire. Defaults: 1024 jobs,
  // 262,144 ranks.
  size_t max_jobs = 1024;
  uint64_t max_ranks = uint64_t{1} << 18;
  // A job with no rank attached and no report for this long is abandoned: it
  // is dropped from memory and from the store (its incidents, requests and
  // suspects stay). Default: 72 hours.
  absl::Duration job_expiry = absl::Hours(72);
  // Quotas by identity (docs/operations.md, "Trust model"), so that no
  // caller locks others out. A job holds, against max_ranks, only what its
  // nodes can hold: min(world size, the sum of its identities' capacities),
  // where a node proven by its caller holds as many ranks as its agent
  // listed GPUs, else max_ranks_per_node, and each node an unauthenticated
  // rank names counts as one more such node. Rank slots a node fills in one
  // job are bounded by its capacity. Unauthenticated ranks together hold at
  // most max_unauthenticated_ranks. Each identity (a proven node, or every
  // unauthenticated caller together) holds at most max_jobs_per_identity
  // jobs (its own abandoned jobs go first to make room) and
  // max_layout_bytes_per_identity of weight layouts (the tensor names of the
  // replica groups its Hellos created). Defaults: 16 ranks per node, 4,096
  // unauthenticated ranks, 64 jobs and 256 MiB per identity.
  uint32_t max_ranks_per_node = 16;
  uint64_t max_unauthenticated_ranks = 4096;
  size_t max_jobs_per_identity = 64;
  uint64_t max_layout_bytes_per_identity = uint64_t{256} << 20;
  // One job opens at most this many replacement requests at once (it may
  // join those already open for its nodes); 0: half of
  // escalation.max_open_requests, at least 1.
  int max_open_requests_per_job = 0;
  // A new attempt that resumes from a checkpoint the gate never called
  // final (provisional, revoked, or never allowed): kWarn (the default)
  // starts it and says why in the operator's log and to its ranks
  // (AttachResult::resume_warning); kRefuse refuses its Hellos.
  enum class ResumePolicy { kWarn, kRefuse };
  ResumePolicy resume_policy = ResumePolicy::kWarn;
  EscalationPolicy escalation;
};

// Who sent a Hello, as sdcd's edge proved it (docs/operations.md, "Trust
// model"): evidence about a node counts only from a caller proven to be that
// node.
struct Caller {
  // The node the caller proved to be: the name its node certificate gives,
  // or the node of the authenticated agent that relays it. Empty: the caller
  // proved nothing; its ranks are recorded, but their evidence can never open
  // a replacement request.
  std::string node;
  // How it was proved, for operators ("certificate", "relay", ...).
  std::string proof;
  // The GPU ids that node's agent listed; empty when it listed none (or has
  // not registered): any GPU id is then taken as the rank's.
  std::vector<std::string> gpus;
};

// A message to trainer ranks and its recipients.
struct OutMessage {
  std::string job_id;
  std::vector<Rank> ranks;  // Recipients.
  CoordinatorMessage body;
};

// A check that finished, for metrics: check kind and result word.
struct CheckEvent {
  CheckKind check = CheckKind::kNonFinite;
  std::string result;  // "pass", "faulty", "suspect", "systemic", ...
  absl::Duration latency;  // First report of the step to the verdict.
};

// What one call changed. Send `messages` and acknowledge only after the
// store reports `ticket` durable.
struct Effects {
  uint64_t ticket = 0;  // 0: nothing was written.
  bool duplicate = false;
  uint64_t acked_sequence = 0;
  std::vector<OutMessage> messages;
  std::vector<Incident> incidents;
  std::vector<ReplacementRequest> requests;
  std::vector<CheckEvent> checks;
  uint32_t skipped_steps = 0;  // Steps some rank reported as skipped.
  std::vector<std::string> expired_jobs;  // Abandoned jobs dropped (Tick).
  std::vector<std::string> notes;         // Lines for the operator's log.
};

struct AttachResult {
  uint64_t acked_sequence = 0;
  std::vector<PlanMessage> pending_plans;
  uint64_t attempt = 0;        // The job's attempt, as sdcd holds it.
  std::string resume_warning;  // Why the attempt's resume is doubtful; empty: it is not.
  Effects effects;
};

struct CheckpointResult {
  bool allowed = false;
  // True when the veto is only a wait (reports or verdicts still to come):
  // asking again later may be allowed. Final decisions are persisted.
  bool retryable = false;
  std::string reason;
  // Checkpoints up to here are final (0: none); `revoked` were provisional
  // and must be deleted (see CheckpointDecision in proto/trainer.proto).
  Step confirmed_through = 0;
  std::vector<Step> revoked;
  Effects effects;
};

struct JobSummary {
  std::string job_id;
  uint32_t world_size = 0;
  uint32_t attached = 0;
  Step last_step = 0;
  absl::Time created;
  uint32_t open_incidents = 0;
  uint32_t nodes = 0;
  uint64_t attempt = 0;
};

struct RankSummary {
  std::string job_id;
  Placement placement;
  bool attached = false;
  Step checks_through = 0;
  uint64_t incarnation = 0;
  std::string identity;  // RankRecord's: who proved the placement, how, or why not.
  std::string proof;
  std::string unproven;
};

class Coordinator {
 public:
  Coordinator(CoordinatorOptions options, const Clock* clock, Store* store);

  // Rebuilds state from the store: records, then unfinalized reports in
  // arrival order. Call once, before anything else.
  absl::Status Restore() ABSL_LOCKS_EXCLUDED(mu_);

  // A rank's Hello from `caller`. InvalidArgument for malformed hellos;
  // FailedPrecondition when it contradicts the job (world size, cadence,
  // layout) within its attempt, names an older attempt, or resumes from a
  // checkpoint that is not final under ResumePolicy::kRefuse; a higher
  // attempt starts it (StartAttempt); PermissionDenied when the caller proved a node other
  // than the one the Hello names, or is unauthenticated and the rank is held
  // by a proven caller; ResourceExhausted past a quota (CoordinatorOptions).
  absl::StatusOr<AttachResult> Attach(const Hello& hello, const Caller& caller)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The rank's stream ended.
  void Detach(const std::string& job_id, Rank rank, uint64_t incarnation)
      ABSL_LOCKS_EXCLUDED(mu_);

  // One report. Idempotent: a sequence already acknowledged returns
  // duplicate=true and changes nothing. Errors leave the state unchanged:
  // NotFound (unknown job), InvalidArgument (bad rank, bad step, wrong tensor
  // count, a role the plan does not give), FailedPrecondition (no Hello, stale
  // incarnation), OutOfRange (a gap in sequence numbers), AlreadyExists (a
  // second report of the same kind for the same step).
  //
  // Order between ranks is not an error: reports that come early are held
  // (an audit result before every rank of the job said Hello, a tie-break
  // result before its audit is attributed) and those that come late are
  // taken and judged after the fact (see "Late reports" in
  // docs/ARCHITECTURE.md): after an outage ranks come back in any order.
  absl::StatusOr<Effects> Ingest(const Report& report) ABSL_LOCKS_EXCLUDED(mu_);

  // A report Ingest refused with `why` (InvalidArgument or AlreadyExists)
  // is consumed: the rank's acknowledged sequence moves past it, so the
  // rank drops it and the reports behind it flow on; the refusal goes to the
  // operator's log (Effects::notes). Only the next sequence (or one already
  // acknowledged) can be consumed: FailedPrecondition otherwise, or when the
  // report's rank or incarnation is not the attached one.
  absl::StatusOr<Effects> Consume(const Report& report, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The checkpoint gate; the decision is persisted. NotFound for unknown jobs.
  // An allowed checkpoint is provisional; the next allowed one confirms it,
  // and a GPU attributed faulty before that revokes it.
  absl::StatusOr<CheckpointResult> MayCheckpoint(const std::string& job_id, Step step)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Which checkpoints are confirmed and revoked, deciding nothing (allowed is
  // false). NotFound for unknown jobs.
  absl::StatusOr<CheckpointResult> CheckpointStatus(const std::string& job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Deadlines and expiry. Call periodically.
  Effects Tick() ABSL_LOCKS_EXCLUDED(mu_);

  // Operators.
  // Closes incident `id` (audited: who, why): a confirmed incident's GPUs
  // stop vetoing their job's checkpoints, a suspect's GPUs stop being
  // suspects. NotFound, InvalidArgument (no operator or reason),
  // FailedPrecondition (already resolved, or nothing to clear: a request
  // still open for it is the way, approve or deny it).
  absl::StatusOr<std::pair<Incident, Effects>> ResolveIncident(uint64_t id, const std::string& op,
                                                               const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::pair<ReplacementRequest, Effects>> Approve(
      uint64_t id, const std::string& op, const std::string& reason, bool force,
      bool dry_run) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::pair<ReplacementRequest, Effects>> Deny(
      uint64_t id, const std::string& op, const std::string& reason, bool force,
      bool dry_run) ABSL_LOCKS_EXCLUDED(mu_);

  // Actuators: take Approved requests (moving them to Executing), then
  // report each result.
  std::pair<std::vector<ReplacementRequest>, Effects> StartApproved(
      const std::string& actuator) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::pair<ReplacementRequest, Effects>> FinishExecution(
      uint64_t id, bool ok, const std::string& detail) ABSL_LOCKS_EXCLUDED(mu_);

  // Queries.
  std::vector<JobSummary> ListJobs() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<RankSummary>> ListRanks(const std::string& job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Incident> ListIncidents(const std::string& job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Suspect> ListSuspects() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<ReplacementRequest> ListRequests() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ReplacementRequest> GetRequest(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Incident> GetIncident(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Incidents and requests naming a GPU (or a node), across jobs.
  std::pair<std::vector<Incident>, std::vector<ReplacementRequest>> History(
      const std::string& gpu, const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t AttachedRanks() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct RankState {
    RankRecord record;
    bool attached = false;
    // From this sdcd's last Hello of the rank (audits wait for every
    // rank's Hello, so it is never stale when an audit is judged).
    protocol::SoftwareStack software;
    // Its shard coordinates, from the same Hello (kept in memory only, like
    // `software`: a restarted sdcd learns them again as ranks re-attach).
    protocol::ShardCoordinates shard;
    bool shard_known = false;
    // (sequence, ContentDigest) of the last acknowledged reports, by
    // sequence % size: a resent duplicate must match what was acknowledged.
    std::array<std::pair<uint64_t, uint64_t>, 8> recent{};
  };
  struct GroupState {
    GroupRecord record;
    std::vector<Rank> members;  // Ascending.
    // The members' failure domains, built on first use after the membership
    // or a placement changed (not on every Hello: 16,384 Hellos would
    // rebuild it 16,384 times). See TopologyOf.
    mutable std::unique_ptr<Topology> topology;
    // The identity class (IdentityClass) whose Hello created it, and the
    // bytes of its layout charged to it; "" and 0 for a restored group.
    std::string creator;
    uint64_t layout_bytes = 0;
  };
  // One distinct digest of a vote, with one copy of its tensors.
  struct Ballot {
    std::vector<Rank> ranks;
    std::vector<Fingerprint> tensors;
  };
  // Check 1 of one group at one step.
  struct PendingStep {
    absl::Time first_seen;
    std::map<uint64_t, Ballot> reduced;  // By reduced-gradient digest.
    // Hash sets where only membership counts: at 16,384 ranks a step,
    // ordered sets' node allocations and rebalancing are measurable.
    absl::flat_hash_set<Rank> reported;
    std::set<Rank> local_nonfinite;    // Ordered: named in verdicts.
    std::set<Rank> reduced_nonfinite;
    absl::flat_hash_set<Rank> applied;
    absl::flat_hash_set<Rank> skipped;
    std::map<Rank, std::pair<Rank, uint64_t>> confirms;  // subject -> (confirmer, nonfinite).
    bool loss_scaled = false;  // Some rank's report: the step ran under a loss scaler.
    std::map<uint32_t, uint64_t> reduced_majority;  // By group: the digest most ranks got.
    // Why no confirmation replay comes (StepReport::no_confirmation).
    std::string no_confirmation;
    // A buddy check's finding the step was skipped for, from the named
    // rank's own report (step_checks.cc, ParseBuddyFinding); empty: none.
    std::string buddy_finding;
    Rank buddy_rank = 0;
    bool buddy_faulty = false;
    // A failed every-step product checksum the step was skipped for, from
    // the alarmed rank's own report (step_checks.cc, ParseChecksumAlarm);
    // empty: none.
    std::string checksum_alarm;
    Rank checksum_rank = 0;
    // Some rank's report says the step was skipped for a buddy finding or a
    // checksum alarm: a NaN in the reduced gradients alone is the failure's
    // in-band carrier.
    bool in_band_carried = false;
    std::vector<PendingKey> keys;
  };
  struct PendingWeights {
    absl::Time first_seen;
    std::map<uint64_t, Ballot> ballots;
    absl::flat_hash_set<Rank> voted;
    std::vector<PendingKey> keys;
  };
  struct PendingTieBreak {
    TieBreak tiebreak;
    std::optional<Evidence> result;
  };
  struct PendingAudit {
    absl::Time first_seen;
    // Tie-break results that came before sdcd attributed the audit (ranks
    // derive tie-breaks in-band from every result; sdcd only once every
    // result is in), by (tiebreaker, subject).
    std::map<std::pair<Rank, Rank>, Evidence> early_tiebreaks;
    uint64_t plan_id = 0;
    ReplayPlan plan;
    absl::flat_hash_map<Rank, Rank> subject_of;  // Replayer -> subject, from the plan.
    absl::flat_hash_set<Rank> subjects;          // Ranks whose batch is replayed.
    absl::flat_hash_map<Rank, Evidence> originals;
    absl::flat_hash_map<Rank, Evidence> replays;
    // Replayers whose subject's micro-batch arrived corrupted (checksum
    // mismatch, issue 39 case 4): in, but with no replay to compare.
    std::set<Rank> corrupted;
    std::optional<AuditVerdict> verdict;  // Set once originals and replays are in.
    std::vector<PendingTieBreak> tiebreaks;
    std::vector<PendingKey> keys;
    Rank suspect = 0;  // For targeted plans.
  };
  // Finalized checks of one step, for the checkpoint gate.
  struct LedgerEntry {
    std::map<uint32_t, StepVerdict> weights;  // By group.
    std::set<uint32_t> audits;  // Groups whose audit of the step is decided.
    // Groups whose audit of the step passed without every result (kIncomplete).
    std::map<uint32_t, StepVerdict> incomplete_audits;
    std::vector<StepVerdict> failures;
    bool applied = false;
    std::set<uint32_t> nonfinite;  // Groups whose check 1 of the step is decided.
    // In memory only, for reports that come after check 1 was decided: the
    // ranks whose local NaN/Inf it saw, and the confirmation replays it had
    // (subject -> (confirmer, NaN/Inf elements)).
    std::set<Rank> local_nonfinite;
    std::map<Rank, std::pair<Rank, uint64_t>> confirms;
    std::map<uint32_t, uint64_t> reduced_majority;  // By group: the digest most ranks got.
    // The value each group's weight vote of the step decided (in memory
    // only): a late report is compared with it.
    std::map<uint32_t, uint64_t> weight_majority;

    // Files a decided verdict of this step.
    void Add(const StepVerdict& v);
  };
  // What one identity holds in a job: its rank slots and how many it may.
  struct IdentityShare {
    uint32_t slots = 0;
    uint32_t capacity = 0;
  };
  struct JobState {
    JobRecord record;
    // Sparse: a slot per rank that said Hello. The world size is a claim;
    // memory follows what attached.
    absl::btree_map<Rank, RankState> ranks;
    // By identity key (IdentityKey): the slots each fills, and the sums of
    // their capacities (all, and unauthenticated ones), whose minimum with
    // the world size is what the job holds (reserved, against max_ranks).
    std::map<std::string, IdentityShare> identities;
    uint64_t capacity = 0;
    uint64_t capacity_unauthenticated = 0;
    uint64_t reserved = 0;
    uint64_t reserved_unauthenticated = 0;
    std::map<uint32_t, GroupState> groups;
    std::map<std::pair<uint32_t, Step>, PendingStep> steps;
    std::map<std::pair<uint32_t, Step>, PendingWeights> weights;
    std::map<std::tuple<uint32_t, Step, uint64_t>, PendingAudit> audits;
    std::map<uint64_t, PlanRecord> plans;
    std::map<Step, LedgerEntry> ledger;
    uint32_t said_hello = 0;  // Ranks with a slot; all of them: groups are complete.
    CheckpointLedger checkpoints;
    absl::Time last_seen;  // Last Hello, report or detach; restore time after one.
    // Audit results that came before every rank said Hello (so the plan and
    // the groups are not known yet), in arrival order; applied at the last
    // Hello. Stored as pending reports.
    std::vector<Report> held;
    // Audits decided at the deadline without some results, with their
    // evidence, so results arriving later complete them (in memory only; at
    // most kMaxUnfinishedAudits per job, the oldest go first).
    std::map<std::tuple<uint32_t, Step, uint64_t>, PendingAudit> unfinished;
    uint64_t late_reports = 0;  // Taken after their check was decided.
    // A new attempt that did not say its resume step: its first step report
    // rolls the ledger back to that step (the restart resumed from a
    // checkpoint). Never for a fresh job, nor for an attempt whose Hello
    // gave its resume step (rolled back then): the attempt's own verdicts
    // of that first step may be decided before its step report arrives.
    bool awaiting_first_step = false;
    std::string resume_warning;  // The attempt's (AttachResult::resume_warning).
  };
  static constexpr size_t kMaxUnfinishedAudits = 16;
  // A GPU attributed faulty that still blocks checkpoints of its job (and,
  // when its incident's evidence was proven, of any job it is in).
  struct FaultyGpu {
    std::string job_id;
    Rank rank = 0;
    std::string node;
    Step step = 0;
    uint64_t incident_id = 0;
    bool proven = true;
  };

  // Work of one call: the mutation and effects it builds.
  struct Txn {
    Mutation mutation;
    Effects effects;
    // The report was taken without being stored as pending (it came after
    // its check was decided): the rank's progress is written with this
    // mutation, not later (Mutation::progress), so a resend after a crash
    // cannot judge it twice.
    bool taken_late = false;
  };

  // Every private member below REQUIRES mu_ (annotated where the analysis
  // can check it); each groups under the file that defines it.

  // coordinator.cc: routing, persistence and lookups the checks share.
  //
  // OK, or why `r` cannot be taken (the codes Ingest documents), judged
  // without reading the check it feeds.
  absl::Status ValidateReport(const JobState& job, const Report& r) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Hands a validated report to the check it feeds. On error nothing of the
  // state or `txn` changed.
  absl::Status Apply(JobState& job, const Report& r, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persists and returns the effects; the store's error if it refused.
  absl::StatusOr<Effects> Commit(Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a report being applied is new to the store (not re-applied by
  // Restore or from JobState::held), so it is stored as pending.
  bool Fresh() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !replaying_ && !reapplying_; }
  // True when the checks of `step` are older than what the job's ledger
  // keeps (options_.ledger_steps): decided, or never to be.
  bool Forgotten(const JobState& job, Step step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Counts a report taken after its check was decided and, for the 1st,
  // 10th, 100th... of a job, says so in the operator's log.
  void NoteLate(JobState& job, const Report& r, const std::string& what, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: `rank` said Hello.
  RankRecord& RankOf(JobState& job, Rank rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every rank of the job said Hello at least once (so groups are complete).
  static bool AllAttached(const JobState& job);
  // The group's failure domains. Exclusive: it may fill the group's cached
  // topology. REQUIRES: every member said Hello.
  const Topology& TopologyOf(const JobState& job, const GroupState& group) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "rank 3 (GPU-... on node-1)", or "rank 3" for a rank without a Hello.
  std::string Describe(const JobState& job, Rank rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // "; replica group 1 holds shard 1/2 (rank 1 replica 0, ...)" when the
  // group's ranks hold one shard of a sharded layout; "" otherwise.
  std::string ShardNote(const JobState& job, const GroupState& group) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The layout's names of tensors `indices` ("#i" past the layout's end).
  std::vector<std::string> TensorNames(const GroupState& group,
                                       const std::vector<uint32_t>& indices) const;

  // registry.cc: Hellos, detaches, quotas, expiry.
  //
  // InvalidArgument for a malformed hello; FailedPrecondition when it
  // contradicts its job (world size, cadence, layout) or is stale.
  absl::Status ValidateHello(const Hello& h) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // FailedPrecondition when `h`'s shard coordinates contradict those of
  // another rank of `job`: another shard count, another shard in its
  // replica group, or the same replica of its shard.
  absl::Status ValidateShard(const JobState& job, const Hello& h) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // What a Hello's caller proves about its placement, and what it may hold.
  struct Admission;
  // PermissionDenied, or the rank record's identity, proof and unproven.
  static absl::Status Prove(const Hello& h, const Caller& caller, RankRecord* out);
  // The quotas of CoordinatorOptions for a Hello whose placement `proved`
  // describes: ResourceExhausted naming the limit, after expiring abandoned
  // jobs (and the identity's own, for its job count) when that makes room.
  absl::StatusOr<Admission> Admit(const Hello& h, const Caller& caller, const RankRecord& proved,
                                  Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops abandoned jobs (see CoordinatorOptions::job_expiry); with
  // `identity_class`, that class's abandoned jobs whatever their age, oldest
  // first, until it holds fewer than max_jobs_per_identity.
  void ExpireJobs(Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictJobsOf(const std::string& identity_class, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets job `it` (its quotas too), recording the removal in `txn`.
  void DropJob(std::map<std::string, JobState>::iterator it, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `rank`'s slot of `job` from identity key `from` ("" for a new
  // slot) to `to`, keeping the job's capacities and reservations and sdcd's
  // totals in step.
  void MoveSlot(JobState& job, const std::string& from, const std::string& to,
                uint32_t capacity) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ranks of `group` whose placement is not proven, ascending.
  std::vector<Rank> UnprovenMembers(const JobState& job, const GroupState& group) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Forgets what a rank's incarnations up to `incarnation` contributed to
  // checks still open (a decided audit keeps its results).
  void DropContributions(JobState& job, Rank rank, uint64_t incarnation, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // attempts.cc: a job restarted by its launcher.
  //
  // Empty when `h` may start a new attempt of `job` resuming from
  // h.resume_step, else why its resume is doubtful (a checkpoint the gate
  // never called final).
  std::string DoubtfulResume(const JobState& job, const Hello& h) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Starts attempt h.attempt of `job`: closes the old attempt's open checks
  // (saying so), forgets its ranks, replica groups and plans (with their
  // quotas), voids its verdicts after h.resume_step, abandons a provisional
  // checkpoint after it, and takes h's world size and cadence.
  void StartAttempt(JobState& job, const Hello& h, const std::string& warning, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the audit results held until every rank said Hello; one that
  // its plan refuses now is dropped and said (Effects::notes).
  void ApplyHeld(JobState& job, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // step_checks.cc: check 1 (non-finite values, reduced gradients).
  //
  // AlreadyExists for a step reported twice, InvalidArgument for one below
  // the rank's last step (a restarted rank's first report may go back: that
  // rolls the ledger back).
  absl::Status ApplyStepReport(JobState& job, GroupState& group, const Report& r,
                               const StepReport& s, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Another rank's in-band replay of a subject's micro-batch whose local
  // gradients had NaN/Inf. AlreadyExists for a second one; a confirmation
  // after the step was decided is stored and dropped.
  // REQUIRES: a.role is kConfirm, validated by ApplyAudit.
  absl::Status ApplyConfirmation(JobState& job, GroupState& group, const Report& r,
                                 const AuditResult& a, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The outcome of the incident that says a job's replay audits are off.
  static constexpr char kAuditsOff[] = "audits_off";
  // The outcome of the incident of an audit mismatch explained by the
  // compared ranks' software stacks (ExplainBySoftware): no GPU named.
  static constexpr char kSoftwareMismatch[] = "software_mismatch";
  // The outcome of the incident of a replay input that arrived corrupted:
  // no GPU named.
  static constexpr char kCorruptedTransfer[] = "corrupted_transfer";
  // Records, once per job, that its ranks turned replay audits off.
  void NoteAuditsOff(JobState& job, GroupState& group, Step step, const std::string& reason,
                     Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job of several replica groups (a sharded layout: one group per shard)
  // decides a step whose reports hold NaN/Inf only with every group's
  // reports of it: FSDP's reduce-scatter spreads one rank's NaN into other
  // shards' reduced gradients, and "every rank" means every rank of the job.
  static bool EveryGroupReported(const JobState& job, Step step);
  static std::set<Rank> JobLocalNonFinite(const JobState& job, Step step);
  // Decides check 1 of `step` once every member reported (and a lone rank's
  // NaN/Inf was replayed), or when `deadline` with what arrived; else waits.
  // `revisit`: then decide the other groups that waited for this one.
  void MaybeFinalizeStep(JobState& job, GroupState& group, Step step, bool deadline,
                         Txn& txn, bool revisit = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The failures a step's checks found: explanations, first incident.
  struct StepFailures;
  // A step report of a step whose check 1 was decided without it (or is
  // older than the ledger): nothing reopens; what it shows that the
  // decision lacked (NaN/Inf, a step skipped in-band for a reason no
  // incident records) becomes an incident, decided in-band while sdcd was
  // away, and the step's verdict says so.
  void ApplyLateStepReport(JobState& job, GroupState& group, const Report& r,
                           const StepReport& s, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces check 1's verdict of `step` with the failure `inc` found late.
  void RecordLateVerdict(JobState& job, GroupState& group, Step step, const Incident& inc,
                         Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Check 1's cross-rank part: did every member receive the same reduced
  // gradients? Records a minority as suspects (the bad data may come from
  // elsewhere in the all-reduce); returns the vote's outcome.
  VoteOutcome CheckReducedGradients(JobState& job, GroupState& group, Step step,
                                    const PendingStep& ps, absl::Duration latency,
                                    StepFailures& found, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Check 1's local part: whose NaN/Inf a replay confirmed (faulty), whose
  // it reproduced (data or software), whose nobody replayed (suspect); and
  // NaN/Inf that only the all-reduce produced. Under a loss scaler only a
  // confirmed rank is an incident: the rest is the scaler's overflow.
  // `local`: ranks with local NaN/Inf, ascending; `reduced`:
  // CheckReducedGradients' outcome. True when the step was the scaler's
  // overflow and nothing else.
  bool CheckNonFinite(JobState& job, GroupState& group, Step step, const PendingStep& ps,
                      const std::vector<Rank>& local, VoteOutcome reduced,
                      absl::Duration latency, StepFailures& found, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // replay_audits.cc: check 2 (replay audits, attribution, tie-breaks).
  //
  // The plan of an audit result: the scheduled one (plan_id 0) or a targeted
  // one. FailedPrecondition before every rank said Hello; InvalidArgument
  // when no plan applies.
  absl::StatusOr<ReplayPlan> PlanFor(const JobState& job, const GroupState& group,
                                     Step step, uint64_t plan_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One audit result (original, replay, tie-break or confirmation), checked
  // against its plan: InvalidArgument for a role the plan does not give,
  // AlreadyExists for a repeat or a result after the audit's verdict.
  absl::Status ApplyAudit(JobState& job, GroupState& group, const Report& r,
                          const AuditResult& a, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An audit result whose audit was decided (or is forgotten): it joins the
  // evidence of an audit decided without it (JobState::unfinished), which
  // is judged again once complete; else it is taken and noted.
  absl::Status ApplyLateAudit(JobState& job, GroupState& group, const Report& r,
                              const AuditResult& a, Evidence evidence, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Judges unfinished audit `key` once its results (and the tie-breaks its
  // attribution needs) are in: incidents as at the time, said to be late.
  void MaybeFinishLateAudit(JobState& job, GroupState& group,
                            const std::tuple<uint32_t, Step, uint64_t>& key, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Attributes the audit `key` once its results are in (or at `deadline`),
  // sends tie-breaks when attribution needs them, and decides it once they
  // are in (or at `deadline`); else waits.
  void MaybeFinalizeAudit(JobState& job, GroupState& group,
                          const std::tuple<uint32_t, Step, uint64_t>& key, bool deadline,
                          Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs Attribute over the audit's results. When attribution needs
  // tie-breaks, sends them and, unless `deadline`, an interim verdict.
  // Returns true when the audit now waits for tie-break results.
  // REQUIRES: pa.verdict is unset.
  bool AttributeAudit(JobState& job, GroupState& group, PendingAudit& pa, Step step,
                      bool deterministic, bool deadline, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The final outcome, faulty ranks, suspects and notes of an audit.
  struct AuditFindings;
  // Moves tie-break results that came early into `pa`'s tie-breaks; true
  // when every tie-break then has its result.
  static bool ResolveEarlyTieBreaks(PendingAudit& pa);
  // Settles an attributed audit's tie-breaks: each names the subject or the
  // replayer faulty, or leaves both suspect (as does a result that never
  // arrived). Pure. REQUIRES: pa.verdict is set.
  static AuditFindings SettleAudit(const PendingAudit& pa, bool deterministic);
  // Issue 39, case 3: a rank named faulty or suspect whose software stack
  // differs from that of every rank it was compared with in the audit (its
  // replayers, the subject it replayed, its tie-breakers) is explained by
  // software: moved from faulty/suspects to findings.software, no GPU named.
  // Unknown stacks (older trainers) never differ.
  void ExplainBySoftware(const JobState& job, const PendingAudit& pa,
                         AuditFindings& findings) const;
  // Records the incidents of a decided audit; returns the one its verdict
  // names (the first faulty rank's), 0 for none.
  uint64_t RecordAuditIncidents(JobState& job, GroupState& group, Step step,
                                const AuditFindings& findings, const std::string& explanation,
                                const std::vector<std::string>& differing, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks targeted plan `plan_id` done and, while its suspect has chances
  // left and was not found faulty, schedules the next.
  void FinishTargetedAudit(JobState& job, GroupState& group, uint64_t plan_id,
                           const std::set<Rank>& faulty, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every rank of the job that said Hello, ascending: the recipients of a
  // plan of any group (v1::AuditPlan::group).
  static std::vector<Rank> JobRanks(const JobState& job);

  // watch.cc: ranks not trusted between their naming and their
  // replacement (issue 42 item 4).
  //
  // The group's members whose GPU is named faulty and whose node has an
  // open replacement request (pending, approved or executing), ascending.
  std::vector<Rank> WatchedRanks(JobState& job, const GroupState& group)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The assignments of the group's newest watch plan (empty: none).
  static std::vector<Assignment> CurrentWatch(const JobState& job, const GroupState& group);
  // Sends the group a new watch plan when the plan of WatchedRanks differs
  // from its newest one (one with no assignments ends the watch).
  void UpdateWatch(JobState& job, GroupState& group, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UpdateWatch for every group of every job whose ranks all said Hello
  // (after a request closed).
  void UpdateWatches(Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Sends a targeted audit plan for `suspect`, using one of its chances;
  // nothing when it has none left. REQUIRES: `suspect` is in suspects_.
  void ScheduleTargetedAudit(JobState& job, GroupState& group, Rank suspect,
                             const std::string& reason, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // weight_checks.cc: check 3 (the weight vote).
  //
  // InvalidArgument for a tensor count that is not the layout's (or tensors
  // a relay said it elided); AlreadyExists for a repeat. A report of a vote
  // already decided is compared with the value it decided: a minority of
  // one after the fact.
  absl::Status ApplyWeights(JobState& job, GroupState& group, const Report& r,
                            const WeightReport& w, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyLateWeights(JobState& job, GroupState& group, const Report& r,
                        const WeightReport& w, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides the vote of `step` once every member voted, or at `deadline`.
  void MaybeFinalizeWeights(JobState& job, GroupState& group, Step step, bool deadline,
                            Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // incidents.cc: what failed checks record.
  //
  // Records an incident; confirmed ones open (or join) a request and block
  // checkpoints while the GPU stays; unconfirmed ones make suspects. Any
  // outcome that does not point at the model, data or software revokes the
  // provisional checkpoint. Returns the incident as incidents_ holds it
  // (which never erases one).
  Incident& RecordIncident(JobState& job, GroupState& group, Step step, CheckKind check,
                           const std::string& outcome, std::vector<Rank> ranks,
                           bool confirmed, const std::string& explanation,
                           std::vector<std::string> differing, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `rank`'s GPU a suspect (nothing if it is attributed faulty) and
  // schedules a targeted audit when none is outstanding and the group's
  // topology can attribute.
  void AddSuspect(JobState& job, GroupState& group, Rank rank, const std::string& reason,
                  Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // checkpoint_gate.cc: the verdict ledger and the gate.
  //
  // Files a decided check in the job's ledger (keeping the last
  // options_.ledger_steps steps) and persists it.
  void RecordVerdict(JobState& job, StepVerdict verdict, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the ledger's verdicts of steps `from` onward (the job went back
  // to a checkpoint).
  void Rollback(JobState& job, Step from, Txn& txn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the job's checkpoint revocations after `resume` (a new attempt's
  // abandoned timeline); returns a note naming them, or "".
  std::string ForgetOldRevocations(JobState& job, Step resume, Txn& txn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty when a checkpoint at `step` is allowed; else at most three reasons
  // (and how many more), with *retryable true when all of them are waits.
  std::string CheckpointVeto(const JobState& job, Step step, bool* retryable) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const Clock* const clock_;
  Store* const store_;

  mutable absl::Mutex mu_;
  bool replaying_ ABSL_GUARDED_BY(mu_) = false;  // Restore() re-ingesting.
  bool reapplying_ ABSL_GUARDED_BY(mu_) = false;  // ApplyHeld() re-applying.
  std::map<std::string, JobState> jobs_ ABSL_GUARDED_BY(mu_);
  // Sums of the jobs' reservations (JobState::reserved and
  // reserved_unauthenticated), and layout bytes by identity class.
  uint64_t held_ranks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_unauthenticated_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> layout_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Incident> incidents_ ABSL_GUARDED_BY(mu_);
  uint64_t next_incident_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, Suspect> suspects_ ABSL_GUARDED_BY(mu_);  // By GPU.
  std::map<std::string, FaultyGpu> faulty_gpus_ ABSL_GUARDED_BY(mu_);
  Escalation escalation_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::core

#endif  // SDC_DAEMON_CORE_COORDINATOR_H_
