#ifndef SDC_CLIENT_GUARD_ENGINE_H_
#define SDC_CLIENT_GUARD_ENGINE_H_

// The guard's step protocol over a model given as tensors: what both the
// C++ sdc::Guard (a libtorch nn::Module, its own bucketed all-reduce) and
// the Python package sdc_guard (a DistributedDataParallel model, whose
// reducer all-reduces in a communication hook) run. The engine never
// all-reduces gradients itself; its caller does, and hands it each bucket
// before and after. Everything else of the three checks is here: the audit
// plan, RNG capture and deterministic algorithms, the peer batch exchange
// and replay, the in-band verdict, the agreement all-reduce and the one
// apply-or-skip decision, weight fingerprints, the checkpoint gate, weight
// repair, and the reports to sdcd.
//
// The engine composes parts, each a class with its own state, sharing only
// an explicit context (engine_context.h: the job's EngineContext, the
// step's StepContext) and the model's tensors (model_tensors.h):
//   StepPipeline      check 1 on the buckets, the agreement, apply or skip
//   AuditDeterminism  deterministic algorithms on audit steps
//   PeerReplay        check 2's micro-batch exchange and replay
//   ReplayAudit       check 2: plans, in-band verdict, tie-breaks, confirmations
//   WeightCheck       check 3 and weight repair
//   CheckpointGate    the checkpoint gate and ledger
// guard_engine.cc runs them in the order every rank follows.
//
// A step:
//   BeginStep(step, first_micro_batch, micro_batches)
//   ... the trainer's forward/backward of each micro-batch; after the first:
//   RecordFirstMicroBatch(loss) and, on audit steps, its local gradients
//   (RecordOriginalGradients, from the parameters' .grad or a bucket);
//   for each gradient bucket: ScanLocalBucket(local) before its all-reduce,
//   AddReducedBucket(index, reduced) after;
//   Finish()                       // checks 1 and 2, the decision; collective at exchange steps
//   optimizer.step() when apply;
//   AfterOptimizerStep(checkpoint) // check 3
//   MayCheckpoint()                // when checkpointing; collective
//
// Thread-compatible: one engine per rank. ScanLocalBucket, AddReducedBucket
// and RecordOriginalGradients may be called from the autograd engine's
// threads while the training thread waits in backward(); they take a lock.
// The coordinator link runs its own thread.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/engine_types.h"
#include "client/options.h"
#include "protocol/checkpoint_ledger.h"

namespace sdc::client {

class GuardEngine {
 public:
  // Exchanges node names over `process_group` (a collective: every rank
  // calls Create), says Hello to the coordinator (when configured) and
  // starts the link. `parameters` are the trainable parameters (their
  // gradients are checked, replayed and zeroed on skip), `buffers` the
  // module buffers, `frozen` the parameters that do not train
  // (requires_grad false: a frozen backbone, LoRA's base weights); all as
  // the model holds them (not copies). The weight vote fingerprints and
  // repairs all three.
  // InvalidArgument for bad options, no parameters, a parameter of a dtype
  // the kernels do not read, or tensors on more than one device;
  // Unimplemented / FailedPrecondition when the device cannot be checked.
  static absl::StatusOr<std::unique_ptr<GuardEngine>> Create(
      GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
      NamedTensors parameters, NamedTensors buffers, OptimizerStateFn optimizer_state,
      LossFn loss_fn, NamedTensors frozen = {});
  ~GuardEngine();

  // Starts step `step`. `first_micro_batch` is the one a peer replays on
  // audit steps, `micro_batches` how many the step has (the loss of each is
  // divided by it). Clears the parameters' gradients (to undefined, so the
  // first backward writes them exactly); on audit steps captures the RNG
  // state and turns deterministic algorithms on. InvalidArgument when the
  // micro-batch cannot be sent to a replay peer (more than 6 tensors, one of
  // more than 6 dimensions, or no tensors), at every step, so it never
  // surprises an audit; nothing is changed then.
  absl::Status BeginStep(uint64_t step, std::vector<torch::Tensor> first_micro_batch,
                         int64_t micro_batches);

  // After the first micro-batch's backward: its loss as backpropagated,
  // i.e. divided by the number of micro-batches and, under a loss scaler,
  // multiplied by `loss_scale` (a float32 scalar, torch.amp.GradScaler's
  // scale; undefined: 1). A replay of this micro-batch computes
  // loss_fn(batch) / micro_batches * loss_scale, bit for bit.
  void RecordFirstMicroBatch(const torch::Tensor& loss,
                             const torch::Tensor& loss_scale = torch::Tensor());

  // The module buffers as the first micro-batch's forward will read them.
  // BeginStep takes them; a trainer whose wrapper overwrites buffers
  // between BeginStep and the forward (DDP's broadcast_buffers) calls this
  // after that, right before the module's forward. A replay of this rank's
  // micro-batch starts from these buffers, and the weight vote sees them:
  // on a healthy job every replica holds the same values there.
  void CaptureForwardBuffers();

  // True on audit steps until the first micro-batch's local gradients are
  // recorded: then the caller passes them to RecordOriginalGradients.
  bool WantsOriginalGradients() const;

