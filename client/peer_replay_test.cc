// PeerReplay on one rank: what may be sent, and a replay of the rank's own
// micro-batch, which must reproduce its loss and gradients bit for bit and
// leave the rank's RNG and buffers as they were. (The exchange between ranks
// runs in tests/cluster_*_test.cc and tests/python.)

#include "client/peer_replay.h"

#include <string>
#include <utility>

#include "client/device.h"
#include "client/one_rank_group.h"
#include "client/tensor_checks.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

GuardOptions Options() {
  GuardOptions o;
  o.job_id = "replay";
  o.node_name = "node-a";
  return o;
}

TEST(PeerReplayTest, OnlyWhatTheHeaderCarriesCanBeSent) {
  const auto code = [](const std::vector<torch::Tensor>& batch, int64_t micro_batches) {
    return PeerReplay::CheckSendable(batch, micro_batches).code();
  };
  EXPECT_EQ(code({}, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({torch::ones({2})}, 0), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({torch::ones({2}), torch::Tensor()}, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({torch::zeros({1, 1, 1, 1, 1, 1, 1})}, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(std::vector<torch::Tensor>(7, torch::zeros({1})), 1),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PeerReplay::CheckSendable(std::vector<torch::Tensor>(6, torch::zeros({1, 1, 1, 1, 1, 1})), 4).ok());
}

// A model whose forward draws from the RNG (dropout) and updates buffers
// (batch norm's running statistics): what a replay must carry.
struct Model {
  Model() {
    torch::manual_seed(7);
    linear = torch::nn::Linear(4, 3);
    norm = torch::nn::BatchNorm1d(3);
  }
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  NamedTensors parameters() {
    return {{"linear.weight", "linear.bias", "norm.weight", "norm.bias"},
            {linear->weight, linear->bias, norm->weight, norm->bias}};
  }
  NamedTensors buffers() {
    return {{"norm.running_mean", "norm.running_var", "norm.num_batches_tracked"},
            {norm->running_mean, norm->running_var, norm->num_batches_tracked}};
  }
  LossFn loss() {
    return [this](const std::vector<torch::Tensor>& b) {
      torch::Tensor h = torch::dropout(linear->forward(b[0]), 0.5, /*train=*/true);
      return torch::mse_loss(norm->forward(h), b[1]);
    };
  }
};

struct Fixture {
  explicit Fixture(const std::string& name, GuardOptions options = Options())
      : ctx(std::move(options), OneRankGroup(name)),
        tensors(*ModelTensors::Create(model.parameters(), {}, model.buffers(), true)),
        replay(ctx, tensors, model.loss()) {
    // Collective on the one-rank group; gives the job's fingerprint key.
    EXPECT_TRUE(ctx.ExchangeTopology().ok());
  }
  Model model;
  EngineContext ctx;
  ModelTensors tensors;
  PeerReplay replay;
};

std::vector<torch::Tensor> Batch() {
  torch::manual_seed(11);
  return {torch::randn({5, 4}), torch::randn({5, 3})};
}

TEST(PeerReplayTest, ReplayOfTheOwnBatchReproducesTheStepAndLeavesNoTrace) {
  Fixture f("own");
  constexpr int64_t kMicroBatches = 2;
  const std::vector<torch::Tensor> batch = Batch();
  f.replay.BeginStep(1, batch, kMicroBatches);
  f.tensors.ClearGradients();
  f.replay.CaptureRng();
  f.tensors.CaptureForwardBuffers();
  const torch::Tensor scale = torch::scalar_tensor(1024.0, torch::kFloat);
  f.replay.SetLossScale(scale);
  // The step as the trainer ran it: the loss divided by the micro-batches,
  // scaled as a GradScaler does.
  torch::Tensor loss = f.model.loss()(batch) / static_cast<double>(kMicroBatches) * scale;
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : f.tensors.parameters()) grads.push_back(p.grad().clone());
  const std::vector<kernels::Fingerprint> trained = Fingerprints(f.ctx.fingerprint_key(), grads);
  const std::vector<kernels::Fingerprint> buffers_after = Fingerprints(f.ctx.fingerprint_key(), f.tensors.buffers());
  const torch::Tensor rng_before = CaptureRng(torch::kCPU);

  const PeerReplay::Result r = f.replay.Replay(f.replay.OwnBatch());
  EXPECT_EQ(r.loss_bits, LossBits(loss));
  EXPECT_EQ(r.gradients, trained);
  EXPECT_EQ(r.digest, f.tensors.AuditDigest(trained, buffers_after));
  EXPECT_EQ(r.nonfinite, 0u);
  // No trace: the rank's buffers, RNG and gradients are as they were.
  EXPECT_EQ(Fingerprints(f.ctx.fingerprint_key(), f.tensors.buffers()), buffers_after);
  EXPECT_TRUE(torch::equal(CaptureRng(torch::kCPU), rng_before));
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(f.tensors.parameters()[i].grad(), grads[i])) << i;
  }
  EXPECT_FALSE(f.replay.replaying());
}

