#include "client/guard_engine.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
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

namespace {

// The guard's own count of attempts, when no launcher says one
// (GuardOptions::attempt): the Guards of a job created earlier in this
// process (a framework that restarts training in-process builds a new one).
uint64_t OwnAttempt(const std::string& job_id) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* counts = new std::map<std::string, uint64_t>();
  absl::MutexLock lock(&mu);
  return (*counts)[job_id]++;
}

}  // namespace

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
  // Whether replays can be deterministic on the model's device (cuBLAS's
  // workspace setting): refused with audits scheduled, else audits are off
  // for the job from the start, with the reason.
  absl::Status CheckAuditable();

  absl::Status BeginStep(uint64_t step, std::vector<torch::Tensor> batch, int64_t micro_batches);
  void RecordFirstMicroBatch(const torch::Tensor& loss, const torch::Tensor& loss_scale);
  absl::StatusOr<StepDecision> Finish();
  void NoteFailure(const std::string& what) {
    pipeline_.NoteFailure(absl::InternalError(what));
  }
  void AbortStep() { determinism_.Restore(); }

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

  // On an audit step: the preflight (until it passes), then the audit gate,
  // one small all-reduce every rank runs before any replay exchange.
  // Returns whether the audit runs; turns audits off when a rank ran an op
  // without a deterministic implementation; when a rank's preflight
  // differed sets `preflight_retry` (the first time: the step is skipped
  // and the preflight runs again at the next audit step) or
  // `preflight_failure` (the second); sets `failure` when this rank's
  // preflight raised. Internal when the all-reduce fails.
  absl::StatusOr<bool> GateAudit(StepDecision& decision, absl::Status& failure,
                                 std::string& audits_off_now, std::string& preflight_retry,
                                 std::string& preflight_failure);
  // Skips the step as every rank does (gradients zeroed, the next
  // checkpoint vetoed) for `reason`, the same on every rank, and reports it.
  absl::Status SkipStep(StepDecision& decision, const StepPipeline::Gradients& gradients,
                        const std::string& audits_off_now, std::string reason);
  // The step failed on some rank (the agreement's or the gate's word, the
  // same on every rank): skips it as every rank does (SkipStep), and
  // returns `error`.
  absl::Status FailStep(StepDecision& decision, const StepPipeline::Gradients& gradients,
                        const std::string& audits_off_now, absl::Status error);
  // An ordinary step (no audit, nothing non-finite in the reduced buckets,
  // not an exchange step): decided without a collective. A failure that no
  // bucket carried goes to the next step's buckets.
  absl::StatusOr<StepDecision> FinishOrdinary(StepDecision& decision,
                                              const StepPipeline::Gradients& gradients,
                                              const std::string& audits_off_now,
                                              const absl::Status& failure);
  // The decision from `agreement` (every rank's, or an ordinary step's
  // empty one), applied, counted and reported.
  absl::StatusOr<StepDecision> Conclude(StepDecision& decision,
                                        const StepPipeline::Gradients& gradients,
                                        const std::string& audits_off_now,
                                        const Agreement& agreement, std::string no_confirmation);

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

  double loss_scale_ = 0;           // This step's loss scale; 0: none (read in Finish).
  torch::Tensor loss_scale_tensor_;  // As RecordFirstMicroBatch got it.
  std::string audits_off_at_start_;  // Reported with the first step.
  // The preflight's first difference (the audit gate's, so the same on
  // every rank): its step (0: none) and what differed on which rank. A
  // second difference stops the job; a clean second try leaves it a
  // transient fault on that rank.
  uint64_t preflight_differed_at_ = 0;
  std::string preflight_differed_;
};

