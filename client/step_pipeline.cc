#include "client/step_pipeline.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/device.h"
#include "client/tensor_checks.h"

namespace sdc::client {

StepPipeline::StepPipeline(const EngineContext& ctx, ModelTensors& model)
    : StepPipeline(ctx, model, kernels::RuntimeLauncher()) {}

StepPipeline::StepPipeline(const EngineContext& ctx, ModelTensors& model,
                           kernels::CudaLauncher& launcher)
    : ctx_(ctx), model_(model), launcher_(launcher) {}

void StepPipeline::BeginStep() {
  absl::MutexLock lock(&mu_);
  local_nonfinite_ = 0;
  local_fault_done_ = false;
  reduced_.clear();
  local_ms_ = 0;
  if (queue_unread_) {
    // A step that ended before its read (it failed, or reduced nothing):
    // its queued work is waited for and dropped, so the buffers are free.
    (void)queue_->Read();
    queue_unread_ = false;
  }
  local_scans_.clear();
  failure_ = std::exchange(carried_, absl::OkStatus());
}

void StepPipeline::CarryFailure(const absl::Status& failure) {
  absl::MutexLock lock(&mu_);
  if (carried_.ok()) carried_ = failure;
}

void StepPipeline::NoteFailure(const absl::Status& failure) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = failure;
}

absl::Status StepPipeline::TakeFailure() {
  absl::MutexLock lock(&mu_);
  return std::exchange(failure_, absl::OkStatus());
}

void StepPipeline::ScanLocalBucket(const StepContext& step, const torch::Tensor& local) {
  const absl::Time start = absl::Now();
  const FaultPlan& f = ctx_.fault();
  bool inject = false;
  {
    absl::MutexLock lock(&mu_);
    if ((f.kind == FaultKind::kNanGradient || f.kind == FaultKind::kScanError) &&
        f.FiresAt(ctx_.rank(), step.step) && !local_fault_done_) {
      inject = local_fault_done_ = true;
    }
  }
  uint64_t n = 0;
  try {
    if (inject && f.kind == FaultKind::kNanGradient) {
      torch::NoGradGuard no_grad;
      local.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
      ctx_.Log(absl::StrCat("INJECTED NaN into a local gradient at step ", step.step));
    }
    if (inject && f.kind == FaultKind::kScanError) {
      ctx_.Log(absl::StrCat("INJECTED an error into check 1 at step ", step.step));
      TORCH_CHECK(false, "INJECTED scan-error: the non-finite scan of a local bucket failed");
    }
    if (local.is_cuda()) {
      // On a GPU the scan is queued on the current stream and writes into
      // the step's device results: the hook never waits for the device.
      // CheckGradients reads them once, at the decision.
      const torch::Tensor dense = local.detach().contiguous();
      absl::Status queued = OnCudaStream(dense.device(), [&](kernels::CudaStream stream) {
        absl::StatusOr<kernels::TensorRef> ref = ScanRef(dense);
        if (!ref.ok()) return ref.status();
        absl::MutexLock lock(&mu_);
        if (queue_ == nullptr) queue_ = std::make_unique<kernels::CudaCheckQueue>(launcher_);
        queue_unread_ = true;
        absl::StatusOr<size_t> handle = queue_->QueueScan({&*ref, 1}, stream);
        if (!handle.ok()) return handle.status();
        local_scans_.push_back(*handle);
        return absl::OkStatus();
      });
      if (!queued.ok()) {
        NoteFailure(absl::Status(queued.code(), absl::StrCat("check 1 of a local gradient "
                                                             "bucket: ", queued.message())));
      }
    } else {
      n = NonFinite({local});
    }
  } catch (const std::exception& e) {
    const c10::Error* torch_error = dynamic_cast<const c10::Error*>(&e);
    NoteFailure(absl::InternalError(absl::StrCat(
        "check 1 of a local gradient bucket: ",
        torch_error != nullptr ? torch_error->what_without_backtrace() : e.what())));
  }
  bool poison = false;
  {
    absl::MutexLock lock(&mu_);
    poison = !failure_.ok();
  }
  if (poison) {
    torch::NoGradGuard no_grad;
    try {
      local.view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    } catch (const std::exception&) {
      // Not a flat view (no caller passes such a bucket): the whole bucket.
      local.fill_(std::numeric_limits<double>::quiet_NaN());
    }
  }
  absl::MutexLock lock(&mu_);
  local_nonfinite_ += n;
  local_ms_ += MsSince(start);
}

