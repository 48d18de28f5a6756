#include "client/small_collectives.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

namespace sdc::client {
namespace {

constexpr int kRoot = 0;

torch::Tensor TensorOf(const std::vector<int64_t>& words) {
  return torch::from_blob(const_cast<int64_t*>(words.data()),
                          {static_cast<int64_t>(words.size())}, torch::kInt64)
      .clone();
}

// Every rank's words at the root, in rank order; empty elsewhere.
std::vector<torch::Tensor> GatherAtRoot(c10d::ProcessGroup& pg, const std::vector<int64_t>& words) {
  std::vector<torch::Tensor> input = {TensorOf(words)};
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
  std::vector<torch::Tensor> t = {TensorOf(words)};
  c10d::BroadcastOptions options;
  options.rootRank = kRoot;
  pg.broadcast(t, options)->wait();
  std::copy_n(t[0].data_ptr<int64_t>(), count, words.begin());
}

}  // namespace

SmallCollectives Resolve(SmallCollectives how, c10d::ProcessGroup& pg) {
  if (how != SmallCollectives::kAuto) return how;
  std::string backend;
  try {
    backend = pg.getBackendName();
  } catch (const c10::Error&) {
    // A process group that does not name its backend gets its own collectives.
  }
  return backend == "gloo" ? SmallCollectives::kRooted : SmallCollectives::kBackend;
}

void AllReduceMax(c10d::ProcessGroup& pg, SmallCollectives how, std::vector<int64_t>& words) {
  if (Resolve(how, pg) == SmallCollectives::kBackend) {
    std::vector<torch::Tensor> t = {TensorOf(words)};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    pg.allreduce(t, max)->wait();
    std::copy_n(t[0].data_ptr<int64_t>(), words.size(), words.begin());
    return;
  }
  for (const torch::Tensor& theirs : GatherAtRoot(pg, words)) {
    const int64_t* w = theirs.data_ptr<int64_t>();
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
    std::vector<torch::Tensor> input = {TensorOf(words)};
    std::vector<std::vector<torch::Tensor>> output(1);
    for (size_t r = 0; r < world; ++r) output[0].push_back(torch::empty_like(input[0]));
    pg.allgather(output, input)->wait();
    for (const torch::Tensor& t : output[0]) {
      all.insert(all.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + words.size());
    }
    return all;
  }
  for (const torch::Tensor& t : GatherAtRoot(pg, words)) {
    all.insert(all.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + words.size());
  }
  BroadcastFromRoot(pg, all, world * words.size());
  return all;
}

}  // namespace sdc::client
