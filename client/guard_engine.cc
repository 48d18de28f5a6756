#include "client/guard_engine.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/audit_determinism.h"
#include "client/checkpoint_gate.h"
#include "client/device.h"
#include "client/engine_context.h"
#include "client/model_tensors.h"
#include "client/peer_replay.h"
#include "client/replay_audit.h"
#include "client/step_core.h"
#include "client/step_pipeline.h"
#include "client/tensor_checks.h"
#include "client/weight_check.h"

// The engine composes its parts: it owns them and the context they share,
// sets them up, routes sdcd's messages to them, and runs a step's parts in
// the one order every rank follows (Finish below is the per-step
// collectives table of docs/ARCHITECTURE.md, in code).

namespace sdc::client {

class GuardEngine::Impl {
 public:
  Impl(GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> pg, ModelTensors model,
       OptimizerStateFn optimizer_state, LossFn loss_fn)
      : ctx_(std::move(options), std::move(pg)),
        model_(std::move(model)),
        pipeline_(ctx_, model_),
        determinism_(ctx_),
        replay_(ctx_, model_, std::move(loss_fn)),
        audit_(ctx_, model_, replay_),
        weights_(ctx_, model_, std::move(optimizer_state)),
        gate_(ctx_) {}

  // The collective part of set-up, then the link and metrics.
  absl::Status Start();

  absl::Status BeginStep(uint64_t step, std::vector<torch::Tensor> batch, int64_t micro_batches);
  void RecordFirstMicroBatch(const torch::Tensor& loss, const torch::Tensor& loss_scale);
  absl::StatusOr<StepDecision> Finish();

  absl::StatusOr<double> AfterOptimizerStep(bool checkpoint) {
    return weights_.AfterOptimizerStep(step_, checkpoint);
  }
  absl::StatusOr<bool> MayCheckpoint() { return gate_.MayCheckpoint(step_, weights_); }
  const protocol::CheckpointLedger& checkpoints() const { return gate_.ledger(); }
  absl::StatusOr<protocol::CheckpointLedger> RefreshCheckpoints(absl::Duration timeout) {
    return gate_.Refresh(timeout);
  }

  void CaptureForwardBuffers() { model_.CaptureForwardBuffers(); }
  void NoteNondeterministic(const std::string& what) { determinism_.Note(what); }
  bool WantsOriginalGradients() const { return audit_.WantsOriginalGradients(); }
  void RecordOriginalGradients(const std::vector<size_t>& indices,
                               const std::vector<torch::Tensor>& gradients) {
    audit_.RecordOriginalGradients(indices, gradients);
  }
  void RecordOriginalGradientsFromParameters() {
    std::vector<size_t> indices;
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < model_.parameters().size(); ++i) {
      indices.push_back(i);
      grads.push_back(model_.parameters()[i].grad());
    }
    audit_.RecordOriginalGradients(indices, grads);
  }
  void ScanLocalBucket(const torch::Tensor& local) { pipeline_.ScanLocalBucket(step_, local); }
  void AddReducedBucket(size_t index, const torch::Tensor& reduced) {
    pipeline_.AddReducedBucket(step_, index, reduced);
  }
  torch::Tensor FaultPoint(const torch::Tensor& x) const {
    return pipeline_.FaultPoint(step_, x, replay_.replaying());
  }

  GuardSummary Summary() const {
    GuardSummary s;
    pipeline_.Summarize(s);
    audit_.Summarize(s);
    weights_.Summarize(s);
    gate_.Summarize(s);
    ctx_.Summarize(s);
    return s;
  }
  void Shutdown(absl::Duration flush) { ctx_.Stop(flush); }
  uint32_t rank() const { return ctx_.rank(); }
  uint32_t world() const { return ctx_.world(); }
  uint64_t step() const { return step_.step; }
  bool auditing() const { return audit_.auditing(); }
  const GuardOptions& options() const { return ctx_.options(); }

