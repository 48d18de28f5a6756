#include "client/guard.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdio>
#include <typeinfo>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/product_checks.h"

namespace sdc {

std::vector<torch::Tensor> OptimizerTensors(torch::optim::Optimizer& optimizer,
                                            const std::vector<torch::Tensor>& params,
                                            std::string* unknown) {
  std::vector<torch::Tensor> out;
  auto add = [&out](const torch::Tensor& t) {
    if (t.defined()) out.push_back(t);
  };
  auto& state = optimizer.state();
  for (const torch::Tensor& p : params) {
    auto it = state.find(p.unsafeGetTensorImpl());
    if (it == state.end()) continue;
    torch::optim::OptimizerParamState* s = it->second.get();
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      add(adam->exp_avg());
      add(adam->exp_avg_sq());
      add(adam->max_exp_avg_sq());
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      add(adamw->exp_avg());
      add(adamw->exp_avg_sq());
      add(adamw->max_exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      add(sgd->momentum_buffer());
    } else if (auto* rms = dynamic_cast<torch::optim::RMSpropParamState*>(s)) {
      add(rms->square_avg());
      add(rms->momentum_buffer());
      add(rms->grad_avg());
    } else if (auto* ada = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
      add(ada->sum());
    } else if (unknown != nullptr && unknown->empty()) {
      *unknown = typeid(*s).name();
    }
  }
  return out;
}



// The libtorch adapter: the model's parameters and buffers, the optimizer's
// state and the gradient all-reduce (flat buckets over the process group);
// the step protocol itself is the engine's.
class Guard::Impl {
 public:
  Impl(client::GuardOptions options, FrontEndOptions front_end,
       c10::intrusive_ptr<c10d::ProcessGroup> pg, torch::nn::Module& model,
       torch::optim::Optimizer& optimizer, LossFn loss_fn)
      : options_(std::move(options)),
        front_end_(front_end),
        pg_(std::move(pg)),
        model_(model),
        optimizer_(optimizer),
        loss_fn_(std::move(loss_fn)) {}

  absl::Status Init();
  absl::Status BeginStep(uint64_t step, std::vector<std::vector<torch::Tensor>> batches);
  void AfterMicroBatchBackward(size_t index, const torch::Tensor& loss);
  absl::StatusOr<StepDecision> AllReduceAndCheck();
  absl::StatusOr<StepDecision> TrainStep(uint64_t step,
                                         std::vector<std::vector<torch::Tensor>> batches,
                                         bool checkpoint, double* loss_out);
  client::GuardEngine& engine() { return *engine_; }
  const client::GuardEngine& engine() const { return *engine_; }
  ChecksumCounts Checksums() const;

 private:
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> params;  // Indices into params_.
  };

  // Flat buckets of the parameters' gradients (zeros where a parameter got
  // none, so every rank reduces the same layout), at most bucket_bytes each
  // and of one dtype.
  std::vector<Bucket> MakeBuckets() const;
  void Broadcast(const std::vector<torch::Tensor>& tensors, uint32_t root);

  client::GuardOptions options_;
  FrontEndOptions front_end_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  torch::nn::Module& model_;
  torch::optim::Optimizer& optimizer_;
  LossFn loss_fn_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> buffers_;
  std::unique_ptr<client::GuardEngine> engine_;
  // The every-step checksums (null unless front_end_ or options_ asks for
  // them); after engine_, so they go (and aten's kernels come back) before
  // it.
  c10::intrusive_ptr<client::ProductChecks> checks_;
  uint64_t checksum_skips_ = 0;
  std::vector<std::vector<torch::Tensor>> batches_;
  bool warned_unknown_optimizer_ = false;
};

