#include "client/small_collectives.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
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

// The rooted algorithm: every rank's words to rank 0, which combines them
// and sends the result to each. Its messages go point to point from the
// calling thread: ProcessGroupGloo runs gather and broadcast on its worker
// threads (two more thread hand-offs per call on every rank), and its
// broadcast is a tree (more dependent hops than the root sending to each).
// A rank posts its receive for the result before it sends, so the result
// can flow as soon as the root has it. The tags are the small collectives'
// own: the guard's point-to-point exchanges use 1000 and up, and none is in
// flight at the same time.
constexpr int kGatherTag = 7;
constexpr int kResultTag = 8;

// `combine` gets every rank's words in rank order and returns the result.
std::vector<int64_t> Rooted(
    c10d::ProcessGroup& pg, const std::vector<int64_t>& words, size_t result_size,
    const std::function<std::vector<int64_t>(const std::vector<std::vector<int64_t>>&)>& combine) {
  std::vector<torch::Tensor> mine = {TensorOf(pg, words)};
  if (pg.getRank() != kRoot) {
    std::vector<torch::Tensor> result = {
        torch::empty({static_cast<int64_t>(result_size)}, mine[0].options())};
    c10::intrusive_ptr<c10d::Work> receive = pg.recv(result, kRoot, kResultTag);
    pg.send(mine, kRoot, kGatherTag)->wait();
    receive->wait();
    std::vector<int64_t> out;
    Append(result[0], out);
    return out;
  }
  std::vector<std::vector<torch::Tensor>> theirs(pg.getSize());
  std::vector<c10::intrusive_ptr<c10d::Work>> receives;
  for (int r = 0; r < pg.getSize(); ++r) {
    if (r == kRoot) continue;
    theirs[r] = {torch::empty_like(mine[0])};
    receives.push_back(pg.recv(theirs[r], r, kGatherTag));
  }
  for (auto& w : receives) w->wait();
  std::vector<std::vector<int64_t>> all(pg.getSize());
  for (int r = 0; r < pg.getSize(); ++r) {
    if (r == kRoot) {
      all[r] = words;
    } else {
      Append(theirs[r][0], all[r]);
    }
  }
  std::vector<int64_t> out = combine(all);
  std::vector<torch::Tensor> result = {TensorOf(pg, out)};
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  for (int r = 0; r < pg.getSize(); ++r) {
    if (r != kRoot) sends.push_back(pg.send(result, r, kResultTag));
  }
  for (auto& w : sends) w->wait();
  return out;
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
  words = Rooted(pg, words, words.size(), [](const std::vector<std::vector<int64_t>>& all) {
    std::vector<int64_t> max = all[0];
    for (const std::vector<int64_t>& w : all) {
      for (size_t i = 0; i < max.size(); ++i) max[i] = std::max(max[i], w[i]);
    }
    return max;
  });
}

std::vector<int64_t> AllGather(c10d::ProcessGroup& pg, SmallCollectives how,
                               const std::vector<int64_t>& words) {
  const size_t world = static_cast<size_t>(pg.getSize());
  if (Resolve(how, pg) == SmallCollectives::kBackend) {
    std::vector<torch::Tensor> input = {TensorOf(pg, words)};
    std::vector<std::vector<torch::Tensor>> output(1);
    for (size_t r = 0; r < world; ++r) output[0].push_back(torch::empty_like(input[0]));
    pg.allgather(output, input)->wait();
    std::vector<int64_t> all;
    all.reserve(world * words.size());
    for (const torch::Tensor& t : output[0]) Append(t, all);
    return all;
  }
  return Rooted(pg, words, world * words.size(), [](const std::vector<std::vector<int64_t>>& each) {
    std::vector<int64_t> concatenated;
    for (const std::vector<int64_t>& w : each) concatenated.insert(concatenated.end(), w.begin(), w.end());
    return concatenated;
  });
}

}  // namespace sdc::client
