#include "client/weight_check.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  repair_source_ = majority_source;
  ctx_.Log(absl::StrCat("weight minority at step ", repair_step_, ": ", explanation,
                        "; repair from rank ", repair_source_, " once every rank of the group knows"));
}

uint64_t WeightCheck::RepairDigest() const {
  std::vector<torch::Tensor> tensors = model_.Weights();
  std::vector<std::string> names = model_.weight_names();
  if (optimizer_state_) {
    for (const torch::Tensor& t : optimizer_state_()) {
      names.push_back(absl::StrCat("optimizer.", names.size() - model_.weight_names().size()));
      tensors.push_back(t);
    }
  }
  return client::Digest(names, Fingerprints(ctx_.fingerprint_key(), tensors));
}

void WeightCheck::Copy(const RepairPlan& plan) {
  // Tags above the audits' (replay_audit.cc: 1000, 3000, 5000 and up).
  constexpr int kRepairTag = 1 << 24;
  const uint32_t me = ctx_.rank();
  const bool receiver =
      std::find(plan.receivers.begin(), plan.receivers.end(), me) != plan.receivers.end();
  if (me != *plan.source && !receiver) return;
  std::vector<torch::Tensor> all = model_.Weights(/*live=*/true);
  if (optimizer_state_) {
    for (const torch::Tensor& t : optimizer_state_()) all.push_back(t);
  }
  torch::NoGradGuard no_grad;
  const torch::Device& there = ctx_.collective_device();
  for (size_t i = 0; i < all.size(); ++i) {
    const torch::Tensor& t = all[i];
    // Replicas hold the same layout, so every rank skips the same ones.
    if (!t.defined() || t.numel() == 0) continue;
    const int tag = kRepairTag + static_cast<int>(i);
    if (me == *plan.source) {
      std::vector<torch::Tensor> one = {t.detach().to(there).contiguous()};
      std::vector<c10::intrusive_ptr<c10d::Work>> sent;
      for (uint32_t dst : plan.receivers) {
        sent.push_back(ctx_.group().send(one, static_cast<int>(dst), tag));
      }
      for (auto& w : sent) w->wait();
    } else {
      std::vector<torch::Tensor> one = {torch::empty(t.sizes(), t.options().device(there))};
      ctx_.group().recv(one, static_cast<int>(*plan.source), tag)->wait();
      t.detach().copy_(one[0]);
    }
  }
}

