#ifndef SDC_CLIENT_GUARD_H_
#define SDC_CLIENT_GUARD_H_

// sdc::Guard: the three checks inside a libtorch data-parallel training step.
//
//   auto guard = sdc::Guard::Create(options, process_group, model, optimizer,
//                                   loss_fn);
//   for (step ...) {
//     guard->BeginStep(step, micro_batches);            // audit? RNG, determinism
//     for (i ...) {                                     // the trainer's own loop
//       torch::Tensor loss = loss_fn(micro_batches[i]) / micro_batches.size();
//       loss.backward();
//       guard->AfterMicroBatchBackward(i, loss);        // audit fingerprints
//     }
//     sdc::StepDecision d = guard->AllReduceAndCheck(); // checks 1 and 2
//     if (d.apply) optimizer.step();                    // same decision on every rank
//     guard->AfterOptimizerStep(is_checkpoint_step);    // check 3 (asynchronous)
//     if (is_checkpoint_step && guard->MayCheckpoint()) save(...provisional);
//     promote or delete earlier checkpoints as guard->Checkpoints() says;
//   }
//
// Or TrainStep(), which runs exactly that. The protocol itself is
// client::GuardEngine's, shared with the Python package; this class adapts a
// libtorch nn::Module and optimizer to it and all-reduces the gradients in
// flat buckets. See docs/ARCHITECTURE.md ("The trainer client").
//
// With FrontEndOptions::every_step, every matrix product (mm,
// addmm, bmm on CPU) the step's forward and backward compute between
// BeginStep and AllReduceAndCheck is checked by its row/column checksums
// (client/product_checks.h, the same kernels as the Python front end's
// Guard(every_step=True)); a failed checksum on any rank makes
// AllReduceAndCheck return, on every rank, a skipped step (apply false, the
// gradients zeroed) whose reason holds the alarm (op, phase, shapes,
// discrepancy, threshold), and sdcd names that rank a suspect.
//
// Thread-compatible: one Guard per rank, used from the training thread. The
// coordinator link runs its own thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/guard_engine.h"
#include "client/options.h"
#include "protocol/checkpoint_ledger.h"
#include "torch/torch.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace sdc {

// The step's types are the engine's (client/guard_engine.h).
using LossFn = client::LossFn;
using StepDecision = client::StepDecision;
using GuardSummary = client::GuardSummary;

// Options of the libtorch front end itself (the engine's are GuardOptions).
struct FrontEndOptions {
  // Checksums of every matrix product (mm, addmm, bmm; on CPU, and on a
  // GPU in a CUDA build) in each step's forward and backward
  // (client/product_checks.h; issue 45; the Python front end's
  // Guard(every_step=True)). Off by default; GuardOptions::every_step
  // (SDC_EVERY_STEP=1) switches them on too.
  bool every_step = false;
};

// The every-step checksums' counts since the guard was made (all zero
// without every_step).
struct ChecksumCounts {
  bool every_step = false;
  uint64_t checked = 0;    // Products checked.
  uint64_t unchecked = 0;  // mm/addmm/bmm the checksums could not take.
  uint64_t alarms = 0;     // This rank's failed checksums.
  uint64_t skips = 0;      // Steps every rank skipped for some rank's failed checksum.
};

// Every tensor of `optimizer`'s per-parameter state for `params`, in
// parameter order: libtorch's Adam and AdamW (exp_avg, exp_avg_sq and
// amsgrad's max_exp_avg_sq), SGD (momentum), RMSprop (square_avg, momentum,
// grad_avg) and Adagrad (sum); LBFGS keeps no per-parameter tensors. Step
// counters are host integers in libtorch, not device memory. The state of
// any other type (a custom optimizer) is not read, and `unknown` (when not
// null and empty) gets its type's name, so the caller can say so.
std::vector<torch::Tensor> OptimizerTensors(torch::optim::Optimizer& optimizer,
                                            const std::vector<torch::Tensor>& params,
                                            std::string* unknown = nullptr);

