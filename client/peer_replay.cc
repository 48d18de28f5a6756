#include "client/peer_replay.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/device.h"
#include "client/tensor_checks.h"

namespace sdc::client {
namespace {

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

}  // namespace

absl::Status PeerReplay::CheckSendable(const std::vector<torch::Tensor>& batch,
                                       int64_t micro_batches) {
  if (batch.empty()) return absl::InvalidArgumentError("a micro-batch needs at least one tensor");
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batches must be at least 1, got ", micro_batches));
  }
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
  return absl::OkStatus();
}

PeerReplay::PeerReplay(const EngineContext& ctx, ModelTensors& model, LossFn loss_fn)
    : ctx_(ctx), model_(model), loss_fn_(std::move(loss_fn)) {}

void PeerReplay::BeginStep(uint64_t step, std::vector<torch::Tensor> batch,
                           int64_t micro_batches) {
  step_ = step;
  batch_ = std::move(batch);
  micro_batches_ = micro_batches;
  loss_scale_ = torch::Tensor();
}

void PeerReplay::CaptureRng() { rng_state_ = client::CaptureRng(model_.device()); }

void PeerReplay::SetLossScale(const torch::Tensor& loss_scale) {
  loss_scale_ = loss_scale.defined() ? loss_scale.detach() : torch::Tensor();
}

PeerReplay::Batch PeerReplay::OwnBatch() const {
  Batch out;
  out.tensors = batch_;
  out.micro_batches = micro_batches_;
  out.rng_state = rng_state_;
  if (!model_.forward_buffers().empty()) {
    out.buffers = PackBytes(model_.forward_buffers(), model_.device());
  }
  out.loss_scale = loss_scale_.defined() ? loss_scale_.item<double>() : 1.0;
  return out;
}

void PeerReplay::SendBatch(uint32_t dst, int tag,
                           std::vector<c10::intrusive_ptr<c10d::Work>>& pending) {
  const Batch own = OwnBatch();
  const std::vector<torch::Tensor>& batch = own.tensors;
  const int64_t buffer_bytes = own.buffers.defined() ? own.buffers.numel() : 0;
  torch::Tensor header = torch::zeros({static_cast<int64_t>(kHeaderSlots)}, torch::kInt64);
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(batch.size());
  h[1] = own.micro_batches;
  h[2] = own.rng_state.numel();
  h[3] = buffer_bytes;
  std::memcpy(&h[4], &own.loss_scale, sizeof(own.loss_scale));
  for (size_t i = 0; i < batch.size() && kLeadSlots + (i + 1) * kSlotsPerTensor <= kHeaderSlots;
       ++i) {
    const size_t at = kLeadSlots + i * kSlotsPerTensor;
    h[at] = static_cast<int64_t>(batch[i].scalar_type());
    h[at + 1] = batch[i].device().is_cpu() ? 0 : 1;  // 1: on the model's device.
    h[at + 2] = batch[i].dim();
    for (int64_t d = 0; d < batch[i].dim() && d < kMaxDims; ++d) h[at + 3 + d] = batch[i].size(d);
  }
  // Everything travels from where the process group sends (the GPU on NCCL).
  const torch::Device& there = ctx_.collective_device();
  std::vector<torch::Tensor> messages = {header.to(there)};
  for (const torch::Tensor& t : batch) messages.push_back(t.contiguous().to(there));
  messages.push_back(own.rng_state.to(there));
  if (buffer_bytes > 0) messages.push_back(own.buffers.to(there));
  for (size_t i = 0; i < messages.size(); ++i) {
    std::vector<torch::Tensor> one = {messages[i]};
    pending.push_back(ctx_.group().send(one, static_cast<int>(dst), tag + static_cast<int>(i)));
  }
}

