#include "client/guard_engine.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/coordinator_link.h"
#include "client/device.h"
#include "client/small_collectives.h"
#include "client/step_core.h"
#include "daemon/core/replay_plan.h"
#include "kernels/fingerprint.h"
#include "kernels/model_digest.h"
#include "kernels/nonfinite.h"

namespace sdc::client {
namespace {

// What the coordinator said about the job's checkpoints.
void Learn(core::CheckpointLedger& ledger, const v1::CheckpointDecision& d) {
  ledger.Learn(d.confirmed_through_step(),
               absl::MakeConstSpan(d.revoked_steps().data(), d.revoked_steps().size()));
}

// A micro-batch's header: kLeadSlots words (tensors, micro-batches, RNG
// bytes, buffer bytes, loss scale bits), then per tensor its dtype, device,
// number of dimensions and up to kMaxDims sizes (so at most 6 tensors).
constexpr size_t kHeaderSlots = 64;
constexpr size_t kLeadSlots = 5;
constexpr int64_t kMaxDims = 6;
constexpr int64_t kSlotsPerTensor = 3 + kMaxDims;

// Tensors as one byte tensor (each one's bytes in order), for the peer
// exchange; UnpackBytes copies such bytes back into tensors of the same shapes.
torch::Tensor PackBytes(const std::vector<torch::Tensor>& tensors, torch::Device device) {
  std::vector<torch::Tensor> bytes;
  for (const torch::Tensor& t : tensors) {
    bytes.push_back(t.detach().contiguous().reshape({-1}).view(torch::kUInt8));
  }
  if (bytes.empty()) return torch::empty({0}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  return torch::cat(bytes);
}

int64_t ByteSize(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const torch::Tensor& t : tensors) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

void UnpackBytes(const torch::Tensor& bytes, const std::vector<torch::Tensor>& into) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const torch::Tensor& t : into) {
    const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
    torch::Tensor staged = torch::empty(t.sizes(), t.options());
    staged.reshape({-1}).view(torch::kUInt8).copy_(bytes.narrow(0, offset, n));
    torch::Tensor target = t;
    target.copy_(staged);
    offset += n;
  }
}

// Every library error inside a step becomes a Status at this boundary.
#define SDC_TORCH_TRY(expr)                                                   \
  try {                                                                       \
    expr;                                                                     \
  } catch (const c10::Error& e) {                                             \
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace())); \
  }

double MsSince(absl::Time t) { return absl::ToDoubleMilliseconds(absl::Now() - t); }

uint64_t LossBits(const torch::Tensor& loss) {
  const double v = loss.detach().to(torch::kDouble).item<double>();
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// A kernel failure inside a step (a CUDA error, say) ends the step as a
// libtorch failure would, through SDC_TORCH_TRY.
void ThrowIfFailed(const absl::Status& s) {
  if (!s.ok()) TORCH_CHECK(false, "sdc-guard kernels: ", std::string(s.message()));
}

// Fingerprints of tensors (undefined ones are absent: {0, 0, 0}).
std::vector<kernels::Fingerprint> Fingerprints(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> dense;
  std::vector<size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    dense.push_back(tensors[i].detach().contiguous());
    index.push_back(i);
  }
  std::vector<kernels::Fingerprint> packed;
  ThrowIfFailed(FingerprintOnDevice(dense, &packed));
  std::vector<kernels::Fingerprint> out(tensors.size());
  for (size_t k = 0; k < index.size(); ++k) out[index[k]] = packed[k];
  return out;
}

uint64_t Digest(const std::vector<std::string>& names,
                const std::vector<kernels::Fingerprint>& fps) {
  kernels::ModelDigestBuilder d;
  for (size_t i = 0; i < fps.size(); ++i) d.Add(names[i], fps[i]);
  return d.Finish();
}

// NaN/Inf elements over defined tensors.
uint64_t NonFinite(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> dense;
  for (const torch::Tensor& t : tensors) {
    if (t.defined() && DTypeOf(t).ok()) dense.push_back(t.detach().contiguous());
  }
  std::vector<kernels::ScanResult> out;
  ThrowIfFailed(ScanOnDevice(dense, &out));
  uint64_t n = 0;
  for (const auto& r : out) n += r.nonfinite;
  return n;
}

