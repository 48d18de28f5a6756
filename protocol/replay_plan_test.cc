#include "protocol/replay_plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "protocol/testing_topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::protocol {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using Pairs = std::vector<std::pair<Rank, Rank>>;

// (replayer, subject) pairs in plan order, which gtest prints readably.
Pairs AsPairs(const ReplayPlan& plan) {
  Pairs out;
  for (const Assignment& a : plan.assignments) out.emplace_back(a.replayer, a.subject);
  return out;
}

using testing::Contiguous;

// ---------------------------------------------------------------------------
// Topology

struct ShapeCase {
  const char* name;
  std::vector<int> sizes;
  size_t size;
  int node_count;
  int domain_count;
  AttributionCapability capability;
  std::string describe;
};

TEST(TopologyTest, ShapesTable) {
  const std::vector<ShapeCase> cases = {
      {"empty", {}, 0, 0, 0, AttributionCapability::kNone, "0 node(s) x 0 GPU(s)"},
      {"one_rank", {1}, 1, 1, 1, AttributionCapability::kNone, "1 node(s) x 1 GPU(s)"},
      {"one_node_two_gpus",
       {2},
       2,
       1,
       2,
       AttributionCapability::kDetectOnly,
       "1 node(s) x 2 GPU(s)"},
      {"one_node_three_gpus",
       {3},
       3,
       1,
       3,
       AttributionCapability::kAcrossGpus,
       "1 node(s) x 3 GPU(s)"},
      {"one_node_four_gpus",
       {4},
       4,
       1,
       4,
       AttributionCapability::kAcrossGpus,
       "1 node(s) x 4 GPU(s)"},
      {"two_nodes_one_gpu",
       {1, 1},
       2,
       2,
       2,
       AttributionCapability::kDetectOnly,
       "2 node(s) x 1 GPU(s)"},
      {"two_nodes_eight_gpus",
       {8, 8},
       16,
       2,
       2,
       AttributionCapability::kDetectOnly,
       "2 node(s) x 8 GPU(s)"},
      {"two_nodes_uneven",
       {3, 1},
       4,
       2,
       2,
       AttributionCapability::kDetectOnly,
       "4 GPUs on 2 nodes (1 to 3 per node)"},
      {"three_nodes_one_gpu",
       {1, 1, 1},
       3,
       3,
       3,
       AttributionCapability::kAcrossNodes,
       "3 node(s) x 1 GPU(s)"},
      {"three_nodes_two_gpus",
       {2, 2, 2},
       6,
       3,
       3,
       AttributionCapability::kAcrossNodes,
       "3 node(s) x 2 GPU(s)"},
      {"three_nodes_uneven",
       {2, 3, 1},
       6,
       3,
       3,
       AttributionCapability::kAcrossNodes,
       "6 GPUs on 3 nodes (1 to 3 per node)"},
  };
  for (const ShapeCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Topology t = Contiguous(c.sizes);
    EXPECT_EQ(t.size(), c.size);
    EXPECT_EQ(t.node_count(), c.node_count);
    EXPECT_EQ(t.domain_count(), c.domain_count);
    EXPECT_EQ(t.capability(), c.capability);
    EXPECT_EQ(t.Describe(), c.describe);
  }
}

TEST(TopologyTest, DomainsAreNodesWhenThereAreSeveralNodes) {
  // Members given out of rank order; domains are numbered by node name.
  const Topology t({{5, "zeta"}, {1, "alpha"}, {3, "mid"}, {0, "zeta"}, {4, "alpha"}});
  ASSERT_EQ(t.size(), 5u);
  std::vector<Rank> ranks;
  for (const PlanMember& m : t.members()) ranks.push_back(m.rank);
  EXPECT_THAT(ranks, ElementsAre(0, 1, 3, 4, 5));  // Sorted by rank.
  EXPECT_EQ(t.DomainOf(1), 0);                     // alpha
  EXPECT_EQ(t.DomainOf(4), 0);
  EXPECT_EQ(t.DomainOf(3), 1);  // mid
  EXPECT_EQ(t.DomainOf(0), 2);  // zeta
  EXPECT_EQ(t.DomainOf(5), 2);
  EXPECT_EQ(t.NodeOf(3), "mid");
  EXPECT_EQ(t.NodeOf(5), "zeta");
  EXPECT_TRUE(t.Contains(4));
}

