#include "protocol/attribution.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "protocol/replay_plan.h"
#include "protocol/testing_topology.h"
#include "protocol/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::protocol {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using EvidenceMap = absl::flat_hash_map<Rank, Evidence>;
using Pairs = std::vector<std::pair<Rank, Rank>>;

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer.
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t DigestOf(const std::vector<Fingerprint>& grads) {
  uint64_t h = 0x5dc;
  for (const Fingerprint& f : grads) h = Mix(h ^ f.byte_length ^ Mix(f.s1) ^ Mix(f.s2 + 1));
  return h;
}

using testing::Contiguous;

ReplayPlan HandPlan(const Pairs& replayer_subject, AttributionCapability capability,
                    std::string note = "") {
  ReplayPlan plan;
  for (const auto& [replayer, subject] : replayer_subject) {
    plan.assignments.push_back({replayer, subject});
  }
  plan.capability = capability;
  plan.note = std::move(note);
  return plan;
}

// A healthy result on rank s's micro-batch, with `params` per-parameter
// gradient fingerprints (none when 0).
Evidence Healthy(Rank s, int params = 0) {
  Evidence e;
  e.loss_bits = Mix(1000 + s);
  for (int p = 0; p < params; ++p) {
    e.gradients.push_back({4096, Mix(s * 131 + p), Mix(s * 137 + p + 7)});
  }
  e.gradient_digest = params > 0 ? DigestOf(e.gradients) : e.loss_bits;
  return e;
}

// Corrupts gradients `params` (loss untouched, as a backward-pass fault), or
// the loss when `params` is empty.
Evidence Corrupt(Evidence e, const std::vector<uint32_t>& params, uint64_t how = 0xbad) {
  if (params.empty()) {
    e.loss_bits ^= how;
    e.gradient_digest ^= how;
    return e;
  }
  for (uint32_t p : params) e.gradients[p].s1 ^= how;
  e.gradient_digest = DigestOf(e.gradients);
  return e;
}

// Healthy originals and replays for a plan: every comparison matches.
struct World {
  EvidenceMap originals;
  EvidenceMap replays;
};

World HealthyWorld(const Topology& t, const ReplayPlan& plan, int params = 0) {
  World w;
  for (const PlanMember& m : t.members()) w.originals[m.rank] = Healthy(m.rank, params);
  for (const Assignment& a : plan.assignments) w.replays[a.replayer] = Healthy(a.subject, params);
  return w;
}

AuditVerdict AttributeWorld(const Topology& t, const ReplayPlan& plan, const World& w,
                            bool compare_gradients = false, uint64_t salt = 0) {
  AuditInput in;
  in.plan = &plan;
  in.topology = &t;
  in.originals = &w.originals;
  in.replays = &w.replays;
  in.compare_gradients = compare_gradients;
  in.salt = salt;
  return Attribute(in);
}

std::vector<std::tuple<Rank, Rank, Rank>> TieBreaks(const AuditVerdict& v) {
  std::vector<std::tuple<Rank, Rank, Rank>> out;
  for (const TieBreak& t : v.tiebreaks) out.emplace_back(t.subject, t.disputed, t.tiebreaker);
  return out;
}

// ---------------------------------------------------------------------------
// Names and IsFailure.

TEST(AttributionNamesTest, Table) {
  const std::vector<std::tuple<AuditOutcome, std::string, bool>> cases = {
      {AuditOutcome::kPass, "pass", false},
      {AuditOutcome::kIncomplete, "incomplete", false},
      {AuditOutcome::kFaulty, "faulty", true},
      {AuditOutcome::kTieBreakPending, "tiebreak_pending", true},
      {AuditOutcome::kInconclusive, "inconclusive", true},
      {AuditOutcome::kSystemic, "systemic", true},
      {AuditOutcome::kAttributionImpossible, "attribution_impossible", true},
  };
  for (const auto& [outcome, name, failure] : cases) {
    SCOPED_TRACE(name);
    EXPECT_EQ(AuditOutcomeName(outcome), name);
    EXPECT_EQ(IsFailure(outcome), failure);
  }
  EXPECT_STREQ(TieBreakOutcomeName(TieBreakOutcome::kSubjectFaulty), "subject_faulty");
  EXPECT_STREQ(TieBreakOutcomeName(TieBreakOutcome::kReplayerFaulty), "replayer_faulty");
  EXPECT_STREQ(TieBreakOutcomeName(TieBreakOutcome::kInconclusive), "inconclusive");
}

// ---------------------------------------------------------------------------
// SameResult

struct SameCase {
  const char* name;
  Evidence a;
  Evidence b;
  bool compare_gradients;
  bool same;
  bool loss_differs;
  std::vector<uint32_t> differing;
};

TEST(SameResultTest, Table) {
  const Evidence base = Healthy(3, 12);
  Evidence other_size = base;
  other_size.gradients.pop_back();
  other_size.gradient_digest = DigestOf(other_size.gradients);
  Evidence same_digest_other_grads = Corrupt(base, {2});
  same_digest_other_grads.gradient_digest = base.gradient_digest;
  Evidence loss_only = base;
  loss_only.loss_bits ^= 1;
  Evidence no_grads_a = Healthy(3), no_grads_b = Healthy(3);
  no_grads_b.gradient_digest ^= 4;
  const std::vector<SameCase> cases = {
      {"identical", base, base, true, true, false, {}},
      {"loss_differs", base, loss_only, true, false, true, {}},
      {"loss_differs_without_gradients", base, loss_only, false, false, true, {}},
      {"gradients_ignored_without_compare", base, Corrupt(base, {1, 3}), false, true, false, {}},
      {"two_parameters", base, Corrupt(base, {3, 1}), true, false, false, {1, 3}},
      {"capped_at_eight",
       base,
       Corrupt(base, {11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}),
       true,
       false,
       false,
       {0, 1, 2, 3, 4, 5, 6, 7}},
      {"size_mismatch_names_nothing", base, other_size, true, false, false, {}},
      {"digests_only", no_grads_a, no_grads_b, true, false, false, {}},
      // The digest decides; per-parameter values are only read to name.
      {"equal_digest_wins", base, same_digest_other_grads, true, true, false, {}},
  };
  ASSERT_EQ(kMaxNamedParameters, 8u);
  for (const SameCase& c : cases) {
    SCOPED_TRACE(c.name);
    bool loss_differs = !c.loss_differs;
    std::vector<uint32_t> differing;
    EXPECT_EQ(SameResult(c.a, c.b, c.compare_gradients, &loss_differs, &differing), c.same);
    EXPECT_EQ(loss_differs, c.loss_differs);
    EXPECT_EQ(differing, c.differing);
    // The optional outputs are optional.
    EXPECT_EQ(SameResult(c.a, c.b, c.compare_gradients), c.same);
  }
}