// A one-bit change of a value's mantissa: a small finite error.
void FlipMantissaBit(torch::Tensor t, int bit) {
  torch::NoGradGuard no_grad;
  auto flat = t.view({-1});
  float v = flat[0].item<float>();
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits ^= (1u << bit);
  std::memcpy(&v, &bits, 4);
  flat[0].fill_(v);
}

constexpr char kNoDeterministic[] = " does not have a deterministic implementation";

}  // namespace

// On audit steps, libtorch runs with deterministic algorithms in warn-only
// mode: an op without a deterministic implementation warns instead of
// throwing. This handler, the training thread's while such a step runs,
// notes those warnings and passes every other one on. (Ops called from
// Python report to Python's warnings instead: sdc_guard notes them.)
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

std::string GuardSummary::ToString() const {
  return absl::StrFormat(
      "steps=%d skipped=%d audits=%d (unverified %d, mismatches %d) weight_checks=%d "
      "repairs=%d checkpoints allowed=%d vetoed=%d reports sent=%d acked=%d dropped=%d "
      "coordinator=%s%s",
      steps, skipped, audits, audits_unverified, audit_mismatches, weight_checks, repairs,
      checkpoints_allowed, checkpoints_vetoed, reports_sent, reports_acked, reports_dropped,
      coordinator_connected ? "connected" : "not connected",
      audits_off.empty() ? "" : absl::StrCat(" audits=off (", audits_off, ")"));
}

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

  std::unique_ptr<core::Topology> topology_;
  std::unique_ptr<CoordinatorLink> link_;

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

absl::Status GuardEngine::Impl::Init() {
  if (params_.empty()) return absl::InvalidArgumentError("the model has no trainable parameters");
  if (param_names_.size() != params_.size() || state_names_.size() != state_.size()) {
    return absl::InvalidArgumentError("a name for every parameter and buffer is required");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", param_names_[i], " is undefined"));
    }
    if (absl::StatusOr<kernels::DType> d = DTypeOf(params_[i]); !d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(param_names_[i], ": ", d.status().message()));
    }
  }
  // One device for the whole model, one the kernels can read (a CUDA
  // tensor's pointer is device memory: with no usable GPU it is refused,
  // never read; see ARCHITECTURE.md, "The CUDA path").
  device_ = params_.front().device();
  std::vector<std::string> names = param_names_;
  names.insert(names.end(), state_names_.begin(), state_names_.end());
  std::vector<torch::Tensor> all = params_;
  all.insert(all.end(), state_.begin(), state_.end());
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("buffer ", names[i], " is undefined"));
    }
    if (all[i].device() != device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          names[i], " is on ", all[i].device().str(), ", ", names.front(), " on ",
          device_.str(), ": the guard needs the model on one device"));
    }
  }
  SDC_TORCH_TRY({
    for (const torch::Tensor& b : buffers_) forward_buffers_.push_back(b.detach().clone());
  });
  const std::vector<torch::Tensor> weights = Weights();
  if (absl::Status s = CheckDevice(device_); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(weight_names_.front(), " is on ", device_.str(),
                                               ": ", s.message()));
  }
  // Every rank's node name and replica group, for the replay plans.
  constexpr int64_t kNameBytes = 128;
  torch::Tensor mine = torch::zeros({kNameBytes + 1}, torch::kUInt8);
  const std::string node = options_.node_name.substr(0, kNameBytes);
  std::memcpy(mine.data_ptr(), node.data(), node.size());
  mine[kNameBytes] = static_cast<uint8_t>(options_.replica_group & 0xff);
  std::vector<std::vector<torch::Tensor>> gathered(1);
  std::vector<torch::Tensor> input;
  SDC_TORCH_TRY({
    input.push_back(mine.to(collective_device_));
    for (uint32_t r = 0; r < world_; ++r) gathered[0].push_back(torch::zeros_like(input[0]));
    pg_->allgather(gathered, input)->wait();
    for (torch::Tensor& t : gathered[0]) t = t.cpu();
  });
  std::vector<core::PlanMember> members;
  for (uint32_t r = 0; r < world_; ++r) {
    const auto* bytes = static_cast<const char*>(gathered[0][r].data_ptr());
    if (static_cast<uint8_t>(bytes[kNameBytes]) == (options_.replica_group & 0xff)) {
      members.push_back({r, std::string(bytes, strnlen(bytes, kNameBytes))});
    }
  }
  topology_ = std::make_unique<core::Topology>(std::move(members));
  gpu_uuid_ = options_.gpu_uuid;
  if (!options_.gpu_uuid_set && device_.is_cuda()) {
    absl::StatusOr<std::string> uuid = DeviceUuid(device_);
    if (uuid.ok()) {
      gpu_uuid_ = *uuid;
    } else {
      Log(absl::StrCat("GPU UUID unknown (", uuid.status().message(), "): reporting ", gpu_uuid_,
                       "; set SDC_GPU_UUID"));
    }
  }
  if (!options_.coordinator.empty()) {
    core::Hello hello;
    hello.job_id = options_.job_id;
    hello.placement = {rank_, options_.node_name, options_.local_rank, gpu_uuid_,
                       options_.replica_group};
    hello.world_size = world_;
    hello.incarnation = options_.incarnation;
    hello.weight_tensors = weight_names_;
    hello.parameter_count = static_cast<uint32_t>(params_.size());
    kernels::ModelDigestBuilder layout;
    for (size_t i = 0; i < weights.size(); ++i) {
      layout.Add(weight_names_[i],
                 {static_cast<uint64_t>(weights[i].numel()) * weights[i].element_size(), 0, 0});
    }
    hello.layout_digest = layout.Finish();
    hello.deterministic = true;
    hello.audit_every = options_.audit_every;
    hello.weight_check_every = options_.weight_check_every;
    link_ = std::make_unique<CoordinatorLink>(options_, std::move(hello));
    link_->Start();
  }
  if (fault_.enabled()) Log(absl::StrCat("FAULT INJECTION ARMED: ", fault_.Describe()));
  return absl::OkStatus();
}

