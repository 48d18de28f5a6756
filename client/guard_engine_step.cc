#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/device.h"
#include "client/guard_engine_internal.h"
#include "client/small_collectives.h"
#include "kernels/nonfinite.h"

// A step: BeginStep, check 1 (non-finite scans of the local and reduced
// gradients, the reduced-gradient digest), the agreement all-reduce, the
// lone-NaN confirmation, a weight repair, apply or skip; and the injected
// faults a step can carry.

namespace sdc::client {

absl::Status GuardEngine::Impl::BeginStep(uint64_t step, std::vector<torch::Tensor> batch,
                                          int64_t micro_batches) {
  if (batch.empty()) return absl::InvalidArgumentError("a micro-batch needs at least one tensor");
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batches must be at least 1, got ", micro_batches));
  }
  // What a replay peer can be sent (SendBatch's header), checked at every
  // step on every rank: refused at an audit, the job would wait on this rank.
  if (kLeadSlots + batch.size() * kSlotsPerTensor > kHeaderSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a micro-batch of ", batch.size(), " tensors: replay audits send at most ",
        (kHeaderSlots - kLeadSlots) / kSlotsPerTensor));
  }
  for (const torch::Tensor& t : batch) {
    if (!t.defined()) return absl::InvalidArgumentError("a micro-batch tensor is undefined");
    if (t.dim() > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("a micro-batch tensor of ", t.dim(),
                                                     " dimensions: replay audits send at most ",
                                                     kMaxDims));
    }
  }
  DrainMessages();
  step_ = step;
  first_batch_ = std::move(batch);
  micro_batches_ = micro_batches;
  original_loss_bits_ = 0;
  loss_scale_ = torch::Tensor();
  original_buffers_.assign(buffers_.size(), kernels::Fingerprint{});
  checkpoint_weights_sent_ = false;
  {
    absl::MutexLock lock(&mu_);
    original_gradients_.assign(params_.size(), kernels::Fingerprint{});
    original_recorded_ = false;
    local_nonfinite_ = 0;
    local_fault_done_ = false;
    reduced_.clear();
    check1_ms_ = 0;
  }
  // A targeted plan every rank holds runs at the first step that is not a
  // scheduled audit.
  const uint64_t next_plan = last_plan_run_ < plans_held_by_all_ ? last_plan_run_ + 1 : 0;
  StepPlan sp = PlanStep(step, options_.audit_every, options_.weight_check_every, next_plan);
  if (!audits_off_.empty()) sp.scheduled_audit = false, sp.targeted_plan = 0;
  audit_ = sp.scheduled_audit || sp.targeted_plan != 0;
  plan_id_ = sp.scheduled_audit ? 0 : sp.targeted_plan;
  if (sp.scheduled_audit) {
    plan_ = core::PlanFullAudit(*topology_, step / options_.audit_every);
  } else if (sp.targeted_plan != 0) {
    plan_ = plans_[sp.targeted_plan];
    last_plan_run_ = sp.targeted_plan;
  }
  SDC_TORCH_TRY({
    // Undefined gradients: the first backward writes them exactly, so the
    // audited fingerprints equal a replay's torch::autograd::grad bits.
    for (const torch::Tensor& p : params_) {
      torch::Tensor param = p;
      param.mutable_grad() = torch::Tensor();
    }
    rng_state_ = CaptureRng(device_);
    CaptureForwardBuffers();
  });
  deterministic_before_ = at::globalContext().deterministicAlgorithms();
  deterministic_warn_only_before_ = at::globalContext().deterministicAlgorithmsWarnOnly();
  nondeterministic_.clear();
  alerts_.Uninstall();  // A step that ended in an exception left it installed.
  (void)alerts_.Take();
  if (audit_) {
    // Warn-only: an op with no deterministic implementation must not stop
    // training; Finish turns audits off instead.
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    alerts_.Install();
  }
  return absl::OkStatus();
}

void GuardEngine::Impl::RecordFirstMicroBatch(const torch::Tensor& loss,
                                              const torch::Tensor& loss_scale) {
  original_loss_bits_ = LossBits(loss);
  loss_scale_ = loss_scale.defined() ? loss_scale.detach() : torch::Tensor();
  // The buffers as the first micro-batch's forward left them (backward
  // does not touch them): what a replay must reproduce.
  if (audit_) original_buffers_ = Fingerprints(buffers_);
}