// ---------------------------------------------------------------------------
// ResolveTieBreak

TEST(ResolveTieBreakTest, Table) {
  const Evidence right = Healthy(1);
  const Evidence wrong = Corrupt(right, {}, 0x10);
  const Evidence wrong2 = Corrupt(right, {}, 0x20);
  struct Case {
    const char* name;
    Evidence original, replay, tiebreak;
    bool compare_gradients;
    TieBreakOutcome expected;
  };
  Evidence grad_a = Healthy(1, 4), grad_b = Corrupt(grad_a, {2});
  const std::vector<Case> cases = {
      {"agrees_with_original", right, wrong, right, false, TieBreakOutcome::kReplayerFaulty},
      {"agrees_with_replay", wrong, right, right, false, TieBreakOutcome::kSubjectFaulty},
      {"agrees_with_neither", wrong, wrong2, right, false, TieBreakOutcome::kInconclusive},
      {"agrees_with_both", right, right, right, false, TieBreakOutcome::kInconclusive},
      {"gradients_decide", grad_a, grad_b, grad_a, true, TieBreakOutcome::kReplayerFaulty},
      {"gradients_decide_subject", grad_b, grad_a, grad_a, true, TieBreakOutcome::kSubjectFaulty},
      // Same loss everywhere and gradients not compared: nothing to decide.
      {"gradients_ignored", grad_a, grad_b, grad_a, false, TieBreakOutcome::kInconclusive},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(ResolveTieBreak(c.original, c.replay, c.tiebreak, c.compare_gradients), c.expected);
  }
}

// ---------------------------------------------------------------------------
// Attribute: hand-made cases, one per rule.

// 3 nodes x 2 GPUs: n0 = {0, 1}, n1 = {2, 3}, n2 = {4, 5}; every rank replays
// the rank two places ahead (PlanFullAudit's plan for audit 0).
const Pairs kRing6 = {{0, 2}, {1, 3}, {2, 4}, {3, 5}, {4, 0}, {5, 1}};

struct RuleCase {
  const char* name;
  std::vector<int> sizes;
  Pairs plan;  // (replayer, subject)
  AttributionCapability capability;
  std::set<Rank> bad_original;
  std::set<Rank> bad_replay;  // By replayer.
  std::set<Rank> no_original;
  std::set<Rank> no_replay;
  uint64_t salt;
  AuditOutcome outcome;
  int mismatches;
  std::vector<Rank> faulty;
  std::vector<Rank> suspects;
  std::vector<Rank> missing;
  std::vector<std::tuple<Rank, Rank, Rank>> tiebreaks;  // (j, k, t)
  std::string explanation;  // Exact when it starts with '=', else a substring.
};