absl::Status GuardEngine::Impl::Start() {
  // Before the collective: every rank refuses alike, so none waits.
  if (absl::Status s = CheckAuditable(); !s.ok()) return s;
  // This rank's software stack (in Hello, and its digest in-band).
  protocol::SoftwareStack software = SoftwareStackOf(model_.device());
  if (ctx_.fault().kind == FaultKind::kSoftwareStack) {
    // The demo's emulation of a node on another stack (fault_injection.h).
    software.driver = "emulated-other-driver";
    software.cublas = "emulated-other-cublas";
  }
  if (absl::Status s = ctx_.ExchangeTopology(software.Digest()); !s.ok()) return s;
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
  hello.attempt = options.attempt_set ? options.attempt : OwnAttempt(options.job_id);
  hello.resume_step = options.resume_step;
  hello.weight_tensors = model_.weight_names();
  hello.parameter_count = static_cast<uint32_t>(model_.parameters().size());
  hello.layout_digest = model_.LayoutDigest();
  hello.deterministic = true;
  hello.audit_every = options.audit_every;
  hello.weight_check_every = options.weight_check_every;
  hello.software = std::move(software);
  hello.shard = {options.shard_index, options.shard_count, options.replica_index};
  if (absl::Status s = ctx_.Connect(std::move(hello)); !s.ok()) return s;
  if (ctx_.fault().enabled()) {
    ctx_.Log(absl::StrCat("FAULT INJECTION ARMED: ", ctx_.fault().Describe()));
  }
  return absl::OkStatus();
}

absl::Status GuardEngine::Impl::CheckAuditable() {
  absl::Status s = CheckDeterministicConfig(model_.device());
  if (s.ok()) return s;
  if (ctx_.options().audit_every > 0) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; or run without replay audits "
                                                            "(SDC_AUDIT_EVERY=0, audit_every=0)"));
  }
  // No scheduled audits: the job runs, but no targeted one either.
  audits_off_at_start_ = std::string(s.message());
  audit_.TurnOff(step_, audits_off_at_start_);
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
      audit_.AddPlan(m.audit_plan().plan_id(), assignments, m.audit_plan().watch(),
                     m.audit_plan().group());
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
  loss_scale_ = 0;
  loss_scale_tensor_ = torch::Tensor();
  replay_.BeginStep(step, std::move(batch), micro_batches);
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
  // The loss's bits only where an audit compares them: on other steps the
  // loss stays where it is (on a GPU, a read here would wait for the
  // device). The scale is read at the decision point, in Finish.
  const uint64_t bits = audit_.auditing() ? LossBits(loss) : 0;
  replay_.SetLossScale(loss_scale);
  loss_scale_tensor_ = loss_scale;
  audit_.RecordFirstMicroBatch(bits);
}

absl::StatusOr<bool> GuardEngine::Impl::GateAudit(StepDecision& decision, absl::Status& failure,
                                                   std::string& audits_off_now,
                                                   std::string& preflight_retry,
                                                   std::string& preflight_failure) {
  AuditGateView view;
  // Before the first audit can skip anything: does this rank's own replay
  // reproduce what it trained on?
  bool preflight_ran = false;
  if (failure.ok() && audit_.WantsPreflight()) {
    preflight_ran = true;
    absl::StatusOr<ReplayAudit::Preflight> p = audit_.RunPreflight();
    if (!p.ok()) {
      failure = absl::Status(p.status().code(),
                             absl::StrCat("the preflight replay of this rank's own micro-batch: ",
                                          p.status().message()));
    } else {
      view.preflight_loss = p->loss_differs;
      view.preflight_gradients = p->gradients_differ;
      view.preflight_buffers = p->buffers_differ;
    }
  }
  // After the preflight: its replay may have run such an op too.
  const std::string noted = determinism_.Noted();
  view.nondeterministic = !noted.empty();
  view.failed = !failure.ok();
  std::vector<int64_t> words = EncodeAuditGate(view, ctx_.rank());
  SDC_TORCH_TRY(ctx_.AllReduceMax(words));
  const AuditGate gate = DecodeAuditGate(words);
  if (gate.lowest_failed_rank >= 0) {
    // No rank runs the exchange; the agreement carries the failure.
    decision.audited = false;
    decision.audit_outcome = "failed";
    return false;
  }
  if (gate.nondeterministic) {
    // No replay can reproduce such an op: audits stop for the job.
    audits_off_now =
        noted.empty() ? "another rank ran an op with no deterministic implementation" : noted;
    audit_.TurnOff(step_, audits_off_now);
    decision.audited = false;
    decision.audit_outcome = "audits_off";
    return false;
  }
  if (gate.preflight_failed() && preflight_differed_at_ == 0) {
    // A first difference: a loss_fn that does not reproduce training, or a
    // transient fault on this step (a product error under the checksums'
    // threshold, say) that the replay does not repeat. One try cannot tell
    // them apart; a configuration mistake is deterministic, so every rank
    // skips the step and runs the preflight again at the next audit step.
    preflight_differed_at_ = step_.step;
    preflight_differed_ = PreflightDifferences(gate);
    audit_.RetryPreflight();
    preflight_retry = absl::StrCat(
        "the preflight at step ", step_.step, " differed (", preflight_differed_,
        "): re-run at the next audit step before it is called a configuration error");
    ctx_.Log(absl::StrCat("step ", step_.step, ": ", preflight_retry, "; the step is skipped"));
    decision.audited = false;
    decision.audit_outcome = "preflight_retry";
    return false;
  }
  if (gate.preflight_failed()) {
    // The second try differed too: no transient fault repeats like that.
    preflight_failure = absl::StrCat(
        PreflightFailure(gate, step_.step), "\nThe first try, at step ", preflight_differed_at_,
        ", differed too (", preflight_differed_, ")");
    // Should the trainer catch the error and train on, no audit compares
    // against a loss function that does not reproduce training.
    audits_off_now = absl::StrCat("the preflight at step ", step_.step,
                                  " found that loss_fn does not reproduce the trained loss");
    audit_.TurnOff(step_, audits_off_now);
    decision.audited = false;
    decision.audit_outcome = "preflight_failed";
    return false;
  }
  if (preflight_ran && preflight_differed_at_ > 0) {
    ctx_.Log(absl::StrCat("step ", step_.step, ": the preflight's second try reproduced training "
                          "on every rank: its difference at step ", preflight_differed_at_, " (",
                          preflight_differed_, ") was a transient fault on that rank, not loss_fn"));
  }
  return true;
}

