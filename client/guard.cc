#include "client/guard.h"

#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/coordinator_link.h"
#include "client/device.h"
#include "client/small_collectives.h"
#include "client/step_core.h"
#include "daemon/core/replay_plan.h"
#include "kernels/fingerprint.h"
#include "kernels/model_digest.h"
#include "kernels/nonfinite.h"

namespace sdc {
namespace {

// What the coordinator said about the job's checkpoints.
void Learn(core::CheckpointLedger& ledger, const v1::CheckpointDecision& d) {
  ledger.Learn(d.confirmed_through_step(),
               absl::MakeConstSpan(d.revoked_steps().data(), d.revoked_steps().size()));
}

using client::FaultKind;

// A micro-batch's header: 3 words, then per tensor its dtype, device, number
// of dimensions and up to kMaxDims sizes (so at most 6 tensors).
constexpr size_t kHeaderSlots = 64;
constexpr int64_t kMaxDims = 6;
constexpr int64_t kSlotsPerTensor = 3 + kMaxDims;

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

using client::DTypeOf;

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
  ThrowIfFailed(client::FingerprintOnDevice(dense, &packed));
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
  ThrowIfFailed(client::ScanOnDevice(dense, &out));
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

// The tensors of an optimizer's per-parameter state, in parameter order.
std::vector<torch::Tensor> OptimizerTensors(torch::optim::Optimizer& optimizer,
                                            const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  auto& state = optimizer.state();
  for (const torch::Tensor& p : params) {
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end()) continue;
    torch::optim::OptimizerParamState* s = it->second.get();
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      out.push_back(adam->exp_avg());
      out.push_back(adam->exp_avg_sq());
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      out.push_back(adamw->exp_avg());
      out.push_back(adamw->exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      if (sgd->momentum_buffer().defined()) out.push_back(sgd->momentum_buffer());
    }
  }
  return out;
}

}  // namespace

std::string GuardSummary::ToString() const {
  return absl::StrFormat(
      "steps=%d skipped=%d audits=%d (unverified %d, mismatches %d) weight_checks=%d "
      "repairs=%d checkpoints allowed=%d vetoed=%d reports sent=%d acked=%d dropped=%d "
      "coordinator=%s",
      steps, skipped, audits, audits_unverified, audit_mismatches, weight_checks, repairs,
      checkpoints_allowed, checkpoints_vetoed, reports_sent, reports_acked, reports_dropped,
      coordinator_connected ? "connected" : "not connected");
}

class Guard::Impl {
 public:
  Impl(client::GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> pg,
       torch::nn::Module& model, torch::optim::Optimizer& optimizer, LossFn loss_fn)
      : options_(std::move(options)),
        pg_(std::move(pg)),
        model_(model),
        optimizer_(optimizer),
        loss_fn_(std::move(loss_fn)),
        rank_(static_cast<uint32_t>(pg_->getRank())),
        world_(static_cast<uint32_t>(pg_->getSize())),
        small_collectives_(client::Resolve(options_.small_collectives, *pg_)),
        collective_device_(client::CollectiveDevice(*pg_)) {}

  absl::Status Init();
  absl::Status BeginStep(uint64_t step, std::vector<std::vector<torch::Tensor>> batches);
  void AfterMicroBatchBackward(size_t index, const torch::Tensor& loss);
  absl::StatusOr<StepDecision> AllReduceAndCheck();
  void AfterOptimizerStep(bool checkpoint);
  absl::StatusOr<bool> MayCheckpoint();
  absl::StatusOr<core::CheckpointLedger> RefreshCheckpoints(absl::Duration timeout);
  const core::CheckpointLedger& checkpoints() const { return checkpoints_; }
  torch::Tensor FaultPoint(const torch::Tensor& x);
  GuardSummary Summary() const;
  absl::StatusOr<StepDecision> TrainStep(uint64_t step,
                                         std::vector<std::vector<torch::Tensor>> batches,
                                         bool checkpoint, double* loss_out);
  void Shutdown(absl::Duration flush) {
    if (link_ != nullptr) link_->Stop(flush);
  }
  uint32_t rank() const { return rank_; }
  uint32_t world() const { return world_; }