TEST(AttributeTest, Rules) {
  const auto kNodes = AttributionCapability::kAcrossNodes;
  const std::vector<RuleCase> cases = {
      {"pass",
       {2, 2, 2},
       kRing6,
       kNodes,
       {},
       {},
       {},
       {},
       0,
       AuditOutcome::kPass,
       0,
       {},
       {},
       {},
       {},
       "=all 6 comparisons match"},
      {"incomplete",
       {2, 2, 2},
       kRing6,
       kNodes,
       {},
       {},
       {2},
       {5},
       0,
       AuditOutcome::kIncomplete,
       0,
       {},
       {},
       {2, 5},
       {},
       "=no mismatch, but no results from ranks 2, 5"},
      // Rank 2's original (checked by 0) and its replay of 4 both mismatch.
      // Ranks 0 (bad replays) and 4 (bad original) would look the same, so
      // both comparisons go to tie-breaks in a third domain.
      {"faulty_both_comparisons",
       {2, 2, 2},
       kRing6,
       kNodes,
       {2},
       {2},
       {},
       {},
       0,
       AuditOutcome::kTieBreakPending,
       2,
       {},
       {0, 2, 4},
       {},
       {{2, 0, 4}, {4, 2, 0}},
       "=tie-break: rank 4 replays rank 2's micro-batch (disputed by rank 0); rank 0 replays "
       "rank 4's micro-batch (disputed by rank 2)"},
      // Three partners (replayed by 0 and 3, replays 4), all mismatching: no
      // two other faulty ranks explain that, so rank 2 is named at once.
      {"faulty_three_partners",
       {2, 2, 2},
       {{0, 2}, {3, 2}, {2, 4}, {1, 3}, {4, 0}, {5, 1}},
       kNodes,
       {2},
       {2},
       {},
       {},
       0,
       AuditOutcome::kFaulty,
       3,
       {2},
       {},
       {},
       {},
       "=rank(s) 2 mismatch in every comparison they are part of"},
      // C(2, 0) alone: t from n2 = {4, 5}, index (salt + subject) % 2.
      {"lone_mismatch_original",
       {2, 2, 2},
       kRing6,
       kNodes,
       {2},
       {},
       {},
       {},
       0,
       AuditOutcome::kTieBreakPending,
       1,
       {},
       {0, 2},
       {},
       {{2, 0, 4}},
       "=tie-break: rank 4 replays rank 2's micro-batch (disputed by rank 0)"},
      {"lone_mismatch_salt_rotates",
       {2, 2, 2},
       kRing6,
       kNodes,
       {2},
       {},
       {},
       {},
       1,
       AuditOutcome::kTieBreakPending,
       1,
       {},
       {0, 2},
       {},
       {{2, 0, 5}},
       "rank 5 replays"},
      // C(0, 4): rank 4's replay of 0 is wrong; t from n1 = {2, 3}.
      {"lone_mismatch_replay",
       {2, 2, 2},
       kRing6,
       kNodes,
       {},
       {4},
       {},
       {},
       0,
       AuditOutcome::kTieBreakPending,
       1,
       {},
       {0, 4},
       {},
       {{0, 4, 2}},
       "rank 2 replays rank 0"},
      // A missing comparison is not a mismatch: rank 2 is not faulty.
      {"missing_is_not_mismatch",
       {2, 2, 2},
       kRing6,
       kNodes,
       {2},
       {},
       {},
       {2},
       0,
       AuditOutcome::kTieBreakPending,
       1,
       {},
       {0, 2},
       {2},
       {{2, 0, 4}},
       "tie-break"},
      // Faulty rank 2 explains its two mismatches; C(1, 5) still needs a
      // tie-break (t from n1 = {2, 3}, index (0 + 1) % 2), and the faulty rank
      // is never a suspect.
      {"faulty_and_lone_mismatch",
       {2, 2, 2},
       kRing6,
       kNodes,
       {2},
       {2, 5},
       {},
       {},
       0,
       AuditOutcome::kTieBreakPending,
       3,
       {},
       {0, 1, 2, 4, 5},
       {},
       {{2, 0, 4}, {4, 2, 0}, {1, 5, 3}},
       "=tie-break: rank 4 replays rank 2's micro-batch (disputed by rank 0); rank 0 replays "
       "rank 4's micro-batch (disputed by rank 2); rank 3 replays rank 1's micro-batch "
       "(disputed by rank 5)"},
      // A mutual pair: ranks 0 and 2 each mismatch twice but with a single
      // partner, so nobody is faulty; both comparisons go to tie-breaks.
      {"mutual_pair_needs_tiebreaks",
       {2, 2, 2},
       {{0, 2}, {1, 4}, {2, 0}, {3, 5}, {4, 1}, {5, 3}},
       kNodes,
       {0},
       {0},
       {},
       {},
       0,
       AuditOutcome::kTieBreakPending,
       2,
       {},
       {0, 2},
       {},
       {{2, 0, 4}, {0, 2, 4}},
       "tie-break"},
      // Two nodes but a plan claiming attribution: no third domain exists.
      {"no_third_domain",
       {2, 2},
       {{0, 2}, {1, 3}, {2, 0}, {3, 1}},
       kNodes,
       {2},
       {},
       {},
       {},
       0,
       AuditOutcome::kInconclusive,
       1,
       {},
       {0, 2},
       {},
       {},
       "=no third failure domain for a tie-break"},
      {"two_domains_impossible",
       {2, 2},
       {{0, 2}, {1, 3}, {2, 0}, {3, 1}},
       AttributionCapability::kDetectOnly,
       {2},
       {2},
       {},
       {},
       0,
       AuditOutcome::kAttributionImpossible,
       2,
       {},
       {0, 2},
       {},
       {},
       "=2 comparison(s) mismatch; NOTE"},
      {"one_node_two_gpus_impossible",
       {2},
       {{0, 1}, {1, 0}},
       AttributionCapability::kDetectOnly,
       {},
       {1},
       {},
       {},
       0,
       AuditOutcome::kAttributionImpossible,
       1,
       {},
       {0, 1},
       {},
       {},
       "1 comparison(s) mismatch"},
      // GPUs of one node are domains: t is the third GPU.
      {"one_node_three_gpus",
       {3},
       {{0, 1}, {1, 2}, {2, 0}},
       AttributionCapability::kAcrossGpus,
       {1},
       {},
       {},
       {},
       0,
       AuditOutcome::kTieBreakPending,
       1,
       {},
       {0, 1},
       {},
       {{1, 0, 2}},
       "rank 2 replays rank 1"},
  };
  for (const RuleCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Topology t = Contiguous(c.sizes);
    const ReplayPlan plan = HandPlan(c.plan, c.capability, "NOTE");
    World w = HealthyWorld(t, plan);
    for (Rank r : c.bad_original) w.originals[r] = Corrupt(w.originals[r], {}, 0x100 + r);
    for (Rank r : c.bad_replay) w.replays[r] = Corrupt(w.replays[r], {}, 0x200 + r);
    for (Rank r : c.no_original) w.originals.erase(r);
    for (Rank r : c.no_replay) w.replays.erase(r);
    const AuditVerdict v = AttributeWorld(t, plan, w, false, c.salt);
    EXPECT_EQ(v.outcome, c.outcome) << AuditOutcomeName(v.outcome);
    EXPECT_EQ(v.mismatches, c.mismatches);
    EXPECT_EQ(v.faulty, c.faulty);
    EXPECT_EQ(v.suspects, c.suspects);
    EXPECT_EQ(v.missing, c.missing);
    EXPECT_EQ(TieBreaks(v), c.tiebreaks);
    EXPECT_THAT(v.differing_parameters, IsEmpty());
    if (c.explanation[0] == '=') {
      EXPECT_EQ(v.explanation, c.explanation.substr(1));
    } else {
      EXPECT_THAT(v.explanation, HasSubstr(c.explanation));
    }
    // One comparison per assignment, in plan order, each in the right state.
    ASSERT_EQ(v.comparisons.size(), plan.assignments.size());
    int mismatched = 0;
    for (size_t i = 0; i < plan.assignments.size(); ++i) {
      const Comparison& cmp = v.comparisons[i];
      EXPECT_EQ(cmp.replayer, plan.assignments[i].replayer);
      EXPECT_EQ(cmp.subject, plan.assignments[i].subject);
      const bool missing = c.no_original.count(cmp.subject) || c.no_replay.count(cmp.replayer);
      const bool bad = c.bad_original.count(cmp.subject) || c.bad_replay.count(cmp.replayer);
      const auto expected = missing ? Comparison::State::kMissing
                            : bad   ? Comparison::State::kMismatch
                                    : Comparison::State::kMatch;
      EXPECT_EQ(cmp.state, expected) << "C(" << cmp.subject << ", " << cmp.replayer << ")";
      EXPECT_EQ(cmp.loss_differs, expected == Comparison::State::kMismatch);
      mismatched += expected == Comparison::State::kMismatch;
    }
    EXPECT_EQ(mismatched, c.mismatches);
  }
}

TEST(AttributeTest, DetectOnlyPlanFromPlannerExplainsWhy) {
  const Topology t = Contiguous({2, 2});
  const ReplayPlan plan = PlanFullAudit(t, 0);
  World w = HealthyWorld(t, plan);
  w.originals[3] = Corrupt(w.originals[3], {});
  const AuditVerdict v = AttributeWorld(t, plan, w);
  EXPECT_EQ(v.outcome, AuditOutcome::kAttributionImpossible);
  EXPECT_THAT(v.faulty, IsEmpty());
  EXPECT_THAT(v.suspects, ElementsAre(1, 3));  // 1 replays 3 (2 x 2, shift 2).
  EXPECT_EQ(v.explanation,
            "1 comparison(s) mismatch; attribution needs 3 failure domains and this group "
            "has 2 (2 node(s) x 2 GPU(s)): mismatches are detected but nobody can be named");
}

