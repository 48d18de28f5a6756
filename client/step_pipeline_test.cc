// StepPipeline on a one-rank Gloo group: check 1 over buckets handed over
// in any order, the agreement's one all-reduce, apply or skip, and the
// faults a step carries. (Several ranks: tests/cluster_*_test.cc and
// tests/python run it inside the engine.)

#include "client/step_pipeline.h"

#include <cmath>
#include <limits>
#include <string>

#include "client/one_rank_group.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

GuardOptions Options(const std::string& faults = "") {
  GuardOptions o;
  o.job_id = "pipeline";
  o.node_name = "node-a";
  if (!faults.empty()) {
    absl::StatusOr<std::vector<FaultPlan>> f = ParseFaultSpecs(faults);
    EXPECT_TRUE(f.ok()) << f.status();
    if (f.ok()) o.faults = *f;
  }
  return o;
}

struct Fixture {
  explicit Fixture(const std::string& name, GuardOptions options = Options())
      : ctx(std::move(options), OneRankGroup(name)),
        model(*ModelTensors::Create({{"w", "b"},
                                     {torch::ones({2, 2}, torch::requires_grad()),
                                      torch::ones({2}, torch::requires_grad())}},
                                    {}, {}, true)),
        pipeline(ctx, model) {
    // Collective on the one-rank group; gives the job's fingerprint key.
    EXPECT_TRUE(ctx.ExchangeTopology().ok());
  }
  EngineContext ctx;
  ModelTensors model;
  StepPipeline pipeline;
};

TEST(StepPipelineTest, ReducedBucketsAreCheckedInIndexOrderWhateverTheirArrival) {
  Fixture f("order");
  const torch::Tensor first = torch::tensor({3.0f, 0.0f});
  const torch::Tensor second = torch::tensor({4.0f});
  StepContext step{1, 1};
  f.pipeline.BeginStep();
  f.pipeline.AddReducedBucket(step, 1, second);
  f.pipeline.AddReducedBucket(step, 0, first);
  absl::StatusOr<StepPipeline::Gradients> late = f.pipeline.CheckGradients(step);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_DOUBLE_EQ(late->sum_squares, 25.0);
  EXPECT_EQ(late->reduced_nonfinite, 0u);
  EXPECT_EQ(late->local_nonfinite, 0u);

  step = {2, 1};
  f.pipeline.BeginStep();
  f.pipeline.AddReducedBucket(step, 0, first);
  f.pipeline.AddReducedBucket(step, 1, second);
  absl::StatusOr<StepPipeline::Gradients> in_order = f.pipeline.CheckGradients(step);
  ASSERT_TRUE(in_order.ok()) << in_order.status();
  EXPECT_EQ(in_order->reduced_digest, late->reduced_digest);

  // The same values under swapped indices are different buckets.
  step = {3, 1};
  f.pipeline.BeginStep();
  f.pipeline.AddReducedBucket(step, 0, second);
  f.pipeline.AddReducedBucket(step, 1, first);
  absl::StatusOr<StepPipeline::Gradients> swapped = f.pipeline.CheckGradients(step);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_NE(swapped->reduced_digest, late->reduced_digest);
}

TEST(StepPipelineTest, NonFiniteLocalAndReducedAreCounted) {
  Fixture f("nonfinite");
  const StepContext step{1, 1};
  f.pipeline.BeginStep();
  f.pipeline.ScanLocalBucket(step, torch::tensor({kNaN, 1.0f, kNaN}));
  f.pipeline.ScanLocalBucket(step, torch::tensor({1.0f}));
  f.pipeline.AddReducedBucket(step, 0, torch::tensor({kNaN, 2.0f}));
  absl::StatusOr<StepPipeline::Gradients> g = f.pipeline.CheckGradients(step);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->local_nonfinite, 2u);
  EXPECT_EQ(g->reduced_nonfinite, 1u);
  // The next step starts clean, and a step without buckets cannot be decided.
  f.pipeline.BeginStep();
  EXPECT_EQ(f.pipeline.CheckGradients({2, 1}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StepPipelineTest, TheAgreementOfOneRankIsItsOwnView) {
  Fixture f("agree");
  LocalView view;
  view.local_nonfinite = true;
  view.reduced_digest = 0x123456789abcdefull;
  view.plans_held = 4;
  view.repair_step = 30;
  absl::StatusOr<Agreement> a = f.pipeline.Agree(view);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->any_local_nonfinite);
  EXPECT_TRUE(a->all_local_nonfinite);
  EXPECT_EQ(a->highest_local_nonfinite_rank, 0);
  EXPECT_FALSE(a->reduced_digests_differ);
  EXPECT_EQ(a->plans_held_by_all, 4u);
  EXPECT_EQ(a->repair_step_known_by_all, 30u);
}

