#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/device.h"
#include "client/guard_engine_internal.h"
#include "client/small_collectives.h"

// Check 2, the replay audit: a subject sends its first micro-batch (with its
// RNG state, buffers and loss scale) to its replayer, the replayer recomputes
// the gradients, every rank compares digests in-band (tie-breaks included)
// and reports to sdcd. What happens when a replay mismatches: Audit below,
// then core::InBandVerdict (step_core) and sdcd's attribution.

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

}  // namespace sdc::client
