#include "daemon/core/weight_vote.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// `count` tensor fingerprints; `differ` lists the indices that get another
// value (by `salt`).
std::vector<Fingerprint> Tensors(size_t count, const std::set<uint32_t>& differ = {},
                                 uint64_t salt = 1) {
  std::vector<Fingerprint> out;
  for (uint32_t t = 0; t < count; ++t) {
    out.push_back({4096 + t, 1000 + t, 2000 + 3 * t});
    if (differ.count(t)) out.back().s1 ^= salt << 8;
  }
  return out;
}

TEST(VoteOutcomeNameTest, Names) {
  EXPECT_STREQ(VoteOutcomeName(VoteOutcome::kPass), "pass");
  EXPECT_STREQ(VoteOutcomeName(VoteOutcome::kMinority), "minority");
  EXPECT_STREQ(VoteOutcomeName(VoteOutcome::kNoMajority), "no_majority");
  EXPECT_STREQ(VoteOutcomeName(VoteOutcome::kIncomplete), "incomplete");
}

// Digest-only ballots (no tensors): what the outcome, majority and the rank
// lists are.
struct DigestCase {
  const char* name;
  std::vector<Rank> members;
  std::vector<DigestBallot> ballots;
  VoteOutcome outcome;
  uint64_t majority_digest;
  Rank majority_source;
  std::vector<Rank> minority;
  std::vector<Rank> missing;
};

TEST(VoteTest, DigestTable) {
  const std::vector<DigestCase> cases = {
      {"pass", {0, 1, 2, 3}, {{0xa, {0, 1, 2, 3}}}, VoteOutcome::kPass, 0xa, 0, {}, {}},
      // Sparse, unordered ranks: the source is the lowest.
      {"pass_sparse_ranks", {17, 5, 9}, {{0xa, {9, 17, 5}}}, VoteOutcome::kPass, 0xa, 5, {}, {}},
      {"single_member", {4}, {{0xa, {4}}}, VoteOutcome::kPass, 0xa, 4, {}, {}},
      // A strict majority arrived, nobody disagrees, one member is missing.
      {"incomplete_with_majority",
       {0, 1, 2, 3, 4},
       {{0xa, {4, 0, 2}}},
       VoteOutcome::kIncomplete,
       0xa,
       0,
       {},
       {1, 3}},
      // Half of the GROUP is not a strict majority, even though every ballot
      // that arrived agrees: no winner. With one distinct value the vote is
      // incomplete, and reports that value and its lowest rank.
      {"half_of_group_agrees_rest_missing",
       {0, 1, 2, 3, 4, 5},
       {{0xa, {5, 1, 3}}},
       VoteOutcome::kIncomplete,
       0xa,
       1,
       {},
       {0, 2, 4}},
      {"no_ballots", {3, 1, 2}, {}, VoteOutcome::kIncomplete, 0, 0, {}, {1, 2, 3}},
      {"minority",
       {0, 1, 2, 3, 4},
       {{0xb, {3}}, {0xa, {0, 1, 2, 4}}},
       VoteOutcome::kMinority,
       0xa,
       0,
       {3},
       {}},
      {"minority_three_of_five",
       {10, 11, 12, 13, 14},
       {{0xa, {12, 13, 14}}, {0xb, {11, 10}}},
       VoteOutcome::kMinority,
       0xa,
       12,
       {10, 11},
       {}},
      {"two_minorities_and_missing",
       {0, 1, 2, 3, 4, 5, 6},
       {{0xc, {6}}, {0xa, {5, 1, 2, 4}}, {0xb, {0}}},
       VoteOutcome::kMinority,
       0xa,
       1,
       {0, 6},
       {3}},
      {"three_of_four",
       {0, 1, 2, 3},
       {{0xa, {0, 1, 3}}, {0xb, {2}}},
       VoteOutcome::kMinority,
       0xa,
       0,
       {2},
       {}},
      {"two_of_three",
       {0, 1, 2},
       {{0xb, {1}}, {0xa, {0, 2}}},
       VoteOutcome::kMinority,
       0xa,
       0,
       {1},
       {}},
      {"two_against_two",
       {0, 1, 2, 3},
       {{0xa, {0, 1}}, {0xb, {2, 3}}},
       VoteOutcome::kNoMajority,
       0,
       0,
       {},
       {}},
      {"one_against_one", {0, 1}, {{0xa, {0}}, {0xb, {1}}}, VoteOutcome::kNoMajority, 0, 0, {}, {}},
      {"three_two_one",
       {0, 1, 2, 3, 4, 5},
       {{0xa, {0, 1, 2}}, {0xb, {3, 4}}, {0xc, {5}}},
       VoteOutcome::kNoMajority,
       0,
       0,
       {},
       {}},
      // Three of six agree, one disagrees, two missing: no strict majority of
      // the group and members disagree.
      {"half_agree_one_differs_two_missing",
       {0, 1, 2, 3, 4, 5},
       {{0xa, {0, 1, 2}}, {0xb, {3}}},
       VoteOutcome::kNoMajority,
       0,
       0,
       {},
       {4, 5}},
  };
  for (const DigestCase& c : cases) {
    SCOPED_TRACE(c.name);
    const VoteResult r = Vote(c.members, c.ballots);
    EXPECT_EQ(r.outcome, c.outcome) << VoteOutcomeName(r.outcome);
    EXPECT_EQ(r.majority_digest, c.majority_digest);
    EXPECT_EQ(r.majority_source, c.majority_source);
    EXPECT_EQ(r.minority, c.minority);
    EXPECT_EQ(r.missing, c.missing);
    EXPECT_THAT(r.differing_tensors, IsEmpty());
  }
}