TEST(TopologyTest, DomainsAreGpusOnASingleNode) {
  const Topology t({{7, "solo"}, {2, "solo"}, {9, "solo"}});
  EXPECT_EQ(t.node_count(), 1);
  EXPECT_EQ(t.domain_count(), 3);
  // One domain per GPU, numbered in rank order.
  EXPECT_EQ(t.DomainOf(2), 0);
  EXPECT_EQ(t.DomainOf(7), 1);
  EXPECT_EQ(t.DomainOf(9), 2);
  EXPECT_EQ(t.NodeOf(9), "solo");
}

TEST(TopologyTest, NonMembers) {
  const Topology t({{0, "a"}, {2, "b"}, {4, "c"}});
  for (Rank r : {1u, 3u, 5u, 1000u}) {
    SCOPED_TRACE(r);
    EXPECT_EQ(t.DomainOf(r), -1);
    EXPECT_FALSE(t.Contains(r));
    EXPECT_EQ(t.NodeOf(r), "?");
  }
}

TEST(TopologyTest, CapabilityNames) {
  EXPECT_STREQ(AttributionCapabilityName(AttributionCapability::kAcrossNodes), "across-nodes");
  EXPECT_STREQ(AttributionCapabilityName(AttributionCapability::kAcrossGpus), "across-gpus");
  EXPECT_STREQ(AttributionCapabilityName(AttributionCapability::kDetectOnly), "detect-only");
  EXPECT_STREQ(AttributionCapabilityName(AttributionCapability::kNone), "none");
}

// ---------------------------------------------------------------------------
// PlanFullAudit: exact plans for small topologies, worked out by hand from
// the definition (domains in node-name order, each rotated by the audit
// index, replayer i replays the member `shift` places ahead).

struct PlanCase {
  const char* name;
  std::vector<int> sizes;
  uint64_t audit_index;
  Pairs expected;
  AttributionCapability capability;
  bool cross_domain;
  std::string note;  // Exact.
};

TEST(PlanFullAuditTest, HandComputedPlans) {
  const std::string kTwoByTwoNote =
      "attribution needs 3 failure domains and this group has 2 (2 node(s) x 2 "
      "GPU(s)): mismatches are detected but nobody can be named";
  const std::string kSingleNodeNote =
      "single node: replay partners are other GPUs of the same node, so a fault "
      "common to the whole node cannot be seen";
  const std::vector<PlanCase> cases = {
      {"one_rank",
       {1},
       0,
       {},
       AttributionCapability::kNone,
       true,
       "a single rank has no replay partner"},
      // Two GPUs: the only permutation without self-replay is the swap.
      {"one_node_two_gpus",
       {2},
       0,
       {{0, 1}, {1, 0}},
       AttributionCapability::kDetectOnly,
       true,
       "attribution needs 3 failure domains and this group has 2 (1 node(s) x 2 GPU(s)): "
       "mismatches are detected but nobody can be named"},
      // n = 4, largest 1: shift 1 or 3 (never 2, which pairs mutually).
      {"one_node_four_gpus_index0",
       {4},
       0,
       {{0, 3}, {1, 2}, {2, 0}, {3, 1}},
       AttributionCapability::kAcrossGpus,
       true,
       kSingleNodeNote},
      {"one_node_four_gpus_index1",
       {4},
       1,
       {{0, 2}, {1, 0}, {2, 3}, {3, 1}},
       AttributionCapability::kAcrossGpus,
       true,
       kSingleNodeNote},
      {"two_nodes_two_gpus",
       {2, 2},
       0,
       {{0, 2}, {1, 3}, {2, 0}, {3, 1}},
       AttributionCapability::kDetectOnly,
       true,
       kTwoByTwoNote},
      // One node holds 3 of 4: shift 1; pair (2, 1) stays on n0.
      {"two_nodes_uneven",
       {3, 1},
       0,
       {{0, 2}, {1, 3}, {2, 1}, {3, 0}},
       AttributionCapability::kDetectOnly,
       false,
       "attribution needs 3 failure domains and this group has 2 (4 GPUs on 2 nodes "
       "(1 to 3 per node)): mismatches are detected but nobody can be named"},
      // n = 3: the two 3-cycles.
      {"three_nodes_index0",
       {1, 1, 1},
       0,
       {{0, 2}, {1, 0}, {2, 1}},
       AttributionCapability::kAcrossNodes,
       true,
       ""},
      {"three_nodes_index1",
       {1, 1, 1},
       1,
       {{0, 1}, {1, 2}, {2, 0}},
       AttributionCapability::kAcrossNodes,
       true,
       ""},
      // Golden plans: PlanFullAudit is part of the wire contract (every rank
      // and the coordinator derive the same plan), so its output must never
      // change between versions.
      {"three_by_two_index0",
       {2, 2, 2},
       0,
       {{0, 3}, {1, 2}, {2, 5}, {3, 4}, {4, 0}, {5, 1}},
       AttributionCapability::kAcrossNodes,
       true,
       ""},
      {"three_by_two_index1",
       {2, 2, 2},
       1,
       {{0, 5}, {1, 4}, {2, 0}, {3, 1}, {4, 3}, {5, 2}},
       AttributionCapability::kAcrossNodes,
       true,
       ""},
      // One node holds 3 of 5: shift 5 - 3 = 2, a same-node pair (2, 1).
      {"three_nodes_one_large",
       {3, 1, 1},
       0,
       {{0, 3}, {1, 4}, {2, 1}, {3, 2}, {4, 0}},
       AttributionCapability::kAcrossNodes,
       false,
       "one node holds 3 of 5 ranks: some replay partners share a node"},
  };
  for (const PlanCase& c : cases) {
    SCOPED_TRACE(c.name);
    const ReplayPlan plan = PlanFullAudit(Contiguous(c.sizes), c.audit_index);
    EXPECT_EQ(AsPairs(plan), c.expected);
    EXPECT_EQ(plan.capability, c.capability);
    EXPECT_EQ(plan.cross_domain, c.cross_domain);
    EXPECT_EQ(plan.note, c.note);
  }
}

