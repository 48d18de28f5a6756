// WeightCheck on a one-rank Gloo group without a coordinator: when check 3
// runs, what its digest sees, the faults it injects, and when a repair runs.
// The repair on real Gloo groups (threads), one and two replica groups.
// (The vote across ranks and a real repair end to end: tests/cluster_*_test.cc,
// tests/replica_groups_e2e_test.cc.)

#include "client/weight_check.h"

#include <filesystem>
#include <functional>
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

// One rank of a replica group per thread, on a real Gloo group: each
// rank's value fills its one weight; `verdicts(rank)` says which verdict
// the rank holds before each round (0: none new); each round runs the
// agreement as StepPipeline::Agree does (the real all-reduce of the real
// encoding) and then the repair. Returns each rank's `repaired` per round.
struct GroupsRun {
  std::vector<torch::Tensor> w;
  std::vector<std::vector<bool>> repaired;  // [round][rank]
  std::vector<absl::Status> status;
};
GroupsRun RunGroups(const std::string& name, const std::vector<float>& values,
                    const std::vector<uint32_t>& group_ids, int rounds,
                    const std::function<uint64_t(int rank, int round)>& verdict,
                    uint32_t source_of_group0, uint32_t source_of_group1) {
  const int world = static_cast<int>(values.size());
  const std::string store = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::filesystem::remove(store);
  GroupsRun out;
  out.w.resize(world);
  out.repaired.assign(rounds, std::vector<bool>(world, false));
  out.status.resize(world);
  auto run = [&](int rank) {
    GuardOptions o = Options();
    o.node_name = absl::StrCat("node-", rank);
    o.replica_group = group_ids[rank];
    EngineContext ctx(o, MakeGlooGroup(store, rank, world, std::chrono::seconds(60)));
    out.w[rank] = torch::full({3}, values[rank]).requires_grad_();
    ModelTensors model = *ModelTensors::Create({{"w"}, {out.w[rank]}}, {}, {}, true);
    WeightCheck weights(ctx, model, nullptr);
    ASSERT_TRUE(ctx.ExchangeTopology().ok());
    const ReplicaGroups& groups = ctx.replica_groups();
    const uint32_t mine = groups.index_of(rank);
    for (int round = 0; round < rounds; ++round) {
      if (const uint64_t step = verdict(rank, round); step > 0) {
        weights.NoteMinority(step, mine == 0 ? source_of_group0 : source_of_group1, "test");
      }
      LocalView view;
      view.repair_step = weights.repair_step();
      const uint32_t count = static_cast<uint32_t>(groups.count());
      std::vector<int64_t> words = EncodeAgreement(view, rank, 0, 0, mine, count);
      ctx.AllReduceMax(words);
      StepDecision d;
      absl::Status s = weights.RepairIfAgreed(DecodeAgreement(words, count), d);
      if (!s.ok()) out.status[rank] = s;
      out.repaired[round][rank] = d.repaired;
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(run, r);
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(WeightCheckTest, ARepairWaitsUntilEveryRankOfTheGroupHoldsAVerdict) {
  // Ranks 0 and 2 hold the verdict of step 40 (rank 2 the minority) at
  // round 0, rank 1 only at round 1; round 2 runs with nothing new.
  GroupsRun r = RunGroups(
      "repair_waits", {1, 1, 9}, {0, 0, 0}, 3,
      [](int rank, int round) -> uint64_t { return round == (rank == 1 ? 1 : 0) ? 40 : 0; }, 0, 0);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(r.status[rank].ok()) << rank << ": " << r.status[rank];
    EXPECT_FALSE(r.repaired[0][rank]) << rank << ": rank 1 had not heard of step 40";
    EXPECT_TRUE(r.repaired[1][rank]) << rank;
    EXPECT_FALSE(r.repaired[2][rank]) << rank << ": once per verdict";
    EXPECT_TRUE(torch::equal(r.w[rank], torch::full({3}, 1.0f))) << rank << ": " << r.w[rank];
  }
}

// Ranks may hold different newest verdicts when the agreement runs (weight
// checks every step, a verdict per step, exchange steps far apart): rank 0
// heard step 40's, ranks 1 and 2 only step 30's. A rule of "repair when the
// minimum equals my newest" kept rank 0 out of the all-gather the others
// entered, and the job hung. Now all repair at 30, together; at 40 nothing
// is left to copy.
TEST(WeightCheckTest, RanksHoldingDifferentNewestVerdictsRepairAlike) {
  GroupsRun r = RunGroups(
      "repair_alike", {1, 1, 9}, {0, 0, 0}, 2,
      [](int rank, int round) -> uint64_t {
        if (round == 0) return rank == 0 ? 40 : 30;
        return rank == 0 ? 0 : 40;
      },
      0, 0);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(r.status[rank].ok()) << rank << ": " << r.status[rank];
    EXPECT_TRUE(r.repaired[0][rank]) << rank << ": every rank holds step 30's or newer";
    EXPECT_FALSE(r.repaired[1][rank]) << rank << ": nothing differs any more";
    EXPECT_TRUE(torch::equal(r.w[rank], torch::full({3}, 1.0f))) << rank << ": " << r.w[rank];
  }
}

// Issue 39, case 6: two replica groups on one process group, holding
// different tensors (group 7: ranks 0, 2, 4; group 300: ranks 1, 3, 5).
// sdcd sends a group's verdicts to its ranks only. Round 0: group 7's
// verdict (rank 4 the minority) repairs rank 4 from rank 0 while group 300
// holds none and is left alone. Round 1: both groups due at once (group 300
// now names rank 5, group 7 a newer verdict with nothing left to copy).
TEST(WeightCheckTest, EachReplicaGroupRepairsFromItsOwnMajority) {
  GroupsRun r = RunGroups(
      "repair_groups", {1, 2, 1, 2, 9, 8}, {7, 300, 7, 300, 7, 300}, 3,
      [](int rank, int round) -> uint64_t {
        if (round == 0) return rank % 2 == 0 ? 40 : 0;
        if (round == 1) return 45;
        return 0;
      },
      /*source_of_group0=*/0, /*source_of_group1=*/1);
  const float expected[6] = {1, 2, 1, 2, 1, 2};
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_TRUE(r.status[rank].ok()) << rank << ": " << r.status[rank];
    EXPECT_EQ(r.repaired[0][rank], rank % 2 == 0) << rank << ": only group 7 was due";
    EXPECT_EQ(r.repaired[1][rank], rank % 2 == 1)
        << rank << ": group 300 copied; group 7 had nothing left to copy";
    EXPECT_FALSE(r.repaired[2][rank]) << rank;
    EXPECT_TRUE(torch::equal(r.w[rank], torch::full({3}, expected[rank])))
        << "rank " << rank << ": " << r.w[rank] << " (a copy from the other group's ranks?)";
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
    a.repair_step_by_group = {40};
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

// A repair is verified by fingerprint after the copy. Rank 2's optimizer
// state accessor hands out copies (as an accessor of state that is not
// the optimizer's own storage would), so the copy lands nowhere and rank
// 2 still differs from the source: every rank reads the second
// all-gather alike and skips the step, naming rank 2; no rank counts a
// repair. Sharded options (HSDP: a shard's replicas are the group) take
// the same path.
TEST(WeightCheckTest, ARepairThatDoesNotVerifySkipsTheStepOnEveryRank) {
  constexpr int kWorld = 3;
  const std::string store =
      (std::filesystem::path(::testing::TempDir()) / "repair_verify_store").string();
  std::filesystem::remove(store);
  std::vector<torch::Tensor> w(kWorld);
  StepDecision decisions[kWorld];
  absl::Status status[kWorld];
  auto run = [&](int rank) {
    GuardOptions o = Options();
    o.node_name = absl::StrCat("node-", rank);
    o.shard_count = 2;
    o.shard_index = 0;
    EngineContext ctx(o, MakeGlooGroup(store, rank, kWorld, std::chrono::seconds(60)));
    w[rank] = torch::full({3}, rank == 2 ? 9.0f : 1.0f).requires_grad_();
    const torch::Tensor state = torch::full({2}, rank == 2 ? 5.0f : 4.0f);
    OptimizerStateFn optimizer_state = [state, rank]() -> std::vector<torch::Tensor> {
      return {rank == 2 ? state.clone() : state};
    };
    ModelTensors model = *ModelTensors::Create({{"w"}, {w[rank]}}, {}, {}, true);
    WeightCheck weights(ctx, model, optimizer_state);
    ASSERT_TRUE(ctx.ExchangeTopology().ok());
    weights.NoteMinority(40, /*majority_source=*/0, "rank 2 differs");
    Agreement a;
    a.repair_step_by_group = {40};
    status[rank] = weights.RepairIfAgreed(a, decisions[rank]);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) threads.emplace_back(run, r);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
    EXPECT_FALSE(decisions[r].apply) << r;
    EXPECT_FALSE(decisions[r].repaired) << r;
    EXPECT_NE(decisions[r].reason.find("the weight repair of rank(s) 2 from rank 0 (replica group "
                                       "0, the weight minority of step 40) did not verify"),
              std::string::npos)
        << r << ": " << decisions[r].reason;
    // The weights themselves were copied.
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
    a.repair_step_by_group = {40};
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
