// Issue 39, case 4: the replay input (micro-batch, RNG state, buffers)
// travels with a checksum; a replayer that receives it corrupted replays
// nothing and says so (AuditResult.corrupted_transfer). sdcd leaves that
// comparison out and names nobody for it: before, the replayer replayed the
// corrupted input, its replay mismatched, the tie-break (sent intact)
// sided with the subject, and the replayer's GPU was named with a request.

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/testing_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/replay_plan.h"

namespace sdc::core {
namespace {

using testing::Cluster;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::kJob;
using ::testing::SizeIs;

TEST(CorruptedTransferTest, AReplayerThatGotACorruptedBatchIsNotNamed) {
  Cluster cl(3, 2);
  cl.AttachAll();
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  std::vector<Assignment> plan = PlanFullAudit(Topology(cl.Members()), 1).assignments;
  ASSERT_THAT(plan, Not(IsEmpty()));
  const Rank k = plan[0].replayer;
  const Rank s = plan[0].subject;
  for (const Assignment& a : plan) {
    AuditResult o;
    o.role = AuditRole::kOriginal;
    o.subject = a.subject;
    o.loss_bits = o.gradient_digest = Cluster::BatchValue(a.subject);
    ASSERT_TRUE(cl.Send(a.subject, 10, o).ok());
  }
  for (const Assignment& a : plan) {
    AuditResult rp;
    rp.role = AuditRole::kReplay;
    rp.subject = a.subject;
    if (a.replayer == k) {
      rp.corrupted_transfer = true;
    } else {
      rp.loss_bits = rp.gradient_digest = Cluster::BatchValue(a.subject);
    }
    ASSERT_TRUE(cl.Send(a.replayer, 10, rp).ok());
  }
  cl.AllWeights(10);
  EXPECT_THAT(cl.MessagesOf<TieBreakMessage>(), IsEmpty());
  auto verdicts = cl.MessagesOf<AuditVerdictMessage>();
  ASSERT_THAT(verdicts, SizeIs(1)) << "decided at once: nothing more is coming";
  EXPECT_EQ(verdicts[0].outcome, AuditOutcome::kIncomplete);
  EXPECT_THAT(verdicts[0].faulty, IsEmpty());
  EXPECT_THAT(verdicts[0].suspects, IsEmpty());
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "corrupted_transfer");
  EXPECT_THAT(incidents[0].gpus, IsEmpty());
  EXPECT_THAT(incidents[0].explanation,
              HasSubstr(absl::StrCat("rank ", s, "'s micro-batch reached rank ", k, " corrupted")));
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty());
  // A second report of the same replay is a duplicate, not a new result.
  AuditResult again;
  again.role = AuditRole::kReplay;
  again.subject = s;
  again.corrupted_transfer = true;
  EXPECT_TRUE(cl.Send(k, 10, again).ok()) << "after the verdict: taken as late";
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
}

}  // namespace
}  // namespace sdc::core