TEST(PlanFullAuditTest, EmptyTopologyHasNoAssignments) {
  const ReplayPlan plan = PlanFullAudit(Topology({}), 3);
  EXPECT_THAT(plan.assignments, IsEmpty());
  EXPECT_EQ(plan.capability, AttributionCapability::kNone);
}

// ---------------------------------------------------------------------------
// PlanTargetedAudit

struct TargetedCase {
  const char* name;
  std::vector<int> sizes;
  Rank suspect;
  uint64_t audit_index;
  Pairs expected;
};

TEST(PlanTargetedAuditTest, HandComputedPlans) {
  const std::vector<TargetedCase> cases = {
      // Others of rank 2 (node n1): [0, 1, 4, 5]. k = others[i], i' = others[i+1].
      {"three_by_two_index0", {2, 2, 2}, 2, 0, {{0, 2}, {2, 1}}},
      {"three_by_two_index1", {2, 2, 2}, 2, 1, {{1, 2}, {2, 4}}},
      {"three_by_two_index3_wraps", {2, 2, 2}, 2, 3, {{2, 0}, {5, 2}}},
      // A single other-domain rank is both partners.
      {"one_node_two_gpus", {2}, 0, 0, {{0, 1}, {1, 0}}},
      {"two_nodes_one_gpu", {1, 1}, 0, 7, {{0, 1}, {1, 0}}},
      // On one node the other GPUs are the partners.
      {"one_node_three_gpus", {3}, 1, 0, {{0, 1}, {1, 2}}},
      {"one_rank", {1}, 0, 0, {}},
  };
  for (const TargetedCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Topology t = Contiguous(c.sizes);
    const ReplayPlan plan = PlanTargetedAudit(t, c.suspect, c.audit_index);
    EXPECT_EQ(AsPairs(plan), c.expected);
    EXPECT_EQ(plan.capability, t.capability());
  }
}

// ---------------------------------------------------------------------------
// PlanWatch

struct WatchCase {
  const char* name;
  std::vector<int> sizes;
  std::vector<Rank> watched;
  uint64_t salt;
  Pairs expected;
};

