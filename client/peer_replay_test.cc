// PeerReplay on one rank: what may be sent, and a replay of the rank's own
// micro-batch, which must reproduce its loss and gradients bit for bit and
// leave the rank's RNG and buffers as they were. (The exchange between ranks
// runs in tests/cluster_*_test.cc and tests/python.)

#include "client/peer_replay.h"

#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "client/device.h"
#include "client/gloo_group.h"
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

// Issue 39, case 4: a bit of rank 0's micro-batch flips on its way to its
// replayer, rank 1 (the fault flips it after the checksum, as a link
// would). Rank 1 refuses it as a corrupted transfer (DataLoss) instead of
// replaying it into a wrong result that named its own GPU; the next send
// (a tie-break's) arrives intact and replays as rank 0 computed it.
TEST(PeerReplayTest, AMicroBatchCorruptedOnTheWayIsRefusedNotReplayed) {
  const std::string store =
      (std::filesystem::path(::testing::TempDir()) / "corrupt_transfer_store").string();
  std::filesystem::remove(store);
  Model models[2];
  struct Outcome {
    absl::Status first, second;
    std::optional<PeerReplay::Result> replayed;
  } out[2];
  std::optional<PeerReplay::Result> own;
  // Drawn here: the two ranks' threads share torch's generators, so only
  // rank 0 (the subject) touches them before the exchange.
  const std::vector<torch::Tensor> batch = Batch();
  auto run = [&](int rank) {
    GuardOptions o = Options();
    o.node_name = rank == 0 ? "node-a" : "node-b";
    o.faults = {*ParseFaultSpec("corrupt-transfer:0:step=1")};
    EngineContext ctx(o, MakeGlooGroup(store, rank, 2, std::chrono::seconds(60)));
    ModelTensors tensors =
        *ModelTensors::Create(models[rank].parameters(), {}, models[rank].buffers(), true);
    PeerReplay replay(ctx, tensors, models[rank].loss());
    ASSERT_TRUE(ctx.ExchangeTopology().ok());
    replay.BeginStep(1, batch, 1);
    if (rank == 0) {
      replay.CaptureRng();
      own = replay.Replay(replay.OwnBatch());
    }
    auto first = replay.ExchangeAndReplay({{1, 0}}, 1000);
    out[rank].first = first.status();
    auto second = replay.ExchangeAndReplay({{1, 0}}, 3000);
    out[rank].second = second.status();
    if (second.ok() && second->has_value()) out[rank].replayed = (*second)->second;
  };
  std::thread r0(run, 0), r1(run, 1);
  r0.join();
  r1.join();
  EXPECT_TRUE(out[0].first.ok()) << out[0].first;
  EXPECT_EQ(out[1].first.code(), absl::StatusCode::kDataLoss) << out[1].first;
  EXPECT_NE(out[1].first.message().find("arrived corrupted"), std::string::npos)
      << out[1].first;
  EXPECT_TRUE(out[0].second.ok()) << out[0].second;
  ASSERT_TRUE(out[1].second.ok()) << out[1].second;
  ASSERT_TRUE(out[1].replayed.has_value());
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(out[1].replayed->loss_bits, own->loss_bits);
  EXPECT_EQ(out[1].replayed->digest, own->digest);
}

}  // namespace
}  // namespace sdc::client