TEST(StepPipelineTest, SkipZeroesTheGradientsAndApplyClipsWhenAsked) {
  GuardOptions clipped = Options();
  clipped.max_grad_norm = 1.0;
  Fixture f("apply", clipped);
  torch::Tensor w = f.model.parameters()[0];
  w.mutable_grad() = torch::full({2, 2}, 5.0f);  // Norm 10.

  StepDecision apply;
  apply.grad_norm = 10;
  ASSERT_TRUE(f.pipeline.ApplyOrSkip({1, 1}, apply).ok());
  EXPECT_NEAR(apply.clip_coef, 0.1, 1e-6);
  EXPECT_NEAR(w.grad().norm().item<double>(), 1.0, 1e-5);
  EXPECT_FALSE(f.model.parameters()[1].grad().defined()) << "no gradient: left alone";

  StepDecision skip;
  skip.apply = false;
  skip.reason = "replay audit mismatch";
  skip.grad_norm = 10;
  ASSERT_TRUE(f.pipeline.ApplyOrSkip({2, 1}, skip).ok());
  EXPECT_EQ(skip.clip_coef, 1) << "a skipped step is not clipped";
  EXPECT_EQ(torch::count_nonzero(w.grad()).item<int64_t>(), 0);

  GuardSummary s;
  f.pipeline.Summarize(s);
  EXPECT_EQ(s.steps, 2u);
  EXPECT_EQ(s.skipped, 1u);
}

TEST(StepPipelineTest, GradientFaultsFireOnceAtTheirStep) {
  Fixture nan("nan-fault", Options("nan-gradient:0:step=2"));
  for (uint64_t s : {1, 2}) {
    const StepContext step{s, 1};
    nan.pipeline.BeginStep();
    nan.pipeline.ScanLocalBucket(step, torch::ones({3}));
    nan.pipeline.ScanLocalBucket(step, torch::ones({3}));
    nan.pipeline.AddReducedBucket(step, 0, torch::ones({3}));
    absl::StatusOr<StepPipeline::Gradients> g = nan.pipeline.CheckGradients(step);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->local_nonfinite, s == 2 ? 1u : 0u) << "step " << s;
  }

  Fixture flip("flip-fault", Options("reduced-gradient:0:step=1"));
  Fixture clean("flip-clean");
  uint64_t digests[2];
  Fixture* both[2] = {&flip, &clean};
  for (int i = 0; i < 2; ++i) {
    const StepContext step{1, 1};
    both[i]->pipeline.BeginStep();
    both[i]->pipeline.AddReducedBucket(step, 0, torch::ones({3}));
    both[i]->pipeline.AddReducedBucket(step, 1, torch::ones({3}));
    absl::StatusOr<StepPipeline::Gradients> g = both[i]->pipeline.CheckGradients(step);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->reduced_nonfinite, 0u) << "a bit flip is a finite error";
    digests[i] = g->reduced_digest;
  }
  EXPECT_NE(digests[0], digests[1]);
}

// A rank holding an error poisons each bucket it hands to the all-reduce
// (NaN survives the SUM: every rank's reduced scan sees it and runs the
// agreement); an error carried from a step's end poisons the next step's.
TEST(StepPipelineTest, AnErrorRidesInTheBucketsAsNaN) {
  Fixture f("poison");
  const StepContext one{1, 1};
  f.pipeline.BeginStep();
  torch::Tensor clean = torch::ones({3});
  f.pipeline.ScanLocalBucket(one, clean);
  EXPECT_TRUE(torch::equal(clean, torch::ones({3}))) << "no error: the bucket is left alone";
  f.pipeline.NoteFailure(absl::InternalError("the hook failed"));
  torch::Tensor after = torch::ones({3});
  f.pipeline.ScanLocalBucket(one, after);
  EXPECT_TRUE(std::isnan(after[0].item<float>()));
  EXPECT_EQ(after[1].item<float>(), 1.0f) << "one element is enough";
  absl::Status taken = f.pipeline.TakeFailure();
  EXPECT_EQ(taken.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(taken.message(), "the hook failed");

  f.pipeline.CarryFailure(absl::DataLossError("late"));
  f.pipeline.BeginStep();
  torch::Tensor next = torch::ones({2});
  f.pipeline.ScanLocalBucket({2, 1}, next);
  EXPECT_TRUE(std::isnan(next[0].item<float>())) << "the carried error rides in step 2";
  taken = f.pipeline.TakeFailure();
  EXPECT_EQ(taken.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(taken.message(), "late");
  f.pipeline.BeginStep();
  torch::Tensor third = torch::ones({2});
  f.pipeline.ScanLocalBucket({3, 1}, third);
  EXPECT_TRUE(torch::equal(third, torch::ones({2}))) << "carried once only";
  EXPECT_TRUE(f.pipeline.TakeFailure().ok());
}

TEST(StepPipelineTest, ActivationFaultsFireAtTheirStepAndReplayFaultsOnlyInReplays) {
  Fixture scale("scale-fault", Options("activation-scale:0:step=3:100"));
  const torch::Tensor x = torch::tensor({1.0f, -4.0f, 2.0f});
  EXPECT_TRUE(torch::equal(scale.pipeline.FaultPoint({2, 1}, x, false), x));
  const torch::Tensor y = scale.pipeline.FaultPoint({3, 1}, x, false);
  EXPECT_TRUE(torch::equal(y, torch::tensor({1.0f, -400.0f, 2.0f}))) << y;

  Fixture replay("replay-fault", Options("replay:0:step=3"));
  EXPECT_TRUE(torch::equal(replay.pipeline.FaultPoint({3, 1}, x, false), x));
  EXPECT_FALSE(torch::equal(replay.pipeline.FaultPoint({3, 1}, x, true), x));
}

}  // namespace
}  // namespace sdc::client
