#ifndef SDC_CLIENT_GUARD_ENGINE_INTERNAL_H_
#define SDC_CLIENT_GUARD_ENGINE_INTERNAL_H_

// GuardEngine's implementation, shared by its files (not part of the
// client's API):
//   guard_engine.cc          set-up (Init), coordinator messages, the public
//                            forwarding layer, helpers below;
//   guard_engine_step.cc     a step: BeginStep, check 1 (non-finite scans,
//                            the reduced-gradient digest), the agreement
//                            all-reduce, apply or skip, fault injection;
//   guard_engine_audit.cc    check 2: the micro-batch exchange, replays,
//                            the in-band audit verdict and tie-breaks;
//   guard_engine_weights.cc  check 3 and the checkpoint gate: weight
//                            fingerprints, MayCheckpoint, the ledger.

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator_link.h"
#include "client/device.h"
#include "client/guard_engine.h"
#include "client/small_collectives.h"
#include "client/step_core.h"
#include "client/trainer_metrics.h"
#include "daemon/core/replay_plan.h"
#include "kernels/fingerprint.h"
#include "kernels/model_digest.h"

namespace sdc::client {

// A micro-batch's header: kLeadSlots words (tensors, micro-batches, RNG
// bytes, buffer bytes, loss scale bits), then per tensor its dtype, device,
// number of dimensions and up to kMaxDims sizes (so at most 6 tensors).
inline constexpr size_t kHeaderSlots = 64;
inline constexpr size_t kLeadSlots = 5;
inline constexpr int64_t kMaxDims = 6;
inline constexpr int64_t kSlotsPerTensor = 3 + kMaxDims;

// Every library error inside a step becomes a Status at this boundary.
#define SDC_TORCH_TRY(expr)                                                   \
  try {                                                                       \
    expr;                                                                     \
  } catch (const c10::Error& e) {                                             \
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace())); \
  }

// Milliseconds since `t`.
double MsSince(absl::Time t);

// The bits of a scalar loss as a double (what audits compare).
uint64_t LossBits(const torch::Tensor& loss);

// A kernel failure inside a step (a CUDA error, say) ends the step as a
// libtorch failure would, through SDC_TORCH_TRY.
void ThrowIfFailed(const absl::Status& s);

// NaN/Inf elements over defined tensors.
uint64_t NonFinite(const std::vector<torch::Tensor>& tensors);

// A one-bit change of a value's mantissa (fault injection): a small finite
// error. REQUIRES: `t` is float32.
void FlipMantissaBit(torch::Tensor t, int bit);

// On audit steps, libtorch runs with deterministic algorithms in warn-only
// mode: an op without a deterministic implementation warns instead of
// throwing. This handler, the training thread's while such a step runs,
// notes those warnings and passes every other one on. (Ops called from
// Python report to Python's warnings instead: sdc_guard notes them.)
inline constexpr char kNoDeterministic[] = " does not have a deterministic implementation";

class DeterminismAlerts : public c10::WarningHandler {
 public:
  void Install() {
    if (installed_) return;
    previous_ = c10::WarningUtils::get_warning_handler();
    c10::WarningUtils::set_warning_handler(this);
    installed_ = true;
  }
  void Uninstall() {
    if (!installed_) return;
    c10::WarningUtils::set_warning_handler(previous_);
    installed_ = false;
  }
  void process(const c10::Warning& warning) override {
    const std::string& msg = warning.msg();
    if (const size_t at = msg.find(kNoDeterministic); at != std::string::npos) {
      if (first_.empty()) first_ = absl::StrCat(msg.substr(0, std::min<size_t>(at, 48)),
                                                " has no deterministic implementation");
      return;
    }
    if (previous_ != nullptr) previous_->process(warning);
  }
  // The first alert since the last Take, or empty.
  std::string Take() { return std::exchange(first_, std::string()); }

 private:
  bool installed_ = false;
  c10::WarningHandler* previous_ = nullptr;
  std::string first_;
};