 private:
  struct Replayed {
    uint64_t loss_bits = 0;
    std::vector<kernels::Fingerprint> gradients;
    uint64_t digest = 0;
    uint64_t nonfinite = 0;
  };
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> params;  // Indices into params_.
  };

  void Log(const std::string& line) const {
    std::fprintf(stderr, "sdc-guard rank %u: %s\n", rank_, line.c_str());
  }
  void DrainMessages();
  void SendBatch(uint32_t dst, int tag, std::vector<c10::intrusive_ptr<c10d::Work>>& pending);
  absl::StatusOr<std::pair<std::vector<torch::Tensor>, std::pair<int64_t, torch::Tensor>>>
  RecvBatch(uint32_t src, int tag);
  Replayed Replay(const std::vector<torch::Tensor>& batch, int64_t micro_batches,
                  const torch::Tensor& rng_state);
  // Peers exchange micro-batches along `pairs` (replayer, subject) and each
  // replayer replays what it received: returns its result, if it replayed.
  absl::StatusOr<std::optional<std::pair<uint32_t, Replayed>>> ExchangeAndReplay(
      const std::vector<core::Assignment>& pairs, int tag_base);
  void Send(decltype(core::Report::body) body) {
    if (link_ != nullptr) link_->Send(step_, std::move(body));
  }
  void Broadcast(std::vector<torch::Tensor> tensors, uint32_t root);

  const client::GuardOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  const LossFn loss_fn_;
  const uint32_t rank_;
  const uint32_t world_;
  const client::SmallCollectives small_collectives_;  // Resolved: never kAuto.
  const torch::Device collective_device_;  // Where pg_ sends from.
  torch::Device device_ = torch::kCPU;     // The model's (Init).

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;  // Parameters, then buffers.
  std::vector<torch::Tensor> buffers_;
  size_t parameter_count_ = 0;
  std::unique_ptr<core::Topology> topology_;
  std::unique_ptr<client::CoordinatorLink> link_;

  // The current step.
  uint64_t step_ = 0;
  std::vector<std::vector<torch::Tensor>> batches_;
  torch::Tensor rng_state_;
  bool audit_ = false;
  uint64_t plan_id_ = 0;
  core::ReplayPlan plan_;
  bool deterministic_before_ = false;
  bool weight_check_done_for_checkpoint_ = false;
  Replayed original_;
  bool has_original_ = false;
  bool replaying_ = false;
  bool checkpoint_weights_sent_ = false;
  double last_weight_ms_ = 0;

  // Targeted plans and repairs, agreed in-band.
  std::map<uint64_t, core::ReplayPlan> plans_;
  uint64_t plans_held_ = 0;
  uint64_t plans_held_by_all_ = 0;
  uint64_t last_plan_run_ = 0;
  uint64_t repair_step_ = 0;
  uint32_t repair_source_ = 0;
  uint64_t repaired_step_ = 0;

  GuardSummary summary_;
  core::CheckpointLedger checkpoints_;
};

