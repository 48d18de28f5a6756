#ifndef SDC_DEMO_MODEL_H_
#define SDC_DEMO_MODEL_H_

// The demo's models: a small byte-level transformer language model trained
// on the licence texts every Debian machine has, and a tiny MLP with dropout
// and BatchNorm (the layers a replay must get exactly right).

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "torch/torch.h"

namespace sdc::demo {

// A point in the forward pass where a fault may be injected (Guard::FaultPoint).
using FaultHook = std::function<torch::Tensor(const torch::Tensor&)>;

struct TransformerConfig {
  int64_t vocab = 256;  // Bytes.
  int64_t context = 64;
  int64_t width = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  double dropout = 0.1;
};

class TinyTransformerImpl : public torch::nn::Module {
 public:
  explicit TinyTransformerImpl(const TransformerConfig& config);
  // tokens: [batch, context] int64 -> logits [batch, context, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  void set_fault_hook(FaultHook hook) { hook_ = std::move(hook); }

 private:
  TransformerConfig config_;
  torch::nn::Embedding token_{nullptr}, position_{nullptr};
  std::vector<torch::nn::LayerNorm> norm1_, norm2_;
  std::vector<torch::nn::Linear> qkv_, proj_, fc1_, fc2_;
  torch::nn::LayerNorm final_norm_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::Tensor causal_mask_;
  FaultHook hook_;
};
TORCH_MODULE(TinyTransformer);

// The BatchNorm MLP. `center`: a running mean, kept in a buffer, is
// subtracted before the BatchNorm and then updated with the batch (a forward
// that reads the buffer it writes; "center-mlp"). `nondeterministic`: a mask
// is built with put_, an op with no deterministic implementation (the values
// are the same either way; "put-mlp").
class BnMlpImpl : public torch::nn::Module {
 public:
  explicit BnMlpImpl(bool center = false, bool nondeterministic = false);
  // fc1 frozen (requires_grad off), as a frozen backbone ("frozen-mlp").
  void Freeze();
  torch::Tensor forward(const torch::Tensor& x);
  void set_fault_hook(FaultHook hook) { hook_ = std::move(hook); }

 private:
  bool nondeterministic_ = false;
  torch::Tensor center_;  // The running mean (center-mlp), else undefined.
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  torch::nn::BatchNorm1d bn_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  FaultHook hook_;
};
TORCH_MODULE(BnMlp);

// The concatenated texts under `dir` (default /usr/share/common-licenses);
// FailedPrecondition when it has less than `min_bytes`.
absl::StatusOr<std::string> LoadCorpus(const std::string& dir, size_t min_bytes = 1 << 16);

// `batch` windows of context+1 bytes, from positions drawn with `seed`.
// Returns {inputs [batch, context], targets [batch, context]}.
std::vector<torch::Tensor> TextBatch(const std::string& corpus, int64_t batch, int64_t context,
                                     uint64_t seed);

// A synthetic regression batch for the BatchNorm model: {x [batch, 16], y [batch, 1]}.
std::vector<torch::Tensor> RegressionBatch(int64_t batch, uint64_t seed);

}  // namespace sdc::demo

#endif  // SDC_DEMO_MODEL_H_