class GuardEngine::Impl {
 public:
  // `state`: frozen parameters, then the last `buffer_count` are buffers.
  Impl(GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> pg, NamedTensors params,
       NamedTensors state, size_t buffer_count, OptimizerStateFn optimizer_state,
       LossFn loss_fn)
      : options_(std::move(options)),
        pg_(std::move(pg)),
        param_names_(std::move(params.names)),
        params_(std::move(params.tensors)),
        state_names_(std::move(state.names)),
        state_(std::move(state.tensors)),
        buffers_(state_.end() - std::min(buffer_count, state_.size()), state_.end()),
        buffer_names_(state_names_.end() - std::min(buffer_count, state_names_.size()),
                      state_names_.end()),
        optimizer_state_(std::move(optimizer_state)),
        loss_fn_(std::move(loss_fn)),
        rank_(static_cast<uint32_t>(pg_->getRank())),
        world_(static_cast<uint32_t>(pg_->getSize())),
        fault_(FaultFor(options_.faults, rank_)),
        small_collectives_(Resolve(options_.small_collectives, *pg_)),
        collective_device_(CollectiveDevice(*pg_)) {
    weight_names_ = param_names_;
    weight_names_.insert(weight_names_.end(), state_names_.begin(),
                         state_names_.end() - (options_.vote_buffers ? 0 : buffers_.size()));
  }

  absl::Status Init();
  absl::Status BeginStep(uint64_t step, std::vector<torch::Tensor> batch, int64_t micro_batches);
  void RecordFirstMicroBatch(const torch::Tensor& loss, const torch::Tensor& loss_scale);
  void CaptureForwardBuffers();
  bool WantsOriginalGradients() const {
    absl::MutexLock lock(&mu_);
    return audit_ && !original_recorded_;
  }
  void RecordOriginalGradients(const std::vector<size_t>& indices,
                               const std::vector<torch::Tensor>& gradients);
  void ScanLocalBucket(const torch::Tensor& local);
  void AddReducedBucket(size_t index, const torch::Tensor& reduced);
  absl::StatusOr<StepDecision> Finish();
  absl::StatusOr<double> AfterOptimizerStep(bool checkpoint);
  absl::StatusOr<bool> MayCheckpoint();
  absl::StatusOr<core::CheckpointLedger> RefreshCheckpoints(absl::Duration timeout);
  const core::CheckpointLedger& checkpoints() const { return checkpoints_; }
  torch::Tensor FaultPoint(const torch::Tensor& x);
  GuardSummary Summary() const;
  void Shutdown(absl::Duration flush) {
    if (link_ != nullptr) link_->Stop(flush);
  }
  ~Impl() { alerts_.Uninstall(); }
  void NoteNondeterministic(const std::string& what) {
    if (nondeterministic_.empty()) nondeterministic_ = what.substr(0, 200);
  }
  uint32_t rank() const { return rank_; }
  uint32_t world() const { return world_; }
  uint64_t step() const { return step_; }
  bool auditing() const { return audit_; }
  const GuardOptions& options() const { return options_; }
  const std::vector<torch::Tensor>& params() const { return params_; }

 private:
  struct Replayed {
    uint64_t loss_bits = 0;
    std::vector<kernels::Fingerprint> gradients;
    uint64_t digest = 0;
    uint64_t nonfinite = 0;
  };
  // What a subject sends its replayer: the first micro-batch and everything
  // its forward read besides the parameters.
  struct PeerBatch {
    std::vector<torch::Tensor> tensors;
    int64_t micro_batches = 1;
    torch::Tensor rng_state;
    torch::Tensor buffers;  // Packed (PackBytes); undefined when the model has none.
    double loss_scale = 1;
  };

