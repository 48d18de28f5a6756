// The whole system under real multi-process training: sdcd plus 6 trainer
// processes (3 nodes x 2 GPUs, CPU, Gloo), launched by the demo's launcher
// in a fast configuration. Every fault kind the client can inject: the right
// check fires on the right step, the right rank and node are blamed, the
// step is skipped on every rank, replicas end identical, checkpoints are
// vetoed, and a replacement request is opened. Facts come from sdcd's admin
// API and the trainers' per-step records, never from prose.

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "demo/launcher.h"
#include "demo/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fast_cluster.h"

namespace sdc::demo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::sdc::testing::FastCluster;

// Every rank took the same decision at every step; returns rank 0's records.
std::map<int, StepRecord> SameDecisions(const ClusterResult& r) {
  std::map<int, StepRecord> steps;
  for (const StepRecord& s : r.ranks[0]) steps[s.step] = s;
  for (size_t rank = 1; rank < r.ranks.size(); ++rank) {
    EXPECT_EQ(r.ranks[rank].size(), r.ranks[0].size()) << "rank " << rank;
    for (const StepRecord& s : r.ranks[rank]) {
      EXPECT_EQ(s.apply, steps[s.step].apply) << "rank " << rank << " step " << s.step;
      EXPECT_EQ(s.checkpoint, steps[s.step].checkpoint) << "rank " << rank << " step " << s.step;
    }
  }
  return steps;
}

void ExpectIdenticalReplicas(const ClusterResult& r) {
  ASSERT_FALSE(r.weight_digests.empty());
  for (const std::string& d : r.weight_digests) {
    EXPECT_FALSE(d.empty());
    EXPECT_EQ(d, r.weight_digests[0]);
  }
}

// The one confirmed incident that names `rank`; fails if others blame anyone else.
const v1::Incident* Blames(const ClusterResult& r, uint32_t rank) {
  const v1::Incident* found = nullptr;
  for (const v1::Incident& i : r.incidents) {
    if (!i.confirmed()) continue;
    EXPECT_THAT(i.ranks(), ElementsAre(rank)) << i.explanation();
    if (found == nullptr) found = &i;
  }
  return found;
}

TEST(ClusterTest, CleanRunRaisesNoAlarm) {
  ClusterConfig c = FastCluster("clean", "");
  absl::StatusOr<ClusterResult> r = RunCluster(c);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto steps = SameDecisions(*r);
  EXPECT_TRUE(r->incidents.empty()) << r->incidents.size() << " incidents";
  EXPECT_TRUE(r->requests.empty());
  EXPECT_TRUE(r->suspects.empty());
  for (const auto& [step, s] : steps) {
    EXPECT_TRUE(s.apply) << step;
    if (s.audited) {
      EXPECT_EQ(s.outcome, "pass") << step;
    }
    if (step % 10 == 0) {
      EXPECT_EQ(s.checkpoint, "allowed") << step;
    }
  }
  EXPECT_LT(steps.rbegin()->second.loss, steps.begin()->second.loss) << "the loss falls";
  ExpectIdenticalReplicas(*r);
  // Checkpoint 20 confirmed checkpoint 10; nothing confirms 20 yet.
  EXPECT_THAT(r->checkpoints_final, ElementsAre(10));
  EXPECT_THAT(r->checkpoints_provisional, ElementsAre(20));
}

TEST(ClusterTest, ActivationTimesTenThousandIsAttributedAndSkipped) {
  absl::StatusOr<ClusterResult> r = RunCluster(FastCluster("activation", "activation-scale:3:step=15:10000"));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto steps = SameDecisions(*r);
  const v1::Incident* i = Blames(*r, 3);
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->check(), v1::CHECK_REPLAY);
  EXPECT_EQ(i->step(), 15u);
  EXPECT_THAT(i->node_names(), ElementsAre("node-b"));
  EXPECT_FALSE(steps.at(15).apply);
  EXPECT_EQ(steps.at(15).reason, "replay audit mismatch");
  EXPECT_EQ(steps.at(10).checkpoint, "allowed");
  EXPECT_EQ(steps.at(20).checkpoint, "vetoed") << "the faulty GPU is still in the job";
  EXPECT_TRUE(r->checkpoints_final.empty());
  EXPECT_TRUE(r->checkpoints_provisional.empty()) << "checkpoint 10 was revoked and deleted";
  ASSERT_EQ(r->requests.size(), 1u);
  EXPECT_EQ(r->requests[0].node_name(), "node-b");
  EXPECT_EQ(r->requests[0].state(), v1::PENDING);
  ExpectIdenticalReplicas(*r);
}

