// WeightCheck on a one-rank Gloo group without a coordinator: when check 3
// runs, what its digest sees, the faults it injects, and when a repair runs.
// (The vote across ranks and a real repair: tests/cluster_*_test.cc.)

#include "client/weight_check.h"

#include <string>

#include "client/one_rank_group.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

GuardOptions Options(const std::string& faults = "") {
  GuardOptions o;
  o.job_id = "weights";
  o.node_name = "node-a";
  o.weight_check_every = 5;
  if (!faults.empty()) o.faults = *ParseFaultSpecs(faults);
  return o;
}

struct Fixture {
  explicit Fixture(const std::string& name, GuardOptions options = Options())
      : ctx(std::move(options), OneRankGroup(name)),
        model(*ModelTensors::Create({{"w"}, {torch::ones({3}, torch::requires_grad())}},
                                    {{"frozen"}, {torch::ones({2})}},
                                    {{"buffer"}, {torch::zeros({2})}}, true)),
        weights(ctx, model, [this] { return optimizer_state; }) {
    // Collective on the one-rank group; gives the job's fingerprint key.
    EXPECT_TRUE(ctx.ExchangeTopology().ok());
  }
  EngineContext ctx;
  ModelTensors model;
  // An integer step count, an empty tensor, then the first floating state.
  std::vector<torch::Tensor> optimizer_state = {torch::zeros({1}, torch::kInt64),
                                                torch::empty({0}), torch::ones({3})};
  WeightCheck weights;
};

TEST(WeightCheckTest, RunsOnWeightCheckStepsAndCheckpoints) {
  Fixture f("schedule");
  f.weights.BeginStep();
  absl::StatusOr<double> ms = f.weights.AfterOptimizerStep({3, 1}, /*checkpoint=*/false);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_EQ(*ms, 0.0) << "step 3 is no weight-check step";
  EXPECT_FALSE(f.weights.checkpoint_weights_sent());
  ASSERT_TRUE(f.weights.AfterOptimizerStep({5, 1}, false).ok());
  EXPECT_FALSE(f.weights.checkpoint_weights_sent());
  ASSERT_TRUE(f.weights.AfterOptimizerStep({6, 1}, /*checkpoint=*/true).ok());
  EXPECT_TRUE(f.weights.checkpoint_weights_sent());
  f.weights.BeginStep();
  EXPECT_FALSE(f.weights.checkpoint_weights_sent()) << "a new step needs its own";
  GuardSummary s;
  f.weights.Summarize(s);
  EXPECT_EQ(s.weight_checks, 2u);
}

TEST(WeightCheckTest, TheDigestSeesWeightsFrozenAndTheForwardsBuffers) {
  Fixture f("digest");
  const uint64_t d = f.weights.Digest();
  {
    torch::NoGradGuard no_grad;
    torch::Tensor(f.model.buffers()[0]).fill_(1);  // Live buffers: not what the vote sees.
  }
  EXPECT_EQ(f.weights.Digest(), d);
  f.model.CaptureForwardBuffers();
  const uint64_t with_buffers = f.weights.Digest();
  EXPECT_NE(with_buffers, d);
  {
    torch::NoGradGuard no_grad;
    torch::Tensor(f.model.frozen()[0]).mul_(2);
  }
  EXPECT_NE(f.weights.Digest(), with_buffers);
}

TEST(WeightCheckTest, InjectedFaultsFlipOneMantissaBitOfTheirTarget) {
  struct Case {
    const char* spec;
    int target;  // 0: the parameter, 1: the frozen parameter, 2: optimizer state.
  } cases[] = {{"weight:0:step=2", 0}, {"frozen-weight:0:step=2", 1}, {"optimizer-state:0:step=2", 2}};
  for (const Case& c : cases) {
    Fixture f(std::string("fault-") + std::to_string(c.target), Options(c.spec));
    const torch::Tensor targets[] = {f.model.parameters()[0], f.model.frozen()[0],
                                     f.optimizer_state[2]};
    ASSERT_TRUE(f.weights.AfterOptimizerStep({1, 1}, false).ok());
    EXPECT_EQ(targets[c.target][0].item<float>(), 1.0f) << c.spec << ": not before its step";
    ASSERT_TRUE(f.weights.AfterOptimizerStep({2, 1}, false).ok());
    for (int t = 0; t < 3; ++t) {
      // Bit 16 of 1.0f's mantissa is worth 2^-7; only the first element changes.
      EXPECT_EQ(targets[t][0].item<float>(), t == c.target ? 1.0f + 0x1p-7f : 1.0f)
          << c.spec << ", tensor " << t;
      EXPECT_EQ(targets[t][1].item<float>(), 1.0f) << c.spec << ", tensor " << t;
    }
  }
}

TEST(WeightCheckTest, ARepairRunsOnceEveryRankHoldsTheNewestVerdict) {
  Fixture f("repair");
  f.weights.NoteMinority(40, 0, "rank 0 differs");
  f.weights.NoteMinority(30, 0, "an older verdict");
  EXPECT_EQ(f.weights.repair_step(), 40u) << "an older verdict is ignored";
  Agreement a;
  a.repair_step_known_by_all = 30;  // Some rank has not heard of step 40 yet.
  StepDecision d;
  ASSERT_TRUE(f.weights.RepairIfAgreed(a, d).ok());
  EXPECT_FALSE(d.repaired);
  a.repair_step_known_by_all = 40;
  ASSERT_TRUE(f.weights.RepairIfAgreed(a, d).ok());
  EXPECT_TRUE(d.repaired);
  StepDecision again;
  ASSERT_TRUE(f.weights.RepairIfAgreed(a, again).ok());
  EXPECT_FALSE(again.repaired) << "once per verdict";
  GuardSummary s;
  f.weights.Summarize(s);
  EXPECT_EQ(s.repairs, 1u);
}

}  // namespace
}  // namespace sdc::client
