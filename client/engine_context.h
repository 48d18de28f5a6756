#ifndef SDC_CLIENT_ENGINE_CONTEXT_H_
#define SDC_CLIENT_ENGINE_CONTEXT_H_

// What the parts of client::GuardEngine share, passed to each explicitly:
//   EngineContext  the job, for the engine's life: options, the process
//                  group and its few-word collectives, this rank's place
//                  (rank, world, the replay topology), the injected fault,
//                  the link to sdcd and the metrics exposer;
//   StepContext    the step the engine began, for that step.
// A part holds a const reference to the EngineContext and gets the
// StepContext on each call that needs it; neither holds any part's state.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/coordinator_link.h"
#include "client/engine_types.h"
#include "client/fault_injection.h"
#include "client/options.h"
#include "client/step_core.h"
#include "client/trainer_metrics.h"
#include "kernels/fingerprint.h"
#include "protocol/replay_plan.h"
#include "protocol/types.h"

namespace sdc::client {

// The step as GuardEngine::BeginStep began it; constant until the next
// BeginStep.
struct StepContext {
  uint64_t step = 0;
  int64_t micro_batches = 1;  // How many the step accumulates (the loss of each is divided by it).
};

// Set up once, in this order, by the engine's creation: the constructor,
// ExchangeTopology (a collective), Connect. After that, read-only (safe to
// read from any thread), except that the collectives must be called from
// the training thread, in the same order on every rank, and Send may be
// called from any thread (the link is thread-safe).
class EngineContext {
 public:
  // REQUIRES: `process_group` is not null.
  EngineContext(GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> process_group);
  // Stops the metrics exposer (no scrape reads the link after), then the
  // link without flushing (GuardEngine::Shutdown flushes).
  ~EngineContext();
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  // Collective: every rank's node name and replica group, gathered from
  // every rank, give this rank's replay topology (its replica group's
  // members and their nodes); rank 0's fingerprint seed, drawn here and
  // carried in the same exchange, gives every rank the job's fingerprint
  // key. The same exchange carries each rank's `software_digest`
  // (SoftwareStack::Digest; 0: unknown), so the in-band verdict knows which
  // ranks run another stack (issue 39, case 3), and each rank's replica
  // group (replica_groups(): weight repairs run per group). Internal on a libtorch
  // failure; Unavailable on every rank when rank 0 could not draw a seed.
  absl::Status ExchangeTopology(uint64_t software_digest = 0);

  // Starts the link to sdcd with `hello` (when options.coordinator is set)
  // and the metrics exposer (when options.metrics_listen is set). Errors as
  // TrainerMetrics::Start.
  absl::Status Connect(protocol::Hello hello);

  // Stops the link after flushing reports for up to `flush`.
  void Stop(absl::Duration flush);

  const GuardOptions& options() const { return options_; }
  c10d::ProcessGroup& group() const { return *pg_; }
  uint32_t rank() const { return rank_; }
  uint32_t world() const { return world_; }
  // Where the group sends from: the CPU on Gloo, the current GPU on NCCL.
  const torch::Device& collective_device() const { return collective_device_; }
  // This rank's injected fault (tests and demos); disabled in real jobs.
  const FaultPlan& fault() const { return fault_; }
  // REQUIRES: ExchangeTopology succeeded.
  const protocol::Topology& topology() const { return *topology_; }
  // The job's fingerprint key, the same on every rank, so all ranks
  // compare alike. REQUIRES: ExchangeTopology succeeded.
  const kernels::FingerprintKey& fingerprint_key() const { return *fingerprint_key_; }
  // Every rank's software stack digest, by rank (0: unknown). REQUIRES:
  // ExchangeTopology succeeded.
  const std::vector<uint64_t>& software_digests() const { return software_digests_; }
  // Every rank's replica group (SDC_REPLICA_GROUP), from the same exchange.
  // REQUIRES: ExchangeTopology succeeded.
  const ReplicaGroups& replica_groups() const { return replica_groups_; }
  // Null without a coordinator.
  CoordinatorLink* link() const { return link_.get(); }
  // Null unless options.metrics_listen is set.
  TrainerMetrics* metrics() const { return metrics_.get(); }

  // The few-word collectives (small_collectives.h) on this job's group, as
  // the options chose; throw c10::Error as the group's calls do.
  void AllReduceMax(std::vector<int64_t>& words) const;
  std::vector<int64_t> AllGather(const std::vector<int64_t>& words) const;

  // Queues a report of `step` to sdcd; nothing without a coordinator.
  void Send(uint64_t step, decltype(protocol::Report::body) body) const;
  // One line on stderr, prefixed with this rank.
  void Log(const std::string& line) const;
  // The link's counters into `summary`.
  void Summarize(GuardSummary& summary) const;

 private:
  const GuardOptions options_;
  const c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  const uint32_t rank_;
  const uint32_t world_;
  const FaultPlan fault_;
  const SmallCollectives small_collectives_;  // Resolved: never kAuto.
  const torch::Device collective_device_;
  std::unique_ptr<protocol::Topology> topology_;
  std::unique_ptr<const kernels::FingerprintKey> fingerprint_key_;
  std::vector<uint64_t> software_digests_;
  ReplicaGroups replica_groups_;
  std::unique_ptr<CoordinatorLink> link_;
  // Declared after link_, so it stops (and no scrape reads link_) before
  // the link goes.
  std::unique_ptr<TrainerMetrics> metrics_;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_ENGINE_CONTEXT_H_