void GuardEngine::Impl::CaptureForwardBuffers() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) forward_buffers_[i].copy_(buffers_[i]);
}

std::vector<kernels::Fingerprint> GuardEngine::Impl::GradientFingerprints(
    const std::vector<torch::Tensor>& grads) {
  std::vector<kernels::Fingerprint> out = Fingerprints(grads);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) {
      out[i] = {static_cast<uint64_t>(params_[i].numel()) * params_[i].element_size(), 0, 0};
    }
  }
  return out;
}

void GuardEngine::Impl::RecordOriginalGradients(const std::vector<size_t>& indices,
                                                const std::vector<torch::Tensor>& gradients) {
  TORCH_CHECK(indices.size() == gradients.size(), "sdc-guard: ", indices.size(),
              " parameter indices for ", gradients.size(), " gradients");
  std::vector<torch::Tensor> dense;
  for (size_t k = 0; k < indices.size(); ++k) {
    TORCH_CHECK(indices[k] < params_.size(), "sdc-guard: parameter index ", indices[k],
                " of ", params_.size());
    dense.push_back(gradients[k]);
  }
  std::vector<kernels::Fingerprint> fps = Fingerprints(dense);
  absl::MutexLock lock(&mu_);
  for (size_t k = 0; k < indices.size(); ++k) {
    if (gradients[k].defined()) original_gradients_[indices[k]] = fps[k];
  }
  original_recorded_ = true;
}

void GuardEngine::Impl::ScanLocalBucket(const torch::Tensor& local) {
  const absl::Time start = absl::Now();
  const FaultPlan& f = fault_;
  bool inject = false;
  {
    absl::MutexLock lock(&mu_);
    if (f.kind == FaultKind::kNanGradient && f.FiresAt(rank_, step_) && !local_fault_done_) {
      inject = local_fault_done_ = true;
    }
  }
  if (inject) {
    torch::NoGradGuard no_grad;
    local.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
    Log(absl::StrCat("INJECTED NaN into a local gradient at step ", step_));
  }
  const uint64_t n = NonFinite({local});
  absl::MutexLock lock(&mu_);
  local_nonfinite_ += n;
  check1_ms_ += MsSince(start);
}

void GuardEngine::Impl::AddReducedBucket(size_t index, const torch::Tensor& reduced) {
  const FaultPlan& f = fault_;
  absl::MutexLock lock(&mu_);
  if (f.kind == FaultKind::kReducedGradient && f.FiresAt(rank_, step_) && reduced_.empty()) {
    FlipMantissaBit(reduced, 20);
    Log(absl::StrCat("INJECTED a bit flip into the reduced gradients at step ", step_));
  }
  reduced_.emplace_back(index, reduced);
}

torch::Tensor GuardEngine::Impl::FaultPoint(const torch::Tensor& x) {
  const FaultPlan& f = fault_;
  if (!f.FiresAt(rank_, step_)) return x;
  const bool activation = f.kind == FaultKind::kActivationScale || f.kind == FaultKind::kMantissaBitflip;
  if (!(activation || (f.kind == FaultKind::kReplay && replaying_))) return x;
  torch::Tensor y = x.detach().clone();
  {
    // The largest value, so the error is never lost below rounding.
    torch::NoGradGuard no_grad;
    auto flat = y.view({-1});
    const int64_t at = flat.abs().argmax().item<int64_t>();
    if (f.kind == FaultKind::kActivationScale) {
      flat[at].mul_(f.magnitude);
    } else {
      torch::Tensor element = flat.narrow(0, at, 1);
      FlipMantissaBit(element, 12);
    }
  }
  Log(absl::StrCat("INJECTED ", FaultKindName(f.kind), " into an activation at step ",
                   step_, replaying_ ? " (while replaying a peer)" : ""));
  // Gradients flow through the corrupted value as they would on faulty hardware.
  return x + (y - x).detach();
}