void GuardEngine::Impl::DrainMessages() {
  if (link_ == nullptr) return;
  for (const v1::CoordinatorMessage& m : link_->TakeMessages()) {
    if (m.has_audit_plan()) {
      core::ReplayPlan p;
      for (const auto& a : m.audit_plan().assignments()) p.assignments.push_back({a.replayer(), a.subject()});
      p.capability = topology_->capability();
      plans_[m.audit_plan().plan_id()] = std::move(p);
      while (plans_.count(plans_held_ + 1) > 0) ++plans_held_;
    } else if (m.has_weight_verdict() && !m.weight_verdict().pass() &&
               m.weight_verdict().minority_ranks_size() > 0 &&
               m.weight_verdict().step() > repair_step_) {
      repair_step_ = m.weight_verdict().step();
      repair_source_ = m.weight_verdict().majority_source_rank();
      Log(absl::StrCat("weight minority at step ", repair_step_, ": ",
                       m.weight_verdict().explanation(), "; repair from rank ", repair_source_,
                       " once every rank knows"));
    }
  }
}

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

void GuardEngine::Impl::SendBatch(uint32_t dst, int tag,
                            std::vector<c10::intrusive_ptr<c10d::Work>>& pending) {
  const std::vector<torch::Tensor>& batch = first_batch_;
  torch::Tensor header = torch::zeros({static_cast<int64_t>(kHeaderSlots)}, torch::kInt64);
  auto h = header.accessor<int64_t, 1>();
  const torch::Tensor buffers = PackBytes(forward_buffers_, device_);
  const double scale = loss_scale_.defined() ? loss_scale_.item<double>() : 1.0;
  h[0] = static_cast<int64_t>(batch.size());
  h[1] = micro_batches_;
  h[2] = rng_state_.numel();
  h[3] = buffers.numel();
  std::memcpy(&h[4], &scale, sizeof(scale));
  for (size_t i = 0; i < batch.size() && kLeadSlots + (i + 1) * kSlotsPerTensor <= kHeaderSlots;
       ++i) {
    const size_t at = kLeadSlots + i * kSlotsPerTensor;
    h[at] = static_cast<int64_t>(batch[i].scalar_type());
    h[at + 1] = batch[i].device().is_cpu() ? 0 : 1;  // 1: on the model's device.
    h[at + 2] = batch[i].dim();
    for (int64_t d = 0; d < batch[i].dim() && d < kMaxDims; ++d) h[at + 3 + d] = batch[i].size(d);
  }
  // Everything travels from where the process group sends (the GPU on NCCL).
  std::vector<torch::Tensor> messages = {header.to(collective_device_)};
  for (const torch::Tensor& t : batch) messages.push_back(t.contiguous().to(collective_device_));
  messages.push_back(rng_state_.to(collective_device_));
  if (buffers.numel() > 0) messages.push_back(buffers.to(collective_device_));
  for (size_t i = 0; i < messages.size(); ++i) {
    std::vector<torch::Tensor> one = {messages[i]};
    pending.push_back(pg_->send(one, static_cast<int>(dst), tag + static_cast<int>(i)));
  }
}