TEST(ClusterTest, NanGradientIsConfirmedByAReplay) {
  absl::StatusOr<ClusterResult> r = RunCluster(FastCluster("nan", "nan-gradient:1:step=12"));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto steps = SameDecisions(*r);
  const v1::Incident* i = Blames(*r, 1);
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->check(), v1::CHECK_NONFINITE);
  EXPECT_EQ(i->step(), 12u);
  EXPECT_THAT(i->node_names(), ElementsAre("node-a"));
  EXPECT_THAT(i->explanation(), HasSubstr("finite gradients"));
  EXPECT_FALSE(steps.at(12).apply);
  EXPECT_EQ(steps.at(12).reason, "NaN/Inf in the local gradients of rank 1");
  ASSERT_EQ(r->requests.size(), 1u);
  ExpectIdenticalReplicas(*r);
}

TEST(ClusterTest, WeightCorruptionIsVotedOutAndRepaired) {
  absl::StatusOr<ClusterResult> r = RunCluster(FastCluster("weight", "weight:4:step=12"));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto steps = SameDecisions(*r);
  const v1::Incident* i = Blames(*r, 4);
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->check(), v1::CHECK_WEIGHTS);
  EXPECT_EQ(i->step(), 15u) << "the next weight check after the corruption";
  EXPECT_THAT(i->node_names(), ElementsAre("node-c"));
  ASSERT_GE(i->differing_tensors_size(), 1);
  bool repaired = false;
  for (const auto& [step, s] : steps) repaired = repaired || (s.repaired && step > 15);
  EXPECT_TRUE(repaired) << "weights restored from the majority";
  EXPECT_EQ(steps.at(10).checkpoint, "allowed");
  EXPECT_EQ(steps.at(20).checkpoint, "vetoed");
  ExpectIdenticalReplicas(*r);
}

// At an exchange step (step 15: an audit step) the agreement compares the
// reduced digests in-band. At an ordinary step no collective does: sdcd's
// reduced-gradient vote names the rank from the step reports, and the step
// is applied (docs/ARCHITECTURE.md, "Ordinary steps issue no collective").
TEST(ClusterTest, ReducedGradientDifferenceIsCaughtOnTheSameStep) {
  absl::StatusOr<ClusterResult> r = RunCluster(FastCluster("reduced", "reduced-gradient:2:step=15"));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto steps = SameDecisions(*r);
  // The receiver is a suspect, not blamed: its own computation is sound, so
  // the targeted audits that follow clear it and no request opens.
  EXPECT_EQ(Blames(*r, 2), nullptr);
  EXPECT_TRUE(r->requests.empty());
  ASSERT_FALSE(r->incidents.empty());
  const v1::Incident& i = r->incidents[0];
  EXPECT_EQ(i.check(), v1::CHECK_REDUCED_GRADIENTS);
  EXPECT_EQ(i.outcome(), "suspect");
  EXPECT_THAT(i.ranks(), ElementsAre(2));
  EXPECT_EQ(i.step(), 15u);
  EXPECT_FALSE(steps.at(15).apply);
  EXPECT_EQ(steps.at(15).reason, "ranks received different reduced gradients");
  ExpectIdenticalReplicas(*r);
}

TEST(ClusterTest, FaultyReplayerIsSettledByATieBreak) {
  absl::StatusOr<ClusterResult> r = RunCluster(FastCluster("replayer", "replay:5:from=10"));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto steps = SameDecisions(*r);
  const v1::Incident* i = Blames(*r, 5);
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->check(), v1::CHECK_REPLAY);
  EXPECT_EQ(i->step(), 10u);
  EXPECT_THAT(i->explanation(), HasSubstr("replay was wrong"));
  EXPECT_FALSE(steps.at(10).apply);
  EXPECT_EQ(steps.at(5).checkpoint, "none") << "no checkpoint asked at step 5";
  ASSERT_GE(r->requests.size(), 1u);
  EXPECT_EQ(r->requests[0].node_name(), "node-c");
  ExpectIdenticalReplicas(*r);
}

