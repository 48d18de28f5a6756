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

namespace {

// No digest has a strict majority: vote tensor by tensor. Succeeds when every
// tensor has a value held by a strict majority of the members and one ballot
// holds all those values (the repair source); the ranks whose value differs
// in some tensor are the minority. Two corrupt replicas of four (or of
// three), wrong in different tensors, are named this way.
bool VotePerTensor(size_t members, absl::Span<const DigestBallot> ballots, VoteResult* result) {
  const std::vector<Fingerprint>* first = ballots.front().tensors;
  for (const DigestBallot& b : ballots) {
    if (b.tensors == nullptr || b.tensors->size() != first->size()) return false;
  }
  std::vector<std::vector<bool>> holds_majority(ballots.size(),
                                                std::vector<bool>(first->size(), false));
  for (uint32_t t = 0; t < first->size(); ++t) {
    bool found = false;
    for (size_t i = 0; i < ballots.size() && !found; ++i) {
      size_t holders = 0;
      for (const DigestBallot& b : ballots) {
        if ((*b.tensors)[t] == (*ballots[i].tensors)[t]) holders += b.ranks.size();
      }
      if (2 * holders <= members) continue;
      found = true;
      for (size_t j = 0; j < ballots.size(); ++j) {
        holds_majority[j][t] = (*ballots[j].tensors)[t] == (*ballots[i].tensors)[t];
      }
    }
    if (!found) return false;
  }
  const DigestBallot* source = nullptr;
  std::set<uint32_t> differing;
  for (size_t j = 0; j < ballots.size(); ++j) {
    const auto& held = holds_majority[j];
    if (std::all_of(held.begin(), held.end(), [](bool h) { return h; })) {
      source = &ballots[j];
      continue;
    }
    result->minority.insert(result->minority.end(), ballots[j].ranks.begin(),
                            ballots[j].ranks.end());
    for (uint32_t t = 0; t < held.size(); ++t) {
      if (!held[t]) differing.insert(t);
    }
  }
  if (source == nullptr) {
    result->minority.clear();
    return false;
  }
  result->outcome = VoteOutcome::kMinority;
  result->per_tensor = true;
  result->majority_digest = source->digest;
  result->majority_source = *std::min_element(source->ranks.begin(), source->ranks.end());
  std::sort(result->minority.begin(), result->minority.end());
  for (uint32_t t : differing) {
    if (result->differing_tensors.size() == kMaxNamedTensors) break;
    result->differing_tensors.push_back(t);
  }
  return true;
}

}  // namespace

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
  if (winner == nullptr && distinct >= 2 && VotePerTensor(members.size(), ballots, &result)) {
    return result;
  }
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