  void Log(const std::string& line) const {
    std::fprintf(stderr, "sdc-guard rank %u: %s\n", rank_, line.c_str());
  }
  void DrainMessages();
  // Fingerprints of tensors under the job's key (undefined ones are
  // absent: {0, 0, 0}).
  std::vector<kernels::Fingerprint> Fingerprints(const std::vector<torch::Tensor>& tensors) const;
  // Fingerprints of the parameters' gradients: a parameter without one
  // counts as zeros of its size, whether autograd left it undefined or a
  // reducer filled it with zeros.
  std::vector<kernels::Fingerprint> GradientFingerprints(const std::vector<torch::Tensor>& grads);
  void SendBatch(uint32_t dst, int tag, std::vector<c10::intrusive_ptr<c10d::Work>>& pending);
  absl::StatusOr<PeerBatch> RecvBatch(uint32_t src, int tag);
  Replayed Replay(const PeerBatch& batch);
  // The digest an audit compares: the first micro-batch's gradients, then
  // the buffers as its forward left them (running statistics).
  uint64_t AuditDigest(const std::vector<kernels::Fingerprint>& gradients,
                       const std::vector<kernels::Fingerprint>& buffers) const {
    kernels::ModelDigestBuilder d;
    for (size_t i = 0; i < gradients.size(); ++i) d.Add(param_names_[i], gradients[i]);
    for (size_t i = 0; i < buffers.size(); ++i) d.Add(buffer_names_[i], buffers[i]);
    return d.Finish();
  }
  // Peers exchange micro-batches along `pairs` (replayer, subject) and each
  // replayer replays what it received: returns its result, if it replayed.
  absl::StatusOr<std::optional<std::pair<uint32_t, Replayed>>> ExchangeAndReplay(
      const std::vector<core::Assignment>& pairs, int tag_base);
  // The in-band audit of this step (check 2): exchanges, replays, reports,
  // the in-band verdict and the coordinator's. Fills `decision`.
  absl::Status Audit(StepDecision& decision, LocalView& view);
  // Finish's parts, in the order it runs them (each collective in the same
  // order on every rank).
  struct ReducedCheck {
    uint64_t nonfinite = 0;
    double sum_squares = 0;
    uint64_t digest = 0;  // Over the buckets in index order.
    double ms = 0;
  };
  // Check 1 on the all-reduced buckets: non-finite count, squared norm, digest.
  absl::StatusOr<ReducedCheck> CheckReduced(std::vector<std::pair<size_t, torch::Tensor>> reduced);
  // On an audit step: an op without a deterministic implementation ran on
  // some rank (one all-reduce tells all), so no replay can reproduce its
  // gradients: audits stop for the job, on every rank alike. Returns why
  // when they stop at this step, else empty.
  absl::StatusOr<std::string> TurnAuditsOffIfNondeterministic(StepDecision& decision);
  // A lone local NaN/Inf: one rank of another domain replays that
  // micro-batch. Only a step of one micro-batch can be replayed as it ran:
  // with accumulation the NaN may come from a later micro-batch nobody
  // holds, and a finite replay of the first would wrongly clear the GPU;
  // then no replay runs and sdcd keeps the rank a suspect.
  absl::Status ConfirmLoneNonFinite(const Agreement& a);
  // Restores a weight minority from the majority's source once every rank
  // holds the verdict.
  absl::Status RepairIfAgreed(const Agreement& a, StepDecision& decision);
  // Applies the step (clipped when asked) or skips it (zeroed gradients),
  // identically on every rank.
  absl::Status ApplyOrSkip(StepDecision& decision);
  void Send(decltype(core::Report::body) body) {
    if (link_ != nullptr) link_->Send(step_, std::move(body));
  }
  void Broadcast(std::vector<torch::Tensor> tensors, uint32_t root);
  // What the weight vote fingerprints (in weight_names_' order): the
  // parameters, the frozen ones, and the buffers as this step's forward
  // read them (when voted). `live`: the buffers as they are now instead (a
  // repair restores those).
  std::vector<torch::Tensor> Weights(bool live = false) const {
    std::vector<torch::Tensor> all = params_;
    all.insert(all.end(), state_.begin(), state_.end() - buffers_.size());
    if (options_.vote_buffers) {
      const auto& buffers = live ? buffers_ : forward_buffers_;
      all.insert(all.end(), buffers.begin(), buffers.end());
    }
    return all;
  }