 private:
  // sdcd's targeted audit plans go to the audit, its weight minorities to
  // the weight check.
  void DrainMessages();

  // Declared in the order they are built: the context and the model first,
  // which every part refers to; destroyed in reverse (the parts, then the
  // metrics exposer, then the link).
  EngineContext ctx_;
  ModelTensors model_;
  StepContext step_;
  StepPipeline pipeline_;        // Check 1, the agreement, apply or skip.
  AuditDeterminism determinism_; // Deterministic algorithms on audit steps.
  PeerReplay replay_;            // Check 2's micro-batch exchange and replay.
  ReplayAudit audit_;            // Check 2: plans, in-band verdict, tie-breaks, confirmations.
  WeightCheck weights_;          // Check 3 and weight repair.
  CheckpointGate gate_;          // The checkpoint gate and ledger.
};

absl::Status GuardEngine::Impl::Start() {
  if (absl::Status s = ctx_.ExchangeTopology(); !s.ok()) return s;
  const GuardOptions& options = ctx_.options();
  std::string gpu_uuid = options.gpu_uuid;
  if (!options.gpu_uuid_set && model_.device().is_cuda()) {
    absl::StatusOr<std::string> uuid = DeviceUuid(model_.device());
    if (uuid.ok()) {
      gpu_uuid = *uuid;
    } else {
      ctx_.Log(absl::StrCat("GPU UUID unknown (", uuid.status().message(), "): reporting ",
                            gpu_uuid, "; set SDC_GPU_UUID"));
    }
  }
  protocol::Hello hello;
  hello.job_id = options.job_id;
  hello.placement = {ctx_.rank(), options.node_name, options.local_rank, gpu_uuid,
                     options.replica_group};
  hello.world_size = ctx_.world();
  hello.incarnation = options.incarnation;
  hello.weight_tensors = model_.weight_names();
  hello.parameter_count = static_cast<uint32_t>(model_.parameters().size());
  hello.layout_digest = model_.LayoutDigest();
  hello.deterministic = true;
  hello.audit_every = options.audit_every;
  hello.weight_check_every = options.weight_check_every;
  if (absl::Status s = ctx_.Connect(std::move(hello)); !s.ok()) return s;
  if (ctx_.fault().enabled()) {
    ctx_.Log(absl::StrCat("FAULT INJECTION ARMED: ", ctx_.fault().Describe()));
  }
  return absl::OkStatus();
}

void GuardEngine::Impl::DrainMessages() {
  CoordinatorLink* link = ctx_.link();
  if (link == nullptr) return;
  for (const v1::CoordinatorMessage& m : link->TakeMessages()) {
    if (m.has_audit_plan()) {
      std::vector<protocol::Assignment> assignments;
      for (const auto& a : m.audit_plan().assignments()) {
        assignments.push_back({a.replayer(), a.subject()});
      }
      audit_.AddPlan(m.audit_plan().plan_id(), assignments);
    } else if (m.has_weight_verdict() && !m.weight_verdict().pass() &&
               m.weight_verdict().minority_ranks_size() > 0) {
      const v1::WeightVerdict& v = m.weight_verdict();
      weights_.NoteMinority(v.step(), v.majority_source_rank(), v.explanation());
    }
  }
}

absl::Status GuardEngine::Impl::BeginStep(uint64_t step, std::vector<torch::Tensor> batch,
                                          int64_t micro_batches) {
  // Checked at every step on every rank: refused at an audit, the job would
  // wait on this rank.
  if (absl::Status s = PeerReplay::CheckSendable(batch, micro_batches); !s.ok()) return s;
  DrainMessages();
  step_ = {step, micro_batches};
  replay_.BeginStep(std::move(batch), micro_batches);
  weights_.BeginStep();
  pipeline_.BeginStep();
  audit_.BeginStep(step_);
  SDC_TORCH_TRY({
    // Undefined gradients: the first backward writes them exactly, so the
    // audited fingerprints equal a replay's torch::autograd::grad bits.
    model_.ClearGradients();
    replay_.CaptureRng();
    model_.CaptureForwardBuffers();
  });
  determinism_.BeginStep(audit_.auditing());
  return absl::OkStatus();
}

