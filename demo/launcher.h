#ifndef SDC_DEMO_LAUNCHER_H_
#define SDC_DEMO_LAUNCHER_H_

// Runs a local training cluster: sdcd plus nodes x GPUs trainer processes
// (CPU, Gloo), each rank told its node name; reads their progress while they
// run, can kill -9 and restart the coordinator mid-run, and collects what
// happened (per-step records, final weight digests, the coordinator's
// incidents and requests through its admin API). The demo, the detection
// benchmark, the overhead benchmark and the end-to-end tests all use it. On a
// GPU cluster the same trainer takes NCCL and real node names; this launcher
// is the local stand-in for torchrun.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "admin.pb.h"
#include "demo/progress_line.h"

namespace sdc::demo {

// Live numbers for a progress display.
struct LiveStatus {
  int step = 0;        // Every rank has finished this step.
  int total_steps = 0;
  double loss = 0;     // Mean over ranks at `step`.
  double steps_per_s = 0;
  int audits = 0;
  int audits_failed = 0;
  int weight_checks = 0;
  int skipped = 0;
  int checkpoints_allowed = 0;
  int checkpoints_vetoed = 0;
  int incidents = 0;
  int suspects = 0;
  int requests = 0;
  bool coordinator_up = true;
  std::string last_event;  // The newest incident or skip, one line.
  absl::Duration elapsed;
};

struct ClusterConfig {
  std::string run_dir;  // Created if missing; holds db, logs, progress.
  int nodes = 3;
  int gpus_per_node = 2;
  int steps = 150;
  int audit_every = 5;
  int weight_check_every = 5;
  int checkpoint_every = 25;
  std::string model = "transformer";  // or bn-mlp
  // How the Python trainer lays the model over the ranks (examples/layouts.py):
  // "ddp", "fsdp" (FSDP2 on a 1-D mesh), "hsdp" (FSDP2 on a nodes x GPUs
  // replicate x shard mesh: a shard's replicas on different nodes), "zero"
  // (DDP and a ZeroRedundancyOptimizer) or "tp" (tensor parallel over a
  // node's GPUs, replicated over the nodes: the transformer only).
  std::string layout = "ddp";
  int batch = 8;
  int micro_batches = 1;
  std::string fault;                  // SDC_INJECT_FAULT spec, or empty.
  int restart_coordinator_at = -1;    // kill -9 sdcd once every rank passed this step.
  // Start sdcd only once every rank passed this step (-1: before the
  // trainers). Its trainer port is chosen first, so the trainers dial it
  // from their start: the coordinator-late scenario.
  int start_coordinator_after = -1;
  // What happens to sdcd while the job runs, each once every rank passed
  // its step (fault injection for tests; the demo's coordinator scenarios).
  struct CoordinatorEvent {
    enum class What {
      kKill,         // kill -9 sdcd; after `pause` it starts again on its database and port.
      kMove,         // kill -9 sdcd; after `pause` it starts on a new port, and the
                     // proxies (the name the trainers dial) point there.
      kCutNode,      // `node`'s proxy stops forwarding: its ranks are cut off from sdcd.
      kRestoreNode,  // `node`'s proxy forwards again.
    };
    What what = What::kKill;
    int after_step = 0;
    int node = 0;
    absl::Duration pause = absl::Seconds(1);
  };
  std::vector<CoordinatorEvent> coordinator_events;
  // The trainers of each node dial a proxy (demo/tcp_proxy.h) in front of
  // sdcd, as they would dial a Service name. Needed by kMove and kCutNode.
  bool proxies = false;
  // Extra environment for every trainer (SDC_* settings).
  std::map<std::string, std::string> trainer_env;
  // Several replica groups on the one process group (SDC_REPLICA_GROUP):
  // rank r in group r % replica_groups (so each group spans the nodes, one
  // rank per node with 2 GPUs a node), and each group's model initialised
  // from its own seed (--seed + group), so under the C++ trainer the groups
  // hold different tensors, as pipeline stages would, while one all-reduce
  // carries every rank's gradients (the Python trainer's DDP starts every
  // rank from rank 0's). 0 or 1: one group, one seed.
  int replica_groups = 0;
  // The trainers' collective timeout (0: the trainer's default, 120 s). A
  // test sets it above its own `timeout`, so a hang fails the test as a
  // hang instead of ending in collective errors first.
  absl::Duration collective_timeout = absl::ZeroDuration();
  std::string job_id = "demo";
  bool unguarded = false;             // No sdcd, no guard: the overhead baseline.
  // The every-step product checksums (issue 45): the C++ trainer's
  // --every_step, the Python trainer's SDC_EVERY_STEP=1.
  bool every_step = false;
  bool extra_collective = false;      // Unguarded plus the guard's agreement exchange alone.
  bool count_collectives = false;     // Trainers count each step's collectives (progress lines).
  // Guarded, but the coordinator address leads nowhere (sdcd unreachable).
  bool coordinator_unreachable = false;
  // Guarded, no coordinator configured at all: in-band checks only, no
  // report streams, no sdcd process (what the guard costs without them).
  bool no_coordinator = false;
  bool keep_coordinator = false;      // Leave sdcd running after the run, detached.
  // Turn-taking with other clusters on this machine (the overhead
  // benchmark): when turn_file is set, the ranks run turn_steps steps at a
  // time, each turn starting once the file names turn_name (or says "*"),
  // and hand over by writing turn_next into it.
  std::string turn_file;
  std::string turn_name;
  std::string turn_next;
  int turn_steps = 10;
  std::string actuator = "dry-run";
  // The whole loop (the replace-and-resume scenario): once sdcd opens a
  // replacement request, the launcher approves it with sdcctl under an
  // operator credential of its own; sdcd runs --actuator=command, a local
  // stand-in for HyperPod that records the node as replaced (a file in the
  // run folder); once the request is done, the launcher stops every rank
  // (kill -9: the replaced node's ranks die with it, the others with their
  // job), puts a fresh node (new name, so new GPU ids) where the old one
  // was, and starts every rank again as attempt 1 of the same job
  // (SDC_ATTEMPT, SDC_RESUME_STEP), resumed from the newest final
  // checkpoint on disk, with no fault injected. `actuator` is ignored.
  bool replace_and_resume = false;
  std::string sdcd_binary;            // Default: BinaryPath("daemon/sdcd").
  // Which trainer each rank runs: "cpp" (demo/sdc-trainer, sdc::Guard) or
  // "python" (examples/ddp_train.py: PyTorch DDP with the sdc_guard package,
  // run by $SDC_PYTHON with $SDC_PYTHONPATH, which ./sdc sets), or "hf",
  // "lightning", "accelerate" (examples/framework_train.py: the same model
  // trained by that framework through sdc_guard.integrations). Same flags,
  // same progress lines.
  std::string trainer = "cpp";
  std::string trainer_binary;         // Default: BinaryPath("demo/sdc-trainer").
  absl::Duration timeout = absl::Minutes(20);
  std::function<void(const LiveStatus&)> on_tick;  // About twice a second.
};

struct ClusterResult {
  std::vector<std::vector<StepRecord>> ranks;  // [rank][i]
  std::vector<std::string> weight_digests;     // Final, per rank.
  std::vector<std::string> injections;         // "rank 3 step 20: ..." from trainer logs.
  std::vector<v1::Incident> incidents;
  std::vector<v1::ReplacementRequest> requests;
  std::vector<v1::Suspect> suspects;
  std::string admin_address;
  std::string token_file;
  std::string db;
  // The throwaway CA and per-node certificates the run's ranks presented
  // (node identities); empty without sdcd.
  std::string pki_dir;
  int sdcd_pid = 0;          // When kept running.
  int coordinator_restarts = 0;  // kill -9 and start again (kKill, kMove).
  // Per rank, the guard's summary counters of its final line
  // (reports_sent, reports_acked, reports_dropped, ...).
  std::vector<std::map<std::string, int64_t>> guard_summaries;
  absl::Duration wall;
  double cpu_seconds = 0;       // Trainers and sdcd, user + system, whole life.
  double sdcd_cpu_seconds = 0;  // sdcd's share of it.
  std::vector<double> step_ms;  // Per step, the slowest rank's time.
  // Checkpoint files in the run folder at the end, by step: final ones
  // (step-N.pt) and those still provisional (step-N.pt.provisional).
  std::vector<int> checkpoints_final;
  std::vector<int> checkpoints_provisional;
  // What the replace-and-resume loop did (ClusterConfig::replace_and_resume).
  struct Resume {
    bool resumed = false;       // Attempt 1 ran to the end.
    uint64_t request_id = 0;
    std::string operator_name;  // The credential that approved it.
    std::string replaced_node;  // The request's node.
    std::string replacement_node;
    std::vector<std::string> replaced_gpus;     // The request's GPUs.
    std::vector<std::string> replacement_gpus;  // Those of the fresh node's ranks.
    int64_t approved_unix_ms = 0;  // When sdcctl approve returned.
    int64_t done_unix_ms = 0;      // When the launcher saw the request done.
    int64_t restart_unix_ms = 0;   // When attempt 1's ranks started.
    int stopped_after_step = 0;    // Every rank of attempt 0 had passed this step.
    int resume_step = 0;           // 0: no final checkpoint, started afresh.
    int attempt = 0;
    // Checkpoint files when attempt 0 was stopped.
    std::vector<int> final_at_restart;
    std::vector<int> provisional_at_restart;
    int incidents_at_restart = 0;  // sdcd's incidents when attempt 1 started.
    std::string actuator_record;   // What the actuator wrote.
    std::vector<std::vector<StepRecord>> ranks;  // Attempt 1's records, [rank][i].
  };
  Resume resume;
};

absl::StatusOr<ClusterResult> RunCluster(const ClusterConfig& config);

// "node-a", "node-b", ...
std::string NodeName(int node);

// True for the layouts ClusterConfig::layout takes: ddp, fsdp, hsdp, zero, tp.
bool KnownLayout(const std::string& layout);

}  // namespace sdc::demo

#endif  // SDC_DEMO_LAUNCHER_H_
