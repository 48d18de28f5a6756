#ifndef SDC_DAEMON_CORE_RECORDS_H_
#define SDC_DAEMON_CORE_RECORDS_H_

// What the coordinator persists: the records a Store keeps, and the
// Mutation that carries one atomic change to them.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/core/types.h"

namespace sdc::core {

struct JobRecord {
  std::string job_id;
  uint32_t world_size = 0;
  uint32_t audit_every = 0;
  uint32_t weight_check_every = 0;
  absl::Time created;
  uint64_t next_plan_id = 1;
  // The attempt running now (Hello::attempt) and the checkpoint step it
  // resumed from (0: none said); see AttemptRecord.
  uint64_t attempt = 0;
  Step resume_step = 0;
};

// One attempt of a job: the launcher started (or restarted) all of its
// ranks. A Hello of a higher attempt than the job's starts one: the old
// attempt's open checks are closed (`closed_checks`, said in `note`), its
// ranks and replica groups are forgotten (the new attempt's Hellos build a
// new topology, so the world size may change), its verdicts of steps after
// the resume are void, and its checkpoint decisions stay.
struct AttemptRecord {
  std::string job_id;
  uint64_t attempt = 0;
  uint32_t world_size = 0;
  Step resume_step = 0;
  absl::Time started;
  uint32_t closed_checks = 0;
  // What the attempt start did, for operators: the checks it closed and why,
  // a provisional checkpoint it abandoned, a doubtful resume.
  std::string note;
};

struct RankRecord {
  std::string job_id;
  Placement placement;
  uint64_t incarnation = 0;
  uint64_t acked_sequence = 0;  // Reports durable up to here.
  bool has_last_step = false;   // A StepReport arrived in this incarnation.
  Step last_step = 0;           // Highest step with a StepReport (any incarnation).
  bool deterministic = false;
  // A new incarnation of a rank that had reported steps: if it resumes at or
  // below last_step, the job rolled back to a checkpoint.
  bool resumed = false;
  // Who sent its Hello (Caller): the node the caller proved to be, empty when
  // unauthenticated; how ("certificate", "relay", ...); and why its placement
  // does not count as evidence (empty: it does). Only a group whose every
  // member's placement counts opens replacement requests.
  std::string identity;
  std::string proof;
  std::string unproven;
};

// The weight layout shared by a replica group.
struct GroupRecord {
  std::string job_id;
  uint32_t group = 0;
  std::vector<std::string> weight_tensors;
  uint32_t parameter_count = 0;
  uint64_t layout_digest = 0;
};

struct Incident {
  uint64_t id = 0;
  std::string job_id;
  Step step = 0;
  CheckKind check = CheckKind::kNonFinite;
  std::string outcome;  // "faulty", "suspect", "systemic", "reproduced", ...
  std::vector<Rank> ranks;
  std::vector<std::string> nodes;  // Parallel to ranks.
  std::vector<std::string> gpus;   // Parallel to ranks.
  bool confirmed = false;          // Attributed, not merely suspected.
  // Some rank of its replica group had a placement no caller proved (the
  // explanation names them): the incident opened no replacement request, and
  // blocks checkpoints of its own job only.
  bool unproven_evidence = false;
  std::string explanation;
  std::vector<std::string> differing_tensors;
  absl::Time created;
  uint64_t request_id = 0;
  // Closed by an operator (Coordinator::ResolveIncident): who, why, when.
  std::string resolved_by;
  std::string resolution;
  absl::Time resolved;
};

struct Transition {
  RequestState from = RequestState::kPending;
  RequestState to = RequestState::kPending;
  absl::Time at;
  std::string actor;
  std::string reason;
};

struct Approval {
  std::string op;
  std::string reason;
  absl::Time at;
  bool force = false;  // A forced approval (see Escalation): two are needed.
};

struct ReplacementRequest {
  uint64_t id = 0;
  std::string node;
  RequestState state = RequestState::kPending;
  std::vector<std::string> gpus;
  std::vector<uint64_t> incident_ids;
  std::string reason;
  std::string action = "replace";
  absl::Time created;
  absl::Time updated;
  std::vector<Transition> transitions;
  std::string actuator;
  std::string actuator_result;
  // Approved with force: may execute beyond the blast-radius cap.
  bool cap_override = false;
  // The current round's approvals, by distinct operators (see
  // EscalationPolicy::approvals_required); cleared when the request is
  // denied, expires or fails.
  std::vector<Approval> approvals;
  uint32_t approvals_required = 1;
};

struct Suspect {
  std::string gpu;
  std::string node;
  std::string job_id;
  Rank rank = 0;
  std::string reason;
  uint32_t incidents = 0;
  uint32_t targeted_audits_left = 0;
  absl::Time since;
};

// A targeted audit the coordinator asked for.
struct PlanRecord {
  std::string job_id;
  uint32_t group = 0;
  uint64_t plan_id = 0;
  std::vector<Assignment> assignments;
  std::string reason;
  Rank suspect = 0;
  bool done = false;
  // A standing watch (PlanWatch), not a suspect's one-off audit: run on
  // every step until a later watch of its group replaces it; never done.
  bool watch = false;
};

struct CheckpointDecision {
  std::string job_id;
  Step step = 0;
  bool allowed = false;
  std::string reason;
  absl::Time at;
  // A later revocation of an allowed (provisional) checkpoint.
  bool revocation = false;
  // A provisional checkpoint a new attempt abandoned (it resumed from an
  // earlier step): neither confirmed nor revoked (CheckpointLedger::
  // AbandonProvisional).
  bool abandoned = false;
};

// A finalized check of one step, kept for the checkpoint gate.
struct StepVerdict {
  std::string job_id;
  uint32_t group = 0;
  Step step = 0;
  CheckKind check = CheckKind::kNonFinite;
  bool failed = false;
  bool complete = true;       // False: decided at the deadline, ranks missing.
  bool applied = false;       // Some rank applied the step (check 1 only).
  std::string summary;        // One line: what failed, or "pass".
  uint64_t incident_id = 0;
};

struct PendingKey {
  std::string job_id;
  Rank rank = 0;
  uint64_t incarnation = 0;
  uint64_t sequence = 0;
};

// A check decided in this mutation and the pending reports it consumed.
// A store may remove those reports after the decision is durable rather
// than with it (SqliteStore does, a few at a time when idle: at 16,384
// ranks an audit's 32,768 deletions held its verdict's commit up by about
// 60 ms). Until they are gone the store keeps a mark of the decision, and
// a restore skips (and removes) the pending reports of a marked check.
struct DecidedCheck {
  std::string job_id;
  uint32_t group = 0;
  Step step = 0;
  // kNonFinite: check 1 (step reports and confirmation replays); kReplay:
  // an audit; kWeights: a weight check.
  CheckKind check = CheckKind::kNonFinite;
  uint64_t plan_id = 0;  // kReplay: the audit's plan (0: the scheduled one).
  std::vector<PendingKey> reports;  // Empty in a Snapshot.
};

// One atomic change. A Store applies all of it or none of it.
struct Mutation {
  // Abandoned jobs to drop with their ranks, groups, plans, verdicts and
  // checkpoint decisions (not their incidents); applied before `jobs`, so a
  // job may come back under the same id in the same batch.
  std::vector<std::string> jobs_removed;
  // Attempts started: each drops its job's ranks, replica groups and plans
  // (not its verdicts, checkpoint decisions, decided-check marks or
  // incidents; the old attempt's pending reports leave through
  // pending_removed) and is kept as the attempt's history; applied after
  // jobs_removed and before everything else.
  std::vector<AttemptRecord> attempts;
  std::vector<JobRecord> jobs;
  std::vector<RankRecord> ranks;
  // Rank records whose change is only progress that pending reports carry
  // (acked_sequence; last_step, has_last_step and resumed from a step
  // report). A store may write them later, but before it drops any of
  // those reports: until then a restore derives the progress from them.
  std::vector<RankRecord> progress;
  std::vector<GroupRecord> groups;
  std::vector<Report> pending_added;
  std::vector<PendingKey> pending_removed;
  std::vector<Incident> incidents;
  std::vector<ReplacementRequest> requests;
  std::vector<Suspect> suspects;
  std::vector<std::string> suspects_removed;  // By GPU.
  std::vector<PlanRecord> plans;
  std::vector<CheckpointDecision> checkpoint_decisions;
  std::vector<StepVerdict> step_verdicts;
  // (job, step): a rollback abandoned every step verdict from `step` on.
  std::vector<std::pair<std::string, Step>> rollbacks;
  // Checks decided: their marks now, their reports removed now or later.
  std::vector<DecidedCheck> decided;
  // Marks to remove (their reports are gone; `reports` is empty).
  std::vector<DecidedCheck> decided_cleared;

