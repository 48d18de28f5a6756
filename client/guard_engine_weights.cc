#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/guard_engine_internal.h"
#include "client/small_collectives.h"

// Check 3 and the checkpoint gate: weight fingerprints after the optimizer
// step (scheduled, and at every checkpoint with the optimizer state), and
// MayCheckpoint: sdcd's decision, or the in-band fallback.

namespace sdc::client {
namespace {

// What the coordinator said about the job's checkpoints.
void Learn(core::CheckpointLedger& ledger, const v1::CheckpointDecision& d) {
  ledger.Learn(d.confirmed_through_step(),
               absl::MakeConstSpan(d.revoked_steps().data(), d.revoked_steps().size()));
}

uint64_t Digest(const std::vector<std::string>& names,
                const std::vector<kernels::Fingerprint>& fps) {
  kernels::ModelDigestBuilder d;
  for (size_t i = 0; i < fps.size(); ++i) d.Add(names[i], fps[i]);
  return d.Finish();
}

}  // namespace

absl::StatusOr<double> GuardEngine::Impl::AfterOptimizerStep(bool checkpoint) {
  const FaultPlan& f = fault_;
  if (f.kind == FaultKind::kWeight && f.FiresAt(rank_, step_)) {
    SDC_TORCH_TRY(FlipMantissaBit(params_.front(), 16));
    Log(absl::StrCat("INJECTED a bit flip into weight ", param_names_.front(), " after step ", step_));
  }
  if (f.kind == FaultKind::kFrozenWeight && f.FiresAt(rank_, step_) &&
      state_.size() > buffers_.size()) {
    SDC_TORCH_TRY(FlipMantissaBit(state_.front(), 16));
    Log(absl::StrCat("INJECTED a bit flip into frozen weight ", state_names_.front(),
                     " after step ", step_));
  }
  if (f.kind == FaultKind::kOptimizerState && f.FiresAt(rank_, step_) && optimizer_state_) {
    SDC_TORCH_TRY({
      for (torch::Tensor& t : optimizer_state_()) {
        if (!t.is_floating_point() || t.numel() == 0) continue;
        FlipMantissaBit(t, 16);
        Log(absl::StrCat("INJECTED a bit flip into optimizer state after step ", step_));
        break;
      }
    });
  }
  const bool scheduled = options_.weight_check_every > 0 && step_ % options_.weight_check_every == 0;
  if (!scheduled && !checkpoint) return 0.0;
  const absl::Time start = absl::Now();
  ++summary_.weight_checks;
  core::WeightReport w;
  SDC_TORCH_TRY({
    w.tensors = Fingerprints(Weights());
    w.digest = Digest(weight_names_, w.tensors);
    w.checkpoint = checkpoint;
    if (checkpoint) {
      const std::vector<torch::Tensor> state =
          optimizer_state_ ? optimizer_state_() : std::vector<torch::Tensor>{};
      std::vector<std::string> names;
      for (size_t i = 0; i < state.size(); ++i) names.push_back(absl::StrCat("optimizer.", i));
      w.has_optimizer_digest = true;
      w.optimizer_digest = Digest(names, Fingerprints(state));
      checkpoint_weights_sent_ = true;
    }
  });
  Send(std::move(w));
  const double ms = MsSince(start);
  if (metrics_ != nullptr) metrics_->WeightsChecked(ms);
  return ms;
}

absl::StatusOr<bool> GuardEngine::Impl::MayCheckpoint() {
  if (!checkpoint_weights_sent_) {
    return absl::FailedPreconditionError(
        "MayCheckpoint needs AfterOptimizerStep(/*checkpoint=*/true) at this step");
  }
  bool allowed = false;
  bool in_band = false;  // Decided here, not by the coordinator.
  std::string reason;
  if (link_ != nullptr) {
    absl::StatusOr<v1::CheckpointDecision> d = link_->MayCheckpoint(step_, options_.checkpoint_wait);
    if (d.ok()) {
      allowed = d->allowed();
      reason = d->reason();
      Learn(checkpoints_, *d);
    } else if (options_.checkpoint_fallback == CheckpointFallback::kInBand) {
      in_band = true;
      reason = "coordinator unreachable: in-band vote";
      allowed = true;  // Refined by the in-band digest vote below.
    } else {
      reason = absl::StrCat("coordinator unreachable (", d.status().message(),
                            "): checkpoints are vetoed by policy");
    }
  } else {
    reason = options_.checkpoint_fallback == CheckpointFallback::kInBand
                 ? "no coordinator: in-band vote"
                 : "no coordinator configured: checkpoints are vetoed by policy";
    allowed = options_.checkpoint_fallback == CheckpointFallback::kInBand;
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
    SDC_TORCH_TRY(d = Digest(weight_names_, Fingerprints(Weights())));
    digest_hi = static_cast<int64_t>(d >> 32);
    digest_lo = static_cast<int64_t>(d & 0xffffffffu);
  }
  std::vector<int64_t> m = {allowed ? 0 : 1, digest_hi, -digest_hi, digest_lo, -digest_lo};
  SDC_TORCH_TRY(AllReduceMax(*pg_, small_collectives_, m));
  const bool same_weights = m[1] == -m[2] && m[3] == -m[4];
  const bool all_allowed = m[0] == 0 && same_weights;
  if (!all_allowed) {
    ++summary_.checkpoints_vetoed;
    summary_.last_veto = !same_weights ? "replicas hold different weights (in-band digest)"
                                       : (reason.empty() ? "vetoed on another rank" : reason);
    Log(absl::StrCat("checkpoint of step ", step_, " vetoed: ", summary_.last_veto));
  } else {
    ++summary_.checkpoints_allowed;
    checkpoints_.Allowed(step_);
  }
  // A failure vetoes the first checkpoint after it, not every later one.
  failed_since_checkpoint_.clear();
  return all_allowed;
}

absl::StatusOr<core::CheckpointLedger> GuardEngine::Impl::RefreshCheckpoints(absl::Duration timeout) {
  if (link_ == nullptr) return absl::FailedPreconditionError("no coordinator configured");
  absl::StatusOr<v1::CheckpointDecision> d = link_->CheckpointStatus(timeout);
  if (!d.ok()) return d.status();
  Learn(checkpoints_, *d);
  return checkpoints_;
}

}  // namespace sdc::client