absl::StatusOr<GuardEngine::Impl::PeerBatch> GuardEngine::Impl::RecvBatch(uint32_t src, int tag) {
  const torch::TensorOptions there = torch::TensorOptions().device(collective_device_);
  std::vector<torch::Tensor> header = {
      torch::zeros({static_cast<int64_t>(kHeaderSlots)}, there.dtype(torch::kInt64))};
  SDC_TORCH_TRY({
    pg_->recv(header, static_cast<int>(src), tag)->wait();
    header[0] = header[0].cpu();
  });
  auto h = header[0].accessor<int64_t, 1>();
  const int64_t n = h[0];
  if (n < 0 || static_cast<int64_t>(kLeadSlots) + n * kSlotsPerTensor >
                   static_cast<int64_t>(kHeaderSlots)) {
    return absl::InternalError(absl::StrCat("micro-batch from rank ", src, " has ", n, " tensors"));
  }
  if (h[3] < 0) {
    return absl::InternalError(absl::StrCat("rank ", src, " sends ", h[3], " bytes of buffers"));
  }
  PeerBatch out;
  out.micro_batches = h[1];
  std::memcpy(&out.loss_scale, &h[4], sizeof(out.loss_scale));
  std::vector<torch::Tensor>& batch = out.tensors;
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = kLeadSlots + i * kSlotsPerTensor;
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < std::min(h[at + 2], kMaxDims); ++d) shape.push_back(h[at + 3 + d]);
    std::vector<torch::Tensor> one;
    SDC_TORCH_TRY({
      one.push_back(torch::empty(shape, there.dtype(static_cast<torch::ScalarType>(h[at]))));
      pg_->recv(one, static_cast<int>(src), tag + 1 + static_cast<int>(i))->wait();
      // Where the subject had it: the host, or the model's device.
      batch.push_back(one[0].to(h[at + 1] == 0 ? torch::Device(torch::kCPU) : device_));
    });
  }
  std::vector<torch::Tensor> rng;
  SDC_TORCH_TRY({
    rng.push_back(torch::empty({h[2]}, there.dtype(torch::kUInt8)));
    pg_->recv(rng, static_cast<int>(src), tag + 1 + static_cast<int>(n))->wait();
    out.rng_state = rng[0].cpu();
    if (h[3] > 0) {
      std::vector<torch::Tensor> buffers = {torch::empty({h[3]}, there.dtype(torch::kUInt8))};
      pg_->recv(buffers, static_cast<int>(src), tag + 2 + static_cast<int>(n))->wait();
      out.buffers = buffers[0].to(device_);
    }
  });
  // The same model everywhere: the subject's buffers are this rank's size
  // (checked after every message is received, so the subject never waits).
  if (h[3] != ByteSize(buffers_)) {
    return absl::InternalError(absl::StrCat("rank ", src, " sent ", h[3],
                                            " bytes of module buffers, this rank holds ",
                                            ByteSize(buffers_)));
  }
  return out;
}