absl::Status Guard::Impl::Init() {
  client::NamedTensors params, buffers, frozen;
  for (const auto& item : model_.named_parameters(/*recurse=*/true)) {
    client::NamedTensors& to = item.value().requires_grad() ? params : frozen;
    to.names.push_back(item.key());
    to.tensors.push_back(item.value());
  }
  for (const auto& item : model_.named_buffers(/*recurse=*/true)) {
    buffers.names.push_back(item.key());
    buffers.tensors.push_back(item.value());
  }
  params_ = params.tensors;
  buffers_ = buffers.tensors;
  absl::StatusOr<std::unique_ptr<client::GuardEngine>> engine = client::GuardEngine::Create(
      options_, pg_, std::move(params), std::move(buffers),
      [this] {
        std::string unknown;
        std::vector<torch::Tensor> state = OptimizerTensors(optimizer_, params_, &unknown);
        if (!unknown.empty() && !warned_unknown_optimizer_) {
          warned_unknown_optimizer_ = true;
          std::fprintf(stderr,
                       "sdc-guard: the optimizer's state of type %s is not checked (only "
                       "libtorch's Adam, AdamW, SGD, RMSprop and Adagrad states are read)\n",
                       unknown.c_str());
        }
        return state;
      },
      loss_fn_, std::move(frozen));
  if (!engine.ok()) return engine.status();
  engine_ = *std::move(engine);
  if (front_end_.every_step || options_.every_step) {
    // The Python front end's defaults (sdc_guard/checksums.py): the
    // probabilistic rule at 10 standard deviations (docs/ARCHITECTURE.md).
    client::GuardEngine* e = engine_.get();
    absl::StatusOr<c10::intrusive_ptr<client::ProductChecks>> checks =
        client::ProductChecks::Create(engine_->rank(), "probabilistic", 10.0,
                                      [e](const std::string& what) { e->NoteFailure(what); });
    if (!checks.ok()) return checks.status();
    checks_ = *std::move(checks);
  }
  return absl::OkStatus();
}

ChecksumCounts Guard::Impl::Checksums() const {
  ChecksumCounts c;
  if (checks_) {
    c.every_step = true;
    c.checked = static_cast<uint64_t>(checks_->Checked());
    c.unchecked = static_cast<uint64_t>(checks_->Unchecked());
    c.alarms = static_cast<uint64_t>(checks_->Alarms());
  }
  c.skips = checksum_skips_;
  return c;
}

absl::Status Guard::Impl::BeginStep(uint64_t step,
                                    std::vector<std::vector<torch::Tensor>> batches) {
  if (batches.empty()) return absl::InvalidArgumentError("a step needs at least one micro-batch");
  if (absl::Status s = engine_->BeginStep(step, batches.front(),
                                          static_cast<int64_t>(batches.size()));
      !s.ok()) {
    return s;
  }
  batches_ = std::move(batches);
  if (checks_) {  // From here to AllReduceAndCheck: the forward and backward.
    const std::optional<client::ProductFault> fault =
        client::ProductFaultAt(options_, engine_->rank(), step);
    checks_->Begin(static_cast<int64_t>(step),
                   fault ? std::optional<double>(fault->magnitude) : std::nullopt,
                   fault && fault->column_scaled);
    if (absl::Status s = checks_->Enter(); !s.ok()) {
      engine_->AbortStep();
      return s;
    }
  }
  return absl::OkStatus();
}

void Guard::Impl::AfterMicroBatchBackward(size_t index, const torch::Tensor& loss) {
  if (index != 0) return;
  engine_->RecordFirstMicroBatch(loss);
  if (engine_->WantsOriginalGradients()) engine_->RecordOriginalGradientsFromParameters();
}

std::vector<Guard::Impl::Bucket> Guard::Impl::MakeBuckets() const {
  std::vector<Bucket> buckets;
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
    pieces.push_back(g.defined() ? g.reshape({-1})
                                 : torch::zeros({params_[i].numel()}, params_[i].options()));
    current.params.push_back(i);
    bytes += params_[i].numel() * params_[i].element_size();
    if (bytes >= options_.bucket_bytes ||
        (i + 1 < params_.size() && params_[i + 1].scalar_type() != params_[i].scalar_type())) {
      close();
    }
  }
  close();
  return buckets;
}

void Guard::Impl::Broadcast(const std::vector<torch::Tensor>& tensors, uint32_t root) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& t : tensors) {
    std::vector<torch::Tensor> one = {t.detach()};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg_->broadcast(one, o)->wait();
  }
}

