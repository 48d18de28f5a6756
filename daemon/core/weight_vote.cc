#include "daemon/core/weight_vote.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_set.h"

namespace sdc::core {

const char* VoteOutcomeName(VoteOutcome outcome) {
  switch (outcome) {
    case VoteOutcome::kPass:
      return "pass";
    case VoteOutcome::kMinority:
      return "minority";
    case VoteOutcome::kNoMajority:
      return "no_majority";
    case VoteOutcome::kIncomplete:
      return "incomplete";
  }
  return "unknown";
}

VoteResult Vote(absl::Span<const Rank> members, absl::Span<const DigestBallot> ballots) {
  VoteResult result;
  size_t voted = 0;
  const DigestBallot* winner = nullptr;
  for (const DigestBallot& b : ballots) {
    voted += b.ranks.size();
    if (2 * b.ranks.size() > members.size()) winner = &b;
  }
  if (voted < members.size()) {
    absl::flat_hash_set<Rank> seen;
    for (const DigestBallot& b : ballots) seen.insert(b.ranks.begin(), b.ranks.end());
    for (Rank r : members) {
      if (!seen.contains(r)) result.missing.push_back(r);
    }
    std::sort(result.missing.begin(), result.missing.end());
  }
  const size_t distinct = ballots.size();
  if (winner == nullptr) {
    result.outcome = distinct <= 1 ? VoteOutcome::kIncomplete : VoteOutcome::kNoMajority;
    if (distinct == 1) {
      result.majority_digest = ballots[0].digest;
      result.majority_source = *std::min_element(ballots[0].ranks.begin(), ballots[0].ranks.end());
    }
    return result;
  }
  result.majority_digest = winner->digest;
  result.majority_source = *std::min_element(winner->ranks.begin(), winner->ranks.end());
  std::set<uint32_t> differing;
  for (const DigestBallot& b : ballots) {
    if (&b == winner) continue;
    result.minority.insert(result.minority.end(), b.ranks.begin(), b.ranks.end());
    if (b.tensors != nullptr && winner->tensors != nullptr &&
        b.tensors->size() == winner->tensors->size()) {
      for (uint32_t t = 0; t < b.tensors->size(); ++t) {
        if ((*b.tensors)[t] != (*winner->tensors)[t]) differing.insert(t);
      }
    } else {
      result.uncompared = true;
    }
  }
  std::sort(result.minority.begin(), result.minority.end());
  for (uint32_t t : differing) {
    if (result.differing_tensors.size() == kMaxNamedTensors) break;
    result.differing_tensors.push_back(t);
  }
  if (!result.minority.empty()) {
    result.outcome = VoteOutcome::kMinority;
  } else {
    result.outcome = result.missing.empty() ? VoteOutcome::kPass : VoteOutcome::kIncomplete;
  }
  return result;
}

}  // namespace sdc::core