absl::Status GuardEngine::Impl::FailStep(StepDecision& decision,
                                         const StepPipeline::Gradients& gradients,
                                         const std::string& audits_off_now, absl::Status error) {
  if (absl::Status s = SkipStep(decision, gradients, audits_off_now,
                                std::string(error.message()).substr(0, 200));
      !s.ok()) {
    return s;
  }
  return error;
}

absl::Status GuardEngine::Impl::SkipStep(StepDecision& decision,
                                         const StepPipeline::Gradients& gradients,
                                         const std::string& audits_off_now, std::string reason) {
  decision.apply = false;
  decision.overflow = false;
  decision.reason = std::move(reason);
  // Zeroes the gradients, as every rank does: a loop that steps anyway
  // changes nothing.
  if (absl::Status s = pipeline_.ApplyOrSkip(step_, decision); !s.ok()) return s;
  gate_.StepSkipped(step_, decision.reason);
  protocol::StepReport report;
  report.local_nonfinite = gradients.local_nonfinite;
  report.reduced_nonfinite = gradients.reduced_nonfinite;
  report.reduced_sum_squares = gradients.sum_squares;
  report.reduced_digest = gradients.reduced_digest;
  report.applied = false;
  report.skip_reason = decision.reason;
  report.audits_off = audits_off_now;
  report.loss_scaled = decision.loss_scaled;
  ctx_.Send(step_.step, std::move(report));
  return absl::OkStatus();
}