GuardEngine::Impl::Replayed GuardEngine::Impl::Replay(const PeerBatch& batch) {
  // The replay starts from the subject's RNG state and buffers as its
  // forward read them; this rank's own are restored after: the replay must
  // leave no trace on this rank's own training.
  std::vector<torch::Tensor> saved_buffers;
  for (const torch::Tensor& b : buffers_) saved_buffers.push_back(b.detach().clone());
  const torch::Tensor own_rng = CaptureRng(device_);
  ThrowIfFailed(RestoreRng(device_, batch.rng_state));  // Checked before anything is set.
  // Whatever happens in the replay (a libtorch error propagates to the
  // caller), the rank leaves it with its own RNG, buffers and mode.
  struct Restore {
    Impl* self;
    torch::Tensor rng;
    std::vector<torch::Tensor>& saved;
    ~Restore() {
      self->replaying_ = false;
      try {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < self->buffers_.size(); ++i) self->buffers_[i].copy_(saved[i]);
        (void)RestoreRng(self->device_, rng);  // Its own state: the size fits.
      } catch (const c10::Error& e) {
        self->Log(absl::StrCat("could not restore buffers or RNG after a replay: ",
                               e.what_without_backtrace()));
      }
    }
  } restore{this, own_rng, saved_buffers};
  if (batch.buffers.defined()) UnpackBytes(batch.buffers, buffers_);
  replaying_ = true;
  Replayed out;
  torch::Tensor loss = loss_fn_(batch.tensors) / static_cast<double>(batch.micro_batches);
  // As a loss scaler multiplies it (torch.amp.GradScaler: by a float32 scale).
  if (batch.loss_scale != 1.0) {
    loss = loss * torch::scalar_tensor(batch.loss_scale, loss.options().dtype(torch::kFloat));
  }
  out.loss_bits = LossBits(loss);
  // torch::autograd::grad leaves every parameter's .grad untouched.
  std::vector<torch::Tensor> grads = torch::autograd::grad(
      {loss}, params_, /*grad_outputs=*/{}, /*retain_graph=*/false, /*create_graph=*/false,
      /*allow_unused=*/true);
  replaying_ = false;
  out.gradients = GradientFingerprints(grads);
  out.digest = AuditDigest(out.gradients, Fingerprints(buffers_));
  out.nonfinite = NonFinite(grads);
  return out;
}

absl::StatusOr<std::optional<std::pair<uint32_t, GuardEngine::Impl::Replayed>>>
GuardEngine::Impl::ExchangeAndReplay(const std::vector<core::Assignment>& pairs, int tag_base) {
  std::vector<std::pair<uint32_t, int>> sends;  // (replayer of mine, tag)
  std::optional<uint32_t> subject;
  int tag_of_mine = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const int tag = tag_base + static_cast<int>(i) * 64;
    if (pairs[i].subject == rank_ && pairs[i].replayer != rank_) sends.push_back({pairs[i].replayer, tag});
    if (pairs[i].replayer == rank_) {
      subject = pairs[i].subject;
      tag_of_mine = tag;
    }
  }
  // On NCCL a send waits for its peer's receive (and a pair's first message
  // for both sides to set up the pair's communicator), so a cycle of ranks
  // that all send first deadlocks: two ranks replaying each other, or any
  // longer cycle of a plan. A rank whose subject is lower receives first:
  // going backwards round a cycle the ranks cannot all increase, so every
  // cycle has a rank that receives first. (Gloo does not care.)
  const bool receive_first = subject.has_value() && *subject < rank_;
  std::vector<c10::intrusive_ptr<c10d::Work>> pending;
  auto send_all = [&]() -> absl::Status {
    for (const auto& [dst, tag] : sends) SDC_TORCH_TRY(SendBatch(dst, tag, pending));
    return absl::OkStatus();
  };
  std::optional<std::pair<uint32_t, Replayed>> result;
  if (!receive_first) {
    if (absl::Status s = send_all(); !s.ok()) return s;
  }
  if (subject.has_value()) {
    auto received = RecvBatch(*subject, tag_of_mine);
    if (!received.ok()) return received.status();
    if (receive_first) {
      if (absl::Status s = send_all(); !s.ok()) return s;
    }
    Replayed r;
    SDC_TORCH_TRY(r = Replay(*received));
    result = std::make_pair(*subject, std::move(r));
  }
  for (auto& w : pending) SDC_TORCH_TRY(w->wait());
  return result;
}