TEST(VoteTest, MinorityNamesDifferingTensors) {
  const std::vector<Fingerprint> majority = Tensors(12);
  const std::vector<Fingerprint> b = Tensors(12, {5, 2}, 1);
  const std::vector<Fingerprint> c = Tensors(12, {9, 5}, 2);
  const std::vector<Rank> members = {0, 1, 2, 3, 4, 5, 6};
  const std::vector<DigestBallot> ballots = {
      {0xb, {3}, &b}, {0xa, {6, 2, 0, 4}, &majority}, {0xc, {5}, &c}};
  const VoteResult r = Vote(members, ballots);
  EXPECT_EQ(r.outcome, VoteOutcome::kMinority);
  EXPECT_EQ(r.majority_digest, 0xau);
  EXPECT_EQ(r.majority_source, 0u);
  EXPECT_THAT(r.minority, ElementsAre(3, 5));
  EXPECT_THAT(r.missing, ElementsAre(1));
  // The union over the minority ballots, ascending.
  EXPECT_THAT(r.differing_tensors, ElementsAre(2, 5, 9));
}

TEST(VoteTest, DifferingTensorsAreCapped) {
  ASSERT_EQ(kMaxNamedTensors, 8u);
  std::set<uint32_t> differ;
  for (uint32_t t = 30; t > 10; --t) differ.insert(t);  // 11..30
  const std::vector<Fingerprint> majority = Tensors(40);
  const std::vector<Fingerprint> bad = Tensors(40, differ);
  const std::vector<Fingerprint> bad2 = Tensors(40, {3}, 5);
  const std::vector<DigestBallot> ballots = {
      {0xa, {0, 1, 2}, &majority}, {0xb, {3}, &bad}, {0xc, {4}, &bad2}};
  const VoteResult r = Vote(std::vector<Rank>{0, 1, 2, 3, 4}, ballots);
  EXPECT_EQ(r.outcome, VoteOutcome::kMinority);
  EXPECT_THAT(r.differing_tensors, ElementsAre(3, 11, 12, 13, 14, 15, 16, 17));
}