// A 12-rank ring over 3 nodes of 4 (n0 = 0..3, n1 = 4..7, n2 = 8..11) visiting
// the nodes in turn, so every pair crosses nodes and it is a single cycle:
// order 0, 4, 8, 1, 5, 9, ...; order[i] replays order[i + 1].
Pairs InterleavedRing(int nodes, int gpus) {
  std::vector<Rank> order;
  for (int i = 0; i < nodes * gpus; ++i) order.push_back((i % nodes) * gpus + i / nodes);
  Pairs out;
  for (size_t i = 0; i < order.size(); ++i)
    out.emplace_back(order[i], order[(i + 1) % order.size()]);
  std::sort(out.begin(), out.end());
  return out;
}

// The subjects of every other assignment along the ring: corrupting their
// originals gives lone mismatches (no rank has both comparisons wrong).
std::vector<Rank> EveryOtherOnRing(int nodes, int gpus) {
  std::vector<Rank> out;
  for (int i = 0; i < nodes * gpus; i += 2) out.push_back((i % nodes) * gpus + i / nodes);
  return out;
}

TEST(AttributeTest, SystemicByCount) {
  struct Case {
    int nodes, gpus;
    int mismatches;
    bool systemic;
  };
  // Over max(4, comparisons / 4) mismatches is systemic.
  const std::vector<Case> cases = {
      {3, 4, 4, false},  // 12 comparisons: threshold max(4, 3) = 4.
      {3, 4, 5, true},   {3, 4, 6, true},  {4, 10, 10, false},  // 40 comparisons: threshold 10.
      {4, 10, 11, true}, {3, 2, 3, false},                      // 6 comparisons: threshold 4.
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.nodes, " x ", c.gpus, ", ", c.mismatches, " mismatches"));
    const Topology t = Contiguous(std::vector<int>(c.nodes, c.gpus));
    const ReplayPlan plan =
        HandPlan(InterleavedRing(c.nodes, c.gpus), AttributionCapability::kAcrossNodes);
    World w = HealthyWorld(t, plan);
    const std::vector<Rank> bad = EveryOtherOnRing(c.nodes, c.gpus);
    ASSERT_GE(bad.size(), static_cast<size_t>(c.mismatches));
    for (int i = 0; i < c.mismatches; ++i) {
      w.originals[bad[i]] = Corrupt(w.originals[bad[i]], {}, 0x40 + i);
    }
    const AuditVerdict v = AttributeWorld(t, plan, w);
    EXPECT_EQ(v.mismatches, c.mismatches);
    if (c.systemic) {
      EXPECT_EQ(v.outcome, AuditOutcome::kSystemic);
      EXPECT_THAT(v.faulty, IsEmpty());
      EXPECT_THAT(v.suspects, IsEmpty());
      EXPECT_THAT(v.tiebreaks, IsEmpty());
      EXPECT_EQ(v.explanation,
                absl::StrCat(c.mismatches, " of ", c.nodes * c.gpus,
                             " comparisons mismatch: non-determinism or a software change, "
                             "not one GPU; nobody is blamed"));
    } else {
      EXPECT_EQ(v.outcome, AuditOutcome::kTieBreakPending);
      EXPECT_EQ(v.tiebreaks.size(), static_cast<size_t>(c.mismatches));
      EXPECT_EQ(v.suspects.size(), static_cast<size_t>(2 * c.mismatches));
    }
  }
}

// Issue 24, item 2: in a group of 4 or fewer ranks the count rule (over
// max(4, n/4) mismatches) cannot fire, so non-determinism that makes every
// comparison mismatch blamed healthy ranks. Issue 39, case 2: calling it
// systemic instead hid two faulty GPUs, which look the same there. Nobody
// is named and no tie-break is asked (a replay that differs from every
// original would name every subject); every rank is a suspect.
TEST(AttributeTest, SmallGroupWhereEveryComparisonMismatchesSuspectsEveryRank) {
  for (int nodes : {3, 4}) {
    SCOPED_TRACE(absl::StrCat(nodes, " ranks"));
    const Topology t = Contiguous(std::vector<int>(nodes, 1));
    const ReplayPlan plan =
        HandPlan(InterleavedRing(nodes, 1), AttributionCapability::kAcrossNodes);
    World w = HealthyWorld(t, plan);
    for (Rank r = 0; r < static_cast<Rank>(nodes); ++r) {
      w.originals[r] = Corrupt(w.originals[r], {}, 0x70 + r);
    }
    const AuditVerdict v = AttributeWorld(t, plan, w);
    EXPECT_EQ(v.mismatches, nodes);
    EXPECT_EQ(v.outcome, AuditOutcome::kInconclusive);
    EXPECT_TRUE(IsFailure(v.outcome));
    EXPECT_THAT(v.faulty, IsEmpty());
    EXPECT_THAT(v.tiebreaks, IsEmpty());
    std::vector<Rank> all(nodes);
    for (int r = 0; r < nodes; ++r) all[r] = r;
    EXPECT_EQ(v.suspects, all);
    EXPECT_THAT(v.explanation, HasSubstr("two faulty GPUs or non-determinism"));
  }
}

TEST(AttributeTest, SystemicBySameParametersWithoutCommonRank) {
  constexpr int kParams = 6;
  struct Case {
    const char* name;
    std::vector<std::vector<uint32_t>> corrupted;  // Per bad original, in ring order.
    AuditOutcome outcome;
  };
  const std::vector<Case> cases = {
      {"three_same", {{3}, {3}, {3}}, AuditOutcome::kSystemic},
      {"four_same_pair", {{1, 4}, {1, 4}, {1, 4}, {1, 4}}, AuditOutcome::kSystemic},
      {"two_same_is_too_few", {{3}, {3}}, AuditOutcome::kTieBreakPending},
      {"one_differs", {{3}, {3}, {3, 4}}, AuditOutcome::kTieBreakPending},
  };
  const Topology t = Contiguous({4, 4, 4});
  const ReplayPlan plan = HandPlan(InterleavedRing(3, 4), AttributionCapability::kAcrossNodes);
  const std::vector<Rank> bad = EveryOtherOnRing(3, 4);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    World w = HealthyWorld(t, plan, kParams);
    for (size_t i = 0; i < c.corrupted.size(); ++i) {
      w.originals[bad[i]] = Corrupt(w.originals[bad[i]], c.corrupted[i], 0x77 + i);
    }
    const AuditVerdict v = AttributeWorld(t, plan, w, /*compare_gradients=*/true);
    EXPECT_EQ(v.outcome, c.outcome) << AuditOutcomeName(v.outcome);
    EXPECT_EQ(v.mismatches, static_cast<int>(c.corrupted.size()));
    EXPECT_THAT(v.faulty, IsEmpty());
    for (const Comparison& cmp : v.comparisons) EXPECT_FALSE(cmp.loss_differs);
    if (c.outcome == AuditOutcome::kSystemic) {
      EXPECT_THAT(v.suspects, IsEmpty());
      EXPECT_EQ(v.differing_parameters, c.corrupted[0]);
    }
    // Without deterministic kernels the same (gradient-only) corruption is
    // invisible.
    EXPECT_EQ(AttributeWorld(t, plan, w, /*compare_gradients=*/false).outcome, AuditOutcome::kPass);
  }
}