absl::StatusOr<StepDecision> GuardEngine::Impl::Finish() {
  // Whatever path Finish leaves by, the process's deterministic-algorithms
  // setting is as it was before the step.
  struct RestoreOnExit {
    AuditDeterminism& determinism;
    ~RestoreOnExit() { determinism.Restore(); }
  } restore{determinism_};
  StepDecision decision;
  decision.audited = audit_.auditing();
  std::string audits_off_now = std::exchange(audits_off_at_start_, std::string());
  // The first error this rank meets in the step (a bucket hand-off's kept
  // one first). It reaches every rank through the audit gate and the
  // agreement; no rank leaves Finish before a collective the others run.
  absl::Status failure = pipeline_.TakeFailure();

  // Check 1 on the reduced buckets (local work), and the scale with it: on
  // a GPU the step's one device-to-host read, at the decision (GradScaler
  // reads its own found-inf flag here too).
  StepPipeline::Gradients gradients;
  absl::StatusOr<StepPipeline::Gradients> checked =
      pipeline_.CheckGradients(step_, loss_scale_tensor_);
  if (checked.ok()) {
    gradients = *checked;
    loss_scale_ = gradients.loss_scale;
  } else if (absl::IsFailedPrecondition(checked.status())) {
    // No backward reached the engine (the same on every rank of a DDP job):
    // nothing was exchanged, so nothing waits.
    return checked.status();
  } else {
    failure.Update(checked.status());
    // The check failed; the scale is still needed to decide alike.
    SDC_TORCH_TRY(loss_scale_ =
                      loss_scale_tensor_.defined() ? loss_scale_tensor_.item<double>() : 0);
  }
  decision.loss_scaled = loss_scale_ > 0;
  decision.check1_ms = gradients.ms;
  // Under a loss scaler the gradients are scaled: the norm the optimizer
  // sees (and clipping uses) is the unscaled one.
  decision.grad_norm =
      std::sqrt(gradients.sum_squares) / (decision.loss_scaled ? loss_scale_ : 1.0);
  LocalView view;
  view.local_nonfinite = gradients.local_nonfinite > 0;
  view.reduced_nonfinite = gradients.reduced_nonfinite > 0;
  view.reduced_digest = gradients.reduced_digest;

  // Audit steps: the preflight and the gate, then check 2, a replay audit
  // compared in-band so every rank decides alike.
  if (audit_.auditing()) {
    std::string preflight_retry, preflight_failure;
    absl::StatusOr<bool> run =
        GateAudit(decision, failure, audits_off_now, preflight_retry, preflight_failure);
    if (!run.ok()) return run.status();
    if (!preflight_failure.empty()) {
      return FailStep(decision, gradients, audits_off_now,
                      absl::FailedPreconditionError(preflight_failure));
    }
    if (!preflight_retry.empty()) {
      // Every rank skips the step alike (the gate's word); no audit runs.
      if (absl::Status s = SkipStep(decision, gradients, audits_off_now, preflight_retry);
          !s.ok()) {
        return s;
      }
      return decision;
    }
    if (*run) {
      const absl::Time audit_start = absl::Now();
      failure.Update(audit_.Run(step_, decision, view));
      decision.audit_ms = MsSince(audit_start);
    }
  }

  DrainMessages();
  // An ordinary step: no collective of the guard's own. Its buckets'
  // all-reduce already carried what the agreement would: NaN/Inf (and a
  // failing rank's poisoned bucket, see StepPipeline::ScanLocalBucket)
  // survive the SUM, so the reduced scan, the same on every rank, says
  // whether any rank had one, and then every rank runs the agreement
  // below. The reduced digests go to sdcd, which compares them
  // (docs/ARCHITECTURE.md, "Ordinary steps").
  // Under a sharded layout the reduced gradients differ from shard to shard
  // (a NaN reaches only its own shard's replicas), so no rank can tell from
  // its own what the others saw: the agreement runs on every step there.
  if (!audit_.auditing() && gradients.reduced_nonfinite == 0 &&
      ctx_.options().shard_count == 0 &&
      !IsExchangeStep(step_.step, ctx_.options().audit_every)) {
    return FinishOrdinary(decision, gradients, audits_off_now, failure);
  }

  // The agreement all-reduce, and the decision every rank derives from it.
  const absl::Time agreement_start = absl::Now();
  view.plans_held = audit_.plans_held();
  view.repair_step = weights_.repair_step();
  view.failed = !failure.ok();
  absl::StatusOr<Agreement> agreement = pipeline_.Agree(view);
  if (!agreement.ok()) return agreement.status();
  audit_.PlansHeldByAll(agreement->plans_held_by_all);
  decision.agreement_ms = MsSince(agreement_start);
  if (agreement->lowest_failed_rank >= 0) {
    // Every rank raises the failing rank's own error, word for word.
    const uint32_t failed = static_cast<uint32_t>(agreement->lowest_failed_rank);
    std::vector<int64_t> all;
    SDC_TORCH_TRY(all = ctx_.AllGather(EncodeFailure(failure)));
    const absl::Status theirs = DecodeFailure(
        absl::MakeConstSpan(all).subspan(static_cast<size_t>(failed) * kFailureSlots,
                                         kFailureSlots));
    return FailStep(decision, gradients, audits_off_now,
                    absl::Status(theirs.code(),
                                 absl::StrCat("step ", step_.step, " failed on rank ", failed,
                                              " and was skipped on every rank: ",
                                              theirs.message())));
  }
  std::string no_confirmation = audit_.ConfirmLoneNonFinite(step_, *agreement);
  return Conclude(decision, gradients, audits_off_now, *agreement, std::move(no_confirmation));
}

