// CheckpointGate on a one-rank Gloo group without a coordinator: the
// fallback policy, the in-band veto after a skipped step, and the ledger.
// (With sdcd: tests/cluster_*_test.cc and tests/python.)

#include "client/checkpoint_gate.h"

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/gloo_group.h"
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

// Issue 39, case 6: replica groups on one process group hold different
// tensors. Four ranks, groups {0, 1} and {2, 3} (SDC_REPLICA_GROUP 1 and
// 257, equal in their low 8 bits): the in-band checkpoint check compared
// digests across groups and vetoed every checkpoint; it compares within
// each group, and still vetoes when two ranks of one group differ.
std::vector<bool> InBandCheckpoint(const std::string& name, const float values[4]) {
  constexpr int kWorld = 4;
  const std::string store = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove(store);
  std::vector<bool> allowed(kWorld, false);
  std::vector<size_t> members(kWorld, 0);
  auto run = [&](int rank) {
    GuardOptions o = Options(CheckpointFallback::kInBand);
    o.node_name = absl::StrCat("node-", rank);
    o.replica_group = rank < 2 ? 1 : 257;
    EngineContext ctx(o, MakeGlooGroup(store, rank, kWorld, std::chrono::seconds(60)));
    ModelTensors model = *ModelTensors::Create(
        {{"w"}, {torch::full({3}, values[rank]).requires_grad_()}}, {}, {}, true);
    WeightCheck weights(ctx, model, nullptr);
    CheckpointGate gate(ctx);
    ASSERT_TRUE(ctx.ExchangeTopology().ok());
    members[rank] = ctx.topology().size();
    weights.BeginStep();
    ASSERT_TRUE(weights.AfterOptimizerStep({10, 1}, /*checkpoint=*/true).ok());
    absl::StatusOr<bool> a = gate.MayCheckpoint({10, 1}, weights);
    ASSERT_TRUE(a.ok()) << a.status();
    allowed[rank] = *a;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(run, r);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(members[r], 2u) << "rank " << r << ": groups 1 and 257 are two groups in-band";
  }
  return allowed;
}

TEST(CheckpointGateTest, ReplicaGroupsCompareDigestsWithinTheirGroupOnly) {
  const float two_groups[4] = {1, 1, 2, 2};
  EXPECT_EQ(InBandCheckpoint("groups_agree", two_groups), std::vector<bool>(4, true));
  const float one_differs[4] = {1, 1, 2, 3};
  EXPECT_EQ(InBandCheckpoint("group_differs", one_differs), std::vector<bool>(4, false));
}

}  // namespace
}  // namespace sdc::client