absl::Status Guard::Impl::Init() {
  for (const auto& item : model_.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    names_.push_back(item.key());
  }
  parameter_count_ = params_.size();
  for (const auto& item : model_.named_buffers(/*recurse=*/true)) {
    buffers_.push_back(item.value());
    names_.push_back(item.key());
  }
  if (params_.empty()) return absl::InvalidArgumentError("the model has no trainable parameters");
  for (const torch::Tensor& p : params_) {
    if (absl::StatusOr<kernels::DType> d = DTypeOf(p); !d.ok()) return d.status();
  }
  // One device for the whole model, one the kernels can read (a CUDA
  // tensor's pointer is device memory: without the CUDA path it is refused,
  // never read; see ARCHITECTURE.md, "The CUDA path").
  device_ = params_.front().device();
  for (size_t i = 0; i < names_.size(); ++i) {
    const torch::Tensor& t = i < parameter_count_ ? params_[i] : buffers_[i - parameter_count_];
    if (t.device() != device_) {
      return absl::InvalidArgumentError(absl::StrCat(names_[i], " is on ", t.device().str(), ", ",
                                                     names_.front(), " on ", device_.str(),
                                                     ": the guard needs the model on one device"));
    }
  }
  if (absl::Status s = client::CheckDevice(device_); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(names_.front(), " is on ", device_.str(), ": ", s.message()));
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
  if (!options_.coordinator.empty()) {
    core::Hello hello;
    hello.job_id = options_.job_id;
    hello.placement = {rank_, options_.node_name, options_.local_rank, options_.gpu_uuid,
                       options_.replica_group};
    hello.world_size = world_;
    hello.incarnation = options_.incarnation;
    hello.weight_tensors = names_;
    hello.parameter_count = static_cast<uint32_t>(parameter_count_);
    kernels::ModelDigestBuilder layout;
    std::vector<torch::Tensor> all = params_;
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    for (size_t i = 0; i < all.size(); ++i) {
      layout.Add(names_[i], {static_cast<uint64_t>(all[i].numel()) * all[i].element_size(), 0, 0});
    }
    hello.layout_digest = layout.Finish();
    hello.deterministic = true;
    hello.audit_every = options_.audit_every;
    hello.weight_check_every = options_.weight_check_every;
    link_ = std::make_unique<client::CoordinatorLink>(options_, std::move(hello));
    link_->Start();
  }
  if (options_.fault.enabled()) Log(absl::StrCat("FAULT INJECTION ARMED: ", options_.fault.Describe()));
  return absl::OkStatus();
}

void Guard::Impl::DrainMessages() {
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

absl::Status Guard::Impl::BeginStep(uint64_t step,
                                    std::vector<std::vector<torch::Tensor>> batches) {
  if (batches.empty()) return absl::InvalidArgumentError("a step needs at least one micro-batch");
  // What a replay peer can be sent (SendBatch's header), checked at every
  // step on every rank: refused at an audit, the job would wait on this rank.
  if (3 + batches.front().size() * kSlotsPerTensor > kHeaderSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a micro-batch of ", batches.front().size(), " tensors: replay audits send at most ",
        (kHeaderSlots - 3) / kSlotsPerTensor));
  }
  for (const torch::Tensor& t : batches.front()) {
    if (t.dim() > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("a micro-batch tensor of ", t.dim(),
                                                     " dimensions: replay audits send at most ",
                                                     kMaxDims));
    }
  }
  DrainMessages();
  step_ = step;
  batches_ = std::move(batches);
  has_original_ = false;
  checkpoint_weights_sent_ = false;
  // A targeted plan every rank holds runs at the first step that is not a
  // scheduled audit.
  const uint64_t next_plan = last_plan_run_ < plans_held_by_all_ ? last_plan_run_ + 1 : 0;
  const client::StepPlan sp =
      client::PlanStep(step, options_.audit_every, options_.weight_check_every, next_plan);
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
    for (torch::Tensor& p : params_) p.mutable_grad() = torch::Tensor();
    rng_state_ = client::CaptureRng(device_);
  });
  deterministic_before_ = at::globalContext().deterministicAlgorithms();
  if (audit_) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  return absl::OkStatus();
}

void Guard::Impl::AfterMicroBatchBackward(size_t index, const torch::Tensor& loss) {
  if (index != 0) return;
  original_.loss_bits = LossBits(loss);
  if (!audit_) return;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params_) grads.push_back(p.grad());
  original_.gradients = Fingerprints(grads);
  std::vector<std::string> names(names_.begin(), names_.begin() + parameter_count_);
  original_.digest = Digest(names, original_.gradients);
  has_original_ = true;
}

torch::Tensor Guard::Impl::FaultPoint(const torch::Tensor& x) {
  const client::FaultPlan& f = options_.fault;
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
  Log(absl::StrCat("INJECTED ", client::FaultKindName(f.kind), " into an activation at step ",
                   step_, replaying_ ? " (while replaying a peer)" : ""));
  // Gradients flow through the corrupted value as they would on faulty hardware.
  return x + (y - x).detach();
}