TEST(PlanWatchTest, HandComputedPlans) {
  const std::vector<WatchCase> cases = {
      // 3 x 2: n0 = {0, 1}, n1 = {2, 3}, n2 = {4, 5}. Free replayers of 3:
      // [0, 1, 4, 5]; the (salt + 3)th.
      {"one_watched", {2, 2, 2}, {3}, 0, {{5, 3}}},
      {"one_watched_salt1", {2, 2, 2}, {3}, 1, {{0, 3}}},
      // 1's free replayers [2, 4, 5] (3 is watched): 4. Then 3's: [0, 5]
      // (1 watched, 4 busy): 5.
      {"two_watched", {2, 2, 2}, {1, 3}, 0, {{4, 1}, {5, 3}}},
      // Nobody left who is trusted and elsewhere.
      {"two_nodes_both_watched", {1, 1}, {0, 1}, 0, {}},
      {"one_rank", {1}, {0}, 0, {}},
      {"nobody_watched", {2, 2, 2}, {}, 0, {}},
  };
  for (const WatchCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Topology t = Contiguous(c.sizes);
    const ReplayPlan plan = PlanWatch(t, c.watched, c.salt);
    EXPECT_EQ(AsPairs(plan), c.expected);
    EXPECT_EQ(plan.capability, t.capability());
  }
}

TEST(PlanWatchTest, EveryWatchedRankIsReplayedByATrustedRankOfAnotherDomain) {
  for (uint64_t salt = 0; salt < 50; ++salt) {
    const Topology t = Contiguous({4, 4, 4, 4});
    std::vector<Rank> watched;
    for (Rank r = 0; r < 16; ++r) {
      if ((r * 7 + salt) % 5 == 0) watched.push_back(r);
    }
    const ReplayPlan plan = PlanWatch(t, watched, salt);
    std::set<Rank> replayers;
    std::set<Rank> subjects;
    for (const Assignment& a : plan.assignments) {
      EXPECT_NE(t.DomainOf(a.replayer), t.DomainOf(a.subject));
      EXPECT_EQ(std::count(watched.begin(), watched.end(), a.replayer), 0) << a.replayer;
      EXPECT_TRUE(replayers.insert(a.replayer).second) << "replayer " << a.replayer << " twice";
      subjects.insert(a.subject);
    }
    // 16 ranks, at most 4 watched: every watched rank has a replayer.
    EXPECT_EQ(subjects, std::set<Rank>(watched.begin(), watched.end())) << "salt " << salt;
  }
}

// ---------------------------------------------------------------------------
// ChooseTieBreaker / ChooseConfirmer

struct ChooserCase {
  const char* name;
  std::vector<int> sizes;
  Rank a;
  Rank b;  // Ignored by ChooseConfirmer.
  uint64_t salt;
  std::optional<Rank> tiebreaker;
  std::optional<Rank> confirmer;  // For subject `a`.
};

TEST(ChooserTest, Table) {
  const std::vector<ChooserCase> cases = {
      // 3 x 2: n0 = {0, 1}, n1 = {2, 3}, n2 = {4, 5}.
      {"three_by_two_salt0", {2, 2, 2}, 0, 2, 0, 4, 2},
      {"three_by_two_salt1", {2, 2, 2}, 0, 2, 1, 5, 3},
      {"three_by_two_salt2", {2, 2, 2}, 0, 2, 2, 4, 4},
      {"three_by_two_salt5", {2, 2, 2}, 0, 2, 5, 5, 3},
      // a and b on the same node: anyone off that node.
      {"same_node_pair", {2, 2, 2}, 0, 1, 5, 3, 3},
      // Two nodes: no third domain.
      {"two_nodes", {2, 2}, 0, 2, 0, std::nullopt, 2},
      {"two_nodes_salt3", {2, 2}, 0, 2, 3, std::nullopt, 3},
      // One node: GPUs are the domains.
      {"one_node_three_gpus", {3}, 0, 1, 9, 2, 2},
      {"one_node_two_gpus", {2}, 0, 1, 0, std::nullopt, 1},
      {"one_rank", {1}, 0, 0, 0, std::nullopt, std::nullopt},
  };
  for (const ChooserCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Topology t = Contiguous(c.sizes);
    EXPECT_EQ(ChooseTieBreaker(t, c.a, c.b, c.salt), c.tiebreaker);
    EXPECT_EQ(ChooseConfirmer(t, c.a, c.salt), c.confirmer);
  }
}

TEST(ChooserTest, TieBreakerRotatesOverTheWholeThirdDomainSet) {
  // 4 nodes x 2: the tie-breaker for (0 on n0, 2 on n1) ranges over n2 and n3.
  const Topology t = Contiguous({2, 2, 2, 2});
  std::set<Rank> seen;
  for (uint64_t salt = 0; salt < 8; ++salt) {
    std::optional<Rank> r = ChooseTieBreaker(t, 0, 2, salt);
    ASSERT_TRUE(r.has_value());
    seen.insert(*r);
  }
  EXPECT_THAT(seen, ElementsAre(4, 5, 6, 7));
}

