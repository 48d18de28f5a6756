// WeightCheck on a one-rank Gloo group without a coordinator: when check 3
// runs, what its digest sees, the faults it injects, and when a repair runs.
// (The vote across ranks and a real repair: tests/cluster_*_test.cc.)

#include "client/weight_check.h"

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

// Ranks may hold different newest verdicts when the agreement runs (weight
// checks every step, a verdict per step, exchange steps far apart): rank 0
// heard step 40's, ranks 1 and 2 only step 30's. Each rank once waited for
// the agreement to reach its own newest verdict, so rank 0 stayed out of
// the all-gather the others entered, and the job hung. Now every rank
// repairs at the agreement's minimum, once; a later agreement with nothing
// left to repair broadcasts nothing.
TEST(WeightCheckTest, RanksHoldingDifferentNewestVerdictsRepairAlike) {
  constexpr int kWorld = 3;
  const std::string store =
      (std::filesystem::path(::testing::TempDir()) / "repair_alike_store").string();
  std::filesystem::remove(store);
  std::vector<torch::Tensor> w(kWorld);
  bool repaired[kWorld][3] = {};
  absl::Status status[kWorld];
  uint64_t noted[kWorld] = {};
  GuardSummary summaries[kWorld];
  auto run = [&](int rank) {
    GuardOptions o = Options();
    o.node_name = absl::StrCat("node-", rank);
    EngineContext ctx(o, MakeGlooGroup(store, rank, kWorld, std::chrono::seconds(60)));
    w[rank] = torch::full({3}, rank == 2 ? 9.0f : 1.0f).requires_grad_();  // 2: the minority.
    ModelTensors model = *ModelTensors::Create({{"w"}, {w[rank]}}, {}, {}, true);
    WeightCheck weights(ctx, model, nullptr);
    ASSERT_TRUE(ctx.ExchangeTopology().ok());
    weights.NoteMinority(30, 0, "rank 2 differs");
    if (rank == 0) weights.NoteMinority(40, 1, "rank 2 differs");
    weights.NoteMinority(20, 0, "an older verdict");
    noted[rank] = weights.repair_step();
    Agreement a;
    a.repair_step_known_by_all = 30;  // Rank 1 and 2 have not heard of step 40.
    for (int i = 0; i < 3; ++i) {
      if (i == 2) a.repair_step_known_by_all = 40;  // Everyone has heard of 40 now.
      StepDecision d;
      status[rank].Update(weights.RepairIfAgreed(a, d));
      repaired[rank][i] = d.repaired;
    }
    weights.Summarize(summaries[rank]);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(run, r);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
    EXPECT_EQ(noted[r], r == 0 ? 40u : 30u) << "an older verdict is ignored";
    EXPECT_TRUE(repaired[r][0]) << r << ": the first agreement past the last repair";
    EXPECT_FALSE(repaired[r][1]) << r << ": once per agreed verdict";
    EXPECT_FALSE(repaired[r][2]) << r << ": nothing differs any more";
    EXPECT_EQ(summaries[r].repairs, 1u) << r;
    EXPECT_TRUE(torch::equal(w[r], torch::full({3}, 1.0f))) << "rank " << r << ": " << w[r];
  }
}

// Issue 39, case 8: the repair broadcast the source's weights as they were
// at the vote, without looking at them again. Five ranks: the vote of step
// 40 found rank 4 a minority and named rank 1 a majority source; after the
// vote rank 1's weights went bad too. The repair re-checks every rank's
// digest and copies from rank 0, which holds what the majority (0, 2, 3)
// holds, so nobody gets rank 1's corrupted weights.
TEST(WeightCheckTest, TheRepairRechecksTheSourceAndCopiesFromTheMajority) {
  constexpr int kWorld = 5;
  const std::string store =
      (std::filesystem::path(::testing::TempDir()) / "repair_recheck_store").string();
  std::filesystem::remove(store);
  std::vector<torch::Tensor> w(kWorld);
  bool repaired[kWorld] = {};
  absl::Status status[kWorld];
  auto run = [&](int rank) {
    GuardOptions o = Options();
    o.node_name = absl::StrCat("node-", rank);
    EngineContext ctx(o, MakeGlooGroup(store, rank, kWorld, std::chrono::seconds(60)));
    const float value = rank == 4 ? 9.0f : rank == 1 ? 7.0f : 1.0f;  // 4: the minority; 1: bad since.
    w[rank] = torch::full({3}, value).requires_grad_();
    ModelTensors model =
        *ModelTensors::Create({{"w"}, {w[rank]}}, {}, {}, true);
    WeightCheck weights(ctx, model, nullptr);
    ASSERT_TRUE(ctx.ExchangeTopology().ok());
    weights.NoteMinority(40, /*majority_source=*/1, "rank 4 differs");
    Agreement a;
    a.repair_step_known_by_all = 40;
    StepDecision d;
    status[rank] = weights.RepairIfAgreed(a, d);
    repaired[rank] = d.repaired;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(run, r);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
    EXPECT_TRUE(repaired[r]) << r;
    EXPECT_TRUE(torch::equal(w[r], torch::full({3}, 1.0f))) << "rank " << r << ": " << w[r];
  }
}

// With no strict majority left (ranks 0 and 2 of four agree, 1 went bad
// after the vote, 3 is the minority) nobody's weights are copied.
TEST(WeightCheckTest, NoRepairWithoutAMajorityAfterTheSourceWentBad) {
  constexpr int kWorld = 4;
  const std::string store =
      (std::filesystem::path(::testing::TempDir()) / "repair_no_majority_store").string();
  std::filesystem::remove(store);
  std::vector<torch::Tensor> w(kWorld);
  bool repaired[kWorld] = {};
  auto run = [&](int rank) {
    GuardOptions o = Options();
    o.node_name = absl::StrCat("node-", rank);
    EngineContext ctx(o, MakeGlooGroup(store, rank, kWorld, std::chrono::seconds(60)));
    const float value = rank == 3 ? 9.0f : rank == 1 ? 7.0f : 1.0f;
    w[rank] = torch::full({3}, value).requires_grad_();
    ModelTensors model = *ModelTensors::Create({{"w"}, {w[rank]}}, {}, {}, true);
    WeightCheck weights(ctx, model, nullptr);
    ASSERT_TRUE(ctx.ExchangeTopology().ok());
    weights.NoteMinority(40, /*majority_source=*/1, "rank 3 differs");
    Agreement a;
    a.repair_step_known_by_all = 40;
    StepDecision d;
    EXPECT_TRUE(weights.RepairIfAgreed(a, d).ok());
    repaired[rank] = d.repaired;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(run, r);
  for (std::thread& t : threads) t.join();
  const float expected[kWorld] = {1, 7, 1, 9};
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(repaired[r]) << r;
    EXPECT_TRUE(torch::equal(w[r], torch::full({3}, expected[r]))) << "rank " << r << ": " << w[r];
  }
}

}  // namespace
}  // namespace sdc::client
