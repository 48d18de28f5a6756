#ifndef SDC_CLIENT_STEP_PIPELINE_H_
#define SDC_CLIENT_STEP_PIPELINE_H_

// What every step runs, whatever else it checks: check 1 on the gradient
// buckets the caller hands over (a non-finite scan of each local bucket
// before its all-reduce; after the backward, a scan, the squared norm and a
// digest of the reduced buckets), the agreement all-reduce every rank
// decides from at exchange steps (step_core.h), and applying or skipping the step alike on
// every rank. Also the faults a step's forward and gradients can carry
// (tests and demos only).
//
// Thread-safe for ScanLocalBucket and AddReducedBucket, which autograd's
// threads (a DDP communication hook) may call while the training thread
// waits in backward(): they take a lock. Everything else is the training
// thread's.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/engine_context.h"
#include "client/engine_types.h"
#include "client/model_tensors.h"
#include "client/step_core.h"
#include "kernels/cuda_check_queue.h"
#include "kernels/cuda_launcher.h"

namespace sdc::client {

class StepPipeline {
 public:
  // Check 1's results for a step.
  struct Gradients {
    uint64_t local_nonfinite = 0;    // NaN/Inf elements in this rank's local buckets.
    uint64_t reduced_nonfinite = 0;  // NaN/Inf elements in the reduced buckets.
    double sum_squares = 0;          // Of the reduced gradients.
    uint64_t reduced_digest = 0;     // Over the reduced buckets in index order.
    double loss_scale = 0;           // The loss scaler's scale; 0: none.
    double ms = 0;                   // The scans and the digest (local work).
  };

  // REQUIRES: `ctx` and `model` outlive the pipeline.
  StepPipeline(const EngineContext& ctx, ModelTensors& model);
  // CUDA buckets' checks go through `launcher` (kernels::RuntimeLauncher()
  // above). REQUIRES: it outlives the pipeline.
  StepPipeline(const EngineContext& ctx, ModelTensors& model, kernels::CudaLauncher& launcher);

  // Forgets the previous step's buckets.
  void BeginStep();

  // Before a bucket's all-reduce: scans its local gradients (a CUDA
  // bucket's scan is queued on the current stream into the step's device
  // results (kernels/cuda_check_queue.h) and read in CheckGradients:
  // nothing here waits for or reads the device). Never throws:
  // it runs inside the caller's backward, where an exception on one rank
  // would leave the others waiting in the all-reduce; an error is kept for
  // Finish to carry to every rank (TakeFailure). While this rank holds an
  // error (this scan's, an earlier NoteFailure or a carried one) the
  // bucket's first element is set to NaN before it is all-reduced: NaN
  // survives the SUM, so every rank's reduced scan sees it and every rank
  // runs the agreement, which names the failing rank and its error. No
  // extra collective is needed for a failure to reach every rank.
  void ScanLocalBucket(const StepContext& step, const torch::Tensor& local);
  // An error in the caller's own bucket hand-off (the Python hook's), kept
  // like ScanLocalBucket's. The first error of a step is kept.
  void NoteFailure(const absl::Status& failure);
  // The step's first kept error, or OK.
  absl::Status TakeFailure();
  // An error no bucket of this step carried to the other ranks (it came
  // after the last all-reduce on a step without the agreement): the next
  // step starts holding it, so its first bucket carries it (see
  // ScanLocalBucket) and every rank fails that step alike.
  void CarryFailure(const absl::Status& failure);
  // After bucket `index`'s all-reduce. The tensor must hold the reduced
  // gradients until CheckGradients.
  void AddReducedBucket(const StepContext& step, size_t index, const torch::Tensor& reduced);

  // Check 1 on what the buckets brought: scans and digests the reduced
  // buckets (in index order, whatever order they arrived in) and hands them
  // back. On a GPU this is the step's one device-to-host read: the reduced
  // buckets' scan and fingerprints join the local scans in the step's
  // device results, read back together. FailedPrecondition when no bucket
  // was reduced this step; Internal on a libtorch or kernel failure.
  // `loss_scale` (undefined: none) is read with the rest: on the buckets'
  // GPU it comes back in the same read.
  absl::StatusOr<Gradients> CheckGradients(const StepContext& step,
                                           const torch::Tensor& loss_scale = torch::Tensor());

  // The agreement: one MAX all-reduce of every rank's `view` (collective).
  // Internal on a libtorch failure.
  absl::StatusOr<Agreement> Agree(const LocalView& view) const;

  // Applies `decision` to the gradients identically on every rank: on skip
  // they are zeroed, except after a loss scaler's overflow (decision.
  // overflow: the scaler must find the NaN/Inf to skip the step and back
  // off); on apply they are clipped to options.max_grad_norm when it is set
  // and decision.grad_norm (unscaled) exceeds it (decision.clip_coef says
  // by what). Counts the step. Internal on a libtorch failure.
  absl::Status ApplyOrSkip(const StepContext& step, StepDecision& decision);

  // A point in the model's forward where activation faults are injected:
  // returns `activation` unless this rank's injected fault fires at this
  // step (`replaying`: the forward is a replay of a peer's micro-batch).
  torch::Tensor FaultPoint(const StepContext& step, const torch::Tensor& activation,
                           bool replaying) const;

  // steps and skipped.
  void Summarize(GuardSummary& summary) const;

 private:
  const EngineContext& ctx_;
  ModelTensors& model_;
  uint64_t steps_ = 0;
  uint64_t skipped_ = 0;

  mutable absl::Mutex mu_;
  uint64_t local_nonfinite_ ABSL_GUARDED_BY(mu_) = 0;
  double local_ms_ ABSL_GUARDED_BY(mu_) = 0;
  bool local_fault_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  absl::Status carried_ ABSL_GUARDED_BY(mu_);
  // A CUDA step's checks, queued on the device and read once per step
  // (created at the first CUDA bucket).
  kernels::CudaLauncher& launcher_;
  std::unique_ptr<kernels::CudaCheckQueue> queue_ ABSL_GUARDED_BY(mu_);
  // The queue's handles of this step's local bucket scans.
  std::vector<size_t> local_scans_ ABSL_GUARDED_BY(mu_);
  // Work is queued that no Read has collected.
  bool queue_unread_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<size_t, torch::Tensor>> reduced_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_STEP_PIPELINE_H_