// ---------------------------------------------------------------------------
// Property tests over random topologies.

struct RandomGroup {
  std::vector<int> sizes;            // GPUs per node.
  std::map<Rank, std::string> node;  // Ground truth, not read from Topology.
  std::vector<PlanMember> members;
  size_t largest = 0;
  size_t size() const { return node.size(); }
};

// Nodes of the given sizes. Rank ids are distinct but sparse, and dealt to
// nodes in shuffled order; node names are random so their sort order is
// unrelated to creation order; members are handed over shuffled.
RandomGroup MakeGroup(std::mt19937_64& rng, const std::vector<int>& sizes) {
  RandomGroup g;
  g.sizes = sizes;
  size_t n = 0;
  for (int s : sizes) {
    n += s;
    g.largest = std::max<size_t>(g.largest, s);
  }
  std::set<Rank> ids;
  std::uniform_int_distribution<Rank> id(0, static_cast<Rank>(4 * n + 10));
  while (ids.size() < n) ids.insert(id(rng));
  std::vector<Rank> ranks(ids.begin(), ids.end());
  std::shuffle(ranks.begin(), ranks.end(), rng);
  std::set<std::string> names;
  std::uniform_int_distribution<int> name(0, 999999);
  while (names.size() < sizes.size()) names.insert(absl::StrCat("ip-", name(rng)));
  std::vector<std::string> shuffled(names.begin(), names.end());
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  size_t next = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (int k = 0; k < sizes[i]; ++k) {
      const Rank r = ranks[next++];
      g.node[r] = shuffled[i];
      g.members.push_back({r, shuffled[i]});
    }
  }
  std::shuffle(g.members.begin(), g.members.end(), rng);
  return g;
}

int Uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// Node sizes for the property tests, cycling through regimes:
//   0, 1: 3..64 nodes of 1..8 GPUs (uneven);
//   2:    3..64 nodes, all of the same size 1..8;
//   3:    one large node holding exactly half of the ranks (3..5 nodes);
//   4:    one large node holding more than half of the ranks (3..5 nodes).
std::vector<int> RandomSizes(std::mt19937_64& rng, int iter) {
  std::vector<int> sizes;
  switch (iter % 5) {
    case 0:
    case 1: {
      const int nodes = Uniform(rng, 3, 64);
      for (int i = 0; i < nodes; ++i) sizes.push_back(Uniform(rng, 1, 8));
      break;
    }
    case 2: {
      const int nodes = Uniform(rng, 3, 64);
      sizes.assign(nodes, Uniform(rng, 1, 8));
      break;
    }
    default: {
      // Others: 2..3 nodes of 1..2 GPUs (at most 6 ranks), so the large
      // node stays within 8 GPUs.
      const int others = Uniform(rng, 2, 3);
      int rest = 0;
      for (int i = 0; i < others; ++i) {
        sizes.push_back(Uniform(rng, 1, 2));
        rest += sizes.back();
      }
      const int large = iter % 5 == 3 ? rest : rest + Uniform(rng, 1, 8 - rest);
      sizes.insert(sizes.begin() + Uniform(rng, 0, others), large);
      break;
    }
  }
  return sizes;
}

std::string Shape(const RandomGroup& g) {
  return absl::StrCat("node sizes [", absl::StrJoin(g.sizes, ","), "]");
}

// The invariants every full plan of a group of 2+ ranks keeps: a permutation
// without fixed points, sorted by replayer.
void CheckPermutation(const RandomGroup& g, const ReplayPlan& plan) {
  ASSERT_EQ(plan.assignments.size(), g.size());
  std::map<Rank, int> as_replayer, as_subject;
  for (size_t i = 0; i < plan.assignments.size(); ++i) {
    const Assignment& a = plan.assignments[i];
    ASSERT_EQ(g.node.count(a.replayer), 1u) << "replayer " << a.replayer << " not a member";
    ASSERT_EQ(g.node.count(a.subject), 1u) << "subject " << a.subject << " not a member";
    EXPECT_NE(a.replayer, a.subject) << "self-replay by " << a.replayer;
    ++as_replayer[a.replayer];
    ++as_subject[a.subject];
    if (i > 0) {
      EXPECT_LT(plan.assignments[i - 1].replayer, a.replayer) << "not sorted";
    }
  }
  for (const auto& [rank, node] : g.node) {
    EXPECT_EQ(as_replayer[rank], 1)
        << "rank " << rank << " replays " << as_replayer[rank] << " batches";
    EXPECT_EQ(as_subject[rank], 1)
        << "rank " << rank << "'s batch is replayed " << as_subject[rank] << " times";
  }
}