absl::Status WeightCheck::RepairIfAgreed(const Agreement& a, StepDecision& decision) {
  // Under HSDP a replica group is one shard's replicas (across the
  // replicate dim): the same local shards, buffers and optimizer state
  // (DTensor state's local tensors), copied the same way.
  const ReplicaGroups& groups = ctx_.replica_groups();
  // A default agreement (no exchange this step) carries no steps.
  if (a.repair_step_by_group.size() != groups.count()) return absl::OkStatus();
  repaired_by_group_.resize(groups.count(), 0);
  std::vector<uint32_t> due;
  for (uint32_t g = 0; g < groups.count(); ++g) {
    if (a.repair_step_by_group[g] > repaired_by_group_[g]) due.push_back(g);
  }
  if (due.empty()) return absl::OkStatus();
  const uint32_t mine = groups.index_of(ctx_.rank());
  const bool my_group_due = std::find(due.begin(), due.end(), mine) != due.end();
  // The weights now, not at the vote: steps ran since, and the source's
  // GPU may have gone bad meanwhile (issue 39, case 8). Every rank of the
  // process group joins (it knows from the agreement that some group is
  // due); a rank of a group that is not due sends zeros.
  std::vector<int64_t> words(2, 0);
  std::vector<int64_t> gathered;
  SDC_TORCH_TRY({
    if (my_group_due) {
      words[0] = static_cast<int64_t>(RepairDigest());
      words[1] = static_cast<int64_t>(repair_source_);
    }
    gathered = ctx_.AllGather(words);
  });
  std::vector<uint64_t> digests(groups.ranks());
  for (size_t r = 0; r < digests.size(); ++r) digests[r] = static_cast<uint64_t>(gathered[2 * r]);
  // Every rank plans every due group alike (the same gathered words), so
  // every rank knows which groups copy and verifies them alike below.
  std::vector<std::pair<uint32_t, RepairPlan>> copies;
  for (uint32_t g : due) {
    const uint64_t step = a.repair_step_by_group[g];
    repaired_by_group_[g] = step;
    const std::vector<uint32_t> members = groups.members(g);
    // Every rank of the group holds a verdict at least as new as `step`;
    // the group's lowest rank's names the source every rank considers.
    const uint32_t hint = static_cast<uint32_t>(gathered.at(2 * members.front() + 1));
    const RepairPlan plan = PlanRepair(members, digests, hint);
    const bool log = g == mine;
    if (!plan.source.has_value()) {
      if (log) {
        ctx_.Log(absl::StrCat("no repair of the weight minority of step ", step,
                              " in replica group ", groups.id(g), ": rank ", hint,
                              "'s weights changed since the vote and no strict majority of the "
                              "group holds one model now; the next weight vote decides"));
      }
      continue;
    }
    if (plan.receivers.empty()) {
      if (log) {
        ctx_.Log(absl::StrCat("no repair of the weight minority of step ", step,
                              " in replica group ", groups.id(g), ": every rank of the group "
                              "holds rank ", *plan.source, "'s weights and optimizer state now"));
      }
      continue;
    }
    if (log && *plan.source != hint) {
      ctx_.Log(absl::StrCat("rank ", hint, "'s weights changed since the vote of step ", step,
                            "; repairing from rank ", *plan.source,
                            ", which holds the majority's"));
    }
    if (g == mine) {
      SDC_TORCH_TRY(Copy(plan));
    }
    copies.emplace_back(g, plan);
  }
  if (copies.empty()) return absl::OkStatus();
  // Verified by fingerprint after the copy: every rank joins a second
  // all-gather (every rank knows some group copied); a copying group's
  // ranks put in their digest now, which must equal the source's.
  std::vector<int64_t> after;
  SDC_TORCH_TRY({
    std::vector<int64_t> word(1, 0);
    for (const auto& [g, plan] : copies) {
      if (g == mine) word[0] = static_cast<int64_t>(RepairDigest());
    }
    after = ctx_.AllGather(word);
  });
  std::vector<std::string> failed;
  for (const auto& [g, plan] : copies) {
    std::vector<std::string> to, wrong;
    for (uint32_t r : plan.receivers) {
      to.push_back(absl::StrCat(r));
      if (after.at(r) != after.at(*plan.source)) wrong.push_back(absl::StrCat(r));
    }
    const uint64_t step = repaired_by_group_[g];
    if (!wrong.empty()) {
      failed.push_back(absl::StrCat(
          "the weight repair of rank(s) ", absl::StrJoin(wrong, ", "), " from rank ", *plan.source,
          " (replica group ", groups.id(g), ", the weight minority of step ", step,
          ") did not verify: their fingerprints differ from the source's after the copy"));
      continue;
    }
    if (g != mine) continue;
    decision.repaired = true;
    ++repairs_;
    ctx_.Log(absl::StrCat("replica group ", groups.id(g), ": weights, buffers and optimizer state "
                          "of rank(s) ", absl::StrJoin(to, ", "), " restored from rank ",
                          *plan.source, " (the weight minority of step ", step,
                          "), verified by fingerprint"));
  }
  if (!failed.empty()) {
    // Every rank read the same digests: every rank skips this step alike.
    const std::string why = absl::StrJoin(failed, "; ");
    ctx_.Log(why);
    decision.apply = false;
    decision.reason = decision.reason.empty() ? why : absl::StrCat(decision.reason, "; ", why);
  }
  return absl::OkStatus();
}

void WeightCheck::Summarize(GuardSummary& summary) const {
  summary.weight_checks = weight_checks_;
  summary.repairs = repairs_;
}

}  // namespace sdc::client