void StepPipeline::AddReducedBucket(const StepContext& step, size_t index,
                                    const torch::Tensor& reduced) {
  const FaultPlan& f = ctx_.fault();
  absl::MutexLock lock(&mu_);
  if (f.kind == FaultKind::kReducedGradient && f.FiresAt(ctx_.rank(), step.step) &&
      reduced_.empty()) {
    FlipMantissaBit(reduced, 20);
    ctx_.Log(absl::StrCat("INJECTED a bit flip into the reduced gradients at step ", step.step));
  }
  reduced_.emplace_back(index, reduced);
}

absl::StatusOr<StepPipeline::Gradients> StepPipeline::CheckGradients(
    const StepContext& step, const torch::Tensor& loss_scale) {
  Gradients out;
  std::vector<std::pair<size_t, torch::Tensor>> reduced;
  std::vector<size_t> local_scans;
  {
    absl::MutexLock lock(&mu_);
    reduced.swap(reduced_);
    out.local_nonfinite = local_nonfinite_;
    out.ms = local_ms_;
    local_scans = std::exchange(local_scans_, {});
  }
  if (reduced.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step.step, ": no gradients were all-reduced (run the backward pass between "
        "BeginStep and Finish)"));
  }
  std::sort(reduced.begin(), reduced.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const absl::Time start = absl::Now();
  std::vector<torch::Tensor> buckets;
  std::vector<std::string> names;
  bool one_gpu = true;
  for (const auto& [index, t] : reduced) {
    buckets.push_back(t.detach().contiguous());
    names.push_back(absl::StrCat("bucket.", index));
    one_gpu = one_gpu && t.is_cuda() && t.device() == reduced.front().second.device();
  }
  std::vector<kernels::ScanResult> scans;
  std::vector<kernels::Fingerprint> fps;
  absl::StatusOr<kernels::CudaCheckQueue::Results> device_results;
  if (one_gpu) {
    // The step's one device-to-host read: the reduced buckets' scan and
    // fingerprints join the local scans queued in the hook.
    std::vector<kernels::TensorRef> refs;
    std::vector<kernels::ByteSpan> spans;
    // The scale as fp64 on the buckets' device (a queued conversion).
    torch::Tensor scale;
    if (loss_scale.defined()) {
      SDC_TORCH_TRY(scale = loss_scale.detach()
                                .to(buckets.front().device(), torch::kDouble, /*non_blocking=*/true)
                                .reshape({-1})
                                .narrow(0, 0, 1)
                                .contiguous());
    }
    for (const torch::Tensor& b : buckets) {
      absl::StatusOr<kernels::TensorRef> ref = ScanRef(b);
      if (!ref.ok()) return absl::InternalError(ref.status().message());
      refs.push_back(*ref);
      spans.push_back(BytesOf(b));
    }
    absl::Status s = OnCudaStream(buckets.front().device(), [&](kernels::CudaStream stream) {
      absl::MutexLock lock(&mu_);
      if (queue_ == nullptr) queue_ = std::make_unique<kernels::CudaCheckQueue>(launcher_);
      queue_unread_ = true;
      absl::StatusOr<size_t> scan = queue_->QueueScan(refs, stream);
      absl::StatusOr<size_t> fp =
          scan.ok() ? queue_->QueueFingerprint(spans, ctx_.fingerprint_key(), stream)
                    : scan.status();
      absl::StatusOr<size_t> copy =
          !fp.ok() ? fp.status()
          : scale.defined() ? queue_->QueueCopy(scale.data_ptr(), sizeof(double), stream)
                            : absl::StatusOr<size_t>(0);
      device_results = queue_->Read();
      queue_unread_ = false;
      if (!scan.ok()) return scan.status();
      if (!fp.ok()) return fp.status();
      if (!copy.ok()) return copy.status();
      if (!device_results.ok()) return device_results.status();
      scans = device_results->scans[*scan];
      fps = device_results->fingerprints[*fp];
      if (scale.defined()) {
        std::memcpy(&out.loss_scale, device_results->copies[*copy].data(), sizeof(double));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat("check 1 of the reduced gradients: ", s.message()));
    }
  } else {
    {
      absl::MutexLock lock(&mu_);
      if (queue_unread_) {
        // CUDA local buckets whose reduced ones came back elsewhere.
        device_results = queue_->Read();
        queue_unread_ = false;
        if (!device_results.ok()) {
          return absl::InternalError(absl::StrCat("check 1 of the local gradients: ",
                                                  device_results.status().message()));
        }
      }
    }
    SDC_TORCH_TRY({
      scans = ScanTensors(buckets);
      fps = Fingerprints(ctx_.fingerprint_key(), buckets);
      if (loss_scale.defined()) out.loss_scale = loss_scale.item<double>();
    });
  }
  if (device_results.ok()) {
    // The local buckets' scans, queued in the hook, came back in the read.
    for (size_t h : local_scans) {
      for (const kernels::ScanResult& r : device_results->scans[h]) {
        out.local_nonfinite += r.nonfinite;
      }
    }
  }
  for (const kernels::ScanResult& r : scans) {
    out.reduced_nonfinite += r.nonfinite;
    out.sum_squares += r.sum_squares;
  }
  out.reduced_digest = Digest(names, fps);
  out.ms += MsSince(start);
  return out;
}

absl::StatusOr<Agreement> StepPipeline::Agree(const LocalView& view) const {
  const GuardOptions& o = ctx_.options();
  // Several replica groups: a repair slot per group (under HSDP a group is
  // one shard's replicas; WeightCheck::RepairIfAgreed).
  const ReplicaGroups& groups = ctx_.replica_groups();
  const uint32_t group_count = static_cast<uint32_t>(groups.count());
  std::vector<int64_t> agree =
      EncodeAgreement(view, ctx_.rank(), o.shard_index, o.shard_count,
                      group_count > 1 ? groups.index_of(ctx_.rank()) : 0, group_count);
  SDC_TORCH_TRY(ctx_.AllReduceMax(agree));
  return DecodeAgreement(agree, group_count);
}

absl::Status StepPipeline::ApplyOrSkip(const StepContext& step, StepDecision& decision) {
  torch::NoGradGuard no_grad;
  const double max_norm = ctx_.options().max_grad_norm;
  if (decision.apply && max_norm > 0 && decision.grad_norm > max_norm) {
    decision.clip_coef = max_norm / (decision.grad_norm + 1e-6);
  }
  SDC_TORCH_TRY({
    for (const torch::Tensor& p : model_.parameters()) {
      torch::Tensor g = p.grad();
      if (!g.defined()) continue;
      if (!decision.apply && decision.overflow) {
        // The loss scaler finds the NaN/Inf itself, skips, and backs off.
      } else if (!decision.apply) {
        g.zero_();
      } else if (decision.clip_coef < 1) {
        g.mul_(decision.clip_coef);
      }
    }
  });
  ++steps_;
  if (!decision.apply) {
    ++skipped_;
    ctx_.Log(absl::StrCat("step ", step.step, " skipped on every rank: ", decision.reason));
  }
  return absl::OkStatus();
}

torch::Tensor StepPipeline::FaultPoint(const StepContext& step, const torch::Tensor& x,
                                       bool replaying) const {
  const FaultPlan& f = ctx_.fault();
  if (!f.FiresAt(ctx_.rank(), step.step)) return x;
  const bool activation = f.kind == FaultKind::kActivationScale ||
                          f.kind == FaultKind::kMantissaBitflip ||
                          f.kind == FaultKind::kSoftwareStack;
  if (!(activation || (f.kind == FaultKind::kReplay && replaying))) return x;
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
      // Another stack rounds differently: one ulp, deterministically.
      FlipMantissaBit(element, f.kind == FaultKind::kSoftwareStack ? 0 : 12);
    }
  }
  ctx_.Log(absl::StrCat("INJECTED ", FaultKindName(f.kind), " into an activation at step ",
                        step.step, replaying ? " (while replaying a peer)" : ""));
  // Gradients flow through the corrupted value as they would on faulty hardware.
  return x + (y - x).detach();
}

void StepPipeline::Summarize(GuardSummary& summary) const {
  summary.steps = steps_;
  summary.skipped = skipped_;
}

}  // namespace sdc::client
