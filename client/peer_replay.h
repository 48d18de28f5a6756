#ifndef SDC_CLIENT_PEER_REPLAY_H_
#define SDC_CLIENT_PEER_REPLAY_H_

// The micro-batch exchange and replay that check 2 runs (ReplayAudit says
// when and what to compare). Each rank keeps its step's first micro-batch
// with everything its forward read besides the parameters: the RNG state,
// the buffers as that forward read them, the loss scale. Along a list of
// (replayer, subject) pairs each subject sends it to its replayer, point to
// point, and each replayer recomputes the subject's loss and gradients with
// the trainer's loss function, starting from the subject's RNG state and
// buffers and leaving its own as they were.
//
// The message: a header of kHeaderSlots int64 (the number of tensors, the
// micro-batches, the RNG and buffer byte counts, the loss scale's bits, then
// per tensor its dtype, whether on the model's device, its number of
// dimensions and up to kMaxDims sizes), then each tensor, the RNG state and
// the packed buffers, with consecutive tags from the pair's tag.
//
// Thread-compatible: the training thread's (replays run the loss function
// and autograd there).

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/engine_context.h"
#include "client/engine_types.h"
#include "client/model_tensors.h"
#include "protocol/replay_plan.h"
#include "kernels/fingerprint.h"

namespace sdc::client {

class PeerReplay {
 public:
  static constexpr size_t kHeaderSlots = 64;
  static constexpr size_t kLeadSlots = 5;
  static constexpr int64_t kMaxDims = 6;
  static constexpr int64_t kSlotsPerTensor = 3 + kMaxDims;

  // What a subject sends its replayer.
  struct Batch {
    std::vector<torch::Tensor> tensors;
    int64_t micro_batches = 1;
    torch::Tensor rng_state;  // CaptureRng's, on the CPU.
    torch::Tensor buffers;    // The buffers' bytes in order; undefined when the model has none.
    double loss_scale = 1;
  };
  // What a replay computed.
  struct Result {
    uint64_t loss_bits = 0;                      // LossBits of the replayed loss.
    std::vector<kernels::Fingerprint> gradients;  // One per parameter (absent: zeros).
    std::vector<kernels::Fingerprint> buffers;    // The buffers as the replay's forward left them.
    uint64_t digest = 0;                         // ModelTensors::AuditDigest.
    uint64_t nonfinite = 0;                      // NaN/Inf elements in the gradients.
  };

  // OK when a micro-batch of `batch` (accumulated over `micro_batches`) can
  // be sent to a replayer; else InvalidArgument saying why: no tensors, an
  // undefined one, more than the header holds (6), a tensor of more than
  // kMaxDims dimensions, or micro_batches < 1. Checked at every step, so a
  // job never finds out at an audit that one rank cannot send.
  static absl::Status CheckSendable(const std::vector<torch::Tensor>& batch,
                                    int64_t micro_batches);

  // REQUIRES: `ctx` and `model` outlive this.
  PeerReplay(const EngineContext& ctx, ModelTensors& model, LossFn loss_fn);

  // Keeps step `step`'s first micro-batch. REQUIRES: CheckSendable passed.
  void BeginStep(uint64_t step, std::vector<torch::Tensor> batch, int64_t micro_batches);
  // Captures the RNG state the micro-batch's forward starts from. Throws
  // c10::Error on a libtorch failure.
  void CaptureRng();
  // The first micro-batch's loss scale (a float32 scalar; undefined: 1).
  void SetLossScale(const torch::Tensor& loss_scale);

  // Collective over the ranks in `pairs` (replayer, subject): every subject
  // sends its batch to its replayer (tags from `tag_base`, 64 a pair) and
  // every replayer replays what it received. Returns (subject, result) on a
  // rank that replayed, nullopt on the others. A rank replays at most one
  // subject per call. Internal on a libtorch failure (the loss function's
  // included) or a malformed message; whatever fails, this rank still sends
  // its own micro-batch and waits for its sends, so no peer waits on it.
  absl::StatusOr<std::optional<std::pair<uint32_t, Result>>> ExchangeAndReplay(
      const std::vector<protocol::Assignment>& pairs, int tag_base);

  // This rank's own batch as its replayer would receive it.
  Batch OwnBatch() const;
  // Recomputes `batch`'s loss and gradients with the loss function from its
  // RNG state and buffers; this rank's RNG state, buffers and parameter
  // gradients are restored after, whatever happens. Throws c10::Error on a
  // libtorch failure (also InvalidArgument's message from RestoreRng when
  // the RNG state does not fit); an exception of the loss function
  // propagates as it is.
  Result Replay(const Batch& batch);

  // True while Replay runs the loss function (activation faults of kind
  // `replay` fire only then).
  bool replaying() const { return replaying_; }

 private:
  void SendBatch(uint32_t dst, int tag, std::vector<c10::intrusive_ptr<c10d::Work>>& pending);
  absl::StatusOr<Batch> RecvBatch(uint32_t src, int tag);

  const EngineContext& ctx_;
  ModelTensors& model_;
  const LossFn loss_fn_;
  uint64_t step_ = 0;
  std::vector<torch::Tensor> batch_;
  int64_t micro_batches_ = 1;
  torch::Tensor rng_state_;
  torch::Tensor loss_scale_;  // Undefined: 1.
  bool replaying_ = false;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_PEER_REPLAY_H_