TEST(AttributeTest, SameParametersWithACommonRankIsThatRank) {
  // Rank 0 takes part in four comparisons with three partners (a hand-made
  // plan) that all differ in parameter 3: one GPU, not non-determinism.
  const Topology t = Contiguous({2, 2, 2});
  const ReplayPlan plan =
      HandPlan({{0, 2}, {2, 0}, {4, 0}, {5, 0}}, AttributionCapability::kAcrossNodes);
  World w = HealthyWorld(t, plan, 6);
  w.originals[0] = Corrupt(w.originals[0], {3}, 0x1);
  w.replays[0] = Corrupt(w.replays[0], {3}, 0x2);
  const AuditVerdict v = AttributeWorld(t, plan, w, true);
  EXPECT_EQ(v.mismatches, 4);
  EXPECT_EQ(v.outcome, AuditOutcome::kFaulty);
  EXPECT_THAT(v.faulty, ElementsAre(0));
  EXPECT_THAT(v.suspects, IsEmpty());
  EXPECT_THAT(v.differing_parameters, ElementsAre(3));
}

TEST(AttributeTest, DifferingParametersAreNamedAndCapped) {
  const Topology t = Contiguous({2, 2, 2});
  const ReplayPlan plan = HandPlan(kRing6, AttributionCapability::kAcrossNodes);
  World w = HealthyWorld(t, plan, 16);
  // C(2, 0): parameters 1..5; C(5, 3): 4..15 (12, named 4..11).
  w.originals[2] = Corrupt(w.originals[2], {5, 4, 3, 2, 1});
  w.replays[3] = Corrupt(w.replays[3], {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  const AuditVerdict v = AttributeWorld(t, plan, w, true);
  EXPECT_EQ(v.outcome, AuditOutcome::kTieBreakPending);
  EXPECT_EQ(v.mismatches, 2);
  ASSERT_EQ(v.comparisons.size(), 6u);
  EXPECT_THAT(v.comparisons[0].differing_parameters, ElementsAre(1, 2, 3, 4, 5));  // (0, 2)
  EXPECT_THAT(v.comparisons[3].differing_parameters,
              ElementsAre(4, 5, 6, 7, 8, 9, 10, 11));  // (3, 5)
  // The union of the named ones, first kMaxNamedParameters.
  EXPECT_THAT(v.differing_parameters, ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
}

// ---------------------------------------------------------------------------
// Simulated faults over random topologies.

enum class Mode { kOwnBatch, kOthersBatches, kBoth };

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kOwnBatch:
      return "own batch";
    case Mode::kOthersBatches:
      return "others' batches";
    case Mode::kBoth:
      return "both";
  }
  return "?";
}

// Every rank computes any micro-batch; healthy ranks reproduce it exactly, a
// faulty rank corrupts it in its mode, by an amount that depends on (its
// rank, the subject), so two faulty ranks never agree by accident.
class Simulation {
 public:
  Simulation(const Topology& topology, std::map<Rank, Mode> faulty, int params, uint64_t seed)
      : topology_(topology), faulty_(std::move(faulty)), params_(params), seed_(seed) {}

  bool compare_gradients() const { return params_ > 0; }

  Evidence Compute(Rank rank, Rank subject) const {
    Evidence e;
    const uint64_t value = Mix(seed_ ^ Mix(subject));
    e.loss_bits = value;
    for (int p = 0; p < params_; ++p) {
      e.gradients.push_back({1024, Mix(value + p), Mix(value ^ (p * 0x9e37ull))});
    }
    auto it = faulty_.find(rank);
    const bool corrupt =
        it != faulty_.end() &&
        (rank == subject ? it->second != Mode::kOthersBatches : it->second != Mode::kOwnBatch);
    const uint64_t how = Mix(seed_ ^ (uint64_t{rank} << 32) ^ subject ^ 0xc0ffee) | 1;
    if (corrupt && params_ > 0) {
      // 1..3 parameters; the loss only sometimes (a backward-pass fault
      // leaves it intact).
      const int k = 1 + static_cast<int>(how % 3);
      std::set<int> params;
      for (int i = 0; i < k; ++i) params.insert((how >> (8 + 5 * i)) % params_);
      for (int p : params) e.gradients[p].s1 ^= how;
      if ((how >> 40) & 1) e.loss_bits ^= how;
    } else if (corrupt) {
      e.loss_bits ^= how;
    }
    e.gradient_digest = params_ > 0 ? DigestOf(e.gradients) : e.loss_bits;
    return e;
  }

  struct Outcome {
    AuditVerdict verdict;
    std::set<Rank> blamed;  // Faulty ranks, plus those tie-breaks name.
    // What the coordinator's SettleAudit leaves suspected: the verdict's
    // suspects outside tie-breaks, both ranks of an inconclusive one.
    std::set<Rank> suspects;
    int inconclusive_tiebreaks = 0;
  };

  Outcome Audit(const ReplayPlan& plan, uint64_t salt) const {
    EvidenceMap originals, replays;
    for (const PlanMember& m : topology_.members()) originals[m.rank] = Compute(m.rank, m.rank);
    for (const Assignment& a : plan.assignments)
      replays[a.replayer] = Compute(a.replayer, a.subject);
    AuditInput in;
    in.plan = &plan;
    in.topology = &topology_;
    in.originals = &originals;
    in.replays = &replays;
    in.compare_gradients = compare_gradients();
    in.salt = salt;
    Outcome out;
    out.verdict = Attribute(in);
    out.blamed.insert(out.verdict.faulty.begin(), out.verdict.faulty.end());
    std::set<Rank> tiebroken;
    for (const TieBreak& tb : out.verdict.tiebreaks) {
      tiebroken.insert(tb.subject);
      tiebroken.insert(tb.disputed);
    }
    for (Rank r : out.verdict.suspects) {
      if (!tiebroken.count(r)) out.suspects.insert(r);
    }
    for (const TieBreak& tb : out.verdict.tiebreaks) {
      EXPECT_NE(topology_.DomainOf(tb.tiebreaker), topology_.DomainOf(tb.subject));
      EXPECT_NE(topology_.DomainOf(tb.tiebreaker), topology_.DomainOf(tb.disputed));
      switch (ResolveTieBreak(originals.at(tb.subject), replays.at(tb.disputed),
                              Compute(tb.tiebreaker, tb.subject), compare_gradients())) {
        case TieBreakOutcome::kSubjectFaulty:
          out.blamed.insert(tb.subject);
          break;
        case TieBreakOutcome::kReplayerFaulty:
          out.blamed.insert(tb.disputed);
          break;
        case TieBreakOutcome::kInconclusive:
          ++out.inconclusive_tiebreaks;
          out.suspects.insert(tb.subject);
          out.suspects.insert(tb.disputed);
          break;
      }
    }
    for (Rank r : out.blamed) out.suspects.erase(r);
    return out;
  }

 private:
  const Topology& topology_;
  std::map<Rank, Mode> faulty_;
  int params_;
  uint64_t seed_;
};

int Uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

struct Group {
  std::vector<int> sizes;
  std::vector<PlanMember> members;
  std::string shape;
};

// `nodes` nodes of 1..max_gpus GPUs, sparse rank ids dealt in shuffled order.
Group RandomGroup(std::mt19937_64& rng, int nodes, int max_gpus) {
  Group g;
  size_t n = 0;
  for (int i = 0; i < nodes; ++i) {
    g.sizes.push_back(Uniform(rng, 1, max_gpus));
    n += g.sizes.back();
  }
  std::set<Rank> ids;
  while (ids.size() < n) ids.insert(static_cast<Rank>(Uniform(rng, 0, static_cast<int>(3 * n))));
  std::vector<Rank> ranks(ids.begin(), ids.end());
  std::shuffle(ranks.begin(), ranks.end(), rng);
  size_t next = 0;
  for (int i = 0; i < nodes; ++i) {
    const std::string node = absl::StrCat("host-", Uniform(rng, 0, 1 << 20), "-", i);
    for (int k = 0; k < g.sizes[i]; ++k) g.members.push_back({ranks[next++], node});
  }
  g.shape = absl::StrCat("node sizes [", absl::StrJoin(g.sizes, ","), "]");
  return g;
}

Rank PickRank(std::mt19937_64& rng, const Group& g) {
  return g.members[Uniform(rng, 0, static_cast<int>(g.members.size()) - 1)].rank;
}

std::map<Rank, Rank> SubjectOf(const ReplayPlan& plan) {
  std::map<Rank, Rank> out;
  for (const Assignment& a : plan.assignments) out[a.replayer] = a.subject;
  return out;
}

std::map<Rank, Rank> ReplayerOf(const ReplayPlan& plan) {
  std::map<Rank, Rank> out;
  for (const Assignment& a : plan.assignments) out[a.subject] = a.replayer;
  return out;
}

TEST(AttributionSimulationTest, SingleFaultyRankIsAlwaysNamedExactly) {
  std::mt19937_64 rng(0xa77a0001);
  std::map<AuditOutcome, int> outcomes;
  for (int iter = 0; iter < 600; ++iter) {
    // Mostly 3..64 nodes; every 10th group a single node of 3..8 GPUs.
    const Group g =
        iter % 10 == 9 ? RandomGroup(rng, 1, 8) : RandomGroup(rng, Uniform(rng, 3, 64), 8);
    const Topology t(g.members);
    if (t.domain_count() < 3) continue;
    const Rank f = PickRank(rng, g);
    const Mode mode = static_cast<Mode>(iter % 3);
    const int params = iter % 2 == 0 ? 0 : Uniform(rng, 1, 20);
    const uint64_t index = rng() % 16;
    SCOPED_TRACE(absl::StrCat(g.shape, ", faulty rank ", f, " (", ModeName(mode), "), ", params,
                              " parameters, audit ", index));
    const Simulation sim(t, {{f, mode}}, params, rng());
    const ReplayPlan plan = PlanFullAudit(t, index);
    const Simulation::Outcome out = sim.Audit(plan, rng());
    const AuditVerdict& v = out.verdict;
    ++outcomes[v.outcome];
    EXPECT_EQ(v.mismatches, mode == Mode::kBoth ? 2 : 1);
    EXPECT_THAT(out.blamed, ElementsAre(f));
    EXPECT_EQ(out.inconclusive_tiebreaks, 0);
    EXPECT_THAT(v.outcome, AnyOf(AuditOutcome::kFaulty, AuditOutcome::kTieBreakPending));
    // A ring audit gives every rank two comparisons, which two other faulty
    // ranks could explain: each mismatch goes to a tie-break.
    EXPECT_EQ(v.outcome, AuditOutcome::kTieBreakPending);
    EXPECT_THAT(v.faulty, IsEmpty());
    EXPECT_EQ(v.tiebreaks.size(), mode == Mode::kBoth ? 2u : 1u);
  }
  EXPECT_EQ(outcomes[AuditOutcome::kFaulty], 0);
  EXPECT_GE(outcomes[AuditOutcome::kTieBreakPending], 500);
}

TEST(AttributionSimulationTest, SingleFaultyRankUnderTargetedAudit) {
  // The coordinator's follow-up: a targeted audit of the faulty rank itself
  // names it (both comparisons, or the tie-break of the lone one).
  std::mt19937_64 rng(0xa77a0002);
  for (int iter = 0; iter < 300; ++iter) {
    const Group g = RandomGroup(rng, Uniform(rng, 3, 32), 8);
    const Topology t(g.members);
    const Rank f = PickRank(rng, g);
    const Mode mode = static_cast<Mode>(iter % 3);
    SCOPED_TRACE(absl::StrCat(g.shape, ", faulty rank ", f, " (", ModeName(mode), ")"));
    const Simulation sim(t, {{f, mode}}, iter % 2 == 0 ? 0 : 8, rng());
    const Simulation::Outcome out = sim.Audit(PlanTargetedAudit(t, f, rng() % 8), rng());
    EXPECT_THAT(out.blamed, ElementsAre(f));
    EXPECT_EQ(out.inconclusive_tiebreaks, 0);
  }
}

// A healthy rank h "between" two faulty ranks: one faulty rank replays h's
// batch and h replays the other's. Its two comparisons then both involve a
// faulty partner and can both mismatch.
std::set<Rank> Sandwiched(const ReplayPlan& plan, const std::set<Rank>& faulty) {
  const std::map<Rank, Rank> subject_of = SubjectOf(plan), replayer_of = ReplayerOf(plan);
  std::set<Rank> out;
  for (const auto& [rank, subject] : subject_of) {
    const Rank replayer = replayer_of.at(rank);
    if (!faulty.count(rank) && subject != replayer && faulty.count(subject) &&
        faulty.count(replayer)) {
      out.insert(rank);
    }
  }
  return out;
}

// Issue 39, case 2: this test asserted only "not pass", and two faulty
// GPUs of a ring of three (every comparison mismatches, no rank in all) or
// opposite in a ring of four came out systemic: nobody named or suspected.
// Now both faulty ranks always end named or suspected, and a healthy rank
// is never named.
TEST(AttributionSimulationTest, TwoFaultyRanksNeverBlameAHealthyRank) {
  std::mt19937_64 rng(0xa77a0003);
  int runs = 0, named_both = 0, sandwiches = 0, small = 0, everyone_suspect = 0;
  for (int iter = 0; iter < 600; ++iter) {
    // Every 5th group is a ring of three or four single-GPU nodes.
    const bool small_ring = iter % 5 == 4;
    const Group g = small_ring ? RandomGroup(rng, Uniform(rng, 3, 4), 1)
                               : RandomGroup(rng, Uniform(rng, 3, 64), 8);
    const Topology t(g.members);
    const Rank f1 = PickRank(rng, g);
    Rank f2 = PickRank(rng, g);
    while (f2 == f1) f2 = PickRank(rng, g);
    const Mode m1 = static_cast<Mode>(iter % 3), m2 = static_cast<Mode>((iter / 3) % 3);
    const int params = iter % 2 == 0 ? 0 : Uniform(rng, 1, 20);
    const uint64_t index = rng() % 16;
    // Every 4th case puts f2 right behind f1 (f1 replays f2's batch) or two
    // steps behind (a healthy rank in between), the hard cases.
    const ReplayPlan plan = PlanFullAudit(t, index);
    if (iter % 4 == 1) f2 = SubjectOf(plan).at(f1);
    if (iter % 4 == 2) {
      const Rank mid = SubjectOf(plan).at(f1);
      const Rank next = SubjectOf(plan).at(mid);
      if (next != f1) f2 = next;
    }
    const std::set<Rank> truth = {f1, f2};
    SCOPED_TRACE(absl::StrCat(g.shape, ", faulty ", f1, " (", ModeName(m1), ") and ", f2, " (",
                              ModeName(m2), "), ", params, " parameters, audit ", index));
    const Simulation sim(t, {{f1, m1}, {f2, m2}}, params, rng());
    const Simulation::Outcome out = sim.Audit(plan, rng());
    const AuditVerdict& v = out.verdict;
    ++runs;
    small += small_ring;
    EXPECT_LE(v.mismatches, 4);
    EXPECT_NE(v.outcome, AuditOutcome::kPass);
    EXPECT_NE(v.outcome, AuditOutcome::kSystemic) << v.explanation;
    // Any blamed rank is truly faulty. A healthy rank h whose replayer f1
    // corrupts others' batches and whose subject f2 corrupts its own looks,
    // in one audit, exactly like a single faulty h: rule 3 must not confirm
    // it from two partners; the tie-breaks on both comparisons name f1 and f2.
    sandwiches += !Sandwiched(plan, truth).empty();
    for (Rank r : out.blamed) {
      EXPECT_TRUE(truth.count(r)) << "healthy rank " << r << " blamed";
    }
    // Each faulty rank is named or stays a suspect (targeted audits follow).
    for (Rank f : truth) {
      EXPECT_TRUE(out.blamed.count(f) || out.suspects.count(f))
          << "faulty rank " << f << " neither named nor suspected: " << v.explanation;
    }
    if (v.mismatches == static_cast<int>(v.comparisons.size())) {
      // Every comparison mismatches (a small ring): suspects, nobody named.
      EXPECT_EQ(v.outcome, AuditOutcome::kInconclusive);
      EXPECT_THAT(v.tiebreaks, IsEmpty());
      EXPECT_THAT(out.blamed, IsEmpty());
      EXPECT_EQ(out.suspects.size(), t.members().size());
      ++everyone_suspect;
    }
    named_both += out.blamed == truth;
  }
  EXPECT_EQ(runs, 600);
  EXPECT_EQ(small, 120);
  EXPECT_GE(sandwiches, 50);         // The hard case was exercised...
  EXPECT_GE(everyone_suspect, 10);   // ...and the ring where every comparison mismatches...
  EXPECT_GE(named_both, 250);        // ...and attribution still usually works.
}

// Issue 39, case 2, by hand: every placement of two faulty GPUs (each
// corrupting its own and others' batches) in a ring of three, and opposite
// in a ring of four. Every comparison mismatches.
TEST(AttributionSimulationTest, TwoFaultyRanksOfASmallRingAreSuspects) {
  for (int nodes : {3, 4}) {
    const Topology t = Contiguous(std::vector<int>(nodes, 1));
    for (uint64_t index = 0; index < 4; ++index) {
      const ReplayPlan plan = PlanFullAudit(t, index);
      for (Rank f1 = 0; f1 < static_cast<Rank>(nodes); ++f1) {
        // Three nodes: f1 and its subject. Four: f1 and the rank opposite.
        Rank f2 = SubjectOf(plan).at(f1);
        if (nodes == 4) f2 = SubjectOf(plan).at(f2);
        SCOPED_TRACE(absl::StrCat(nodes, " nodes, audit ", index, ", faulty ", f1, " and ", f2));
        for (int params : {0, 6}) {
          const Simulation sim(t, {{f1, Mode::kBoth}, {f2, Mode::kBoth}}, params, 7 + f1);
          const Simulation::Outcome out = sim.Audit(plan, index);
          EXPECT_EQ(out.verdict.mismatches, nodes);
          EXPECT_EQ(out.verdict.outcome, AuditOutcome::kInconclusive);
          EXPECT_THAT(out.verdict.faulty, IsEmpty());
          EXPECT_THAT(out.verdict.tiebreaks, IsEmpty());
          EXPECT_THAT(out.blamed, IsEmpty());
          EXPECT_EQ(out.suspects.size(), static_cast<size_t>(nodes));
          EXPECT_TRUE(out.suspects.count(f1) && out.suspects.count(f2));
        }
      }
    }
  }
}

// Fixed (found by this test): rule 3 blames a healthy rank h whose replayer f1 and subject f2 are
// both faulty in both modes. C(h, f1) mismatches because f1's replay of h's
// batch is wrong and C(f2, h) because f2's own result is wrong, so h
// "mismatches in every comparison it is part of, with two partners" and is
// named faulty next to f1 and f2, although f1 and f2 explain every mismatch
// (and are the only pair of ranks that can). Now rank 1 stays a suspect.
// attribution.h sizes the
// systemic threshold for "two faulty GPUs"; two faulty GPUs should not get a
// third, healthy one replaced. Reproduction: 5 nodes x 1 GPU, PlanFullAudit
// index 0 = (replayer->subject) 0->1, 1->2, 2->3, 3->4, 4->0; ranks 0 and 2
// corrupt their own and others' batches: C(1,0), C(0,4), C(2,1), C(3,2)
// mismatch and Attribute returns faulty = {0, 1, 2}. (When f1 corrupts only
// others' batches and f2 only its own, h's comparisons are exactly those of
// a single faulty h, which one audit cannot tell apart: not this bug.)
TEST(AttributeTest, HealthyRankBetweenTwoFaultyRanks) {
  const Topology t = Contiguous({1, 1, 1, 1, 1});
  // The ring 0->1->2->3->4->0 (replayer -> subject), built by hand.
  ReplayPlan plan = PlanFullAudit(t, 0);
  plan.assignments = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 0}};
  const Simulation sim(t, {{0, Mode::kBoth}, {2, Mode::kBoth}}, 0, 42);
  const Simulation::Outcome out = sim.Audit(plan, 0);
  EXPECT_EQ(out.verdict.mismatches, 4);
  EXPECT_EQ(out.blamed.count(1), 0u)
      << "healthy rank 1 blamed; faulty = " << absl::StrJoin(out.verdict.faulty, ",");
  // Nobody is named from the audit alone; the four tie-breaks (by ranks 3
  // and 4, healthy) name both faulty ranks.
  EXPECT_THAT(out.verdict.faulty, IsEmpty());
  EXPECT_EQ(out.verdict.suspects, (std::vector<Rank>{0, 1, 2, 3, 4}));
  EXPECT_EQ(out.blamed, (std::set<Rank>{0, 2}));
}