  bool empty() const {
    return jobs_removed.empty() && attempts.empty() && jobs.empty() && ranks.empty() && progress.empty() && groups.empty() &&
           pending_added.empty() &&
           pending_removed.empty() && incidents.empty() && requests.empty() &&
           suspects.empty() && suspects_removed.empty() && plans.empty() &&
           checkpoint_decisions.empty() && step_verdicts.empty() && rollbacks.empty() &&
           decided.empty() && decided_cleared.empty();
  }
};

// Everything a Store holds, as the coordinator rebuilds from it.
struct Snapshot {
  std::vector<JobRecord> jobs;
  std::vector<AttemptRecord> attempts;  // By job, then attempt.
  std::vector<RankRecord> ranks;
  std::vector<GroupRecord> groups;
  std::vector<Report> pending;  // In the order they were added.
  std::vector<Incident> incidents;
  std::vector<ReplacementRequest> requests;
  std::vector<Suspect> suspects;
  std::vector<PlanRecord> plans;
  std::vector<StepVerdict> step_verdicts;
  std::vector<CheckpointDecision> checkpoint_decisions;
  // Checks decided whose reports may still be pending (see DecidedCheck).
  std::vector<DecidedCheck> decided;
};

}  // namespace sdc::core

#endif  // SDC_DAEMON_CORE_RECORDS_H_