absl::StatusOr<StepDecision> Guard::Impl::AllReduceAndCheck() {
  if (checks_) checks_->Exit();  // aten's own kernels again: replays are not checked.
  try {
    torch::NoGradGuard no_grad;
    std::vector<Bucket> buckets = MakeBuckets();
    const double world = static_cast<double>(pg_->getSize());
    for (size_t b = 0; b < buckets.size(); ++b) {
      engine_->ScanLocalBucket(buckets[b].flat);  // Check 1, before the all-reduce.
      std::vector<torch::Tensor> one = {buckets[b].flat};
      pg_->allreduce(one)->wait();
      buckets[b].flat.div_(world);
      engine_->AddReducedBucket(b, buckets[b].flat);
    }
    // The gradients are the reduced ones from here on (views of the buckets,
    // which the engine zeroes on a skipped step).
    for (Bucket& b : buckets) {
      int64_t offset = 0;
      for (size_t i : b.params) {
        const int64_t n = params_[i].numel();
        params_[i].mutable_grad() = b.flat.narrow(0, offset, n).view(params_[i].sizes());
        offset += n;
      }
    }
    // Buffers follow rank 0, as DistributedDataParallel's broadcast_buffers.
    if (!buffers_.empty()) Broadcast(buffers_, 0);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  absl::StatusOr<StepDecision> d = engine_->Finish();
  if (!d.ok() && absl::StrContains(d.status().message(), client::kChecksumAlarmMark)) {
    // A rank's product checksum failed: every rank has this same error and
    // skips the step here (the engine zeroed the gradients); training goes on.
    ++checksum_skips_;
    StepDecision skipped;
    skipped.apply = false;
    skipped.reason = std::string(d.status().message());
    return skipped;
  }
  return d;
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
      // exactly as the engine's replay computes it.
      torch::Tensor loss = loss_fn_(batches_[i]) / static_cast<double>(n);
      loss.backward();
      total += loss.item<double>();
      AfterMicroBatchBackward(i, loss);
    }
  } catch (const c10::Error& e) {
    if (checks_) checks_->Exit();
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  absl::StatusOr<StepDecision> d = AllReduceAndCheck();
  if (!d.ok()) return d;
  try {
    if (d->apply) optimizer_.step();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  }
  absl::StatusOr<double> weight_ms = engine_->AfterOptimizerStep(checkpoint);
  if (!weight_ms.ok()) return weight_ms.status();
  d->weight_ms = *weight_ms;
  if (loss_out != nullptr) *loss_out = total;
  return d;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Guard>> Guard::Create(
    client::GuardOptions options, c10::intrusive_ptr<c10d::ProcessGroup> process_group,
    torch::nn::Module& model, torch::optim::Optimizer& optimizer, LossFn loss_fn,
    FrontEndOptions front_end) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("options.job_id is empty");
  if (!loss_fn) return absl::InvalidArgumentError("a loss function is required");
  auto impl = std::make_unique<Impl>(std::move(options), front_end, std::move(process_group),
                                     model, optimizer, std::move(loss_fn));
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
void Guard::AfterOptimizerStep(bool checkpoint) {
  absl::StatusOr<double> done = impl_->engine().AfterOptimizerStep(checkpoint);
  if (!done.ok()) TORCH_CHECK(false, "sdc-guard: ", std::string(done.status().message()));
}
absl::StatusOr<bool> Guard::MayCheckpoint() { return impl_->engine().MayCheckpoint(); }
const protocol::CheckpointLedger& Guard::Checkpoints() const {
  return impl_->engine().Checkpoints();
}
absl::StatusOr<protocol::CheckpointLedger> Guard::RefreshCheckpoints(absl::Duration timeout) {
  return impl_->engine().RefreshCheckpoints(timeout);
}
torch::Tensor Guard::FaultPoint(const torch::Tensor& x) { return impl_->engine().FaultPoint(x); }
GuardSummary Guard::Summary() const { return impl_->engine().Summary(); }
ChecksumCounts Guard::Checksums() const { return impl_->Checksums(); }
uint32_t Guard::rank() const { return impl_->engine().rank(); }
uint32_t Guard::world_size() const { return impl_->engine().world_size(); }
void Guard::Shutdown(absl::Duration flush) { impl_->engine().Shutdown(flush); }

absl::StatusOr<StepDecision> Guard::TrainStep(uint64_t step,
                                              std::vector<std::vector<torch::Tensor>> batches,
                                              bool checkpoint, double* loss_out) {
  return impl_->TrainStep(step, std::move(batches), checkpoint, loss_out);
}

}  // namespace sdc