absl::StatusOr<StepDecision> GuardEngine::Impl::FinishOrdinary(
    StepDecision& decision, const StepPipeline::Gradients& gradients,
    const std::string& audits_off_now, const absl::Status& failure) {
  if (!failure.ok()) {
    // This rank's error came after its last bucket left (the reduced
    // buckets' hand-off or scan, the first micro-batch's record), so no
    // bucket carried it and no other rank knows. The reduced gradients are
    // the same on every rank, and every other rank applies them (its
    // reduced scan found nothing, or it would be in the agreement): so does
    // this one, and the next step's first bucket carries the error, which
    // every rank then raises alike at that step.
    pipeline_.CarryFailure(absl::Status(
        failure.code(), absl::StrCat("at step ", step_.step, " (which every rank applied; the "
                                     "error came after the all-reduce): ", failure.message())));
    ctx_.Log(absl::StrCat("step ", step_.step, ": ", failure.message(),
                          "; carried to the next step's gradient buckets"));
  }
  // With nothing in the buckets, the agreement would say nothing either.
  return Conclude(decision, gradients, audits_off_now, Agreement(), std::string());
}

absl::StatusOr<StepDecision> GuardEngine::Impl::Conclude(StepDecision& decision,
                                                         const StepPipeline::Gradients& gradients,
                                                         const std::string& audits_off_now,
                                                         const Agreement& agreement,
                                                         std::string no_confirmation) {
  const Decision d = Decide(agreement, decision.loss_scaled);
  decision.apply = d.apply;
  decision.reason = d.reason;
  decision.overflow = d.overflow;

  if (absl::Status s = weights_.RepairIfAgreed(agreement, decision); !s.ok()) return s;
  if (absl::Status s = pipeline_.ApplyOrSkip(step_, decision); !s.ok()) return s;
  if (TrainerMetrics* metrics = ctx_.metrics(); metrics != nullptr) {
    metrics->StepChecked(!decision.apply, gradients.local_nonfinite > 0, decision.audited,
                         decision.audit_ms, decision.check1_ms + decision.agreement_ms);
  }
  // Every rank took the same decision: the in-band checkpoint fallback
  // vetoes the next checkpoint on all of them (not for the scaler's own
  // overflow, which is no failed check).
  if (d.failed_check) gate_.StepSkipped(step_, decision.reason);

  protocol::StepReport report;
  report.local_nonfinite = gradients.local_nonfinite;
  report.reduced_nonfinite = gradients.reduced_nonfinite;
  report.reduced_sum_squares = gradients.sum_squares;
  report.reduced_digest = gradients.reduced_digest;
  report.applied = decision.apply;
  report.skip_reason = decision.reason;
  report.audit_unverified = decision.audit_unverified;
  report.audits_off = audits_off_now;
  report.loss_scaled = decision.loss_scaled;
  report.no_confirmation = std::move(no_confirmation);
  ctx_.Send(step_.step, std::move(report));
  return decision;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<GuardEngine>> GuardEngine::Create(
    GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
    NamedTensors parameters, NamedTensors buffers, OptimizerStateFn optimizer_state,
    LossFn loss_fn, NamedTensors frozen) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("options.job_id is empty");
  if (absl::Status s = CheckNodeName(options.node_name); !s.ok()) return s;
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
void GuardEngine::NoteFailure(const std::string& what) { impl_->NoteFailure(what); }
void GuardEngine::AbortStep() { impl_->AbortStep(); }
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
