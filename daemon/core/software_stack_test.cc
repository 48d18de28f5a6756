// Issue 39, case 3: a node whose software stack differs (another driver,
// cuBLAS or GPU model) computes different but correct results. Its audit
// comparisons with the other nodes mismatch, the tie-breaks side with the
// majority, and it was named faulty with a replacement request. A mismatch
// that follows a stack difference between the compared ranks is software:
// no GPU named, no request, no suspect, a "software_mismatch" incident that
// names the node's stack, and the weights are not suspect (no checkpoint
// veto).

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/testing_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::core {
namespace {

using testing::Cluster;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::kJob;
using ::testing::SizeIs;

const protocol::SoftwareStack kFleet{"535.104", "12.2", "120201", "2.11.0",
                                     "NVIDIA H100 80GB HBM3", ""};
const protocol::SoftwareStack kUpgraded{"550.54", "12.4", "120403", "2.11.0",
                                        "NVIDIA H100 80GB HBM3", ""};

// Every rank says Hello with kFleet's stack, the ranks of `upgraded` with
// kUpgraded's.
void AttachWithStacks(Cluster& cl, const std::set<Rank>& upgraded) {
  for (Rank r = 0; r < cl.world(); ++r) {
    Hello h = cl.HelloOf(r);
    h.software = upgraded.count(r) ? kUpgraded : kFleet;
    ASSERT_TRUE(cl.c().Attach(h, testing::Proven(h)).ok()) << r;
  }
}

// Steps 1..10 clean with an audit at 10 in which `wrong` ranks compute
// every batch (their own, replays, tie-breaks) differently.
void AuditStep10(Cluster& cl, const std::set<Rank>& wrong) {
  for (Step s = 1; s <= 10; ++s) cl.CleanStep(s);
  cl.Audit(10, wrong, wrong);
  for (const TieBreakMessage& t : cl.MessagesOf<TieBreakMessage>()) {
    ASSERT_TRUE(cl.TieBreakResult(t.replayer, t.subject, 10, wrong.count(t.replayer) > 0).ok());
  }
  cl.AllWeights(10);
}

TEST(SoftwareStackTest, ANodeOnAnotherStackIsASoftwareMismatchNotAFaultyGpu) {
  Cluster cl(3, 2);
  AttachWithStacks(cl, {4, 5});  // node-c upgraded its driver and CUDA.
  AuditStep10(cl, {4, 5});
  auto incidents = cl.c().ListIncidents(kJob);
  ASSERT_THAT(incidents, SizeIs(1));
  EXPECT_EQ(incidents[0].outcome, "software_mismatch");
  EXPECT_FALSE(incidents[0].confirmed);
  EXPECT_THAT(incidents[0].gpus, IsEmpty()) << "no GPU named";
  EXPECT_THAT(incidents[0].explanation, HasSubstr("node node-c"));
  EXPECT_THAT(incidents[0].explanation, HasSubstr(kUpgraded.Describe()));
  EXPECT_THAT(incidents[0].explanation, HasSubstr(kFleet.Describe()));
  EXPECT_THAT(cl.c().ListRequests(), IsEmpty());
  EXPECT_THAT(cl.c().ListSuspects(), IsEmpty());
  auto verdicts = cl.MessagesOf<AuditVerdictMessage>();
  ASSERT_THAT(verdicts, Not(IsEmpty()));
  EXPECT_EQ(verdicts.back().outcome, AuditOutcome::kSystemic);
  EXPECT_THAT(verdicts.back().faulty, IsEmpty());
  EXPECT_THAT(verdicts.back().suspects, IsEmpty());
  // The weights are not suspect: the step may be checkpointed.
  auto may = cl.c().MayCheckpoint(kJob, 10);
  ASSERT_TRUE(may.ok()) << may.status();
  EXPECT_TRUE(may->allowed) << may->reason;
}

// The same node, one stack with everyone: its GPUs are named.
TEST(SoftwareStackTest, TheSameMismatchOnOneStackNamesTheGpus) {
  Cluster cl(3, 2);
  AttachWithStacks(cl, {});
  AuditStep10(cl, {4, 5});
  std::set<std::string> named;
  for (const Incident& i : cl.c().ListIncidents(kJob)) {
    if (i.confirmed) named.insert(i.gpus.begin(), i.gpus.end());
  }
  EXPECT_THAT(named, ElementsAre("GPU-4", "GPU-5"));
  auto requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].node, "node-c");
  EXPECT_FALSE(cl.c().MayCheckpoint(kJob, 10)->allowed);
}

// A stack difference elsewhere excuses nothing: rank 3's partners run its
// stack, so its wrong results are its GPU's.
TEST(SoftwareStackTest, AStackDifferenceElsewhereDoesNotExcuseAFaultyGpu) {
  Cluster cl(3, 2);
  Topology t(cl.Members());
  std::set<Rank> partners_of_3;
  for (const Assignment& a : PlanFullAudit(t, 1).assignments) {
    if (a.subject == 3) partners_of_3.insert(a.replayer);
    if (a.replayer == 3) partners_of_3.insert(a.subject);
  }
  std::set<Rank> upgraded;
  for (Rank r = 0; r < cl.world(); ++r) {
    if (r != 3 && !partners_of_3.count(r)) upgraded.insert(r);
  }
  ASSERT_THAT(upgraded, Not(IsEmpty()));
  AttachWithStacks(cl, upgraded);
  AuditStep10(cl, {3});
  auto requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_THAT(requests[0].gpus, ElementsAre("GPU-3"));
  for (const Incident& i : cl.c().ListIncidents(kJob)) EXPECT_NE(i.outcome, "software_mismatch");
}

// Trainers that report no stack (older clients) are never excused.
TEST(SoftwareStackTest, AnUnknownStackExcusesNothing) {
  Cluster cl(3, 2);
  cl.AttachAll();
  AuditStep10(cl, {4});
  auto requests = cl.c().ListRequests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_THAT(requests[0].gpus, ElementsAre("GPU-4"));
}

}  // namespace
}  // namespace sdc::core
