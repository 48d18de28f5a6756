#include "client/small_collectives.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "client/device.h"

namespace sdc::client {
namespace {

constexpr int kRoot = 0;

// `words` where `pg` sends from (the CPU for Gloo, the GPU for NCCL).
torch::Tensor TensorOf(c10d::ProcessGroup& pg, const std::vector<int64_t>& words) {
  return torch::tensor(words, torch::kInt64).to(CollectiveDevice(pg));
}

// The words of `t` (wherever it is), appended to `out`.
void Append(const torch::Tensor& t, std::vector<int64_t>& out) {
  const torch::Tensor host = t.cpu();
  out.insert(out.end(), host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

// Every rank's words at the root, in rank order; empty elsewhere.
std::vector<torch::Tensor> GatherAtRoot(c10d::ProcessGroup& pg, const std::vector<int64_t>& words) {
  std::vector<torch::Tensor> input = {TensorOf(pg, words)};
  std::vector<std::vector<torch::Tensor>> output;
  if (pg.getRank() == kRoot) {
    output.resize(1);
    for (int r = 0; r < pg.getSize(); ++r) output[0].push_back(torch::empty_like(input[0]));
  }
  c10d::GatherOptions options;
  options.rootRank = kRoot;
  pg.gather(output, input, options)->wait();
  return output.empty() ? std::vector<torch::Tensor>{} : output[0];
}

// The root's `words` on every rank (resized to `count` elsewhere).
void BroadcastFromRoot(c10d::ProcessGroup& pg, std::vector<int64_t>& words, size_t count) {
  words.resize(count);
  std::vector<torch::Tensor> t = {TensorOf(pg, words)};
  c10d::BroadcastOptions options;
  options.rootRank = kRoot;
  pg.broadcast(t, options)->wait();
  words.clear();
  Append(t[0], words);
}

}  // namespace

SmallCollectives Resolve(SmallCollectives how, c10d::ProcessGroup& pg) {
  if (how != SmallCollectives::kAuto) return how;
  return BackendName(pg) == "gloo" ? SmallCollectives::kRooted : SmallCollectives::kBackend;
}

void AllReduceMax(c10d::ProcessGroup& pg, SmallCollectives how, std::vector<int64_t>& words) {
  if (Resolve(how, pg) == SmallCollectives::kBackend) {
    std::vector<torch::Tensor> t = {TensorOf(pg, words)};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    pg.allreduce(t, max)->wait();
    words.clear();
    Append(t[0], words);
    return;
  }
  for (const torch::Tensor& theirs : GatherAtRoot(pg, words)) {
    std::vector<int64_t> w;
    Append(theirs, w);
    for (size_t i = 0; i < words.size(); ++i) words[i] = std::max(words[i], w[i]);
  }
  BroadcastFromRoot(pg, words, words.size());
}

std::vector<int64_t> AllGather(c10d::ProcessGroup& pg, SmallCollectives how,
                               const std::vector<int64_t>& words) {
  const size_t world = static_cast<size_t>(pg.getSize());
  std::vector<int64_t> all;
  all.reserve(world * words.size());
  if (Resolve(how, pg) == SmallCollectives::kBackend) {
    std::vector<torch::Tensor> input = {TensorOf(pg, words)};
    std::vector<std::vector<torch::Tensor>> output(1);
    for (size_t r = 0; r < world; ++r) output[0].push_back(torch::empty_like(input[0]));
    pg.allgather(output, input)->wait();
    for (const torch::Tensor& t : output[0]) Append(t, all);
    return all;
  }
  for (const torch::Tensor& t : GatherAtRoot(pg, words)) Append(t, all);
  BroadcastFromRoot(pg, all, world * words.size());
  return all;
}

}  // namespace sdc::client