absl::StatusOr<StepDecision> GuardEngine::Impl::Finish() {
  StepDecision decision;
  decision.audited = audit_;
  LocalView view;
  uint64_t local_nonfinite = 0;
  std::vector<std::pair<size_t, torch::Tensor>> reduced;
  {
    absl::MutexLock lock(&mu_);
    reduced.swap(reduced_);
    local_nonfinite = local_nonfinite_;
    decision.check1_ms = check1_ms_;
  }
  if (reduced.empty()) {
    RestoreDeterminism();
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step_, ": no gradients were all-reduced (run the backward pass between "
        "BeginStep and Finish)"));
  }
  absl::StatusOr<ReducedCheck> check = CheckReduced(std::move(reduced));
  if (!check.ok()) return check.status();
  decision.check1_ms += check->ms;
  view.reduced_digest = check->digest;
  view.local_nonfinite = local_nonfinite > 0;
  view.reduced_nonfinite = check->nonfinite > 0;
  decision.grad_norm = std::sqrt(check->sum_squares);

  absl::StatusOr<std::string> audits_off_now = TurnAuditsOffIfNondeterministic(decision);
  if (!audits_off_now.ok()) return audits_off_now.status();

  // Check 2: replay audit, compared in-band so every rank decides alike.
  if (audit_) {
    const absl::Time audit_start = absl::Now();
    if (absl::Status s = Audit(decision, view); !s.ok()) return s;
    decision.audit_ms = MsSince(audit_start);
  }

  // The one agreement all-reduce.
  const absl::Time agreement_start = absl::Now();
  DrainMessages();
  view.plans_held = plans_held_;
  view.repair_step = repair_step_;
  std::vector<int64_t> agree = EncodeAgreement(view, rank_);
  SDC_TORCH_TRY(AllReduceMax(*pg_, small_collectives_, agree));
  const Agreement a = DecodeAgreement(agree);
  plans_held_by_all_ = a.plans_held_by_all;
  decision.agreement_ms = MsSince(agreement_start);
  const Decision d = Decide(a);
  decision.apply = d.apply;
  decision.reason = d.reason;

  if (absl::Status s = ConfirmLoneNonFinite(a); !s.ok()) return s;
  if (absl::Status s = RepairIfAgreed(a, decision); !s.ok()) return s;
  if (absl::Status s = ApplyOrSkip(decision); !s.ok()) return s;
  RestoreDeterminism();
  ++summary_.steps;
  if (metrics_ != nullptr) {
    metrics_->StepChecked(!decision.apply, local_nonfinite > 0, decision.audited,
                          decision.audit_ms, decision.check1_ms + decision.agreement_ms);
  }
  if (!decision.apply) {
    ++summary_.skipped;
    Log(absl::StrCat("step ", step_, " skipped on every rank: ", decision.reason));
    // Every rank took the same decision: the in-band checkpoint fallback
    // vetoes the next checkpoint on all of them.
    if (failed_since_checkpoint_.empty()) {
      failed_since_checkpoint_ = absl::StrCat("step ", step_, ": ", decision.reason);
    }
  }
  core::StepReport report;
  report.local_nonfinite = local_nonfinite;
  report.reduced_nonfinite = check->nonfinite;
  report.reduced_sum_squares = check->sum_squares;
  report.reduced_digest = view.reduced_digest;
  report.applied = decision.apply;
  report.skip_reason = decision.reason;
  report.audit_unverified = decision.audit_unverified;
  report.audits_off = *audits_off_now;
  Send(std::move(report));
  return decision;
}