void GuardEngine::Impl::Broadcast(std::vector<torch::Tensor> tensors, uint32_t root) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor& t : tensors) {
    std::vector<torch::Tensor> one = {t.detach()};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg_->broadcast(one, o)->wait();
  }
}

absl::Status GuardEngine::Impl::Audit(StepDecision& decision, LocalView& view) {
  ++summary_.audits;
  const bool subject = std::any_of(plan_.assignments.begin(), plan_.assignments.end(),
                                   [&](const core::Assignment& a) { return a.subject == rank_; });
  auto replayed = ExchangeAndReplay(plan_.assignments, /*tag_base=*/1000);
  if (!replayed.ok()) return replayed.status();
  std::vector<kernels::Fingerprint> original;
  bool has_original = false;
  {
    absl::MutexLock lock(&mu_);
    original = original_gradients_;
    has_original = original_recorded_;
  }
  for (size_t i = 0; i < original.size(); ++i) {
    if (original[i] == kernels::Fingerprint{}) {  // No gradient recorded: zeros, as a replay's.
      original[i] = {static_cast<uint64_t>(params_[i].numel()) * params_[i].element_size(), 0, 0};
    }
  }
  AuditExchange mine;
  if (subject && has_original) {
    mine.has_original = true;
    mine.original_loss_bits = original_loss_bits_;
    mine.original_digest = AuditDigest(original, original_buffers_);
    core::AuditResult a;
    a.role = core::AuditRole::kOriginal;
    a.plan_id = plan_id_;
    a.subject = rank_;
    a.loss_bits = original_loss_bits_;
    a.gradient_digest = mine.original_digest;
    if (options_.parameter_fingerprints) a.gradients = std::move(original);
    Send(std::move(a));
  }
  if (replayed->has_value()) {
    const auto& [who, r] = **replayed;
    mine.replay_subject = who;
    mine.replay_loss_bits = r.loss_bits;
    mine.replay_digest = r.digest;
    core::AuditResult a;
    a.role = core::AuditRole::kReplay;
    a.plan_id = plan_id_;
    a.subject = who;
    a.loss_bits = r.loss_bits;
    a.gradient_digest = r.digest;
    a.nonfinite = r.nonfinite;
    if (options_.parameter_fingerprints) a.gradients = r.gradients;
    Send(std::move(a));
  }
  std::vector<int64_t> all;
  SDC_TORCH_TRY(all = AllGather(*pg_, small_collectives_, EncodeAudit(mine)));
  const std::vector<AuditExchange> audits = DecodeAudits(all, world_);
  const core::AuditVerdict inband =
      InBandVerdict(plan_, *topology_, audits, /*deterministic=*/true, step_);
  decision.audit_outcome = core::AuditOutcomeName(inband.outcome);
  view.audit_mismatch = core::IsFailure(inband.outcome);
  if (view.audit_mismatch) ++summary_.audit_mismatches;
  // Tie-breaks, in-band: every rank derived the same list.
  if (!inband.tiebreaks.empty()) {
    std::vector<core::Assignment> pairs;
    for (const core::TieBreak& t : inband.tiebreaks) pairs.push_back({t.tiebreaker, t.subject});
    // One tie-break per tiebreaker at a time keeps each rank's receive single.
    for (size_t i = 0; i < pairs.size(); ++i) {
      auto tb = ExchangeAndReplay({pairs[i]}, 3000 + static_cast<int>(i) * 64);
      if (!tb.ok()) return tb.status();
      if (tb->has_value()) {
        core::AuditResult a;
        a.role = core::AuditRole::kTieBreak;
        a.plan_id = plan_id_;
        a.subject = (*tb)->first;
        a.loss_bits = (*tb)->second.loss_bits;
        a.gradient_digest = (*tb)->second.digest;
        if (options_.parameter_fingerprints) a.gradients = (*tb)->second.gradients;
        Send(std::move(a));
      }
    }
  }
  if (link_ != nullptr) {
    // The in-band verdict decides the step; sdcd's own changes nothing on
    // this rank, so by default it is taken only when already here.
    std::optional<v1::AuditVerdict> v = link_->WaitAuditVerdict(step_, options_.verdict_wait);
    const bool unverified =
        !v.has_value() && (options_.verdict_wait > absl::ZeroDuration() || !link_->stats().connected);
    if (unverified) {
      decision.audit_unverified = true;
      ++summary_.audits_unverified;
    } else if (v.has_value()) {
      // The coordinator's final word (after any tie-break) names the outcome.
      decision.audit_outcome = absl::AsciiStrToLower(v1::VerdictOutcome_Name(v->outcome()));
      if (v->outcome() != v1::PASS) {
        Log(absl::StrCat("sdcd verdict for step ", step_, ": ", v->explanation()));
      }
    }
  } else {
    decision.audit_unverified = true;
    ++summary_.audits_unverified;
  }
  return absl::OkStatus();
}