int MutualPairs(const ReplayPlan& plan) {
  std::map<Rank, Rank> subject_of;
  for (const Assignment& a : plan.assignments) subject_of[a.replayer] = a.subject;
  int mutual = 0;
  for (const Assignment& a : plan.assignments) mutual += subject_of[a.subject] == a.replayer;
  return mutual;
}

int SameNodePairs(const RandomGroup& g, const ReplayPlan& plan) {
  int same = 0;
  for (const Assignment& a : plan.assignments) {
    same += g.node.at(a.replayer) == g.node.at(a.subject);
  }
  return same;
}

TEST(PlanFullAuditPropertyTest, MultiNodePlansArePermutationsAcrossNodes) {
  std::mt19937_64 rng(0x5dc0001);
  int half = 0, more_than_half = 0, free_shifts = 0;
  for (int iter = 0; iter < 500; ++iter) {
    const RandomGroup g = MakeGroup(rng, RandomSizes(rng, iter));
    const Topology t(g.members);
    const size_t n = g.size();
    const size_t largest = g.largest;
    SCOPED_TRACE(Shape(g));
    ASSERT_GE(t.node_count(), 3);
    half += n == 2 * largest;
    more_than_half += 2 * largest > n;
    free_shifts += 2 * largest < n;
    for (uint64_t index = 0; index < 6; ++index) {
      SCOPED_TRACE(absl::StrCat("audit index ", index));
      const ReplayPlan plan = PlanFullAudit(t, index);
      CheckPermutation(g, plan);
      EXPECT_EQ(plan.capability, AttributionCapability::kAcrossNodes);
      if (2 * largest <= n) {
        // No node holds more than half of the ranks: every pair crosses nodes.
        EXPECT_TRUE(plan.cross_domain);
        EXPECT_EQ(SameNodePairs(g, plan), 0);
        EXPECT_EQ(plan.note, "");
      } else {
        // The largest node's L ranks can replay at most n - L batches of
        // other nodes, so at least 2L - n pairs stay on it; no more than that.
        EXPECT_FALSE(plan.cross_domain);
        EXPECT_EQ(SameNodePairs(g, plan), static_cast<int>(2 * largest - n));
        EXPECT_EQ(plan.note, absl::StrCat("one node holds ", largest, " of ", n,
                                          " ranks: some replay partners share a node"));
      }
      // Mutual pairs. The plan lays the ranks out node after node and has
      // position i replay position i + s (mod n). Then i + s replays i + 2s,
      // so the pair is mutual exactly when 2s == n. A shift crosses nodes
      // when largest <= s <= n - largest: N - 2*largest + 1 candidate shifts.
      // When that count is at least 2, some candidate is not n/2 and the plan
      // must avoid mutual pairs. Only n == 2*largest leaves the single
      // candidate n/2, which makes every pair mutual. When one node holds
      // more than half, s = n - largest < n/2: never mutual either.
      const int mutual = MutualPairs(plan);
      if (n >= 2 * largest && n - 2 * largest + 1 >= 2) {
        EXPECT_EQ(mutual, 0);
      } else if (n == 2 * largest) {
        EXPECT_EQ(mutual, static_cast<int>(n));
      } else {
        EXPECT_EQ(mutual, 0);
      }
    }
  }
  // The generator reached every regime.
  EXPECT_GE(half, 50);
  EXPECT_GE(more_than_half, 50);
  EXPECT_GE(free_shifts, 200);
}