  // The first micro-batch's local gradients of the parameters at
  // `parameter_indices` (positions in Create's `parameters`), before any
  // all-reduce or further accumulation. May be called several times (a DDP
  // bucket at a time); every parameter not given counts as no gradient.
  void RecordOriginalGradients(const std::vector<size_t>& parameter_indices,
                               const std::vector<torch::Tensor>& gradients);
  // The same from each parameter's current .grad (a trainer that
  // accumulates locally before one all-reduce).
  void RecordOriginalGradientsFromParameters();

  // Check 1 before a bucket's all-reduce: its local gradients. Never throws
  // (it runs inside the caller's backward, where one rank's exception would
  // leave the others in the all-reduce): an error is kept, and Finish
  // carries it to every rank.
  void ScanLocalBucket(const torch::Tensor& local);
  // An error in the caller's own part of the step (the Python hook's bucket
  // hand-off, say; any thread), kept like ScanLocalBucket's. Never throws.
  void NoteFailure(const std::string& what);
  // After bucket `index`'s all-reduce: the reduced gradients, scanned and
  // fingerprinted in Finish (the tensor must hold them until then).
  void AddReducedBucket(size_t index, const torch::Tensor& reduced);

  // Checks 1 and 2 and, at exchange steps (audit steps, every 100th step
  // without audits, and any step whose reduced gradients hold NaN/Inf:
  // step_core.h's IsExchangeStep), the agreement all-reduce: returns the
  // decision every rank takes. An ordinary step issues no collective: its
  // decision reads the reduced scan, the same bits on every rank, and an
  // error reaches every rank through the buckets (StepPipeline::
  // ScanLocalBucket) or, when it came after the last one, the next step's. On skip the parameters' gradients are zeroed (except
  // after a loss scaler's overflow: decision.overflow); on apply they are
  // clipped when options.max_grad_norm is set (off by default; the norm is
  // the unscaled one under a loss scaler). Reports the step. Collective:
  // every rank calls it at every step.
  //
  // At the first audit step each rank first replays its own micro-batch
  // (the preflight): when that does not reproduce what it trained on,
  // every rank skips the step (the reason says so) and the preflight runs
  // again at the next audit step, on that step's micro-batch, since a
  // transient fault on the first looks the same in one try; when the
  // second try differs too (on any rank), every rank skips that step and
  // returns the same FailedPrecondition naming what differed, the likely
  // causes and their fixes.
  //
  // An error on any rank (a scan, the exchange, a replay that raises)
  // never leaves before a collective the others run: it reaches every rank
  // through the agreement (a poisoned bucket sends every rank there), every rank skips the step (gradients zeroed) and
  // returns the same error, the failing rank's code and message; the engine
  // is ready for the next step. Whatever the path, the deterministic-
  // algorithms setting is as it was before BeginStep.
  // FailedPrecondition when no bucket was reduced this step.
  absl::StatusOr<StepDecision> Finish();

  // Ends a step that will not reach Finish (the trainer's own code raised
  // inside it): puts back the deterministic-algorithms setting. Not a
  // collective; the other ranks are wherever the trainer's error left them.
  void AbortStep();

  // Check 3 after optimizer.step() (or after a skipped step): fingerprints
  // parameters and buffers on weight-check steps and always when
  // `checkpoint` (then optimizer state too), and sends them. Training does
  // not wait for the verdict. Returns the milliseconds it took (0 when it
  // did nothing).
  absl::StatusOr<double> AfterOptimizerStep(bool checkpoint);

  // True when sdcd allows a checkpoint of the current step (every rank gets
  // the same answer: collective). FailedPrecondition unless
  // AfterOptimizerStep(true) ran for this step.
  absl::StatusOr<bool> MayCheckpoint();

  // Where the job's checkpoints stand, as of the last MayCheckpoint or
  // RefreshCheckpoints (see sdc::Guard::Checkpoints).
  const protocol::CheckpointLedger& Checkpoints() const;
  // Asks the coordinator (not a collective). Unavailable when it cannot be
  // reached within `timeout`; FailedPrecondition without a coordinator.
  absl::StatusOr<protocol::CheckpointLedger> RefreshCheckpoints(absl::Duration timeout);

  // An op with no deterministic implementation ran on this rank during an
  // audit step (`what` names it). Ops run from C++ are noticed by the
  // engine itself; sdc_guard reports those Python's warnings saw. At the
  // step's Finish every rank turns replay audits off for the job (one
  // small collective on audit steps): training goes on with non-finite
  // checks and weight votes, sdcd records why, and no replay blames a GPU
  // for an op's own nondeterminism.
  void NoteNondeterministic(const std::string& what);

  // A point in the model's forward where activation faults are injected
  // (tests and demos only; returns `activation` unless fault injection is
  // armed for this rank and step).
  torch::Tensor FaultPoint(const torch::Tensor& activation);

  GuardSummary Summary() const;
  uint32_t rank() const;
  uint32_t world_size() const;
  uint64_t step() const;
  // Whether the current step is an audit step (after BeginStep).
  bool auditing() const;
  const GuardOptions& options() const;
  // Stops the link after flushing reports for up to `flush`.
  void Shutdown(absl::Duration flush = absl::Seconds(5));

 private:
  class Impl;
  explicit GuardEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_GUARD_ENGINE_H_
