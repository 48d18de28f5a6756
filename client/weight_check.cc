#include "client/weight_check.h"

#include <map>
#include <optional>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tensor_checks.h"

namespace sdc::client {

WeightCheck::WeightCheck(const EngineContext& ctx, ModelTensors& model,
                         OptimizerStateFn optimizer_state)
    : ctx_(ctx), model_(model), optimizer_state_(std::move(optimizer_state)) {}

void WeightCheck::BeginStep() { checkpoint_weights_sent_ = false; }

void WeightCheck::InjectFaults(const StepContext& step) {
  const FaultPlan& f = ctx_.fault();
  if (!f.FiresAt(ctx_.rank(), step.step)) return;
  if (f.kind == FaultKind::kWeight) {
    FlipMantissaBit(model_.parameters().front(), 16);
    ctx_.Log(absl::StrCat("INJECTED a bit flip into weight ", model_.parameter_names().front(),
                          " after step ", step.step));
  }
  if (f.kind == FaultKind::kFrozenWeight && !model_.frozen().empty()) {
    FlipMantissaBit(model_.frozen().front(), 16);
    ctx_.Log(absl::StrCat("INJECTED a bit flip into frozen weight ", model_.frozen_names().front(),
                          " after step ", step.step));
  }
  if (f.kind == FaultKind::kOptimizerState && optimizer_state_) {
    for (torch::Tensor& t : optimizer_state_()) {
      if (!t.is_floating_point() || t.numel() == 0) continue;
      FlipMantissaBit(t, 16);
      ctx_.Log(absl::StrCat("INJECTED a bit flip into optimizer state after step ", step.step));
      break;
    }
  }
}

absl::StatusOr<double> WeightCheck::AfterOptimizerStep(const StepContext& step, bool checkpoint) {
  SDC_TORCH_TRY(InjectFaults(step));
  const uint32_t every = ctx_.options().weight_check_every;
  const bool scheduled = every > 0 && step.step % every == 0;
  if (!scheduled && !checkpoint) return 0.0;
  const absl::Time start = absl::Now();
  ++weight_checks_;
  protocol::WeightReport w;
  SDC_TORCH_TRY({
    w.tensors = Fingerprints(ctx_.fingerprint_key(), model_.Weights());
    w.digest = client::Digest(model_.weight_names(), w.tensors);
    w.checkpoint = checkpoint;
    if (checkpoint) {
      const std::vector<torch::Tensor> state =
          optimizer_state_ ? optimizer_state_() : std::vector<torch::Tensor>{};
      std::vector<std::string> names;
      for (size_t i = 0; i < state.size(); ++i) names.push_back(absl::StrCat("optimizer.", i));
      w.has_optimizer_digest = true;
      w.optimizer_digest = client::Digest(names, Fingerprints(ctx_.fingerprint_key(), state));
      checkpoint_weights_sent_ = true;
    }
  });
  ctx_.Send(step.step, std::move(w));
  const double ms = MsSince(start);
  if (TrainerMetrics* metrics = ctx_.metrics(); metrics != nullptr) metrics->WeightsChecked(ms);
  return ms;
}

uint64_t WeightCheck::Digest() const {
  return client::Digest(model_.weight_names(), Fingerprints(ctx_.fingerprint_key(), model_.Weights()));
}

void WeightCheck::NoteMinority(uint64_t step, uint32_t majority_source,
                               const std::string& explanation) {
  if (step <= repair_step_) return;
  repair_step_ = step;
  ctx_.Log(absl::StrCat("weight minority at step ", repair_step_, ": ", explanation,
                        "; the majority's weights are on rank ", majority_source,
                        "; repair once every rank knows"));
}

absl::Status WeightCheck::RepairIfAgreed(const Agreement& a, StepDecision& decision) {
  // Only what every rank holds alike decides whether to enter the
  // collectives below: the agreement's minimum and repaired_step_ (set here
  // from that minimum). Ranks may hold different newest verdicts (one heard
  // step 98's, another only step 97's): a rank that waited for its own
  // newest one would stay out while the others gathered, and the job hung.
  if (a.repair_step_known_by_all <= repaired_step_) return absl::OkStatus();
  repaired_step_ = a.repair_step_known_by_all;
  // The weights now, not at the vote: steps ran since, and the vote's
  // majority rank may have gone bad meanwhile (issue 39, case 8). Every
  // rank's digest now, all-gathered: the repair copies from the lowest rank
  // holding what a strict majority holds, and from nobody when no majority
  // holds one model or every rank already holds the same. Every rank
  // decides alike from the same gathered digests.
  std::vector<int64_t> digests;
  SDC_TORCH_TRY(digests = ctx_.AllGather({static_cast<int64_t>(Digest())}));
  std::map<int64_t, size_t> holders;
  for (int64_t d : digests) ++holders[d];
  if (holders.size() == 1) {
    ctx_.Log(absl::StrCat("no repair for the verdict of step ", repaired_step_,
                          ": every rank holds the same weights now"));
    return absl::OkStatus();
  }
  std::optional<uint32_t> source;
  for (uint32_t r = 0; r < digests.size() && !source.has_value(); ++r) {
    if (holders[digests[r]] * 2 > digests.size()) source = r;
  }
  if (!source.has_value()) {
    ctx_.Log(absl::StrCat("no repair for the verdict of step ", repaired_step_,
                          ": no strict majority holds one model now; the next weight vote "
                          "decides"));
    return absl::OkStatus();
  }
  std::vector<torch::Tensor> all = model_.Weights(/*live=*/true);
  SDC_TORCH_TRY({
    if (optimizer_state_) {
      for (const torch::Tensor& t : optimizer_state_()) all.push_back(t);
    }
    torch::NoGradGuard no_grad;
    for (torch::Tensor& t : all) {
      std::vector<torch::Tensor> one = {t.detach()};
      c10d::BroadcastOptions o;
      o.rootRank = static_cast<int>(*source);
      ctx_.group().broadcast(one, o)->wait();
    }
  });
  decision.repaired = true;
  ++repairs_;
  ctx_.Log(absl::StrCat("weights, buffers and optimizer state restored from rank ", *source));
  return absl::OkStatus();
}

void WeightCheck::Summarize(GuardSummary& summary) const {
  summary.weight_checks = weight_checks_;
  summary.repairs = repairs_;
}

}  // namespace sdc::client
