#include "protocol/attribution.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::protocol {

const char* AuditOutcomeName(AuditOutcome outcome) {
  switch (outcome) {
    case AuditOutcome::kPass:
      return "pass";
    case AuditOutcome::kIncomplete:
      return "incomplete";
    case AuditOutcome::kFaulty:
      return "faulty";
    case AuditOutcome::kTieBreakPending:
      return "tiebreak_pending";
    case AuditOutcome::kInconclusive:
      return "inconclusive";
    case AuditOutcome::kSystemic:
      return "systemic";
    case AuditOutcome::kAttributionImpossible:
      return "attribution_impossible";
  }
  return "unknown";
}

bool IsFailure(AuditOutcome outcome) {
  return outcome != AuditOutcome::kPass && outcome != AuditOutcome::kIncomplete;
}

const char* TieBreakOutcomeName(TieBreakOutcome outcome) {
  switch (outcome) {
    case TieBreakOutcome::kSubjectFaulty:
      return "subject_faulty";
    case TieBreakOutcome::kReplayerFaulty:
      return "replayer_faulty";
    case TieBreakOutcome::kInconclusive:
      return "inconclusive";
  }
  return "unknown";
}

bool SameResult(const Evidence& a, const Evidence& b, bool compare_gradients,
                bool* loss_differs, std::vector<uint32_t>* differing) {
  const bool loss_same = a.loss_bits == b.loss_bits;
  if (loss_differs != nullptr) *loss_differs = !loss_same;
  bool gradients_same = true;
  if (compare_gradients) {
    gradients_same = a.gradient_digest == b.gradient_digest;
    if (!gradients_same && differing != nullptr &&
        a.gradients.size() == b.gradients.size()) {
      size_t named = 0;
      for (uint32_t p = 0; p < a.gradients.size() && named < kMaxNamedParameters; ++p) {
        if (a.gradients[p] != b.gradients[p]) {
          differing->push_back(p);
          ++named;
        }
      }
    }
  }
  return loss_same && gradients_same;
}

