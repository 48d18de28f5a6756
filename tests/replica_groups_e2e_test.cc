// Issue 39, case 6, end to end: two replica groups on one process group
// (SDC_REPLICA_GROUP), with real trainers (6 processes, 3 nodes x 2 GPUs,
// CPU, Gloo) and a real sdcd. Rank r is in group r % 2, so each group has
// one rank on each node; each group's model starts from its own seed, so
// the groups hold different tensors (as pipeline stages would) while one
// all-reduce carries every rank's gradients. Rank 4 (group 0, node-c)
// flips a bit of its weights after step 12: group 0's vote at step 15 names
// it, and the repair at the next exchange step copies group 0's majority
// into it, point to point within group 0, while group 1 is left alone and
// its clean votes raise nothing. Facts come from sdcd's admin API, the
// trainers' step records, final weight digests and logs.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "demo/launcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fast_cluster.h"

namespace sdc::demo {
namespace {

using ::sdc::testing::FastCluster;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ReplicaGroupsE2eTest, AWeightFaultIsRepairedFromItsOwnGroupAndTheOtherIsUntouched) {
  ClusterConfig c = FastCluster("replica-groups", "weight:4:step=12");
  c.replica_groups = 2;
  c.steps = 30;  // Exchange (audit) steps 20, 25 and 30 after the vote of step 15.
  // The run's limit is below the trainers' collective timeout: a repair
  // that left ranks waiting on each other fails here as a hang.
  c.timeout = absl::Minutes(6);
  c.collective_timeout = absl::Minutes(10);
  absl::StatusOr<ClusterResult> r = RunCluster(c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->ranks.size(), 6u);

  // The vote: group 0's ballot of step 15 names rank 4, on node-c; every
  // incident names rank 4 only (group 1's clean votes raise none).
  const v1::Incident* weights = nullptr;
  for (const v1::Incident& i : r->incidents) {
    EXPECT_THAT(i.ranks(), ElementsAre(4u)) << i.explanation();
    if (i.check() == v1::CHECK_WEIGHTS && weights == nullptr) weights = &i;
  }
  ASSERT_NE(weights, nullptr) << r->incidents.size() << " incidents, none of the weight vote";
  EXPECT_TRUE(weights->confirmed());
  EXPECT_EQ(weights->step(), 15u) << "the next weight check after the corruption";
  EXPECT_THAT(weights->node_names(), ElementsAre("node-c"));
  EXPECT_THAT(weights->explanation(), HasSubstr("2 of 3"));

  // Every rank took the same decisions; group 0's ranks repaired at an
  // exchange step after the vote, group 1's never did.
  std::vector<int> repaired_at(6, -1);
  for (size_t rank = 0; rank < 6; ++rank) {
    ASSERT_EQ(r->ranks[rank].size(), r->ranks[0].size()) << rank;
    for (size_t i = 0; i < r->ranks[rank].size(); ++i) {
      const StepRecord& s = r->ranks[rank][i];
      EXPECT_EQ(s.apply, r->ranks[0][i].apply) << "rank " << rank << " step " << s.step;
      if (s.repaired && repaired_at[rank] < 0) repaired_at[rank] = s.step;
      if (s.step == 10) EXPECT_EQ(s.checkpoint, "allowed") << "rank " << rank;
    }
  }
  for (int rank : {0, 2, 4}) {
    EXPECT_GT(repaired_at[rank], 15) << "rank " << rank;
    EXPECT_EQ(repaired_at[rank] % c.audit_every, 0) << "repairs run at exchange steps";
    EXPECT_EQ(repaired_at[rank], repaired_at[0]) << "rank " << rank;
  }
  for (int rank : {1, 3, 5}) EXPECT_EQ(repaired_at[rank], -1) << "rank " << rank;

  // From group 0's majority: rank 0 (its lowest), to rank 4 alone.
  EXPECT_THAT(ReadFile(absl::StrCat(c.run_dir, "/trainer-4.log")),
              HasSubstr("replica group 0: weights, buffers and optimizer state of rank(s) 4 "
                        "restored from rank 0"));

  // Each group ends identical within itself, and the groups still differ:
  // rank 4 holds group 0's model, not group 1's.
  const std::vector<std::string>& d = r->weight_digests;
  ASSERT_EQ(d.size(), 6u);
  EXPECT_EQ(d[0], d[2]);
  EXPECT_EQ(d[0], d[4]) << "rank 4 was repaired from its group";
  EXPECT_EQ(d[1], d[3]);
  EXPECT_EQ(d[1], d[5]);
  EXPECT_NE(d[0], d[1]) << "the two groups hold different tensors";
}

}  // namespace
}  // namespace sdc::demo
