#include "demo/model.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace sdc::demo {

TinyTransformerImpl::TinyTransformerImpl(const TransformerConfig& c) : config_(c) {
  token_ = register_module("token", torch::nn::Embedding(c.vocab, c.width));
  position_ = register_module("position", torch::nn::Embedding(c.context, c.width));
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("block", l, "_");
    norm1_.push_back(register_module(p + "norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width}))));
    qkv_.push_back(register_module(p + "qkv", torch::nn::Linear(c.width, 3 * c.width)));
    proj_.push_back(register_module(p + "proj", torch::nn::Linear(c.width, c.width)));
    norm2_.push_back(register_module(p + "norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width}))));
    fc1_.push_back(register_module(p + "fc1", torch::nn::Linear(c.width, 4 * c.width)));
    fc2_.push_back(register_module(p + "fc2", torch::nn::Linear(4 * c.width, c.width)));
  }
  final_norm_ = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  head_ = register_module("head", torch::nn::Linear(c.width, c.vocab));
  dropout_ = register_module("dropout", torch::nn::Dropout(c.dropout));
  causal_mask_ = torch::ones({c.context, c.context}).triu(1).to(torch::kBool);
}

torch::Tensor TinyTransformerImpl::forward(const torch::Tensor& tokens) {
  const int64_t b = tokens.size(0), t = tokens.size(1), w = config_.width, h = config_.heads;
  torch::Tensor positions = torch::arange(t, torch::kInt64);
  torch::Tensor x = token_->forward(tokens) + position_->forward(positions);
  const torch::Tensor mask = causal_mask_.narrow(0, 0, t).narrow(1, 0, t);
  for (size_t l = 0; l < qkv_.size(); ++l) {
    torch::Tensor qkv = qkv_[l]->forward(norm1_[l]->forward(x)).view({b, t, 3, h, w / h});
    torch::Tensor q = qkv.select(2, 0).transpose(1, 2);
    torch::Tensor k = qkv.select(2, 1).transpose(1, 2);
    torch::Tensor v = qkv.select(2, 2).transpose(1, 2);
    torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(w / h));
    scores = scores.masked_fill(mask, -1e9);
    torch::Tensor attn = dropout_->forward(torch::softmax(scores, -1));
    torch::Tensor y = torch::matmul(attn, v).transpose(1, 2).reshape({b, t, w});
    y = proj_[l]->forward(y);
    x = x + dropout_->forward(y);
    // Where activation faults land: the residual stream, after dropout, so
    // a corrupted value always reaches the loss.
    if (l == 0 && hook_) x = hook_(x);
    x = x + dropout_->forward(fc2_[l]->forward(torch::gelu(fc1_[l]->forward(norm2_[l]->forward(x)))));
  }
  return head_->forward(final_norm_->forward(x));
}

BnMlpImpl::BnMlpImpl(bool center, bool nondeterministic) : nondeterministic_(nondeterministic) {
  fc1_ = register_module("fc1", torch::nn::Linear(16, 32));
  if (center) center_ = register_buffer("center_mean", torch::zeros({32}));
  bn_ = register_module("bn", torch::nn::BatchNorm1d(32));
  fc2_ = register_module("fc2", torch::nn::Linear(32, 1));
  dropout_ = register_module("dropout", torch::nn::Dropout(0.2));
}

void BnMlpImpl::Freeze() {
  for (torch::Tensor& p : fc1_->parameters()) p.set_requires_grad(false);
}

torch::Tensor BnMlpImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = fc1_->forward(x);
  if (center_.defined()) {
    torch::Tensor centered = h - center_;
    if (is_training()) {
      torch::NoGradGuard no_grad;
      center_.mul_(0.9).add_(h.mean(0), 0.1);
    }
    h = centered;
  }
  if (nondeterministic_) {
    torch::Tensor mask = torch::ones({h.size(1)}, h.options().requires_grad(false));
    mask.put_(torch::zeros({1}, torch::dtype(torch::kLong).device(h.device())),
              torch::ones({1}, mask.options()));
    h = h * mask;
  }
  h = dropout_->forward(torch::relu(bn_->forward(h)));
  if (hook_) h = hook_(h);  // After dropout: an injected error always counts.
  return fc2_->forward(h);
}

absl::StatusOr<std::string> LoadCorpus(const std::string& dir, size_t min_bytes) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::FailedPreconditionError(absl::StrCat("cannot read ", dir));
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') files.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  std::string corpus;
  for (const std::string& f : files) {
    std::ifstream in(f);
    std::stringstream s;
    s << in.rdbuf();
    corpus += s.str();
  }
  if (corpus.size() < min_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " holds ", corpus.size(), " bytes of text; the demo needs at least ", min_bytes));
  }
  return corpus;
}

std::vector<torch::Tensor> TextBatch(const std::string& corpus, int64_t batch, int64_t context,
                                     uint64_t seed) {
  std::mt19937_64 rng(seed);
  torch::Tensor inputs = torch::empty({batch, context}, torch::kInt64);
  torch::Tensor targets = torch::empty({batch, context}, torch::kInt64);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = targets.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    const size_t at = rng() % (corpus.size() - context - 1);
    for (int64_t t = 0; t < context; ++t) {
      in[b][t] = static_cast<unsigned char>(corpus[at + t]);
      out[b][t] = static_cast<unsigned char>(corpus[at + t + 1]);
    }
  }
  return {inputs, targets};
}

std::vector<torch::Tensor> RegressionBatch(int64_t batch, uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  torch::Tensor x = torch::randn({batch, 16}, gen);
  torch::Tensor y = (x.narrow(1, 0, 4).sum(1, true) * 0.5).tanh();
  return {x, y};
}

}  // namespace sdc::demo