TEST(PeerReplayTest, AFailingReplayStillRestoresTheRank) {
  Fixture f("fails");
  f.replay.BeginStep(1, Batch(), 1);
  f.replay.CaptureRng();
  f.tensors.CaptureForwardBuffers();
  PeerReplay::Batch bad = f.replay.OwnBatch();
  bad.tensors = {torch::ones({5, 9}), torch::ones({5, 3})};  // The wrong width: linear throws.
  {
    torch::NoGradGuard no_grad;
    torch::Tensor(f.tensors.buffers()[0]).fill_(3);
  }
  const std::vector<kernels::Fingerprint> before = Fingerprints(f.ctx.fingerprint_key(), f.tensors.buffers());
  const torch::Tensor rng_before = CaptureRng(torch::kCPU);
  EXPECT_THROW(f.replay.Replay(bad), c10::Error);
  EXPECT_EQ(Fingerprints(f.ctx.fingerprint_key(), f.tensors.buffers()), before) << "the subject's buffers were undone";
  EXPECT_TRUE(torch::equal(CaptureRng(torch::kCPU), rng_before));
  EXPECT_FALSE(f.replay.replaying());
}

// Issue 40, item 3: a replay that raises after its forward (the injected
// replay-error, as a loss function or autograd would) leaves the rank's
// gradients as its own training left them, with its RNG and buffers.
TEST(PeerReplayTest, AReplayThatRaisesLeavesTheGradientsAsTheyWere) {
  GuardOptions options = Options();
  absl::StatusOr<FaultPlan> fault = ParseFaultSpec("replay-error:0:step=2");
  ASSERT_TRUE(fault.ok()) << fault.status();
  options.faults = {*fault};
  Fixture f("raises", options);
  for (uint64_t step : {1, 2}) {
    const std::vector<torch::Tensor> batch = Batch();
    f.replay.BeginStep(step, batch, 1);
    f.tensors.ClearGradients();
    f.replay.CaptureRng();
    f.tensors.CaptureForwardBuffers();
    f.model.loss()(batch).backward();
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : f.tensors.parameters()) grads.push_back(p.grad());
    const torch::Tensor rng_before = CaptureRng(torch::kCPU);
    const std::vector<kernels::Fingerprint> buffers_before = Fingerprints(f.ctx.fingerprint_key(), f.tensors.buffers());
    if (step == 1) {
      EXPECT_NO_THROW(f.replay.Replay(f.replay.OwnBatch()));
    } else {
      EXPECT_THROW(f.replay.Replay(f.replay.OwnBatch()), c10::Error);
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(f.tensors.parameters()[i].grad().is_same(grads[i])) << "step " << step << " " << i;
    }
    EXPECT_TRUE(torch::equal(CaptureRng(torch::kCPU), rng_before)) << step;
    EXPECT_EQ(Fingerprints(f.ctx.fingerprint_key(), f.tensors.buffers()), buffers_before) << step;
    EXPECT_FALSE(f.replay.replaying());
  }
}

TEST(PeerReplayTest, ARankOutsideThePairsExchangesNothing) {
  Fixture f("outside");
  f.replay.BeginStep(1, Batch(), 1);
  f.replay.CaptureRng();
  auto none = f.replay.ExchangeAndReplay({{1, 2}, {2, 1}}, 1000);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
}

}  // namespace
}  // namespace sdc::client