void Guard::Impl::SendBatch(uint32_t dst, int tag,
                            std::vector<c10::intrusive_ptr<c10d::Work>>& pending) {
  const std::vector<torch::Tensor>& batch = batches_.front();
  torch::Tensor header = torch::zeros({static_cast<int64_t>(kHeaderSlots)}, torch::kInt64);
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(batch.size());
  h[1] = static_cast<int64_t>(batches_.size());
  h[2] = rng_state_.numel();
  for (size_t i = 0; i < batch.size() && 3 + (i + 1) * kSlotsPerTensor <= kHeaderSlots; ++i) {
    const size_t at = 3 + i * kSlotsPerTensor;
    h[at] = static_cast<int64_t>(batch[i].scalar_type());
    h[at + 1] = batch[i].device().is_cpu() ? 0 : 1;  // 1: on the model's device.
    h[at + 2] = batch[i].dim();
    for (int64_t d = 0; d < batch[i].dim() && d < kMaxDims; ++d) h[at + 3 + d] = batch[i].size(d);
  }
  // Everything travels from where the process group sends (the GPU on NCCL).
  std::vector<torch::Tensor> messages = {header.to(collective_device_)};
  for (const torch::Tensor& t : batch) messages.push_back(t.contiguous().to(collective_device_));
  messages.push_back(rng_state_.to(collective_device_));
  for (size_t i = 0; i < messages.size(); ++i) {
    std::vector<torch::Tensor> one = {messages[i]};
    pending.push_back(pg_->send(one, static_cast<int>(dst), tag + static_cast<int>(i)));
  }
}

absl::StatusOr<std::pair<std::vector<torch::Tensor>, std::pair<int64_t, torch::Tensor>>>
Guard::Impl::RecvBatch(uint32_t src, int tag) {
  const torch::TensorOptions there = torch::TensorOptions().device(collective_device_);
  std::vector<torch::Tensor> header = {
      torch::zeros({static_cast<int64_t>(kHeaderSlots)}, there.dtype(torch::kInt64))};
  SDC_TORCH_TRY({
    pg_->recv(header, static_cast<int>(src), tag)->wait();
    header[0] = header[0].cpu();
  });
  auto h = header[0].accessor<int64_t, 1>();
  const int64_t n = h[0];
  if (n < 0 || 3 + n * kSlotsPerTensor > static_cast<int64_t>(kHeaderSlots)) {
    return absl::InternalError(absl::StrCat("micro-batch from rank ", src, " has ", n, " tensors"));
  }
  std::vector<torch::Tensor> batch;
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = 3 + i * kSlotsPerTensor;
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
    rng[0] = rng[0].cpu();
  });
  return std::make_pair(std::move(batch), std::make_pair(h[1], rng[0]));
}

Guard::Impl::Replayed Guard::Impl::Replay(const std::vector<torch::Tensor>& batch,
                                          int64_t micro_batches, const torch::Tensor& rng_state) {
  // Module buffers (BatchNorm statistics) and the RNG are restored after:
  // the replay must leave no trace on this rank's own training.
  std::vector<torch::Tensor> saved_buffers;
  for (const torch::Tensor& b : buffers_) saved_buffers.push_back(b.detach().clone());
  const torch::Tensor own_rng = client::CaptureRng(device_);
  ThrowIfFailed(client::RestoreRng(device_, rng_state));  // Checked before anything is set.
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
        (void)client::RestoreRng(self->device_, rng);  // Its own state: the size fits.
      } catch (const c10::Error& e) {
        self->Log(absl::StrCat("could not restore buffers or RNG after a replay: ",
                               e.what_without_backtrace()));
      }
    }
  } restore{this, own_rng, saved_buffers};
  replaying_ = true;
  Replayed out;
  torch::Tensor loss = loss_fn_(batch) / static_cast<double>(micro_batches);
  out.loss_bits = LossBits(loss);
  // torch::autograd::grad leaves every parameter's .grad untouched.
  std::vector<torch::Tensor> grads = torch::autograd::grad(
      {loss}, params_, /*grad_outputs=*/{}, /*retain_graph=*/false, /*create_graph=*/false,
      /*allow_unused=*/true);
  replaying_ = false;
  out.gradients = Fingerprints(grads);
  std::vector<std::string> names(names_.begin(), names_.begin() + parameter_count_);
  out.digest = Digest(names, out.gradients);
  out.nonfinite = NonFinite(grads);
  return out;
}