  const GuardOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  const std::vector<std::string> param_names_;
  const std::vector<torch::Tensor> params_;
  // Frozen parameters, then buffers: voted on, not trained.
  const std::vector<std::string> state_names_;
  const std::vector<torch::Tensor> state_;
  const std::vector<torch::Tensor> buffers_;  // The tail of state_ (saved around replays).
  const std::vector<std::string> buffer_names_;
  // The buffers as this step's forward read them: copied at BeginStep and
  // again by CaptureForwardBuffers (after DDP's buffer broadcast). A replay
  // of this rank's micro-batch starts from them; the weight vote sees them.
  std::vector<torch::Tensor> forward_buffers_;
  // The buffers after the first micro-batch's forward, on audit steps.
  std::vector<kernels::Fingerprint> original_buffers_;
  std::vector<std::string> weight_names_;  // Parameters, frozen parameters, buffers.
  const OptimizerStateFn optimizer_state_;
  const LossFn loss_fn_;
  const uint32_t rank_;
  const uint32_t world_;
  const FaultPlan fault_;  // This rank's injected fault; disabled in real jobs.
  const SmallCollectives small_collectives_;  // Resolved: never kAuto.
  const torch::Device collective_device_;     // Where pg_ sends from.
  torch::Device device_ = torch::kCPU;        // The model's (Init).
  std::string gpu_uuid_;                      // Reported (Init): see GuardOptions::gpu_uuid.
  // The job's fingerprint key: rank 0 draws its seed in Init and every rank
  // takes it from the topology exchange, so all ranks compare alike.
  std::unique_ptr<const kernels::FingerprintKey> fingerprint_key_;

  std::unique_ptr<core::Topology> topology_;
  std::unique_ptr<CoordinatorLink> link_;
  // SDC_METRICS_LISTEN's exposer; null when off. Declared after link_, so
  // it stops (and no scrape reads link_) before the link goes.
  std::unique_ptr<TrainerMetrics> metrics_;

  // The current step.
  uint64_t step_ = 0;
  std::vector<torch::Tensor> first_batch_;
  int64_t micro_batches_ = 1;
  torch::Tensor rng_state_;
  bool audit_ = false;
  uint64_t plan_id_ = 0;
  core::ReplayPlan plan_;
  bool deterministic_before_ = false;
  bool deterministic_warn_only_before_ = false;
  void RestoreDeterminism() {
    alerts_.Uninstall();
    at::globalContext().setDeterministicAlgorithms(deterministic_before_,
                                                   deterministic_warn_only_before_);
  }
  // Replay audits, until an op without a deterministic implementation is
  // seen on an audit step (then why they are off, for good).
  DeterminismAlerts alerts_;
  std::string nondeterministic_;  // This step's first alert, from either path.
  std::string audits_off_;
  uint64_t original_loss_bits_ = 0;
  torch::Tensor loss_scale_;  // The first micro-batch's loss scale (undefined: 1).
  bool replaying_ = false;
  bool checkpoint_weights_sent_ = false;

  // What the gradient buckets and the first micro-batch brought this step;
  // written from autograd's threads during backward.
  mutable absl::Mutex mu_;
  std::vector<kernels::Fingerprint> original_gradients_ ABSL_GUARDED_BY(mu_);
  bool original_recorded_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t local_nonfinite_ ABSL_GUARDED_BY(mu_) = 0;
  bool local_fault_done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<size_t, torch::Tensor>> reduced_ ABSL_GUARDED_BY(mu_);
  double check1_ms_ ABSL_GUARDED_BY(mu_) = 0;

  // Targeted plans and repairs, agreed in-band.
  std::map<uint64_t, core::ReplayPlan> plans_;
  uint64_t plans_held_ = 0;
  uint64_t plans_held_by_all_ = 0;
  uint64_t last_plan_run_ = 0;
  uint64_t repair_step_ = 0;
  uint32_t repair_source_ = 0;
  uint64_t repaired_step_ = 0;

  GuardSummary summary_;
  // The first skipped step since the last checkpoint decision ("step N:
  // why"): the in-band checkpoint fallback vetoes the next checkpoint.
  std::string failed_since_checkpoint_;
  core::CheckpointLedger checkpoints_;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_GUARD_ENGINE_INTERNAL_H_