// Partners are re-drawn for every audit (a portable pseudo-random shuffle of
// domains and ranks, and of the shift), so over time every rank replays
// many different subjects, and keeping the same subject from one audit to
// the next is about as rare as chance allows.
TEST(PlanFullAuditPropertyTest, PartnersChangeFromAuditToAudit) {
  std::mt19937_64 rng(0x5dc0002);
  for (int iter = 0; iter < 300; ++iter) {
    const RandomGroup g = MakeGroup(rng, RandomSizes(rng, iter));
    const Topology t(g.members);
    SCOPED_TRACE(Shape(g));
    constexpr uint64_t kAudits = 40;
    std::map<Rank, std::set<Rank>> subjects;
    std::map<Rank, int> repeats;
    std::vector<Assignment> previous;
    for (uint64_t index = 0; index < kAudits; ++index) {
      const ReplayPlan plan = PlanFullAudit(t, index);
      for (size_t i = 0; i < plan.assignments.size(); ++i) {
        const Assignment& a = plan.assignments[i];
        subjects[a.replayer].insert(a.subject);
        if (!previous.empty() && previous[i].subject == a.subject) ++repeats[a.replayer];
      }
      previous = plan.assignments;
    }
    for (const auto& [rank, seen] : subjects) {
      // Ranks in other domains this rank could replay.
      int choices = 0;
      for (const PlanMember& m : g.members) choices += t.DomainOf(m.rank) != t.DomainOf(rank);
      if (choices < 2) continue;  // A single candidate: nothing to rotate.
      // Some topologies allow only mutual pairs across one big node (e.g.
      // [1,2,1]), which leaves 2 reachable subjects; chance then repeats
      // about half the time.
      EXPECT_GE(seen.size(), 2u) << "rank " << rank;
      EXPECT_LE(repeats[rank], static_cast<int>(kAudits * 3 / 4)) << "rank " << rank;
    }
  }
}

