// CheckpointGate on a one-rank Gloo group without a coordinator: the
// fallback policy, the in-band veto after a skipped step, and the ledger.
// (With sdcd: tests/cluster_*_test.cc and tests/python.)

#include "client/checkpoint_gate.h"

#include <string>

#include "client/one_rank_group.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

GuardOptions Options(CheckpointFallback fallback) {
  GuardOptions o;
  o.job_id = "gate";
  o.node_name = "node-a";
  o.checkpoint_fallback = fallback;
  return o;
}

struct Fixture {
  Fixture(const std::string& name, CheckpointFallback fallback)
      : ctx(Options(fallback), OneRankGroup(name)),
        model(*ModelTensors::Create({{"w"}, {torch::ones({3}, torch::requires_grad())}}, {}, {},
                                    true)),
        weights(ctx, model, nullptr),
        gate(ctx) {
    // Collective on the one-rank group; gives the job's fingerprint key.
    EXPECT_TRUE(ctx.ExchangeTopology().ok());
  }
  // The checkpoint weights of `step` sent, as AfterOptimizerStep(true) does.
  StepContext Checkpointed(uint64_t step) {
    weights.BeginStep();
    EXPECT_TRUE(weights.AfterOptimizerStep({step, 1}, /*checkpoint=*/true).ok());
    return {step, 1};
  }
  EngineContext ctx;
  ModelTensors model;
  WeightCheck weights;
  CheckpointGate gate;
};

TEST(CheckpointGateTest, NeedsTheStepsCheckpointWeights) {
  Fixture f("needs", CheckpointFallback::kInBand);
  f.weights.BeginStep();
  EXPECT_EQ(f.gate.MayCheckpoint({1, 1}, f.weights).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointGateTest, WithoutACoordinatorThePolicyVetoes) {
  Fixture f("veto", CheckpointFallback::kVeto);
  absl::StatusOr<bool> allowed = f.gate.MayCheckpoint(f.Checkpointed(10), f.weights);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_FALSE(*allowed);
  GuardSummary s;
  f.gate.Summarize(s);
  EXPECT_EQ(s.checkpoints_vetoed, 1u);
  EXPECT_EQ(s.checkpoints_allowed, 0u);
  EXPECT_EQ(s.last_veto, "no coordinator configured: checkpoints are vetoed by policy");
  EXPECT_EQ(f.gate.Refresh(absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointGateTest, InBandASkippedStepVetoesTheNextCheckpointOnly) {
  Fixture f("in-band", CheckpointFallback::kInBand);
  absl::StatusOr<bool> allowed = f.gate.MayCheckpoint(f.Checkpointed(10), f.weights);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(*allowed);
  EXPECT_EQ(f.gate.ledger().provisional(), std::optional<protocol::Step>(10));

  f.gate.StepSkipped({14, 1}, "NaN/Inf in the reduced gradients");
  f.gate.StepSkipped({15, 1}, "a later failure");
  allowed = f.gate.MayCheckpoint(f.Checkpointed(20), f.weights);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_FALSE(*allowed);
  GuardSummary s;
  f.gate.Summarize(s);
  EXPECT_EQ(s.last_veto,
            "in-band: a check failed since the last checkpoint (step 14: NaN/Inf in the "
            "reduced gradients)");

  allowed = f.gate.MayCheckpoint(f.Checkpointed(30), f.weights);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(*allowed) << "a failure vetoes the first checkpoint after it, not every later one";
  EXPECT_EQ(f.gate.ledger().Of(10), protocol::CheckpointLedger::Standing::kFinal);
  EXPECT_EQ(f.gate.ledger().Of(30), protocol::CheckpointLedger::Standing::kProvisional);
  f.gate.Summarize(s);
  EXPECT_EQ(s.checkpoints_allowed, 2u);
  EXPECT_EQ(s.checkpoints_vetoed, 1u);
}

}  // namespace
}  // namespace sdc::client