absl::StatusOr<StepDecision> GuardEngine::Impl::Finish() {
  StepDecision decision;
  decision.audited = audit_;
  LocalView view;
  uint64_t local_nonfinite = 0, reduced_nonfinite = 0;
  double sum_squares = 0;
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
  std::sort(reduced.begin(), reduced.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  try {
    // Check 1 after the all-reduce, and the digest every rank compares.
    const absl::Time start = absl::Now();
    std::vector<torch::Tensor> flats;
    for (const auto& [index, t] : reduced) flats.push_back(t.detach().contiguous());
    std::vector<kernels::ScanResult> scans;
    ThrowIfFailed(ScanOnDevice(flats, &scans));
    for (const auto& r : scans) {
      reduced_nonfinite += r.nonfinite;
      sum_squares += r.sum_squares;
    }
    std::vector<kernels::Fingerprint> fps;
    ThrowIfFailed(FingerprintOnDevice(flats, &fps));
    kernels::ModelDigestBuilder digest;
    for (size_t i = 0; i < fps.size(); ++i) digest.Add(absl::StrCat("bucket.", reduced[i].first), fps[i]);
    view.reduced_digest = digest.Finish();
    decision.check1_ms += MsSince(start);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  view.local_nonfinite = local_nonfinite > 0;
  view.reduced_nonfinite = reduced_nonfinite > 0;
  decision.grad_norm = std::sqrt(sum_squares);

  // An op without a deterministic implementation ran on some rank's audit
  // step: no replay can reproduce its gradients, so audits stop for the
  // job, on every rank alike (a replay's mismatch would blame healthy GPUs).
  std::string audits_off_now;
  if (audit_) {
    const std::string alert = alerts_.Take();
    if (!alert.empty()) NoteNondeterministic(alert);
    std::vector<int64_t> seen = {nondeterministic_.empty() ? 0 : 1};
    SDC_TORCH_TRY(AllReduceMax(*pg_, small_collectives_, seen));
    if (seen[0] != 0) {
      audits_off_ = nondeterministic_.empty() ? "another rank ran an op with no deterministic "
                                                "implementation"
                                              : nondeterministic_;
      audits_off_now = audits_off_;
      audit_ = false;
      decision.audited = false;
      decision.audit_outcome = "audits_off";
      Log(absl::StrCat("replay audits are off for this job from step ", step_, ": ",
                       audits_off_, " (non-finite checks and weight votes go on)"));
    }
  }

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

  // A lone local NaN/Inf: one rank of another domain replays that micro-batch.
  // Only a step of one micro-batch can be replayed as it ran (its batch and
  // RNG state): with accumulation the NaN may come from a later micro-batch
  // nobody holds, and a finite replay of the first would wrongly confirm the
  // GPU. Then no replay runs and the coordinator keeps the rank a suspect
  // (targeted audits decide). Every rank of a DDP job accumulates alike, so
  // all take the same branch.
  const bool replayable = micro_batches_ == 1;
  if (a.any_local_nonfinite && !a.all_local_nonfinite && a.highest_local_nonfinite_rank >= 0 &&
      !replayable && rank_ == static_cast<uint32_t>(a.highest_local_nonfinite_rank)) {
    Log(absl::StrCat("NaN/Inf in this rank's local gradients at step ", step_, " (", micro_batches_,
                     " micro-batches): not replayable as it ran, so not confirmed; a suspect"));
  }
  if (a.any_local_nonfinite && !a.all_local_nonfinite && a.highest_local_nonfinite_rank >= 0 &&
      replayable) {
    const uint32_t subject = static_cast<uint32_t>(a.highest_local_nonfinite_rank);
    std::optional<core::Rank> confirmer = core::ChooseConfirmer(*topology_, subject, step_);
    if (confirmer.has_value()) {
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
    }
  }

  // Repair a weight minority once every rank holds the verdict.
  if (a.repair_step_known_by_all > repaired_step_ && a.repair_step_known_by_all == repair_step_) {
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
  }

  // Apply (clipped, when asked) or skip (zeroed), identically everywhere.
  try {
    torch::NoGradGuard no_grad;
    if (decision.apply && options_.max_grad_norm > 0 &&
        decision.grad_norm > options_.max_grad_norm) {
      decision.clip_coef = options_.max_grad_norm / (decision.grad_norm + 1e-6);
    }
    for (const torch::Tensor& p : params_) {
      torch::Tensor g = p.grad();
      if (!g.defined()) continue;
      if (!decision.apply) {
        g.zero_();
      } else if (decision.clip_coef < 1) {
        g.mul_(decision.clip_coef);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  RestoreDeterminism();
  ++summary_.steps;
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
  report.reduced_nonfinite = reduced_nonfinite;
  report.reduced_sum_squares = sum_squares;
  report.reduced_digest = view.reduced_digest;
  report.applied = decision.apply;
  report.skip_reason = decision.reason;
  report.audit_unverified = decision.audit_unverified;
  report.audits_off = audits_off_now;
  Send(std::move(report));
  return decision;
}

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
  return MsSince(start);
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

GuardSummary GuardEngine::Impl::Summary() const {
  GuardSummary s = summary_;
  s.audits_off = audits_off_;
  if (link_ != nullptr) {
    const CoordinatorLink::Stats l = link_->stats();
    s.reports_sent = l.sent;
    s.reports_acked = l.acked;
    s.reports_dropped = l.dropped;
    s.coordinator_connected = l.connected;
  }
  return s;
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
  if (frozen.names.size() != frozen.tensors.size()) {
    return absl::InvalidArgumentError("a name for every frozen parameter is required");
  }
  frozen.names.insert(frozen.names.end(), buffers.names.begin(), buffers.names.end());
  frozen.tensors.insert(frozen.tensors.end(), buffers.tensors.begin(), buffers.tensors.end());
  auto impl = std::make_unique<Impl>(std::move(options), std::move(process_group),
                                     std::move(parameters), std::move(frozen),
                                     buffers.tensors.size(), std::move(optimizer_state),
                                     std::move(loss_fn));
  if (absl::Status s = impl->Init(); !s.ok()) return s;
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
  std::vector<size_t> indices;
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < impl_->params().size(); ++i) {
    indices.push_back(i);
    grads.push_back(impl_->params()[i].grad());
  }
  impl_->RecordOriginalGradients(indices, grads);
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
const core::CheckpointLedger& GuardEngine::Checkpoints() const { return impl_->checkpoints(); }
absl::StatusOr<core::CheckpointLedger> GuardEngine::RefreshCheckpoints(absl::Duration timeout) {
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