absl::StatusOr<PeerReplay::Batch> PeerReplay::RecvBatch(uint32_t src, int tag) {
  c10d::ProcessGroup& pg = ctx_.group();
  const torch::TensorOptions there = torch::TensorOptions().device(ctx_.collective_device());
  std::vector<torch::Tensor> header = {
      torch::zeros({static_cast<int64_t>(kHeaderSlots)}, there.dtype(torch::kInt64))};
  SDC_TORCH_TRY({
    pg.recv(header, static_cast<int>(src), tag)->wait();
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
  Batch out;
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
      pg.recv(one, static_cast<int>(src), tag + 1 + static_cast<int>(i))->wait();
      // Where the subject had it: the host, or the model's device.
      batch.push_back(one[0].to(h[at + 1] == 0 ? torch::Device(torch::kCPU) : model_.device()));
    });
  }
  std::vector<torch::Tensor> rng;
  SDC_TORCH_TRY({
    rng.push_back(torch::empty({h[2]}, there.dtype(torch::kUInt8)));
    pg.recv(rng, static_cast<int>(src), tag + 1 + static_cast<int>(n))->wait();
    out.rng_state = rng[0].cpu();
    if (h[3] > 0) {
      std::vector<torch::Tensor> buffers = {torch::empty({h[3]}, there.dtype(torch::kUInt8))};
      pg.recv(buffers, static_cast<int>(src), tag + 2 + static_cast<int>(n))->wait();
      out.buffers = buffers[0].to(model_.device());
    }
  });
  if (ctx_.fault().kind == FaultKind::kExchangeError && ctx_.fault().FiresAt(ctx_.rank(), step_)) {
    ctx_.Log(absl::StrCat("INJECTED a malformed micro-batch from rank ", src, " at step ", step_));
    return absl::InternalError(absl::StrCat("INJECTED exchange-error: the micro-batch from rank ",
                                            src, " is malformed"));
  }
  // The same model everywhere: the subject's buffers are this rank's size
  // (checked after every message is received, so the subject never waits).
  if (h[3] != ByteSize(model_.buffers())) {
    return absl::InternalError(absl::StrCat("rank ", src, " sent ", h[3],
                                            " bytes of module buffers, this rank holds ",
                                            ByteSize(model_.buffers())));
  }
  return out;
}

PeerReplay::Result PeerReplay::Replay(const Batch& batch) {
  // The replay starts from the subject's RNG state and buffers as its
  // forward read them; this rank's own are restored after, and so are its
  // parameters' gradients: the replay must leave no trace on this rank's
  // own training.
  std::vector<torch::Tensor> saved_buffers;
  for (const torch::Tensor& b : model_.buffers()) saved_buffers.push_back(b.detach().clone());
  const torch::Tensor own_rng = client::CaptureRng(model_.device());
  ThrowIfFailed(RestoreRng(model_.device(), batch.rng_state));  // Checked before anything is set.
  std::vector<torch::Tensor> saved_grads;
  for (const torch::Tensor& p : model_.parameters()) saved_grads.push_back(p.grad());
  // Whatever happens in the replay (an error propagates to the caller), the
  // rank leaves it with its own RNG, buffers, gradients and mode.
  struct Restore {
    PeerReplay* self;
    torch::Tensor rng;
    std::vector<torch::Tensor>& saved;
    std::vector<torch::Tensor>& grads;
    ~Restore() {
      self->replaying_ = false;
      try {
        torch::NoGradGuard no_grad;
        const std::vector<torch::Tensor>& buffers = self->model_.buffers();
        for (size_t i = 0; i < buffers.size(); ++i) {
          torch::Tensor b = buffers[i];
          b.copy_(saved[i]);
        }
        const std::vector<torch::Tensor>& params = self->model_.parameters();
        for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
        (void)RestoreRng(self->model_.device(), rng);  // Its own state: the size fits.
      } catch (const c10::Error& e) {
        self->ctx_.Log(absl::StrCat("could not restore buffers, gradients or RNG after a replay: ",
                                    e.what_without_backtrace()));
      }
    }
  } restore{this, own_rng, saved_buffers, saved_grads};
  if (batch.buffers.defined()) UnpackBytes(batch.buffers, model_.buffers());
  // Undefined gradients: the replay's backward writes them exactly, as the
  // subject's first backward wrote its own.
  for (const torch::Tensor& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
  replaying_ = true;
  Result out;
  torch::Tensor loss = loss_fn_(batch.tensors) / static_cast<double>(batch.micro_batches);
  // As a loss scaler multiplies it (torch.amp.GradScaler: by a float32 scale).
  if (batch.loss_scale != 1.0) {
    loss = loss * torch::scalar_tensor(batch.loss_scale, loss.options().dtype(torch::kFloat));
  }
  out.loss_bits = LossBits(loss);
  out.buffers = Fingerprints(ctx_.fingerprint_key(), model_.buffers());
  if (ctx_.fault().kind == FaultKind::kReplayError && ctx_.fault().FiresAt(ctx_.rank(), step_)) {
    ctx_.Log(absl::StrCat("INJECTED an error into a replay at step ", step_));
    TORCH_CHECK(false, "INJECTED replay-error: the replay's backward failed");
  }
  // backward(), not torch::autograd::grad: reentrant activation
  // checkpointing refuses the latter. It writes into the gradients set
  // aside above, which Restore puts back.
  loss.backward();
  replaying_ = false;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : model_.parameters()) grads.push_back(p.grad());
  out.gradients = Fingerprints(ctx_.fingerprint_key(), grads);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) out.gradients[i] = model_.AbsentGradient(ctx_.fingerprint_key(), i);
  }
  out.digest = model_.AuditDigest(out.gradients, out.buffers);
  out.nonfinite = NonFinite(grads);
  return out;
}

