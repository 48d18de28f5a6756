#include "demo/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace sdc::demo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// One rank's decisions for steps 1..n: every step applied unless listed.
std::vector<StepRecord> Steps(int n, std::vector<int> skipped, int repaired_at = -1) {
  std::vector<StepRecord> out;
  for (int s = 1; s <= n; ++s) {
    StepRecord r;
    r.step = s;
    r.apply = std::find(skipped.begin(), skipped.end(), s) == skipped.end();
    r.repaired = s == repaired_at;
    out.push_back(r);
  }
  return out;
}

v1::Incident IncidentAt(int step, v1::CheckKind check) {
  v1::Incident i;
  i.set_step(step);
  i.set_check(check);
  i.set_outcome("mismatch");
  i.set_confirmed(true);
  i.add_ranks(3);
  i.add_node_names("node-b");
  i.add_gpu_uuids("GPU-3");
  return i;
}

ClusterResult Result(std::vector<StepRecord> steps, std::vector<std::string> injections) {
  ClusterResult r;
  r.ranks.push_back(std::move(steps));
  r.injections = std::move(injections);
  r.weight_digests = {"abc", "abc"};
  return r;
}

const Scenario kScenario = {"intermittent", "test", "mantissa-bitflip:{rank}:p=0.2"};

ClusterConfig Config() {
  ClusterConfig c;
  c.fault = "mantissa-bitflip:3:p=0.2";
  return c;
}

TEST(ReportTest, AnInjectionOnAnAppliedStepWithNoIncidentIsTrainedOnUndetected) {
  ClusterResult r = Result(Steps(12, {5}, /*repaired_at=*/10),
                           {"rank 3: INJECTED mantissa-bitflip into an activation at step 3",
                            "rank 3: INJECTED mantissa-bitflip into an activation at step 5",
                            "rank 3: INJECTED a bit flip into weight w after step 7",
                            "rank 3: INJECTED mantissa-bitflip into an activation at step 8 "
                            "(while replaying a peer)",
                            "rank 3: INJECTED mantissa-bitflip into an activation at step 11"});
  r.incidents.push_back(IncidentAt(5, v1::CHECK_REPLAY));
  r.incidents.push_back(IncidentAt(11, v1::CHECK_REPLAY));  // Its step was applied.
  const RunFacts f = Analyze(r, kScenario, Config(), 3);

  ASSERT_EQ(f.injections.size(), 5u);
  EXPECT_EQ(f.injections[0].fate, Fate::kUndetected);
  EXPECT_EQ(f.injections[1].fate, Fate::kCaughtSkipped);
  EXPECT_EQ(f.injections[2].fate, Fate::kCaughtRepaired);
  EXPECT_EQ(f.injections[3].fate, Fate::kReplay);
  EXPECT_EQ(f.injections[4].fate, Fate::kDetectedApplied);
  EXPECT_EQ(f.caught, 2);
  EXPECT_EQ(f.detected_applied, 1);
  EXPECT_THAT(f.undetected_steps, ElementsAre(3));

  const std::string text = SummaryText(f, r, Config(), "");
  EXPECT_THAT(text, HasSubstr("4 into training: 2 caught, 1 detected after they were applied, "
                              "1 trained on undetected (steps 3); 1 into replays of a peer"));
  EXPECT_THAT(text, HasSubstr("1 corruption(s) went into them undetected"));

  // Identical replicas are not a green outcome when corruption went in unseen.
  const std::string html = HtmlReport(f, r, Config());
  EXPECT_THAT(html, HasSubstr("<th>Replicas at the end</th><td class=\"bad\">identical, with 1 "
                              "undetected corruption(s) in all of them"));
  EXPECT_THAT(html, HasSubstr("<th>Corruptions trained on undetected</th><td class=\"bad\">"));
  EXPECT_THAT(html, HasSubstr("<th>Detected</th><td class=\"bad\">"));

  const nlohmann::json j = nlohmann::json::parse(FactsJson(f, r));
  EXPECT_EQ(j["undetected_steps"], nlohmann::json::array({3}));
  EXPECT_EQ(j["injections"][0]["fate"], "TRAINED ON UNDETECTED");
}

TEST(ReportTest, EveryInjectionCaughtIsGreen) {
  ClusterResult r = Result(Steps(12, {5, 9}),
                           {"rank 3: INJECTED mantissa-bitflip into an activation at step 5",
                            "rank 3: INJECTED mantissa-bitflip into an activation at step 9"});
  r.incidents.push_back(IncidentAt(5, v1::CHECK_REPLAY));
  const RunFacts f = Analyze(r, kScenario, Config(), 3);
  EXPECT_EQ(f.caught, 2);
  EXPECT_TRUE(f.undetected_steps.empty());
  const std::string html = HtmlReport(f, r, Config());
  EXPECT_THAT(html, HasSubstr("<th>Replicas at the end</th><td class=\"ok\">identical</td>"));
  EXPECT_THAT(html, HasSubstr("<th>Corruptions trained on undetected</th><td class=\"ok\">none"));
  EXPECT_THAT(SummaryText(f, r, Config(), ""), Not(HasSubstr("went into them undetected")));
}

