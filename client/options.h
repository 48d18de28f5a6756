#ifndef SDC_CLIENT_OPTIONS_H_
#define SDC_CLIENT_OPTIONS_H_

// Everything a trainer configures about sdc-guard, in one struct. A trainer
// with no command line of its own fills it from the environment with
// OptionsFromEnvironment() (the only function that reads the environment).

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/fault_injection.h"

namespace sdc::client {

enum class CheckpointFallback {
  kVeto,    // Coordinator unreachable: no checkpoint (default).
  kInBand,  // Coordinator unreachable: vote on weight digests over the process group.
};

// How the guard runs its few-word collectives (the step's agreement, the
// audit exchange, the in-band checkpoint vote); see small_collectives.h.
enum class SmallCollectives {
  kAuto,     // kRooted on Gloo, kBackend on any other backend (default).
  kBackend,  // The process group's own all-reduce and all-gather.
  kRooted,   // Each rank to rank 0, combined there, the result sent to each.
};

struct GuardOptions {
  // The coordinator's trainer address, HOST:PORT (or unix:PATH): sdcd, or
  // this node's sdc-agent when it relays (--relay_listen). Empty: run
  // without one (checks 1-3 in-band only; audits unverified).
  // Env: SDC_COORDINATOR.
  std::string coordinator;
  // The same on every rank of a job. Env: SDC_JOB_ID, else the launcher's
  // (JobIdFromVariables). Required.
  std::string job_id;
  // Where job_id came from: "SDC_JOB_ID", "TORCHELASTIC_RUN_ID",
  // "PET_RDZV_ID" or "SLURM_JOB_ID" (front ends log it at start).
  std::string job_id_source;
  std::string node_name;      // Env: SDC_NODE_NAME, else the host name.
  // Env: SDC_GPU_UUID. Unset (gpu_uuid_set false): the guard takes the
  // model's CUDA device's UUID ("GPU-...", as NVML and DCGM's `UUID` label
  // print it) at start, so incidents follow the physical GPU across jobs and
  // node names; a model on the CPU keeps "cpu-<node>-<local_rank>".
  std::string gpu_uuid;
  bool gpu_uuid_set = false;
  uint32_t local_rank = 0;    // Env: LOCAL_RANK.
  // Serve this rank's metrics (client/trainer_metrics.h) on HOST:PORT.
  // Env: SDC_METRICS_LISTEN; a non-zero PORT is offset by LOCAL_RANK so the
  // ranks of one node share one setting (9470 -> 9470, 9471, ...). Empty:
  // off (the default).
  std::string metrics_listen;
  uint32_t replica_group = 0; // Env: SDC_REPLICA_GROUP. Default: 0 (pure data parallel).
  // A sharded layout (an FSDP2/HSDP module on a replicate x shard mesh;
  // sdc_guard.Guard sets these from the mesh): this rank holds shard
  // `shard_index` of `shard_count`, as replica `replica_index` of it. The
  // ranks of one replica group hold one shard: reduced gradients are
  // compared in-band per shard and sdcd votes on weights per group.
  // shard_count 0 (the default): full replicas.
  // Env: SDC_SHARD_INDEX, SDC_SHARD_COUNT, SDC_REPLICA_INDEX.
  uint32_t shard_index = 0;
  uint32_t shard_count = 0;
  uint32_t replica_index = 0;
  // Incarnation of this process; grows on every restart. Env: SDC_INCARNATION,
  // else the start time in milliseconds.
  uint64_t incarnation = 0;
  // The job's attempt: every restart of the whole job by a launcher is a
  // new one (docs/ARCHITECTURE.md, "Attempts"). Two launchers may count:
  // the one that starts torchrun again (SDC_ATTEMPT, else Slurm's
  // SLURM_RESTART_COUNT: a requeue) and torchrun itself
  // (TORCHELASTIC_RESTART_COUNT, --max-restarts), so the attempt is
  // outer * kAttemptsPerOuter + torchrun's count (torchrun's count starts at
  // 0 in every launch, and the order of the pair is the order of attempts).
  // None set (attempt_set false): the guard's own count of the Guards of
  // this job created earlier in this process.
  static constexpr uint64_t kAttemptsPerOuter = 1000000;
  uint64_t attempt = 0;
  bool attempt_set = false;
  // The step of the checkpoint this attempt resumed from; 0: none (a fresh
  // start). sdcd warns about, or refuses, a resume from a checkpoint that is
  // not final. Env: SDC_RESUME_STEP.
  uint64_t resume_step = 0;
  uint32_t audit_every = 100;        // Env: SDC_AUDIT_EVERY. 0 = no scheduled audits.
  uint32_t weight_check_every = 10;  // Env: SDC_WEIGHT_CHECK_EVERY. 0 = only at checkpoints.
  // How long an audit step waits for sdcd's verdict. The in-band verdict
  // decides the step and sdcd's changes nothing on the rank, so by default
  // a rank does not wait (it takes a verdict already here); a wait puts
  // sdcd's word into the step's record (the demo uses 3 s).
  // Env: SDC_VERDICT_WAIT_MS. Default: 0.
  absl::Duration verdict_wait = absl::ZeroDuration();
  // Bounded wait for a checkpoint decision. Env: SDC_CHECKPOINT_WAIT_MS.
  absl::Duration checkpoint_wait = absl::Seconds(30);
  CheckpointFallback checkpoint_fallback = CheckpointFallback::kVeto;  // Env: SDC_CHECKPOINT_FALLBACK=veto|in-band.
  // What a rank holds for sdcd while it is away (or slow): unacknowledged
  // reports, at most report_buffer of them and report_buffer_bytes of
  // memory. Past either bound, reports not yet written go in this order:
  // clean step reports, then weight reports a newer one supersedes, then
  // other weight reports and the results of audits that passed, oldest
  // first of each; the evidence of a fault (a NaN, a skipped step, the
  // results of an audit that mismatched, tie-breaks, confirmations) never.
  // Every report dropped is counted by kind (client/coordinator_link.h).
  // Env: SDC_REPORT_BUFFER (reports; default 262,144) and
  // SDC_REPORT_BUFFER_MB (MiB; default 64).
  size_t report_buffer = size_t{1} << 18;
  size_t report_buffer_bytes = size_t{64} << 20;
  // A clean step's report (applied, no NaN/Inf, audit verified) may wait
  // this long to travel with the next report, so a job with short steps
  // sends sdcd one message per rank every so often, not one every step.
  // Every other report goes at once and takes the waiting ones with it.
  // 0: each report at once. Env: SDC_REPORT_LINGER_MS.
  absl::Duration report_linger = absl::Seconds(1);
  // Reconnection: the first retry after reconnect_min, then doubling (with
  // jitter) up to reconnect_max, so a coordinator that comes back (late,
  // restarted, at a new address behind the same name) is found within
  // reconnect_max. Env: SDC_RECONNECT_MAX_MS (default 5000).
  absl::Duration reconnect_min = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(5);
  // Gradient all-reduce bucket size in bytes. Env: SDC_BUCKET_BYTES.
  size_t bucket_bytes = 25u << 20;
  // Env: SDC_SMALL_COLLECTIVES=auto|backend|rooted.
  SmallCollectives small_collectives = SmallCollectives::kAuto;
  // Clip the reduced gradients' norm to this; 0 = no clipping. The guard
  // changes nothing about training unless asked: clipping is the trainer's
  // choice. Default: 0. Env: SDC_MAX_GRAD_NORM.
  double max_grad_norm = 0;
  // Per-parameter gradient fingerprints in audit reports (names the first
  // differing parameters; costs the coordinator memory on large jobs).
  // Env: SDC_PARAMETER_FINGERPRINTS=0|1. Default: on.
  bool parameter_fingerprints = true;
  // Module buffers join the weight vote, as the step's forward read them
  // (after any buffer broadcast). Off when each replica keeps buffers of its
  // own (DDP's broadcast_buffers=False: running statistics differ by rank);
  // the replay audit still checks how a forward updates them.
  // Env: SDC_VOTE_BUFFERS=0|1. Default: on.
  bool vote_buffers = true;
  // Checksums of every matrix product in each step's forward and backward
  // (issue 45; client/product_checks.h). The libtorch front end (sdc::Guard)
  // runs them when this or FrontEndOptions::every_step is set; the Python
  // front end reads the same variable itself (Guard(every_step=...) wins).
  // Env: SDC_EVERY_STEP=0|1. Default: off.
  bool every_step = false;
  std::string tls_ca;    // Env: SDC_TLS_CA (PEM): use TLS.
  std::string tls_cert;  // Env: SDC_TLS_CERT: client certificate.
  std::string tls_key;   // Env: SDC_TLS_KEY.
  // Off by default; see fault_injection.h for how it is enabled. At most
  // one plan per rank.
  std::vector<FaultPlan> faults;
};

// A job id and the variable it came from.
struct JobId {
  std::string id;
  std::string source;
};

// The job id from the first of: SDC_JOB_ID; torchrun's TORCHELASTIC_RUN_ID
// unless it is "none" (a static rendezvous without --rdzv_id); PET_RDZV_ID
// (a Kubeflow or HyperPod PyTorchJob's rendezvous id, its job name, for a
// script its pods start without torchrun); SLURM_JOB_ID. NotFound, naming
// every source and how to set one, when none is set.
absl::StatusOr<JobId> JobIdFromVariables(const std::map<std::string, std::string>& overrides);

// Reads the SDC_* variables above (plus LOCAL_RANK). InvalidArgument names
// the variable: "SDC_AUDIT_EVERY: expected a non-negative integer, got 'x'".
absl::StatusOr<GuardOptions> OptionsFromEnvironment();

// InvalidArgument unless `node_name` is one sdcd accepts
// (common::IsSafeNodeName: at most protocol::kMaxNodeNameBytes), so a
// trainer refuses it at start instead of sdcd at Hello.
absl::Status CheckNodeName(const std::string& node_name);

// The same with `overrides` (variable name -> value) taking the place of the
// environment's values: the Python package passes its keyword arguments
// this way, so both are validated by the same code.
absl::StatusOr<GuardOptions> OptionsFromVariables(
    const std::map<std::string, std::string>& overrides);

}  // namespace sdc::client

#endif  // SDC_CLIENT_OPTIONS_H_