absl::StatusOr<std::optional<std::pair<uint32_t, PeerReplay::Result>>>
PeerReplay::ExchangeAndReplay(const std::vector<protocol::Assignment>& pairs, int tag_base) {
  const uint32_t rank = ctx_.rank();
  std::vector<std::pair<uint32_t, int>> sends;  // (replayer of mine, tag)
  std::optional<uint32_t> subject;
  int tag_of_mine = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const int tag = tag_base + static_cast<int>(i) * 64;
    if (pairs[i].subject == rank && pairs[i].replayer != rank) {
      sends.push_back({pairs[i].replayer, tag});
    }
    if (pairs[i].replayer == rank) {
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
  const bool receive_first = subject.has_value() && *subject < rank;
  std::vector<c10::intrusive_ptr<c10d::Work>> pending;
  auto send_all = [&]() -> absl::Status {
    for (const auto& [dst, tag] : sends) SDC_TORCH_TRY(SendBatch(dst, tag, pending));
    return absl::OkStatus();
  };
  // The first error; whatever fails, this rank's own micro-batch is still
  // sent and its sends are waited for, so its replayer never waits on it.
  absl::Status failure;
  std::optional<std::pair<uint32_t, Result>> result;
  if (!receive_first) failure.Update(send_all());
  if (subject.has_value()) {
    absl::StatusOr<Batch> received = RecvBatch(*subject, tag_of_mine);
    if (receive_first) failure.Update(send_all());
    if (!received.ok()) {
      failure.Update(received.status());
    } else if (failure.ok()) {
      auto replay = [&]() -> absl::Status {
        Result r;
        SDC_TORCH_TRY(r = Replay(*received));
        result = std::make_pair(*subject, std::move(r));
        return absl::OkStatus();
      };
      absl::Status replayed = replay();
      if (!replayed.ok()) {
        failure.Update(absl::Status(replayed.code(),
                                    absl::StrCat("replaying rank ", *subject, "'s micro-batch: ",
                                                 replayed.message())));
      }
    }
  }
  for (auto& w : pending) {
    auto wait = [&]() -> absl::Status {
      SDC_TORCH_TRY(w->wait());
      return absl::OkStatus();
    };
    failure.Update(wait());
  }
  if (!failure.ok()) return failure;
  return result;
}

}  // namespace sdc::client