TEST(VoteTest, TensorsAreNamedOnlyWhenComparable) {
  const std::vector<Fingerprint> majority = Tensors(6);
  const std::vector<Fingerprint> bad = Tensors(6, {1});
  const std::vector<Fingerprint> shorter = Tensors(5, {1});
  struct Case {
    const char* name;
    const std::vector<Fingerprint>* majority;
    const std::vector<Fingerprint>* minority;
    std::vector<uint32_t> differing;
  };
  const std::vector<Case> cases = {
      {"both", &majority, &bad, {1}},
      {"minority_digest_only", &majority, nullptr, {}},
      {"majority_digest_only", nullptr, &bad, {}},
      {"different_tensor_counts", &majority, &shorter, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<DigestBallot> ballots = {{0xa, {0, 1}, c.majority}, {0xb, {2}, c.minority}};
    const VoteResult r = Vote(std::vector<Rank>{0, 1, 2}, ballots);
    EXPECT_EQ(r.outcome, VoteOutcome::kMinority);
    EXPECT_THAT(r.minority, ElementsAre(2));
    EXPECT_EQ(r.differing_tensors, c.differing);
  }
}

TEST(VoteTest, NoMajorityNamesNoTensors) {
  const std::vector<Fingerprint> a = Tensors(4), b = Tensors(4, {0, 1, 2, 3});
  const std::vector<DigestBallot> ballots = {{0xa, {0, 1}, &a}, {0xb, {2, 3}, &b}};
  const VoteResult r = Vote(std::vector<Rank>{0, 1, 2, 3}, ballots);
  EXPECT_EQ(r.outcome, VoteOutcome::kNoMajority);
  EXPECT_THAT(r.minority, IsEmpty());
  EXPECT_THAT(r.differing_tensors, IsEmpty());
}

// Issue 24, item 9: with digests alone two corrupt replicas of four (or of
// three) leave no digest a strict majority: 'no_majority', nobody named.
// Tensor by tensor each tensor still has a majority, and the healthy replica
// holds all of them.
TEST(VoteTest, TwoCorruptReplicasAreNamedTensorByTensor) {
  const std::vector<Fingerprint> good = Tensors(6), b = Tensors(6, {1}, 1), c = Tensors(6, {4}, 2);
  VoteResult r = Vote(std::vector<Rank>{0, 1, 2, 3},
                      std::vector<DigestBallot>{{0xa, {0, 3}, &good}, {0xb, {1}, &b}, {0xc, {2}, &c}});
  EXPECT_EQ(r.outcome, VoteOutcome::kMinority);
  EXPECT_TRUE(r.per_tensor);
  EXPECT_EQ(r.majority_digest, 0xau);
  EXPECT_EQ(r.majority_source, 0u);
  EXPECT_THAT(r.minority, ElementsAre(1, 2));
  EXPECT_THAT(r.differing_tensors, ElementsAre(1, 4));
  // Three replicas, two of them corrupt: the healthy one alone.
  r = Vote(std::vector<Rank>{0, 1, 2},
           std::vector<DigestBallot>{{0xb, {0}, &b}, {0xc, {1}, &c}, {0xa, {2}, &good}});
  EXPECT_EQ(r.outcome, VoteOutcome::kMinority);
  EXPECT_EQ(r.majority_source, 2u);
  EXPECT_THAT(r.minority, ElementsAre(0, 1));
}

TEST(VoteTest, PerTensorNeedsOneReplicaHoldingEveryMajority) {
  // Every replica is wrong somewhere: each tensor has a majority, but no
  // replica could repair the others.
  const std::vector<Fingerprint> w = Tensors(4, {0}, 1), x = Tensors(4, {1}, 2),
                                 y = Tensors(4, {2}, 3), z = Tensors(4, {3}, 4);
  const VoteResult r =
      Vote(std::vector<Rank>{0, 1, 2, 3},
           std::vector<DigestBallot>{{1, {0}, &w}, {2, {1}, &x}, {3, {2}, &y}, {4, {3}, &z}});
  EXPECT_EQ(r.outcome, VoteOutcome::kNoMajority);
  EXPECT_THAT(r.minority, IsEmpty());
  // Without tensors there is nothing to vote on.
  const VoteResult digests_only = Vote(
      std::vector<Rank>{0, 1, 2, 3}, std::vector<DigestBallot>{{1, {0, 3}}, {2, {1}}, {3, {2}}});
  EXPECT_EQ(digests_only.outcome, VoteOutcome::kNoMajority);
}

// Random groups of 3..200 ranks (sparse ids, shuffled), a strict minority
// (fewer than half) split over 1..3 corrupted values, and sometimes members
// missing while the majority stays strict.
TEST(VotePropertyTest, FindsExactlyTheMinorityAndItsTensors) {
  std::mt19937_64 rng(0x70de0001);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int with_missing = 0, capped = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    const int n = uniform(3, 200);
    std::set<Rank> ids;
    while (static_cast<int>(ids.size()) < n) ids.insert(static_cast<Rank>(uniform(0, 5 * n)));
    std::vector<Rank> members(ids.begin(), ids.end());
    std::shuffle(members.begin(), members.end(), rng);
    // 2 * minority < n.
    const int minority_size = uniform(1, (n - 1) / 2);
    const size_t tensor_count = uniform(1, 64);
    std::vector<Rank> shuffled = members;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const std::vector<Rank> minority(shuffled.begin(), shuffled.begin() + minority_size);
    std::vector<Rank> majority(shuffled.begin() + minority_size, shuffled.end());
    // Missing majority members, as long as the rest is a strict majority.
    std::vector<Rank> missing;
    if (iter % 3 == 0) {
      const int spare = static_cast<int>(majority.size()) - (n / 2 + 1);
      const int drop = spare > 0 ? uniform(0, spare) : 0;
      missing.assign(majority.end() - drop, majority.end());
      majority.resize(majority.size() - drop);
    }
    ASSERT_GT(2 * majority.size(), static_cast<size_t>(n));

    const std::vector<Fingerprint> good = Tensors(tensor_count);
    const int values = std::min(minority_size, uniform(1, 3));
    std::vector<std::vector<Fingerprint>> bad(values);
    std::vector<DigestBallot> ballots;
    std::set<uint32_t> corrupted;
    for (int v = 0; v < values; ++v) {
      std::set<uint32_t> differ;
      const int k = uniform(1, std::min<int>(12, tensor_count));
      while (static_cast<int>(differ.size()) < k) differ.insert(uniform(0, tensor_count - 1));
      corrupted.insert(differ.begin(), differ.end());
      bad[v] = Tensors(tensor_count, differ, v + 1);
    }
    ballots.push_back({0x600d, majority, &good});
    for (int v = 0; v < values; ++v) ballots.push_back({0xbad0u + v, {}, &bad[v]});
    for (int i = 0; i < minority_size; ++i) {
      // Each value gets at least one rank.
      ballots[1 + (i < values ? i : uniform(0, values - 1))].ranks.push_back(minority[i]);
    }
    std::shuffle(ballots.begin(), ballots.end(), rng);

    SCOPED_TRACE(absl::StrCat("group ", n, ", minority ", minority_size, " over ", values,
                              " values, ", missing.size(), " missing, ", tensor_count, " tensors"));
    const VoteResult r = Vote(members, ballots);
    EXPECT_EQ(r.outcome, VoteOutcome::kMinority);
    EXPECT_EQ(r.majority_digest, 0x600du);
    EXPECT_EQ(r.majority_source, *std::min_element(majority.begin(), majority.end()));
    std::vector<Rank> expected_minority = minority;
    std::sort(expected_minority.begin(), expected_minority.end());
    EXPECT_EQ(r.minority, expected_minority);
    std::sort(missing.begin(), missing.end());
    EXPECT_EQ(r.missing, missing);
    std::vector<uint32_t> expected_tensors(corrupted.begin(), corrupted.end());
    if (expected_tensors.size() > kMaxNamedTensors) {
      expected_tensors.resize(kMaxNamedTensors);
      ++capped;
    }
    EXPECT_EQ(r.differing_tensors, expected_tensors);
    with_missing += !missing.empty();
  }
  EXPECT_GT(with_missing, 100);
  EXPECT_GT(capped, 100);
}