// Issue 45: the summary says how each caught one was caught (its skipped
// step's reason, short).
TEST(ReportTest, ACaughtInjectionSaysHow) {
  std::vector<StepRecord> steps = Steps(8, {3, 6});
  steps[2].reason = "INTERNAL: step 3 failed on rank 3 and was skipped on every rank: checksum "
                    "alarm at step 3 on rank 3: aten::mm [8, 4] x [4, 32] Float in the forward";
  steps[5].reason = "replay audit mismatch";
  ClusterResult r = Result(steps, {"rank 3: INJECTED a product error into aten::mm at step 3",
                                   "rank 3: INJECTED mantissa-bitflip into an activation at step 6"});
  const RunFacts f = Analyze(r, kScenario, Config(), 3);
  ASSERT_EQ(f.injections.size(), 2u);
  EXPECT_EQ(f.injections[0].how, "checksum alarm at step 3 on rank 3: aten::mm");
  EXPECT_EQ(f.injections[1].how, "replay audit mismatch");
  EXPECT_THAT(SummaryText(f, r, Config(), ""),
              HasSubstr("at step 3  -> caught, step skipped (checksum alarm at step 3 on rank 3: "
                        "aten::mm)\n"));
  const nlohmann::json j = nlohmann::json::parse(FactsJson(f, r));
  EXPECT_EQ(j["injections"][1]["how"], "replay audit mismatch");
  // sdcd files a checksum alarm's suspect as check 2's; the summary says
  // what caught it.
  v1::Incident alarm;
  alarm.set_step(3);
  alarm.set_check(v1::CHECK_REPLAY);
  alarm.set_outcome("suspect");
  alarm.set_explanation(steps[2].reason.substr(10));
  v1::Incident replay = alarm;
  replay.set_step(6);
  replay.set_explanation("rank 3's result was wrong");
  r.incidents = {alarm, replay};
  const std::string text = SummaryText(Analyze(r, kScenario, Config(), 3), r, Config(), "");
  EXPECT_THAT(text, HasSubstr("step 3: every-step product checksum (a replay audit judges), suspect"));
  EXPECT_THAT(text, HasSubstr("step 6: ring replay audit (check 2), suspect"));
}

TEST(ReportTest, AFlipInAReplayersCopyIsNotTrainedOn) {
  ClusterResult r = Result(Steps(12, {}),
                           {"rank 3: INJECTED a flipped bit into the micro-batch sent to rank 1 "
                            "at step 5"});
  const RunFacts f = Analyze(r, kScenario, Config(), 3);
  ASSERT_EQ(f.injections.size(), 1u);
  EXPECT_EQ(f.injections[0].fate, Fate::kNoTrainingValue);
  EXPECT_TRUE(f.undetected_steps.empty());
}

TEST(ReportTest, AWeightFlipNobodyFoundIsUndetected) {
  ClusterResult r = Result(Steps(12, {}),
                           {"rank 3: INJECTED a bit flip into weight w after step 4"});
  r.incidents.push_back(IncidentAt(2, v1::CHECK_WEIGHTS));  // Before the flip: not it.
  const RunFacts f = Analyze(r, kScenario, Config(), 3);
  ASSERT_EQ(f.injections.size(), 1u);
  EXPECT_EQ(f.injections[0].fate, Fate::kUndetected);
  EXPECT_THAT(f.undetected_steps, ElementsAre(4));
}

// FSDP's shard-update fault: applied to a shard no one else holds, so a
// later weights incident (the buddy check) detects it and nothing repairs it.
TEST(ReportTest, ShardedLayoutsFaultsInUnrepairedShardsAreDetectedAfterApplied) {
  const std::string line =
      "rank 3: INJECTED a shard-update fault (element 5 of parameter 15's local shard, "
      "relative 0.0009765625) at step 10";
  ClusterResult found = Result(Steps(20, {11}), {line});
  found.incidents.push_back(IncidentAt(11, v1::CHECK_WEIGHTS));
  const RunFacts f = Analyze(found, kScenario, Config(), 3);
  ASSERT_EQ(f.injections.size(), 1u);
  EXPECT_EQ(f.injections[0].fate, Fate::kDetectedApplied);
  EXPECT_EQ(f.detected_applied, 1);
  EXPECT_TRUE(f.undetected_steps.empty());

  // A flipped weight the at-rest check finds stays flipped (no replica).
  ClusterConfig fsdp = Config();
  fsdp.layout = "fsdp";
  ClusterResult flip = Result(Steps(20, {12}), {"rank 3: INJECTED a bit flip into weight "
                                                "token.weight after step 10"});
  flip.incidents.push_back(IncidentAt(12, v1::CHECK_WEIGHTS));
  EXPECT_EQ(Analyze(flip, kScenario, fsdp, 3).injections[0].fate, Fate::kDetectedApplied);
  EXPECT_EQ(Analyze(flip, kScenario, Config(), 3).injections[0].fate, Fate::kCaughtRepaired);

  ClusterResult missed = Result(Steps(20, {}), {line});
  missed.incidents.push_back(IncidentAt(9, v1::CHECK_WEIGHTS));  // Before the fault: not it.
  const RunFacts g = Analyze(missed, kScenario, Config(), 3);
  EXPECT_EQ(g.injections[0].fate, Fate::kUndetected);
  EXPECT_THAT(g.undetected_steps, ElementsAre(10));
}

}  // namespace
}  // namespace sdc::demo
