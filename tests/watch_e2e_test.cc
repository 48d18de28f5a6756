// Issue 42 item 4 with real trainers and a real sdcd: a GPU named at an
// early audit keeps corrupting steps intermittently (the demo's
// intermittent fault kind) while its replacement request waits for an
// operator. Before, every such step that no scheduled audit covered was
// trained on by every replica. Now sdcd sends a standing watch once the
// request is open, every rank runs it on each step that runs no other audit
// (a rank of another node replays the named rank's micro-batch), and each
// further corruption is a mismatch that skips its step on every rank.

#include <set>
#include <string>
#include <vector>

#include "demo/launcher.h"
#include "demo/report.h"
#include "demo/scenarios.h"
#include "gtest/gtest.h"
#include "tests/testing/fast_cluster.h"

namespace sdc::demo {
namespace {

using ::sdc::testing::FastCluster;

TEST(WatchE2eTest, AGpuNamedAtAnAuditHasEveryLaterCorruptStepSkipped) {
  // Rank 3 (node-b) corrupts finite values with probability 0.4 per step:
  // at steps 3, 5, 6, 13, 15, 17, 19, 20, 26, 29 and 30 of 30 (a hash of
  // its seed and the step). Step 5 is the first audit.
  ClusterConfig c = FastCluster("watch", "mantissa-bitflip:3:p=0.4");
  c.steps = 30;
  absl::StatusOr<ClusterResult> r = RunCluster(c);
  ASSERT_TRUE(r.ok()) << r.status();
  const RunFacts f = Analyze(*r, *FindScenario("intermittent"), c, 3);
  ASSERT_TRUE(f.detected);
  EXPECT_TRUE(f.attributed_correctly);
  EXPECT_EQ(f.false_alarms, 0);
  ASSERT_EQ(r->requests.size(), 1u);
  EXPECT_EQ(r->requests[0].node_name(), "node-b");
  const int named = f.first_detection_step;
  ASSERT_GT(named, 0);

  // The first audited step after the naming that no schedule audits is
  // the watch's first; from then on every step is audited.
  int watch_from = -1;
  for (const StepRecord& s : r->ranks[0]) {
    if (s.step > named && s.audited && s.step % c.audit_every != 0) {
      watch_from = s.step;
      break;
    }
  }
  ASSERT_GT(watch_from, 0) << "no step after the naming at " << named << " ran the watch";
  std::vector<int> unaudited;
  for (const StepRecord& s : r->ranks[0]) {
    if (s.step >= watch_from && !s.audited) unaudited.push_back(s.step);
  }
  EXPECT_TRUE(unaudited.empty()) << "steps unaudited while the request is open, first "
                                 << unaudited.front();

  // Every corruption of training from then on was caught, its step skipped
  // on every rank, and named in an incident; and there were several.
  std::set<int> skipped(f.skipped_steps.begin(), f.skipped_steps.end());
  int watched = 0;
  for (const Injection& inj : f.injections) {
    if (inj.while_replaying || inj.step < watch_from) continue;
    if (inj.fate == Fate::kNoTrainingValue) continue;
    ++watched;
    EXPECT_EQ(inj.fate, Fate::kCaughtSkipped) << "step " << inj.step << ": " << inj.what;
    EXPECT_EQ(skipped.count(inj.step), 1u) << "step " << inj.step;
    bool incident = false;
    for (const v1::Incident& i : f.incidents) {
      incident |= static_cast<int>(i.step()) == inj.step && i.confirmed() && i.ranks_size() == 1 &&
                  i.ranks(0) == 3;
    }
    EXPECT_TRUE(incident) << "no incident names rank 3 at step " << inj.step;
  }
  EXPECT_GE(watched, 3) << "the watch started at step " << watch_from
                        << ", too late to see the fault's later steps";
  for (int s : f.undetected_steps) {
    EXPECT_LT(s, watch_from) << "step " << s << " was trained on undetected under the watch";
  }
  EXPECT_TRUE(f.weights_identical);
  EXPECT_EQ(f.bad_checkpoints.size(), 0u);
}

}  // namespace
}  // namespace sdc::demo