// Issue 45 in the C++ front end (sdc::FrontEndOptions::every_step, the
// trainer's --every_step):
// a product error on rank 3 at step 12, a step no replay audit covers
// (audits at 5, 10, ...), is caught by the checksums; every rank skips that
// step with the same reason and trains on; sdcd names rank 3 a suspect; no
// other step and no other rank raises an alarm (the clean part of the run).
TEST(ClusterTest, EveryStepChecksumCatchesAProductErrorOnAnUnauditedStep) {
  ClusterConfig c = FastCluster("every-step", "product:3:step=12:2^-6");
  c.steps = 14;
  c.every_step = true;
  absl::StatusOr<ClusterResult> r = RunCluster(c);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto steps = SameDecisions(*r);
  ASSERT_EQ(steps.size(), 14u);
  for (const auto& [step, s] : steps) {
    EXPECT_EQ(s.apply, step != 12) << step << ": " << s.reason;
  }
  EXPECT_FALSE(steps.at(12).audited);
  EXPECT_THAT(steps.at(12).reason, HasSubstr("step 12 failed on rank 3"));
  EXPECT_THAT(steps.at(12).reason, HasSubstr("checksum alarm at step 12 on rank 3"));
  EXPECT_THAT(steps.at(12).reason, HasSubstr("discrepancy"));
  for (size_t rank = 0; rank < r->ranks.size(); ++rank) {
    for (const StepRecord& s : r->ranks[rank]) {
      if (s.step == 12) EXPECT_EQ(s.reason, steps.at(12).reason) << "rank " << rank;
    }
  }
  ASSERT_EQ(r->guard_summaries.size(), 6u);
  for (size_t rank = 0; rank < 6; ++rank) {
    std::map<std::string, int64_t> g = r->guard_summaries[rank];
    EXPECT_EQ(g["checksum_alarms"], rank == 3 ? 1 : 0) << "rank " << rank;
    EXPECT_EQ(g["checksum_skips"], 1) << "rank " << rank;
    EXPECT_EQ(g["skipped"], 1) << "rank " << rank;
    EXPECT_GE(g["products_checked"], 14) << "rank " << rank;
  }
  ASSERT_EQ(r->injections.size(), 1u);
  EXPECT_THAT(r->injections[0], HasSubstr("rank 3"));
  // sdcd read the alarm from the reason: rank 3 a suspect, not blamed.
  EXPECT_EQ(Blames(*r, 3), nullptr);
  int suspects = 0;
  for (const v1::Incident& i : r->incidents) {
    EXPECT_NE(i.outcome(), "allreduce") << i.explanation();
    if (i.outcome() == "suspect" && i.ranks_size() == 1 && i.ranks(0) == 3) {
      ++suspects;
      EXPECT_EQ(i.step(), 12u);
      EXPECT_THAT(i.explanation(), HasSubstr("discrepancy"));
    }
  }
  EXPECT_EQ(suspects, 1);
  ExpectIdenticalReplicas(*r);
}

// The overhead benchmark's turn-taking: two clusters on one machine run
// their steps in alternating turns, never at the same time, and both finish.
TEST(ClusterTest, ClustersTakeTurns) {
  const std::string turn_file = TestDir("turns") + "/turn";
  { std::ofstream(turn_file) << "plain\n"; }
  auto config = [&](const std::string& name, const std::string& next) {
    ClusterConfig c = FastCluster(name, "");
    c.nodes = 2;
    c.gpus_per_node = 1;
    c.model = "bn-mlp";
    c.steps = 8;
    c.checkpoint_every = 0;
    c.unguarded = name == "plain";
    c.turn_file = turn_file;
    c.turn_name = name;
    c.turn_next = next;
    c.turn_steps = 2;
    return c;
  };
  absl::StatusOr<ClusterResult> plain = absl::UnknownError("not run");
  absl::StatusOr<ClusterResult> guarded = absl::UnknownError("not run");
  std::thread other([&] { guarded = RunCluster(config("guarded", "plain")); });
  plain = RunCluster(config("plain", "guarded"));
  other.join();
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(guarded.ok()) << guarded.status();
  // Every step of every rank, in the order the steps ended.
  std::vector<std::tuple<double, std::string, int>> ended;
  for (const auto& [name, r] : {std::pair{"plain", &*plain}, std::pair{"guarded", &*guarded}}) {
    for (const auto& rank : r->ranks) {
      ASSERT_EQ(rank.size(), 8u) << name;
      for (const StepRecord& s : rank) ended.emplace_back(s.end_unix_ms, name, s.step);
    }
  }
  std::sort(ended.begin(), ended.end());
  // Two steps of one, two of the other: [1, 2] plain, [1, 2] guarded, [3, 4] plain, ...
  std::vector<std::string> turns;
  for (const auto& [when, name, step] : ended) {
    const std::string turn = absl::StrCat(name, " ", (step - 1) / 2);
    if (turns.empty() || turns.back() != turn) turns.push_back(turn);
  }
  EXPECT_THAT(turns, ElementsAre("plain 0", "guarded 0", "plain 1", "guarded 1", "plain 2",
                                 "guarded 2", "plain 3", "guarded 3"));
}

}  // namespace
}  // namespace sdc::demo