void GuardEngine::Impl::RecordFirstMicroBatch(const torch::Tensor& loss,
                                              const torch::Tensor& loss_scale) {
  const uint64_t bits = LossBits(loss);
  replay_.SetLossScale(loss_scale);
  audit_.RecordFirstMicroBatch(bits);
}

absl::StatusOr<StepDecision> GuardEngine::Impl::Finish() {
  StepDecision decision;
  decision.audited = audit_.auditing();

  // Check 1 on the reduced buckets (local work).
  absl::StatusOr<StepPipeline::Gradients> gradients = pipeline_.CheckGradients(step_);
  if (!gradients.ok()) {
    // No backward reached the engine: nothing ran that the mode matters to.
    if (absl::IsFailedPrecondition(gradients.status())) determinism_.Restore();
    return gradients.status();
  }
  decision.check1_ms = gradients->ms;
  decision.grad_norm = std::sqrt(gradients->sum_squares);
  LocalView view;
  view.local_nonfinite = gradients->local_nonfinite > 0;
  view.reduced_nonfinite = gradients->reduced_nonfinite > 0;
  view.reduced_digest = gradients->reduced_digest;

  // Audit steps: one small all-reduce says whether any rank ran an op with
  // no deterministic implementation; then audits stop for the job.
  std::string audits_off_now;
  if (audit_.auditing()) {
    absl::StatusOr<std::string> off = determinism_.Agree();
    if (!off.ok()) return off.status();
    if (!off->empty()) {
      audit_.TurnOff(step_, *off);
      audits_off_now = *off;
      decision.audited = false;
      decision.audit_outcome = "audits_off";
    }
  }

  // Check 2: replay audit, compared in-band so every rank decides alike.
  if (audit_.auditing()) {
    const absl::Time audit_start = absl::Now();
    if (absl::Status s = audit_.Run(step_, decision, view); !s.ok()) return s;
    decision.audit_ms = MsSince(audit_start);
  }

  // The one agreement all-reduce, and the decision every rank derives from it.
  const absl::Time agreement_start = absl::Now();
  DrainMessages();
  view.plans_held = audit_.plans_held();
  view.repair_step = weights_.repair_step();
  absl::StatusOr<Agreement> agreement = pipeline_.Agree(view);
  if (!agreement.ok()) return agreement.status();
  audit_.PlansHeldByAll(agreement->plans_held_by_all);
  decision.agreement_ms = MsSince(agreement_start);
  const Decision d = Decide(*agreement);
  decision.apply = d.apply;
  decision.reason = d.reason;

  if (absl::Status s = audit_.ConfirmLoneNonFinite(step_, *agreement); !s.ok()) return s;
  if (absl::Status s = weights_.RepairIfAgreed(*agreement, decision); !s.ok()) return s;
  if (absl::Status s = pipeline_.ApplyOrSkip(step_, decision); !s.ok()) return s;
  determinism_.Restore();
  if (TrainerMetrics* metrics = ctx_.metrics(); metrics != nullptr) {
    metrics->StepChecked(!decision.apply, gradients->local_nonfinite > 0, decision.audited,
                         decision.audit_ms, decision.check1_ms + decision.agreement_ms);
  }
  // Every rank took the same decision: the in-band checkpoint fallback
  // vetoes the next checkpoint on all of them.
  if (!decision.apply) gate_.StepSkipped(step_, decision.reason);

  protocol::StepReport report;
  report.local_nonfinite = gradients->local_nonfinite;
  report.reduced_nonfinite = gradients->reduced_nonfinite;
  report.reduced_sum_squares = gradients->sum_squares;
  report.reduced_digest = gradients->reduced_digest;
  report.applied = decision.apply;
  report.skip_reason = decision.reason;
  report.audit_unverified = decision.audit_unverified;
  report.audits_off = audits_off_now;
  ctx_.Send(step_.step, std::move(report));
  return decision;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<GuardEngine>> GuardEngine::Create(
    GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
    NamedTensors parameters, NamedTensors buffers, OptimizerStateFn optimizer_state,
    LossFn loss_fn, NamedTensors frozen) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("options.job_id is empty");
  if (!loss_fn) return absl::InvalidArgumentError("a loss function is required");
  if (!process_group) return absl::InvalidArgumentError("a process group is required");
  // Frozen parameters join the weight vote as state the step does not
  // change (after the trainable parameters, before the buffers).
  absl::StatusOr<ModelTensors> model = ModelTensors::Create(
      std::move(parameters), std::move(frozen), std::move(buffers), options.vote_buffers);
  if (!model.ok()) return model.status();
  auto impl = std::make_unique<Impl>(std::move(options), std::move(process_group),
                                     *std::move(model), std::move(optimizer_state),
                                     std::move(loss_fn));
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<GuardEngine>(new GuardEngine(std::move(impl)));
}

