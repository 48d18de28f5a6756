#include "client/guard_engine.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/device.h"
#include "client/guard_engine_internal.h"
#include "kernels/nonfinite.h"

// GuardEngine's set-up, coordinator messages and public methods; the step,
// the audit and the weight check live beside it (guard_engine_internal.h).

namespace sdc::client {

double MsSince(absl::Time t) { return absl::ToDoubleMilliseconds(absl::Now() - t); }

uint64_t LossBits(const torch::Tensor& loss) {
  const double v = loss.detach().to(torch::kDouble).item<double>();
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

void ThrowIfFailed(const absl::Status& s) {
  if (!s.ok()) TORCH_CHECK(false, "sdc-guard kernels: ", std::string(s.message()));
}

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
  if (!options_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<TrainerMetrics>> m = TrainerMetrics::Start(
        options_.metrics_listen, options_.job_id, rank_,
        [this] {
          return link_ != nullptr ? std::optional(link_->stats()) : std::nullopt;
        });
    if (!m.ok()) return m.status();
    metrics_ = *std::move(m);
    Log(absl::StrCat("serving metrics on port ", metrics_->port()));
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