class Guard {
 public:
  // Exchanges node names over `process_group` (a collective: every rank
  // calls Create), says Hello to the coordinator (when configured) and
  // starts the link. InvalidArgument for bad options or an empty model.
  static absl::StatusOr<std::unique_ptr<Guard>> Create(
      client::GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
      torch::nn::Module& model, torch::optim::Optimizer& optimizer, LossFn loss_fn,
      FrontEndOptions front_end = {});
  ~Guard();

  // Starts step `step` with its micro-batches (the first is the one audited).
  // Clears gradients (to undefined, so the first backward writes them
  // exactly); on audit steps captures the RNG state and turns deterministic
  // algorithms on for the first micro-batch. InvalidArgument when the first
  // micro-batch cannot be sent to a replay peer (more than 6 tensors, or one
  // of more than 6 dimensions), at every step, so it never surprises an audit.
  absl::Status BeginStep(uint64_t step, std::vector<std::vector<torch::Tensor>> micro_batches);

  // After micro-batch `index`'s backward. On audit steps, index 0
  // fingerprints the local gradients before the next micro-batch adds to them.
  // Throws c10::Error, as libtorch calls do, when a kernel fails (CUDA).
  void AfterMicroBatchBackward(size_t index, const torch::Tensor& loss);

  // Checks 1 and 2 around the bucketed gradient all-reduce, then the one
  // agreement all-reduce: returns the decision every rank takes. On skip the
  // gradients are zeroed; on apply they are clipped when options.max_grad_norm
  // is set (off by default).
  // Collective: every rank calls it at every step.
  absl::StatusOr<StepDecision> AllReduceAndCheck();

  // Check 3 after optimizer.step() (or after a skipped step): fingerprints
  // parameters and buffers on weight-check steps and always when
  // `checkpoint` (then optimizer state too), and sends them. Training does
  // not wait for the verdict. Fault injection of weights happens here.
  // Throws c10::Error, as libtorch calls do, when a kernel fails (CUDA).
  void AfterOptimizerStep(bool checkpoint = false);

  // True when sdcd allows a checkpoint of the current step (every rank gets
  // the same answer: collective). REQUIRES: AfterOptimizerStep(true) ran for
  // this step. Vetoed when sdcd is unreachable, unless the in-band fallback
  // is configured.
  absl::StatusOr<bool> MayCheckpoint();

  // Where the job's checkpoints stand, as of the last MayCheckpoint or
  // RefreshCheckpoints. An allowed checkpoint is provisional until the next
  // one is allowed, and revoked when a GPU of the job is attributed faulty
  // first: keep provisional checkpoints apart from final ones, promote them
  // when confirmed, delete them when revoked, and resume from a final one.
  const protocol::CheckpointLedger& Checkpoints() const;
  // Asks the coordinator where the checkpoints stand (not a collective; e.g.
  // at the end of training, to learn of a revocation after the last
  // checkpoint). Unavailable when it cannot be reached within `timeout`;
  // FailedPrecondition without a coordinator.
  absl::StatusOr<protocol::CheckpointLedger> RefreshCheckpoints(absl::Duration timeout);

  // The whole step with `loss_fn`: BeginStep, forward/backward of each
  // micro-batch (loss averaged over micro-batches), AllReduceAndCheck,
  // optimizer.step() when applied, AfterOptimizerStep. Returns the decision
  // and the mean loss of the micro-batches in `loss_out`.
  absl::StatusOr<StepDecision> TrainStep(uint64_t step,
                                         std::vector<std::vector<torch::Tensor>> micro_batches,
                                         bool checkpoint, double* loss_out);

  // A point in the model's forward where activation faults are injected
  // (tests and demos only; a no-op unless fault injection is armed).
  torch::Tensor FaultPoint(const torch::Tensor& activation);

  GuardSummary Summary() const;
  ChecksumCounts Checksums() const;
  uint32_t rank() const;
  uint32_t world_size() const;
  // Stops the link after flushing reports for up to `flush`.
  void Shutdown(absl::Duration flush = absl::Seconds(5));

 private:
  class Impl;
  explicit Guard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdc

#endif  // SDC_CLIENT_GUARD_H_