GuardEngine::GuardEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GuardEngine::~GuardEngine() = default;

absl::Status GuardEngine::BeginStep(uint64_t step, std::vector<torch::Tensor> first_micro_batch,
                                    int64_t micro_batches) {
  return impl_->BeginStep(step, std::move(first_micro_batch), micro_batches);
}
void GuardEngine::RecordFirstMicroBatch(const torch::Tensor& loss, const torch::Tensor& loss_scale) {
  impl_->RecordFirstMicroBatch(loss, loss_scale);
}
void GuardEngine::CaptureForwardBuffers() { impl_->CaptureForwardBuffers(); }
void GuardEngine::NoteNondeterministic(const std::string& what) {
  impl_->NoteNondeterministic(what);
}
bool GuardEngine::WantsOriginalGradients() const { return impl_->WantsOriginalGradients(); }
void GuardEngine::RecordOriginalGradients(const std::vector<size_t>& parameter_indices,
                                          const std::vector<torch::Tensor>& gradients) {
  impl_->RecordOriginalGradients(parameter_indices, gradients);
}
void GuardEngine::RecordOriginalGradientsFromParameters() {
  impl_->RecordOriginalGradientsFromParameters();
}
void GuardEngine::ScanLocalBucket(const torch::Tensor& local) { impl_->ScanLocalBucket(local); }
void GuardEngine::AddReducedBucket(size_t index, const torch::Tensor& reduced) {
  impl_->AddReducedBucket(index, reduced);
}
absl::StatusOr<StepDecision> GuardEngine::Finish() { return impl_->Finish(); }
absl::StatusOr<double> GuardEngine::AfterOptimizerStep(bool checkpoint) {
  return impl_->AfterOptimizerStep(checkpoint);
}
absl::StatusOr<bool> GuardEngine::MayCheckpoint() { return impl_->MayCheckpoint(); }
const protocol::CheckpointLedger& GuardEngine::Checkpoints() const { return impl_->checkpoints(); }
absl::StatusOr<protocol::CheckpointLedger> GuardEngine::RefreshCheckpoints(absl::Duration timeout) {
  return impl_->RefreshCheckpoints(timeout);
}
torch::Tensor GuardEngine::FaultPoint(const torch::Tensor& x) { return impl_->FaultPoint(x); }
GuardSummary GuardEngine::Summary() const { return impl_->Summary(); }
uint32_t GuardEngine::rank() const { return impl_->rank(); }
uint32_t GuardEngine::world_size() const { return impl_->world(); }
uint64_t GuardEngine::step() const { return impl_->step(); }
bool GuardEngine::auditing() const { return impl_->auditing(); }
const GuardOptions& GuardEngine::options() const { return impl_->options(); }
void GuardEngine::Shutdown(absl::Duration flush) { impl_->Shutdown(flush); }

}  // namespace sdc::client