absl::StatusOr<std::optional<std::pair<uint32_t, Guard::Impl::Replayed>>>
Guard::Impl::ExchangeAndReplay(const std::vector<core::Assignment>& pairs, int tag_base) {
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
    SDC_TORCH_TRY(r = Replay(received->first, received->second.first, received->second.second));
    result = std::make_pair(*subject, std::move(r));
  }
  for (auto& w : pending) SDC_TORCH_TRY(w->wait());
  return result;
}

void Guard::Impl::Broadcast(std::vector<torch::Tensor> tensors, uint32_t root) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor& t : tensors) {
    std::vector<torch::Tensor> one = {t.detach()};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg_->broadcast(one, o)->wait();
  }
}

absl::StatusOr<StepDecision> Guard::Impl::AllReduceAndCheck() {
  StepDecision decision;
  double allreduce_ms = 0;
  decision.audited = audit_;
  const client::FaultPlan& fault = options_.fault;
  client::LocalView view;
  uint64_t local_nonfinite = 0, reduced_nonfinite = 0;
  double sum_squares = 0;
  std::vector<Bucket> buckets;
  try {
    torch::NoGradGuard no_grad;
    if (fault.kind == FaultKind::kNanGradient && fault.FiresAt(rank_, step_)) {
      for (torch::Tensor& p : params_) {
        if (p.grad().defined()) {
          p.mutable_grad().view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
          Log(absl::StrCat("INJECTED NaN into a local gradient at step ", step_));
          break;
        }
      }
    }
    // Flat buckets of gradients (zeros where a parameter got none, so every
    // rank reduces the same layout).
    Bucket current;
    size_t bytes = 0;
    std::vector<torch::Tensor> pieces;
    auto close = [&] {
      if (current.params.empty()) return;
      current.flat = torch::cat(pieces);
      buckets.push_back(std::move(current));
      current = Bucket{};
      pieces.clear();
      bytes = 0;
    };
    for (size_t i = 0; i < params_.size(); ++i) {
      const torch::Tensor& g = params_[i].grad();
      pieces.push_back(g.defined() ? g.reshape({-1}) : torch::zeros({params_[i].numel()}, params_[i].options()));
      current.params.push_back(i);
      bytes += params_[i].numel() * params_[i].element_size();
      if (bytes >= options_.bucket_bytes ||
          (i + 1 < params_.size() && params_[i + 1].scalar_type() != params_[i].scalar_type())) {
        close();
      }
    }
    close();
    std::vector<torch::Tensor> flats;
    auto scan = [&](double* squares) {
      flats.clear();
      for (const Bucket& b : buckets) flats.push_back(b.flat);
      std::vector<kernels::ScanResult> results;
      ThrowIfFailed(client::ScanOnDevice(flats, &results));
      uint64_t n = 0;
      double s = 0;
      for (const auto& r : results) {
        n += r.nonfinite;
        s += r.sum_squares;
      }
      if (squares != nullptr) *squares = s;
      return n;
    };
    const absl::Time check1_start = absl::Now();
    local_nonfinite = scan(nullptr);  // Check 1, before the all-reduce.
    decision.check1_ms += MsSince(check1_start);
    const absl::Time reduce_start = absl::Now();
    for (Bucket& b : buckets) {
      std::vector<torch::Tensor> one = {b.flat};
      pg_->allreduce(one)->wait();
      b.flat.div_(static_cast<double>(world_));
    }
    allreduce_ms = MsSince(reduce_start);
    const absl::Time post_start = absl::Now();
    if (fault.kind == FaultKind::kReducedGradient && fault.FiresAt(rank_, step_)) {
      FlipMantissaBit(buckets.front().flat, 20);
      Log(absl::StrCat("INJECTED a bit flip into the reduced gradients at step ", step_));
    }
    reduced_nonfinite = scan(&sum_squares);  // Check 1, after.
    std::vector<kernels::Fingerprint> fps;
    ThrowIfFailed(client::FingerprintOnDevice(flats, &fps));
    kernels::ModelDigestBuilder reduced;
    for (size_t i = 0; i < fps.size(); ++i) reduced.Add(absl::StrCat("bucket.", i), fps[i]);
    view.reduced_digest = reduced.Finish();
    decision.check1_ms += MsSince(post_start);
    // Buffers follow rank 0, as DistributedDataParallel's broadcast_buffers.
    if (!buffers_.empty()) Broadcast(buffers_, 0);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  view.local_nonfinite = local_nonfinite > 0;
  view.reduced_nonfinite = reduced_nonfinite > 0;
  decision.grad_norm = std::sqrt(sum_squares);

  (void)allreduce_ms;
  // Check 2: replay audit, compared in-band so every rank decides alike.
  const absl::Time audit_start = absl::Now();
  if (audit_) {
    ++summary_.audits;
    const bool subject = std::any_of(plan_.assignments.begin(), plan_.assignments.end(),
                                     [&](const core::Assignment& a) { return a.subject == rank_; });
    auto replayed = ExchangeAndReplay(plan_.assignments, /*tag_base=*/1000);
    if (!replayed.ok()) return replayed.status();
    client::AuditExchange mine;
    if (subject && has_original_) {
      mine.has_original = true;
      mine.original_loss_bits = original_.loss_bits;
      mine.original_digest = original_.digest;
      core::AuditResult a;
      a.role = core::AuditRole::kOriginal;
      a.plan_id = plan_id_;
      a.subject = rank_;
      a.loss_bits = original_.loss_bits;
      a.gradient_digest = original_.digest;
      if (options_.parameter_fingerprints) a.gradients = original_.gradients;
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
    SDC_TORCH_TRY(all = client::AllGather(*pg_, small_collectives_, client::EncodeAudit(mine)));
    const std::vector<client::AuditExchange> audits = client::DecodeAudits(all, world_);
    const core::AuditVerdict inband =
        client::InBandVerdict(plan_, *topology_, audits, /*deterministic=*/true, step_);
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
      std::optional<v1::AuditVerdict> v = link_->WaitAuditVerdict(step_, options_.verdict_wait);
      if (!v.has_value()) {
        decision.audit_unverified = true;
        ++summary_.audits_unverified;
      } else {
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
  }

  if (audit_) decision.audit_ms = MsSince(audit_start);
  // The one agreement all-reduce.
  const absl::Time agreement_start = absl::Now();
  DrainMessages();
  view.plans_held = plans_held_;
  view.repair_step = repair_step_;
  std::vector<int64_t> agree = client::EncodeAgreement(view, rank_);
  SDC_TORCH_TRY(client::AllReduceMax(*pg_, small_collectives_, agree));
  const client::Agreement a = client::DecodeAgreement(agree);
  plans_held_by_all_ = a.plans_held_by_all;
  decision.agreement_ms = MsSince(agreement_start);
  const client::Decision d = client::Decide(a);
  decision.apply = d.apply;
  decision.reason = d.reason;

  // A lone local NaN/Inf: one rank of another domain replays that micro-batch.
  if (a.any_local_nonfinite && !a.all_local_nonfinite && a.highest_local_nonfinite_rank >= 0) {
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
    std::vector<torch::Tensor> all = params_;
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    for (const torch::Tensor& t : OptimizerTensors(optimizer_, params_)) all.push_back(t);
    SDC_TORCH_TRY(Broadcast(all, repair_source_));
    repaired_step_ = repair_step_;
    decision.repaired = true;
    ++summary_.repairs;
    Log(absl::StrCat("weights, buffers and optimizer state restored from rank ", repair_source_));
  }

  // Apply (clipped) or skip (zeroed), identically everywhere.
  try {
    torch::NoGradGuard no_grad;
    if (decision.apply && options_.max_grad_norm > 0 &&
        decision.grad_norm > options_.max_grad_norm) {
      decision.clip_coef = options_.max_grad_norm / (decision.grad_norm + 1e-6);
    }
    for (Bucket& b : buckets) {
      if (!decision.apply) {
        b.flat.zero_();
      } else if (decision.clip_coef < 1) {
        b.flat.mul_(decision.clip_coef);
      }
      int64_t offset = 0;
      for (size_t i : b.params) {
        const int64_t n = params_[i].numel();
        params_[i].mutable_grad() = b.flat.narrow(0, offset, n).view(params_[i].sizes());
        offset += n;
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  at::globalContext().setDeterministicAlgorithms(deterministic_before_, /*warn_only=*/false);
  ++summary_.steps;
  if (!decision.apply) {
    ++summary_.skipped;
    Log(absl::StrCat("step ", step_, " skipped on every rank: ", decision.reason));
  }
  core::StepReport report;
  report.local_nonfinite = local_nonfinite;
  report.reduced_nonfinite = reduced_nonfinite;
  report.reduced_sum_squares = sum_squares;
  report.reduced_digest = view.reduced_digest;
  report.applied = decision.apply;
  report.skip_reason = decision.reason;
  report.audit_unverified = decision.audit_unverified;
  Send(std::move(report));
  return decision;
}

void Guard::Impl::AfterOptimizerStep(bool checkpoint) {
  const client::FaultPlan& f = options_.fault;
  if (f.kind == FaultKind::kWeight && f.FiresAt(rank_, step_)) {
    FlipMantissaBit(params_.front(), 16);
    Log(absl::StrCat("INJECTED a bit flip into weight ", names_.front(), " after step ", step_));
  }
  const bool scheduled = options_.weight_check_every > 0 && step_ % options_.weight_check_every == 0;
  if (!scheduled && !checkpoint) return;
  const absl::Time start = absl::Now();
  ++summary_.weight_checks;
  std::vector<torch::Tensor> all = params_;
  all.insert(all.end(), buffers_.begin(), buffers_.end());
  core::WeightReport w;
  w.tensors = Fingerprints(all);
  w.digest = Digest(names_, w.tensors);
  w.checkpoint = checkpoint;
  if (checkpoint) {
    const std::vector<torch::Tensor> state = OptimizerTensors(optimizer_, params_);
    std::vector<std::string> names;
    for (size_t i = 0; i < state.size(); ++i) names.push_back(absl::StrCat("optimizer.", i));
    w.has_optimizer_digest = true;
    w.optimizer_digest = Digest(names, Fingerprints(state));
    checkpoint_weights_sent_ = true;
  }
  Send(std::move(w));
  last_weight_ms_ = MsSince(start);
}

absl::StatusOr<bool> Guard::Impl::MayCheckpoint() {
  if (!checkpoint_weights_sent_) {
    return absl::FailedPreconditionError(
        "MayCheckpoint needs AfterOptimizerStep(/*checkpoint=*/true) at this step");
  }
  bool allowed = false;
  std::string reason;
  if (link_ != nullptr) {
    absl::StatusOr<v1::CheckpointDecision> d = link_->MayCheckpoint(step_, options_.checkpoint_wait);
    if (d.ok()) {
      allowed = d->allowed();
      reason = d->reason();
      Learn(checkpoints_, *d);
    } else if (options_.checkpoint_fallback == client::CheckpointFallback::kInBand) {
      reason = "coordinator unreachable: in-band vote";
      allowed = true;  // Refined by the in-band digest vote below.
    } else {
      reason = absl::StrCat("coordinator unreachable (", d.status().message(),
                            "): checkpoints are vetoed by policy");
    }
  } else {
    reason = options_.checkpoint_fallback == client::CheckpointFallback::kInBand
                 ? "no coordinator: in-band vote"
                 : "no coordinator configured: checkpoints are vetoed by policy";
    allowed = options_.checkpoint_fallback == client::CheckpointFallback::kInBand;
  }
  // In-band: every rank must hold the same weights (digest equality).
  int64_t digest_hi = 0, digest_lo = 0;
  {
    std::vector<torch::Tensor> all = params_;
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    uint64_t d = 0;
    SDC_TORCH_TRY(d = Digest(names_, Fingerprints(all)));
    digest_hi = static_cast<int64_t>(d >> 32);
    digest_lo = static_cast<int64_t>(d & 0xffffffffu);
  }
  std::vector<int64_t> m = {allowed ? 0 : 1, digest_hi, -digest_hi, digest_lo, -digest_lo};
  SDC_TORCH_TRY(client::AllReduceMax(*pg_, small_collectives_, m));
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
  return all_allowed;
}

absl::StatusOr<core::CheckpointLedger> Guard::Impl::RefreshCheckpoints(absl::Duration timeout) {
  if (link_ == nullptr) return absl::FailedPreconditionError("no coordinator configured");
  absl::StatusOr<v1::CheckpointDecision> d = link_->CheckpointStatus(timeout);
  if (!d.ok()) return d.status();
  Learn(checkpoints_, *d);
  return checkpoints_;
}

absl::StatusOr<StepDecision> Guard::Impl::TrainStep(
    uint64_t step, std::vector<std::vector<torch::Tensor>> batches, bool checkpoint,
    double* loss_out) {
  const size_t n = batches.size();
  if (absl::Status s = BeginStep(step, std::move(batches)); !s.ok()) return s;
  double total = 0;
  try {
    for (size_t i = 0; i < n; ++i) {
      // What is backpropagated and audited: loss_fn(batch) / micro-batches,
      // exactly as Replay() computes it.
      torch::Tensor loss = loss_fn_(batches_[i]) / static_cast<double>(n);
      loss.backward();
      total += loss.item<double>();
      AfterMicroBatchBackward(i, loss);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  absl::StatusOr<StepDecision> d = AllReduceAndCheck();
  if (!d.ok()) return d;
  last_weight_ms_ = 0;
  try {
    if (d->apply) optimizer_.step();
    AfterOptimizerStep(checkpoint);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  d->weight_ms = last_weight_ms_;
  if (loss_out != nullptr) *loss_out = total;
  return d;
}

GuardSummary Guard::Impl::Summary() const {
  GuardSummary s = summary_;
  if (link_ != nullptr) {
    const client::CoordinatorLink::Stats l = link_->stats();
    s.reports_sent = l.sent;
    s.reports_acked = l.acked;
    s.reports_dropped = l.dropped;
    s.coordinator_connected = l.connected;
  }
  return s;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Guard>> Guard::Create(
    client::GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
    torch::nn::Module& model, torch::optim::Optimizer& optimizer, LossFn loss_fn) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("options.job_id is empty");
  if (!loss_fn) return absl::InvalidArgumentError("a loss function is required");
  auto impl = std::make_unique<Impl>(std::move(options), std::move(process_group), model,
                                     optimizer, std::move(loss_fn));
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  return std::unique_ptr<Guard>(new Guard(std::move(impl)));
}

Guard::Guard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Guard::~Guard() = default;

absl::Status Guard::BeginStep(uint64_t step, std::vector<std::vector<torch::Tensor>> batches) {
  return impl_->BeginStep(step, std::move(batches));
}
void Guard::AfterMicroBatchBackward(size_t index, const torch::Tensor& loss) {
  impl_->AfterMicroBatchBackward(index, loss);
}
absl::StatusOr<StepDecision> Guard::AllReduceAndCheck() { return impl_->AllReduceAndCheck(); }
void Guard::AfterOptimizerStep(bool checkpoint) { impl_->AfterOptimizerStep(checkpoint); }
absl::StatusOr<bool> Guard::MayCheckpoint() { return impl_->MayCheckpoint(); }
const core::CheckpointLedger& Guard::Checkpoints() const { return impl_->checkpoints(); }
absl::StatusOr<core::CheckpointLedger> Guard::RefreshCheckpoints(absl::Duration timeout) {
  return impl_->RefreshCheckpoints(timeout);
}
torch::Tensor Guard::FaultPoint(const torch::Tensor& x) { return impl_->FaultPoint(x); }
GuardSummary Guard::Summary() const { return impl_->Summary(); }
uint32_t Guard::rank() const { return impl_->rank(); }
uint32_t Guard::world_size() const { return impl_->world(); }
void Guard::Shutdown(absl::Duration flush) { impl_->Shutdown(flush); }

absl::StatusOr<StepDecision> Guard::TrainStep(uint64_t step,
                                              std::vector<std::vector<torch::Tensor>> batches,
                                              bool checkpoint, double* loss_out) {
  return impl_->TrainStep(step, std::move(batches), checkpoint, loss_out);
}

}  // namespace sdc
