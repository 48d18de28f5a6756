#include "client/checkpoint_gate.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/tensor_checks.h"

namespace sdc::client {
namespace {

// What the coordinator said about the job's checkpoints.
void Learn(protocol::CheckpointLedger& ledger, const v1::CheckpointDecision& d) {
  ledger.Learn(d.confirmed_through_step(),
               absl::MakeConstSpan(d.revoked_steps().data(), d.revoked_steps().size()));
}

}  // namespace

CheckpointGate::CheckpointGate(const EngineContext& ctx) : ctx_(ctx) {}

void CheckpointGate::StepSkipped(const StepContext& step, const std::string& reason) {
  if (failed_since_checkpoint_.empty()) {
    failed_since_checkpoint_ = absl::StrCat("step ", step.step, ": ", reason);
  }
}

absl::StatusOr<bool> CheckpointGate::MayCheckpoint(const StepContext& step,
                                                   const WeightCheck& weights) {
  if (!weights.checkpoint_weights_sent()) {
    return absl::FailedPreconditionError(
        "MayCheckpoint needs AfterOptimizerStep(/*checkpoint=*/true) at this step");
  }
  const GuardOptions& options = ctx_.options();
  const bool fallback_in_band = options.checkpoint_fallback == CheckpointFallback::kInBand;
  bool allowed = false;
  bool in_band = false;  // Decided here, not by the coordinator.
  std::string reason;
  if (CoordinatorLink* link = ctx_.link(); link != nullptr) {
    absl::StatusOr<v1::CheckpointDecision> d = link->MayCheckpoint(step.step, options.checkpoint_wait);
    if (d.ok()) {
      allowed = d->allowed();
      reason = d->reason();
      Learn(ledger_, *d);
    } else if (fallback_in_band) {
      in_band = true;
      reason = "coordinator unreachable: in-band vote";
      allowed = true;  // Refined by the in-band digest vote below.
    } else {
      reason = absl::StrCat("coordinator unreachable (", d.status().message(),
                            "): checkpoints are vetoed by policy");
    }
  } else {
    reason = fallback_in_band ? "no coordinator: in-band vote"
                              : "no coordinator configured: checkpoints are vetoed by policy";
    allowed = fallback_in_band;
    in_band = allowed;
  }
  // In-band, equal digests are not enough: a check that failed since the
  // last checkpoint (a skipped step) means some GPU computed wrong values,
  // and without the coordinator nobody knows whether it is still here.
  if (in_band && !failed_since_checkpoint_.empty()) {
    allowed = false;
    reason = absl::StrCat("in-band: a check failed since the last checkpoint (",
                          failed_since_checkpoint_, ")");
  }
  // In-band: every rank must hold the same weights (digest equality).
  int64_t digest_hi = 0, digest_lo = 0;
  {
    uint64_t d = 0;
    SDC_TORCH_TRY(d = weights.Digest());
    digest_hi = static_cast<int64_t>(d >> 32);
    digest_lo = static_cast<int64_t>(d & 0xffffffffu);
  }
  std::vector<int64_t> m = {allowed ? 0 : 1, digest_hi, -digest_hi, digest_lo, -digest_lo};
  SDC_TORCH_TRY(ctx_.AllReduceMax(m));
  const bool same_weights = m[1] == -m[2] && m[3] == -m[4];
  const bool all_allowed = m[0] == 0 && same_weights;
  if (!all_allowed) {
    ++vetoed_;
    last_veto_ = !same_weights ? "replicas hold different weights (in-band digest)"
                               : (reason.empty() ? "vetoed on another rank" : reason);
    ctx_.Log(absl::StrCat("checkpoint of step ", step.step, " vetoed: ", last_veto_));
  } else {
    ++allowed_;
    ledger_.Allowed(step.step);
  }
  // A failure vetoes the first checkpoint after it, not every later one.
  failed_since_checkpoint_.clear();
  return all_allowed;
}

absl::StatusOr<protocol::CheckpointLedger> CheckpointGate::Refresh(absl::Duration timeout) {
  CoordinatorLink* link = ctx_.link();
  if (link == nullptr) return absl::FailedPreconditionError("no coordinator configured");
  absl::StatusOr<v1::CheckpointDecision> d = link->CheckpointStatus(timeout);
  if (!d.ok()) return d.status();
  Learn(ledger_, *d);
  return ledger_;
}

void CheckpointGate::Summarize(GuardSummary& summary) const {
  summary.checkpoints_allowed = allowed_;
  summary.checkpoints_vetoed = vetoed_;
  summary.last_veto = last_veto_;
}

}  // namespace sdc::client