TEST(AttributionSimulationTest, NonDeterminismBlamesNobody) {
  std::mt19937_64 rng(0xa77a0004);
  for (int iter = 0; iter < 400; ++iter) {
    const Group g = RandomGroup(rng, Uniform(rng, 3, 64), 8);
    const Topology t(g.members);
    const ReplayPlan plan = PlanFullAudit(t, rng() % 16);
    const size_t n = plan.assignments.size();
    const bool gradients = iter % 2 == 1;
    const uint64_t noise = rng();
    // Non-deterministic kernels: replays differ from the originals. Loss
    // comparisons need more than max(4, n/4) of them, or every comparison
    // of a small group; per-parameter ones whose differences all sit in the
    // same parameters are systemic from 3.
    SCOPED_TRACE(absl::StrCat(g.shape, gradients ? ", gradients" : ", loss only"));
    EvidenceMap originals, replays;
    for (const PlanMember& m : t.members()) originals[m.rank] = Healthy(m.rank, gradients ? 10 : 0);
    // All replays differ, or (every other group) a random share above the
    // threshold.
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    size_t differ = n;
    const size_t threshold = gradients ? 2 : std::max<size_t>(4, n / 4);
    if (iter % 4 >= 2 && n > threshold + 1) {
      differ = threshold + 1 + rng() % (n - threshold - 1);
    }
    for (const Assignment& a : plan.assignments) {
      replays[a.replayer] = Healthy(a.subject, gradients ? 10 : 0);
    }
    for (size_t i = 0; i < differ; ++i) {
      const Assignment& a = plan.assignments[order[i]];
      // The same two parameters differ everywhere; the amount does not.
      replays[a.replayer] = Corrupt(
          replays[a.replayer], gradients ? std::vector<uint32_t>{2, 7} : std::vector<uint32_t>{},
          Mix(noise ^ a.replayer) | 1);
    }
    AuditInput in;
    in.plan = &plan;
    in.topology = &t;
    in.originals = &originals;
    in.replays = &replays;
    in.compare_gradients = gradients;
    const AuditVerdict v = Attribute(in);
    EXPECT_EQ(v.mismatches, static_cast<int>(differ));
    EXPECT_EQ(v.outcome, AuditOutcome::kSystemic);
    EXPECT_THAT(v.faulty, IsEmpty());
    EXPECT_THAT(v.suspects, IsEmpty());
    EXPECT_THAT(v.tiebreaks, IsEmpty());
    EXPECT_TRUE(IsFailure(v.outcome));
  }
}