TEST(PlanFullAuditTest, EveryRankGetsSeveralPartnersOverTime) {
  struct Case {
    const char* name;
    std::vector<int> sizes;
  };
  const std::vector<Case> cases = {
      {"four_nodes_2_1_1_1", {2, 1, 1, 1}},
      {"eight_nodes_4_and_seven_singles", {4, 1, 1, 1, 1, 1, 1, 1}},
      {"two_nodes_2_2", {2, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Topology t = Contiguous(c.sizes);
    std::map<Rank, std::set<Rank>> subjects;
    for (uint64_t index = 0; index < 64; ++index) {
      for (const Assignment& a : PlanFullAudit(t, index).assignments) {
        subjects[a.replayer].insert(a.subject);
      }
    }
    for (const auto& [rank, seen] : subjects) {
      // Every rank here has at least 2 ranks on other nodes to replay.
      EXPECT_GE(seen.size(), 2u) << "rank " << rank << " always replays rank " << *seen.begin();
    }
  }
}

TEST(PlanFullAuditPropertyTest, TwoNodesAreDetectOnly) {
  std::mt19937_64 rng(0x5dc0004);
  for (int iter = 0; iter < 200; ++iter) {
    const RandomGroup g = MakeGroup(rng, {Uniform(rng, 1, 8), Uniform(rng, 1, 8)});
    const Topology t(g.members);
    SCOPED_TRACE(Shape(g));
    const size_t n = g.size();
    for (uint64_t index = 0; index < 4; ++index) {
      const ReplayPlan plan = PlanFullAudit(t, index);
      CheckPermutation(g, plan);
      EXPECT_EQ(plan.capability, AttributionCapability::kDetectOnly);
      EXPECT_THAT(plan.note, HasSubstr("attribution needs 3 failure domains"));
      EXPECT_THAT(plan.note, HasSubstr("has 2"));
      EXPECT_EQ(plan.cross_domain, 2 * g.largest <= n);
      EXPECT_EQ(SameNodePairs(g, plan),
                2 * g.largest <= n ? 0 : static_cast<int>(2 * g.largest - n));
    }
  }
}

TEST(PlanFullAuditPropertyTest, OneNodePairsDifferentGpus) {
  std::mt19937_64 rng(0x5dc0005);
  for (int gpus = 2; gpus <= 8; ++gpus) {
    const RandomGroup g = MakeGroup(rng, {gpus});
    const Topology t(g.members);
    SCOPED_TRACE(Shape(g));
    for (uint64_t index = 0; index < 8; ++index) {
      const ReplayPlan plan = PlanFullAudit(t, index);
      CheckPermutation(g, plan);  // Includes replayer != subject: another GPU.
      EXPECT_TRUE(plan.cross_domain);
      EXPECT_EQ(MutualPairs(plan), gpus == 2 ? 2 : 0);
      if (gpus == 2) {
        EXPECT_EQ(plan.capability, AttributionCapability::kDetectOnly);
        EXPECT_THAT(plan.note, HasSubstr("needs 3 failure domains"));
      } else {
        EXPECT_EQ(plan.capability, AttributionCapability::kAcrossGpus);
        EXPECT_THAT(plan.note, HasSubstr("single node"));
      }
    }
  }
}

TEST(PlanTargetedAuditPropertyTest, SuspectHasTwoComparisonsWithOtherDomains) {
  std::mt19937_64 rng(0x5dc0006);
  int distinct = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<int> sizes(Uniform(rng, 1, iter % 3 == 0 ? 3 : 64));
    for (int& s : sizes) s = Uniform(rng, 1, 8);
    const RandomGroup g = MakeGroup(rng, sizes);
    const Topology t(g.members);
    if (t.size() < 2) continue;
    SCOPED_TRACE(Shape(g));
    const Rank suspect = g.members[Uniform(rng, 0, static_cast<int>(g.size()) - 1)].rank;
    // Ranks of another failure domain: other nodes, or other GPUs on one node.
    std::set<Rank> other_domain;
    for (const auto& [rank, node] : g.node) {
      if (g.sizes.size() >= 2 ? node != g.node.at(suspect) : rank != suspect) {
        other_domain.insert(rank);
      }
    }
    for (uint64_t index = 0; index < 5; ++index) {
      const ReplayPlan plan = PlanTargetedAudit(t, suspect, index);
      ASSERT_EQ(plan.assignments.size(), 2u);
      EXPECT_LT(plan.assignments[0].replayer, plan.assignments[1].replayer);
      int as_subject = 0, as_replayer = 0;
      std::optional<Rank> replays_suspect, replayed_by_suspect;
      for (const Assignment& a : plan.assignments) {
        if (a.subject == suspect) {
          ++as_subject;
          replays_suspect = a.replayer;
        }
        if (a.replayer == suspect) {
          ++as_replayer;
          replayed_by_suspect = a.subject;
        }
      }
      ASSERT_EQ(as_subject, 1);
      ASSERT_EQ(as_replayer, 1);
      EXPECT_EQ(other_domain.count(*replays_suspect), 1u);
      EXPECT_EQ(other_domain.count(*replayed_by_suspect), 1u);
      if (other_domain.size() >= 2) {
        EXPECT_NE(*replays_suspect, *replayed_by_suspect);
        ++distinct;
      } else {
        EXPECT_EQ(*replays_suspect, *replayed_by_suspect);
      }
      EXPECT_EQ(plan.capability, t.capability());
    }
  }
  EXPECT_GT(distinct, 1000);
}

TEST(ChooserPropertyTest, TieBreakerIsInAThirdDomain) {
  std::mt19937_64 rng(0x5dc0007);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int> sizes(Uniform(rng, 1, 6));
    for (int& s : sizes) s = Uniform(rng, 1, 4);
    const RandomGroup g = MakeGroup(rng, sizes);
    const Topology t(g.members);
    SCOPED_TRACE(Shape(g));
    const Rank a = g.members[Uniform(rng, 0, static_cast<int>(g.size()) - 1)].rank;
    const Rank b = g.members[Uniform(rng, 0, static_cast<int>(g.size()) - 1)].rank;
    const uint64_t salt = rng();
    const std::optional<Rank> tb = ChooseTieBreaker(t, a, b, salt);
    bool third_exists = false;
    for (const PlanMember& m : t.members()) {
      third_exists = third_exists ||
                     (t.DomainOf(m.rank) != t.DomainOf(a) && t.DomainOf(m.rank) != t.DomainOf(b));
    }
    ASSERT_EQ(tb.has_value(), third_exists);
    if (tb.has_value()) {
      EXPECT_TRUE(t.Contains(*tb));
      EXPECT_NE(t.DomainOf(*tb), t.DomainOf(a));
      EXPECT_NE(t.DomainOf(*tb), t.DomainOf(b));
    }
    const std::optional<Rank> confirmer = ChooseConfirmer(t, a, salt);
    ASSERT_EQ(confirmer.has_value(), t.size() >= 2);
    if (confirmer.has_value()) {
      EXPECT_NE(t.DomainOf(*confirmer), t.DomainOf(a));
    }
  }
}

}  // namespace
}  // namespace sdc::protocol
