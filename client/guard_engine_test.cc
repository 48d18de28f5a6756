// client::GuardEngine on a one-rank Gloo group: what it refuses, the bucket
// hand-offs of check 1, and the skip that zeroes the gradients. (Multi-rank
// behaviour runs in real processes: tests/cluster_*_test.cc for the C++
// Guard, tests/python for the Python package, both on this engine.)

#include "client/guard_engine.h"

#include <limits>
#include <string>
#include <vector>

#include "client/one_rank_group.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

GuardOptions Options() {
  GuardOptions o;
  o.job_id = "engine";
  o.node_name = "node-a";
  o.audit_every = 0;
  o.weight_check_every = 0;
  return o;
}

struct Model {
  torch::nn::Linear linear{4, 2};
  NamedTensors params() { return {{"weight", "bias"}, {linear->weight, linear->bias}}; }
  LossFn loss() {
    return [this](const std::vector<torch::Tensor>& b) {
      return torch::mse_loss(linear->forward(b[0]), b[1]);
    };
  }
};

std::vector<torch::Tensor> Batch() { return {torch::ones({3, 4}), torch::zeros({3, 2})}; }

// The gradients of the parameters, flattened into one bucket (as a reducer
// would), handed over before and after a one-rank "all-reduce".
void OneBucket(GuardEngine& engine, Model& m) {
  torch::Tensor flat = torch::cat({m.linear->weight.grad().reshape({-1}), m.linear->bias.grad()});
  engine.ScanLocalBucket(flat);
  engine.AddReducedBucket(0, flat);
  m.linear->weight.mutable_grad() = flat.narrow(0, 0, 8).view({2, 4});
  m.linear->bias.mutable_grad() = flat.narrow(0, 8, 2);
}

TEST(GuardEngineTest, CreateRefusesWhatItCannotCheck) {
  Model m;
  auto pg = OneRankGroup("refuses");
  auto no_job = Options();
  no_job.job_id.clear();
  EXPECT_EQ(GuardEngine::Create(no_job, pg, m.params(), {}, nullptr, m.loss()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GuardEngine::Create(Options(), pg, {}, {}, nullptr, m.loss()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GuardEngine::Create(Options(), pg, m.params(), {}, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  NamedTensors unnamed = m.params();
  unnamed.names.pop_back();
  absl::StatusOr<std::unique_ptr<GuardEngine>> e =
      GuardEngine::Create(Options(), pg, unnamed, {}, nullptr, m.loss());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  NamedTensors integer = {{"steps"}, {torch::zeros({3}, torch::kInt64)}};
  e = GuardEngine::Create(Options(), pg, integer, {}, nullptr, m.loss());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(e.status().message()).find("steps"), std::string::npos) << e.status();
}

TEST(GuardEngineTest, BeginStepRefusesABatchAPeerCannotBeSent) {
  Model m;
  auto engine = GuardEngine::Create(Options(), OneRankGroup("batch"), m.params(), {}, nullptr,
                                    m.loss());
  ASSERT_TRUE(engine.ok()) << engine.status();
  GuardEngine& g = **engine;
  EXPECT_EQ(g.BeginStep(1, {}, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.BeginStep(1, Batch(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.BeginStep(1, {torch::zeros({1, 1, 1, 1, 1, 1, 1})}, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.BeginStep(1, std::vector<torch::Tensor>(7, torch::zeros({1})), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(g.BeginStep(1, Batch(), 1).ok());
  // A step whose gradients never reached the engine cannot be decided.
  absl::StatusOr<StepDecision> d = g.Finish();
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms()) << "restored on the way out";
}

TEST(GuardEngineTest, BucketsDecideTheStep) {
  Model m;
  auto engine = GuardEngine::Create(Options(), OneRankGroup("buckets"), m.params(), {}, nullptr,
                                    m.loss());
  ASSERT_TRUE(engine.ok()) << engine.status();
  GuardEngine& g = **engine;
  // A clean step: applied, the norm is the reduced gradients'.
  ASSERT_TRUE(g.BeginStep(1, Batch(), 1).ok());
  EXPECT_FALSE(m.linear->weight.grad().defined()) << "BeginStep clears the gradients";
  torch::Tensor loss = m.loss()(Batch());
  loss.backward();
  g.RecordFirstMicroBatch(loss);
  OneBucket(g, m);
  const double norm = torch::cat({m.linear->weight.grad().reshape({-1}), m.linear->bias.grad()})
                          .norm()
                          .item<double>();
  absl::StatusOr<StepDecision> d = g.Finish();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->apply);
  EXPECT_NEAR(d->grad_norm, norm, 1e-6 * norm);
  // A NaN in the local bucket: skipped, the gradients zeroed.
  ASSERT_TRUE(g.BeginStep(2, Batch(), 1).ok());
  loss = m.loss()(Batch());
  loss.backward();
  g.RecordFirstMicroBatch(loss);
  {
    torch::NoGradGuard no_grad;
    m.linear->bias.grad()[0] = std::numeric_limits<float>::quiet_NaN();
  }
  OneBucket(g, m);
  d = g.Finish();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->apply);
  EXPECT_EQ(d->reason, "NaN/Inf in every rank's local gradients");
  EXPECT_EQ(torch::count_nonzero(m.linear->weight.grad()).item<int64_t>(), 0);
  EXPECT_EQ(g.Summary().skipped, 1u);
  EXPECT_EQ(g.Summary().steps, 2u);
}

}  // namespace
}  // namespace sdc::client