TEST(AttributionSimulationTest, TwoDomainsNameSuspectsOnly) {
  std::mt19937_64 rng(0xa77a0005);
  for (int iter = 0; iter < 300; ++iter) {
    const Group g = iter % 5 == 0 ? RandomGroup(rng, 1, 1) : RandomGroup(rng, 2, 8);
    Group two = g;
    if (iter % 5 == 0) {
      // One node with exactly two GPUs.
      two.members.push_back({two.members[0].rank + 1, two.members[0].node});
    }
    const Topology t(two.members);
    ASSERT_EQ(t.domain_count(), 2);
    const Rank f = two.members[Uniform(rng, 0, static_cast<int>(two.members.size()) - 1)].rank;
    const Mode mode = static_cast<Mode>(iter % 3);
    SCOPED_TRACE(absl::StrCat(two.shape, ", faulty rank ", f, " (", ModeName(mode), ")"));
    const Simulation sim(t, {{f, mode}}, iter % 2 == 0 ? 0 : 5, rng());
    const ReplayPlan plan = PlanFullAudit(t, rng() % 8);
    const Simulation::Outcome out = sim.Audit(plan, 0);
    const AuditVerdict& v = out.verdict;
    EXPECT_EQ(v.outcome, AuditOutcome::kAttributionImpossible);
    EXPECT_THAT(v.faulty, IsEmpty());
    EXPECT_THAT(v.tiebreaks, IsEmpty());
    // The suspects are exactly the ranks of the mismatching comparisons.
    std::set<Rank> expected = {f};
    if (mode != Mode::kOthersBatches) expected.insert(ReplayerOf(plan).at(f));
    if (mode != Mode::kOwnBatch) expected.insert(SubjectOf(plan).at(f));
    EXPECT_EQ(std::set<Rank>(v.suspects.begin(), v.suspects.end()), expected);
    EXPECT_THAT(v.explanation, HasSubstr("attribution needs 3 failure domains"));
  }
}

}  // namespace
}  // namespace sdc::protocol
