#ifndef SDC_DAEMON_CORE_WEIGHT_VOTE_H_
#define SDC_DAEMON_CORE_WEIGHT_VOTE_H_

// The weight fingerprint vote of one replica group at one step (check 3), and
// the same vote over reduced-gradient digests (check 1's cross-rank part).
//
// Ballots arrive grouped by model digest: ranks with equal digests hold equal
// tensors, so a healthy group is a single digest and costs one comparison per
// rank. Only a minority digest is compared tensor by tensor, against one
// representative of the majority.
//
// The value held by more than half of the group's members wins (a strict
// majority of the group, not of the ballots that arrived). Ranks holding
// another value are the minority. When no digest has a strict majority and
// every ballot carries tensors, the vote goes tensor by tensor: if every
// tensor has a strict-majority value and one ballot holds all of them, the
// ranks that differ in any tensor are the minority (two corrupt replicas of
// three or four, wrong in different tensors, are named). Otherwise no
// majority: inconclusive.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "daemon/core/types.h"

namespace sdc::core {

// All ranks that reported one digest. `tensors` (from any one of them) may
// be null when only digests are compared.
struct DigestBallot {
  uint64_t digest = 0;
  std::vector<Rank> ranks;
  const std::vector<Fingerprint>* tensors = nullptr;
};

enum class VoteOutcome {
  kPass,        // Every member reported the same value.
  kMinority,    // A strict majority exists and some members differ from it.
  kNoMajority,  // Members disagree and no value has a strict majority.
  kIncomplete,  // No disagreement so far, but members are missing.
};

const char* VoteOutcomeName(VoteOutcome outcome);

struct VoteResult {
  VoteOutcome outcome = VoteOutcome::kPass;
  uint64_t majority_digest = 0;
  Rank majority_source = 0;        // Lowest rank holding the majority value.
  std::vector<Rank> minority;      // Ascending.
  std::vector<Rank> missing;       // Members with no ballot, ascending.
  // Tensor indices where a minority value differs from the majority's
  // (first few, ascending), when tensors were supplied.
  std::vector<uint32_t> differing_tensors;
  // A minority ballot could not be compared tensor by tensor (it or the
  // majority came without tensors): an empty `differing_tensors` then
  // says nothing about where they differ.
  bool uncompared = false;
  // Decided tensor by tensor (no digest had a strict majority).
  bool per_tensor = false;
};

inline constexpr size_t kMaxNamedTensors = 8;

// REQUIRES: ballots' ranks are distinct members of `members`.
VoteResult Vote(absl::Span<const Rank> members, absl::Span<const DigestBallot> ballots);

}  // namespace sdc::core

#endif  // SDC_DAEMON_CORE_WEIGHT_VOTE_H_
