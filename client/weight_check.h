#ifndef SDC_CLIENT_WEIGHT_CHECK_H_
#define SDC_CLIENT_WEIGHT_CHECK_H_

// Check 3, the weight vote, as one rank takes part in it: after the
// optimizer step (applied or skipped), on weight-check steps and at every
// checkpoint, fingerprints of the weight vote's tensors (ModelTensors::
// Weights: parameters, frozen parameters, the buffers as the step's forward
// read them) and at checkpoints the optimizer state's digest, sent to sdcd;
// training never waits for its verdict. When sdcd names a minority, the
// repair: weights, buffers and optimizer state broadcast from a majority
// rank, once the agreement shows every rank holds that verdict. Also the
// faults injected into weights and optimizer state (tests and demos only).
//
// Thread-compatible: the training thread's.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/engine_context.h"
#include "client/engine_types.h"
#include "client/model_tensors.h"
#include "client/step_core.h"

namespace sdc::client {

class WeightCheck {
 public:
  // `optimizer_state` may be empty (no state is fingerprinted or repaired).
  // REQUIRES: `ctx` and `model` outlive this.
  WeightCheck(const EngineContext& ctx, ModelTensors& model, OptimizerStateFn optimizer_state);

  // Forgets that the previous step sent checkpoint weights.
  void BeginStep();

  // After optimizer.step() (or the skip): on weight-check steps and when
  // `checkpoint`, fingerprints the weights (and, when `checkpoint`, the
  // optimizer state) and sends them. Returns the milliseconds it took (0
  // when it did nothing). Internal on a libtorch failure.
  absl::StatusOr<double> AfterOptimizerStep(const StepContext& step, bool checkpoint);
  // True once AfterOptimizerStep(step, true) sent this step's weights.
  bool checkpoint_weights_sent() const { return checkpoint_weights_sent_; }
  // The digest of the weight vote's tensors now (the in-band checkpoint
  // vote compares it). Throws c10::Error on a kernel failure.
  uint64_t Digest() const;

  // sdcd found ranks of this rank's replica group whose weights differ
  // from the majority's at `step`; `majority_source` holds the majority's.
  // A verdict no newer than the last one noted is ignored.
  void NoteMinority(uint64_t step, uint32_t majority_source, const std::string& explanation);
  // The step of the newest minority verdict noted (agreement input).
  uint64_t repair_step() const { return repair_step_; }
  // Per replica group (issue 39, case 6): once every rank of a group holds
  // a verdict at least as new as the group's agreed step
  // (agreement.repair_step_by_group, the minimum over its ranks) and that
  // step is newer than the group's last repair, the group repairs. Every
  // rank of the process group then joins one all-gather (each repairing
  // group's ranks put in their digest of weights and optimizer state as
  // they are now, and the source their verdict named); each repairing
  // group's ranks then plan alike (PlanRepair: the verdict's source, named
  // by the group's lowest rank, if a strict majority of the group holds
  // what it holds, else the group's lowest rank that holds such a digest,
  // else nobody) and the source sends weights, buffers and optimizer state
  // point to point to the group's ranks that differ from it; no other rank
  // takes part. Under HSDP a group is one shard's replicas and the copy is
  // of local shards and their optimizer state. After any copy every rank
  // joins a second all-gather of the copying groups' digests: a receiver
  // whose digest differs from the source's fails the repair, and then
  // every rank skips the step (decision.apply false, the reason says
  // which ranks). decision.repaired is set on every rank of a group whose
  // copy verified. Collective when a group is due; every rank decides
  // alike from the agreement.
  // Internal on a libtorch failure.
  absl::Status RepairIfAgreed(const Agreement& agreement, StepDecision& decision);

  // weight_checks and repairs.
  void Summarize(GuardSummary& summary) const;

 private:
  void InjectFaults(const StepContext& step);

  const EngineContext& ctx_;
  ModelTensors& model_;
  const OptimizerStateFn optimizer_state_;
  bool checkpoint_weights_sent_ = false;
  // The digest a repair compares: the vote's tensors and optimizer state.
  uint64_t RepairDigest() const;
  // The point-to-point copy of a repair within this rank's group.
  void Copy(const RepairPlan& plan);

  uint64_t repair_step_ = 0;
  uint32_t repair_source_ = 0;
  // By replica group index: the agreed step each group last repaired at
  // (the same on every rank: every rank reads the same agreements).
  std::vector<uint64_t> repaired_by_group_;
  uint64_t weight_checks_ = 0;
  uint64_t repairs_ = 0;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_WEIGHT_CHECK_H_
