#ifndef SDC_CLIENT_CHECKPOINT_GATE_H_
#define SDC_CLIENT_CHECKPOINT_GATE_H_

// The checkpoint gate, as one rank asks it: sdcd's decision (asked again
// while the answer is retryable, up to options.checkpoint_wait), or without
// sdcd the fallback the options chose (veto, or the in-band vote); then one
// small MAX all-reduce of (veto, weight digest halves), so every rank
// decides alike and replicas are proven identical in-band. In-band, equal
// digests are not enough: a step skipped since the previous checkpoint
// decision (a failed check) vetoes the next checkpoint, since without sdcd
// nobody knows whether the GPU that failed is still here. Also the ledger
// of what sdcd said about the job's checkpoints (confirmed, revoked).
//
// Thread-compatible: the training thread's.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/engine_context.h"
#include "client/engine_types.h"
#include "client/weight_check.h"
#include "protocol/checkpoint_ledger.h"

namespace sdc::client {

class CheckpointGate {
 public:
  // REQUIRES: `ctx` outlives this.
  explicit CheckpointGate(const EngineContext& ctx);

  // Every rank skipped `step` for `reason`: the in-band fallback vetoes the
  // next checkpoint (the first such step since the last decision is kept).
  void StepSkipped(const StepContext& step, const std::string& reason);

  // Whether a checkpoint of `step` may be written: the same answer on every
  // rank (collective). FailedPrecondition unless `weights` sent this step's
  // checkpoint weights (WeightCheck::AfterOptimizerStep(step, true));
  // Internal on a libtorch failure.
  absl::StatusOr<bool> MayCheckpoint(const StepContext& step, const WeightCheck& weights);

  // Where the job's checkpoints stand, as of the last MayCheckpoint or Refresh.
  const protocol::CheckpointLedger& ledger() const { return ledger_; }
  // Asks sdcd (not a collective). Unavailable when it cannot be reached
  // within `timeout`; FailedPrecondition without a coordinator.
  absl::StatusOr<protocol::CheckpointLedger> Refresh(absl::Duration timeout);

  // checkpoints_allowed, checkpoints_vetoed and last_veto.
  void Summarize(GuardSummary& summary) const;

 private:
  const EngineContext& ctx_;
  protocol::CheckpointLedger ledger_;
  // The first skipped step since the last checkpoint decision ("step N: why").
  std::string failed_since_checkpoint_;
  uint64_t allowed_ = 0;
  uint64_t vetoed_ = 0;
  std::string last_veto_;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_CHECKPOINT_GATE_H_