// And the other side of the boundary: a value held by exactly half of the
// group, or less, never wins, whatever the rest holds or whether it arrived.
TEST(VotePropertyTest, HalfIsNeverAMajority) {
  std::mt19937_64 rng(0x70de0002);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int iter = 0; iter < 500; ++iter) {
    const int n = 2 * uniform(2, 100);  // Even, 4..200.
    std::vector<Rank> members(n);
    for (int i = 0; i < n; ++i) members[i] = static_cast<Rank>(3 * i + 1);
    std::shuffle(members.begin(), members.end(), rng);
    const std::vector<Rank> half(members.begin(), members.begin() + n / 2);
    // The other half: another value, split values, or (partly) missing.
    const int other = uniform(0, n / 2);
    std::vector<DigestBallot> ballots = {{0xa, half}};
    if (other > 0)
      ballots.push_back({0xb, {members.begin() + n / 2, members.begin() + n / 2 + other}});
    SCOPED_TRACE(absl::StrCat("group ", n, ", other value held by ", other));
    const VoteResult r = Vote(members, ballots);
    EXPECT_EQ(r.outcome, other > 0 ? VoteOutcome::kNoMajority : VoteOutcome::kIncomplete);
    EXPECT_THAT(r.minority, IsEmpty());
    EXPECT_EQ(r.missing.size(), static_cast<size_t>(n / 2 - other));
  }
}

}  // namespace
}  // namespace sdc::core
