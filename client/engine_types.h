#ifndef SDC_CLIENT_ENGINE_TYPES_H_
#define SDC_CLIENT_ENGINE_TYPES_H_

// The plain types of client::GuardEngine's API (guard_engine.h), apart so
// that the engine's parts (step_pipeline.h, replay_audit.h, weight_check.h,
// ...) speak them without depending on the engine that composes them.

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sdc::client {

// Computes the training loss of one micro-batch (a list of tensors) with the
// trainer's model. The engine calls it to replay a peer's micro-batch; it
// must be a pure function of the batch, the parameters, the buffers and the
// RNG state, and must not run the gradient all-reduce (for DDP: the wrapped
// module, not the DDP wrapper).
using LossFn = std::function<torch::Tensor(const std::vector<torch::Tensor>& batch)>;

// The tensors of the optimizer's state, in a fixed order (the same on every
// rank). Called at checkpoint steps and for a weight repair.
using OptimizerStateFn = std::function<std::vector<torch::Tensor>()>;

struct NamedTensors {
  std::vector<std::string> names;
  std::vector<torch::Tensor> tensors;
};

struct StepDecision {
  bool apply = true;       // Run optimizer.step(); else the step is skipped.
  std::string reason;      // Why skipped.
  // Skipped for the loss scaler's overflow (NaN/Inf under a GradScaler):
  // the gradients keep their NaN/Inf, so GradScaler.step finds them, skips
  // optimizer.step() and the scaler backs off. Other skips zero them.
  bool overflow = false;
  bool loss_scaled = false;  // The step ran under a loss scaler.
  // L2 norm of the reduced gradients (before clipping; under a loss scaler,
  // divided by its scale: what the optimizer sees once the scaler unscales).
  double grad_norm = 0;
  double clip_coef = 1;    // Applied to the gradients (1 = unclipped).
  bool audited = false;    // A replay audit ran on this step.
  // No coordinator verdict: with verdict_wait 0 (the default) when sdcd was
  // not connected (the results wait in the link); else none arrived in time.
  bool audit_unverified = false;
  // In-band verdict: pass, faulty, systemic, ...; "failed" when a rank's
  // exchange or replay raised (Finish then returns that error on every rank).
  std::string audit_outcome;
  bool repaired = false;   // Weights were restored from the majority this step.
  // Time spent in the guard's own work this step, in milliseconds:
  double check1_ms = 0;    // Non-finite scans and the reduced-gradient digest (local work).
  double agreement_ms = 0; // The agreement all-reduce, waiting for the slowest rank included.
  double audit_ms = 0;     // Batch exchange, replays, in-band comparison, verdict wait.
  double weight_ms = 0;    // Weight fingerprints after the optimizer step (of this step).
};

// Counters since the engine was created. Each part of the engine fills its
// own fields (GuardEngine::Summary asks every part).
struct GuardSummary {
  uint64_t steps = 0;
  uint64_t skipped = 0;
  uint64_t audits = 0;
  uint64_t audits_unverified = 0;
  uint64_t audit_mismatches = 0;
  uint64_t weight_checks = 0;
  uint64_t repairs = 0;
  uint64_t checkpoints_allowed = 0;
  uint64_t checkpoints_vetoed = 0;
  uint64_t reports_sent = 0;
  uint64_t reports_acked = 0;
  uint64_t reports_dropped = 0;
  bool coordinator_connected = false;
  std::string last_veto;
  std::string audits_off;  // Why replay audits are off for the job; empty while on.
  std::string ToString() const;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_ENGINE_TYPES_H_