namespace {

std::string RankList(absl::Span<const Rank> ranks) {
  return absl::StrJoin(ranks, ", ");
}

void SortUnique(std::vector<Rank>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// True when one rank takes part in every mismatched comparison: one faulty
// GPU explains them all, whatever they look like.
bool OneRankInEvery(const std::vector<const Comparison*>& mismatched) {
  for (Rank r : {mismatched.front()->subject, mismatched.front()->replayer}) {
    bool in_all = true;
    for (const Comparison* c : mismatched) {
      in_all = in_all && (c->subject == r || c->replayer == r);
    }
    if (in_all) return true;
  }
  return false;
}

// True when two ranks (or one) take part in every mismatched comparison: two
// faulty GPUs explain them all, whatever they look like (a large error
// makes every parameter differ, in every comparison it touches).
bool TwoRanksInEvery(const std::vector<const Comparison*>& mismatched) {
  if (OneRankInEvery(mismatched)) return true;
  for (Rank r : {mismatched.front()->subject, mismatched.front()->replayer}) {
    std::vector<const Comparison*> rest;
    for (const Comparison* c : mismatched) {
      if (c->subject != r && c->replayer != r) rest.push_back(c);
    }
    if (rest.empty() || OneRankInEvery(rest)) return true;
  }
  return false;
}

// Two faulty ranks can explain a rank's mismatches with at most two distinct
// partners (by being those partners); with three they cannot.
constexpr size_t kPartnersToConfirm = 3;

// Systemic: more mismatches than two faulty ranks can explain; every
// comparison of a group of three or more with no two ranks common to all
// (the count cannot fire in a group of four or fewer; in a ring of three or
// four two ranks always take part in every comparison, see
// TwoFaultsOrNonDeterminism); or several mismatches confined to the very
// same parameters that no two ranks share.
bool LooksSystemic(const std::vector<const Comparison*>& mismatched,
                   size_t comparisons) {
  const size_t m = mismatched.size();
  if (m > std::max<size_t>(4, comparisons / 4)) return true;
  if (m < 3) return false;
  if (m == comparisons && !TwoRanksInEvery(mismatched)) return true;
  const auto& params = mismatched.front()->differing_parameters;
  if (params.empty()) return false;
  for (const Comparison* c : mismatched) {
    if (c->differing_parameters != params) return false;
  }
  // Same parameters everywhere: systemic unless one or two ranks are in
  // every mismatch (a faulty GPU differs in whatever it corrupts, and two
  // faulty GPUs hit by large errors differ in the same, first, parameters).
  return !TwoRanksInEvery(mismatched);
}

// Every comparison mismatches (three or more, none missing) and no rank
// takes part in all, yet two do: in a ring of three or four ranks, always.
// Two faulty GPUs look exactly like non-determinism or a software change
// there. A tie-break cannot settle it either: where every replay differs
// from every original the same way, the tie-breaker agrees with each
// replay and would name every subject. So every rank involved becomes a
// suspect, whose targeted audits follow, and nobody is named.
bool TwoFaultsOrNonDeterminism(const std::vector<const Comparison*>& mismatched,
                               size_t comparisons) {
  return mismatched.size() >= 3 && mismatched.size() == comparisons &&
         !OneRankInEvery(mismatched) && TwoRanksInEvery(mismatched);
}

}  // namespace

AuditVerdict Attribute(const AuditInput& in) {
  AuditVerdict v;
  const ReplayPlan& plan = *in.plan;
  v.comparisons.reserve(plan.assignments.size());
  std::vector<const Comparison*> mismatched;
  for (const Assignment& a : plan.assignments) {
    Comparison c;
    c.subject = a.subject;
    c.replayer = a.replayer;
    auto original = in.originals->find(a.subject);
    auto replay = in.replays->find(a.replayer);
    if (original == in.originals->end() || replay == in.replays->end()) {
      c.state = Comparison::State::kMissing;
      if (original == in.originals->end()) v.missing.push_back(a.subject);
      if (replay == in.replays->end()) v.missing.push_back(a.replayer);
    } else if (!SameResult(original->second, replay->second, in.compare_gradients,
                           &c.loss_differs, &c.differing_parameters)) {
      c.state = Comparison::State::kMismatch;
    }
    v.comparisons.push_back(std::move(c));
  }
  SortUnique(v.missing);
  for (const Comparison& c : v.comparisons) {
    if (c.state == Comparison::State::kMismatch) mismatched.push_back(&c);
  }
  v.mismatches = static_cast<int>(mismatched.size());
  {
    std::set<uint32_t> params;
    for (const Comparison* c : mismatched) {
      params.insert(c->differing_parameters.begin(), c->differing_parameters.end());
    }
    for (uint32_t p : params) {
      if (v.differing_parameters.size() == kMaxNamedParameters) break;
      v.differing_parameters.push_back(p);
    }
  }

  if (mismatched.empty()) {
    if (v.missing.empty()) {
      v.outcome = AuditOutcome::kPass;
      v.explanation = absl::StrCat("all ", v.comparisons.size(), " comparisons match");
    } else {
      v.outcome = AuditOutcome::kIncomplete;
      v.explanation = absl::StrCat("no mismatch, but no results from ranks ",
                                   RankList(v.missing));
    }
    return v;
  }

  if (LooksSystemic(mismatched, v.comparisons.size())) {
    v.outcome = AuditOutcome::kSystemic;
    v.explanation = absl::StrCat(
        v.mismatches, " of ", v.comparisons.size(),
        " comparisons mismatch: non-determinism or a software change, not one GPU; "
        "nobody is blamed");
    return v;
  }

  if (plan.capability == AttributionCapability::kDetectOnly ||
      plan.capability == AttributionCapability::kNone) {
    v.outcome = AuditOutcome::kAttributionImpossible;
    for (const Comparison* c : mismatched) {
      v.suspects.push_back(c->subject);
      v.suspects.push_back(c->replayer);
    }
    SortUnique(v.suspects);
    v.explanation = absl::StrCat(v.mismatches, " comparison(s) mismatch; ", plan.note);
    return v;
  }

  // Rule 2b: every comparison of a small group mismatches, two ranks take
  // part in all of them and no single rank does.
  if (TwoFaultsOrNonDeterminism(mismatched, v.comparisons.size())) {
    v.outcome = AuditOutcome::kInconclusive;
    for (const Comparison* c : mismatched) {
      v.suspects.push_back(c->subject);
      v.suspects.push_back(c->replayer);
    }
    SortUnique(v.suspects);
    v.explanation = absl::StrCat(
        "all ", v.mismatches, " comparisons mismatch: two faulty GPUs or non-determinism, "
        "which one audit of a group this small cannot tell apart; nobody is named, ranks ",
        RankList(v.suspects), " are suspects");
    return v;
  }

  // Rule 3: every comparison of the rank mismatches, with three or more
  // distinct partners. Two partners are not enough: a healthy rank whose
  // replayer corrupts others' batches and whose subject corrupts its own
  // mismatches in exactly the same two comparisons as a faulty rank, so
  // those comparisons go to tie-breaks (rule 4) like any other.
  absl::flat_hash_map<Rank, std::vector<const Comparison*>> by_rank;
  for (const Comparison& c : v.comparisons) {
    by_rank[c.subject].push_back(&c);
    by_rank[c.replayer].push_back(&c);
  }
  for (auto& [rank, comps] : by_rank) {
    if (comps.size() < 2) continue;
    absl::flat_hash_set<Rank> partners;
    bool all_mismatch = true;
    for (const Comparison* c : comps) {
      all_mismatch = all_mismatch && c->state == Comparison::State::kMismatch;
      partners.insert(c->subject == rank ? c->replayer : c->subject);
    }
    if (all_mismatch && partners.size() >= kPartnersToConfirm) v.faulty.push_back(rank);
  }
  SortUnique(v.faulty);
  // The smallest explanation: a candidate whose every mismatch is already
  // explained by another remaining candidate may be a healthy rank between
  // two faulty ones (its replayer and its subject), so it is not blamed;
  // it stays a suspect, and a targeted audit settles it.
  std::vector<Rank> sandwiched;
  {
    absl::flat_hash_set<Rank> kept(v.faulty.begin(), v.faulty.end());
    for (Rank rank : v.faulty) {
      bool explained = true;
      for (const Comparison* c : by_rank[rank]) {
        const Rank other = c->subject == rank ? c->replayer : c->subject;
        explained = explained && kept.contains(other);
      }
      if (explained) {
        kept.erase(rank);
        sandwiched.push_back(rank);
      }
    }
    v.faulty.assign(kept.begin(), kept.end());
    SortUnique(v.faulty);
  }
  const absl::flat_hash_set<Rank> faulty(v.faulty.begin(), v.faulty.end());

  // Rule 4: mismatches no faulty rank explains.
  bool inconclusive = false;
  for (const Comparison* c : mismatched) {
    if (faulty.contains(c->subject) || faulty.contains(c->replayer)) continue;
    std::optional<Rank> t =
        ChooseTieBreaker(*in.topology, c->subject, c->replayer, in.salt + c->subject);
    if (t.has_value()) {
      v.tiebreaks.push_back({c->subject, c->replayer, *t});
    } else {
      inconclusive = true;
    }
    v.suspects.push_back(c->subject);
    v.suspects.push_back(c->replayer);
  }
  v.suspects.insert(v.suspects.end(), sandwiched.begin(), sandwiched.end());
  SortUnique(v.suspects);

  std::vector<std::string> parts;
  if (!v.faulty.empty()) {
    parts.push_back(absl::StrCat("rank(s) ", RankList(v.faulty),
                                 " mismatch in every comparison they are part of"));
  }
  if (!v.tiebreaks.empty()) {
    std::vector<std::string> tb;
    for (const TieBreak& t : v.tiebreaks) {
      tb.push_back(absl::StrCat("rank ", t.tiebreaker, " replays rank ", t.subject,
                                "'s micro-batch (disputed by rank ", t.disputed, ")"));
    }
    parts.push_back(absl::StrCat("tie-break: ", absl::StrJoin(tb, "; ")));
  }
  if (inconclusive) parts.push_back("no third failure domain for a tie-break");
  if (!sandwiched.empty()) {
    parts.push_back(absl::StrCat("rank(s) ", RankList(sandwiched),
                                 " mismatch only with ranks found faulty: suspects, not blamed"));
  }
  v.explanation = absl::StrJoin(parts, "; ");
  if (!v.tiebreaks.empty()) {
    v.outcome = AuditOutcome::kTieBreakPending;
  } else if (!v.faulty.empty()) {
    v.outcome = AuditOutcome::kFaulty;
  } else {
    v.outcome = AuditOutcome::kInconclusive;
  }
  return v;
}

TieBreakOutcome ResolveTieBreak(const Evidence& original, const Evidence& replay,
                                const Evidence& tiebreak, bool compare_gradients) {
  const bool agrees_with_original = SameResult(tiebreak, original, compare_gradients);
  const bool agrees_with_replay = SameResult(tiebreak, replay, compare_gradients);
  if (agrees_with_original && !agrees_with_replay) return TieBreakOutcome::kReplayerFaulty;
  if (agrees_with_replay && !agrees_with_original) return TieBreakOutcome::kSubjectFaulty;
  return TieBreakOutcome::kInconclusive;
}

}  // namespace sdc::protocol