absl::StatusOr<GuardEngine::Impl::ReducedCheck> GuardEngine::Impl::CheckReduced(
    std::vector<std::pair<size_t, torch::Tensor>> reduced) {
  std::sort(reduced.begin(), reduced.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  ReducedCheck out;
  const absl::Time start = absl::Now();
  std::vector<torch::Tensor> flats;
  std::vector<kernels::ScanResult> scans;
  std::vector<kernels::Fingerprint> fps;
  SDC_TORCH_TRY({
    for (const auto& [index, t] : reduced) flats.push_back(t.detach().contiguous());
    ThrowIfFailed(ScanOnDevice(flats, &scans));
    ThrowIfFailed(FingerprintOnDevice(flats, *fingerprint_key_, &fps));
  });
  for (const auto& r : scans) {
    out.nonfinite += r.nonfinite;
    out.sum_squares += r.sum_squares;
  }
  kernels::ModelDigestBuilder digest;
  for (size_t i = 0; i < fps.size(); ++i) digest.Add(absl::StrCat("bucket.", reduced[i].first), fps[i]);
  out.digest = digest.Finish();
  out.ms = MsSince(start);
  return out;
}

absl::StatusOr<std::string> GuardEngine::Impl::TurnAuditsOffIfNondeterministic(
    StepDecision& decision) {
  if (!audit_) return std::string();
  const std::string alert = alerts_.Take();
  if (!alert.empty()) NoteNondeterministic(alert);
  std::vector<int64_t> seen = {nondeterministic_.empty() ? 0 : 1};
  SDC_TORCH_TRY(AllReduceMax(*pg_, small_collectives_, seen));
  if (seen[0] == 0) return std::string();
  audits_off_ = nondeterministic_.empty()
                    ? "another rank ran an op with no deterministic implementation"
                    : nondeterministic_;
  audit_ = false;
  decision.audited = false;
  decision.audit_outcome = "audits_off";
  Log(absl::StrCat("replay audits are off for this job from step ", step_, ": ", audits_off_,
                   " (non-finite checks and weight votes go on)"));
  return audits_off_;
}

absl::Status GuardEngine::Impl::ConfirmLoneNonFinite(const Agreement& a) {
  if (!a.any_local_nonfinite || a.all_local_nonfinite || a.highest_local_nonfinite_rank < 0) {
    return absl::OkStatus();
  }
  const uint32_t subject = static_cast<uint32_t>(a.highest_local_nonfinite_rank);
  // Every rank of a DDP job accumulates alike, so all take the same branch.
  if (micro_batches_ != 1) {
    if (rank_ == subject) {
      Log(absl::StrCat("NaN/Inf in this rank's local gradients at step ", step_, " (",
                       micro_batches_,
                       " micro-batches): not replayable as it ran, so not confirmed; a suspect"));
    }
    return absl::OkStatus();
  }
  std::optional<core::Rank> confirmer = core::ChooseConfirmer(*topology_, subject, step_);
  if (!confirmer.has_value()) return absl::OkStatus();
  auto confirmed = ExchangeAndReplay({{*confirmer, subject}}, 5000);
  if (!confirmed.ok()) return confirmed.status();
  if (confirmed->has_value()) {
    core::AuditResult c;
    c.role = core::AuditRole::kConfirm;
    c.subject = subject;
    c.loss_bits = (*confirmed)->second.loss_bits;
    c.nonfinite = (*confirmed)->second.nonfinite;
    Send(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status GuardEngine::Impl::RepairIfAgreed(const Agreement& a, StepDecision& decision) {
  if (a.repair_step_known_by_all <= repaired_step_ || a.repair_step_known_by_all != repair_step_) {
    return absl::OkStatus();
  }
  std::vector<torch::Tensor> all = Weights(/*live=*/true);
  SDC_TORCH_TRY({
    if (optimizer_state_) {
      for (const torch::Tensor& t : optimizer_state_()) all.push_back(t);
    }
    Broadcast(all, repair_source_);
  });
  repaired_step_ = repair_step_;
  decision.repaired = true;
  ++summary_.repairs;
  Log(absl::StrCat("weights, buffers and optimizer state restored from rank ", repair_source_));
  return absl::OkStatus();
}

absl::Status GuardEngine::Impl::ApplyOrSkip(StepDecision& decision) {
  torch::NoGradGuard no_grad;
  if (decision.apply && options_.max_grad_norm > 0 &&
      decision.grad_norm > options_.max_grad_norm) {
    decision.clip_coef = options_.max_grad_norm / (decision.grad_norm + 1e-6);
  }
  SDC_TORCH_TRY({
    for (const torch::Tensor& p : params_) {
      torch::Tensor g = p.grad();
      if (!g.defined()) continue;
      if (!decision.apply) {
        g.zero_();
      } else if (decision.clip_coef < 1) {
        g.mul_(decision.clip_coef);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace sdc::client
