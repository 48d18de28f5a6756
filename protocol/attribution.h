#ifndef SDC_PROTOCOL_ATTRIBUTION_H_
#define SDC_PROTOCOL_ATTRIBUTION_H_

// What happens when a replay mismatches: the ring replay audit's
// attribution, as plain functions of the plan and the results.
//
// Comparison C(j, k): rank j's original result on its own micro-batch versus
// rank k's replay of it. Results match when the loss bits match and, when the
// job runs deterministic kernels, the gradient digests match too. Then, in
// this order:
//   1. Systemic. More mismatches than two faulty GPUs explain (over
//      max(4, a quarter of the comparisons)), every comparison of a group of
//      three or more with no two ranks taking part in all of them, or three
//      or more mismatches that all differ in exactly the same parameters and
//      that no two ranks between them take part in: non-determinism or a
//      software change. Nobody is blamed.
//   2. Fewer than three failure domains: detected, attribution impossible;
//      the ranks involved become suspects.
//   2b. Every comparison mismatches (three or more) and two ranks, but no
//      single one, take part in all of them: in a ring of three or four
//      ranks, always (the count cannot fire there). Two faulty GPUs look
//      exactly like non-determinism then, and a tie-break cannot tell them
//      apart either (a replay that differs from every original the same way
//      would name every subject). Inconclusive: nobody is named, every rank
//      involved is a suspect (targeted audits follow; the step fails, so
//      checkpoints are vetoed and a provisional one is revoked).
//   3. A rank whose comparisons (as owner and as replayer) all mismatch, with
//      three or more distinct partners, is faulty: at most two other faulty
//      ranks cannot explain them. With two partners (every rank of a ring
//      audit) it is not: a healthy rank whose replayer corrupts others'
//      batches and whose subject corrupts its own looks exactly like one
//      faulty rank, so its comparisons go to rule 4. And a candidate whose
//      every mismatch another candidate explains stays a suspect.
//   4. A mismatch not explained by a faulty rank gets a tie-break: a rank t in
//      a third domain replays j's micro-batch. t agrees with j -> k is
//      faulty; t agrees with k -> j is faulty; otherwise inconclusive and
//      both are suspects. Without a third domain: inconclusive.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "protocol/replay_plan.h"
#include "protocol/types.h"

namespace sdc::protocol {

// One side of a comparison.
struct Evidence {
  uint64_t loss_bits = 0;
  uint64_t gradient_digest = 0;
  // Per-parameter fingerprints; empty when not reported.
  std::vector<Fingerprint> gradients;
};

enum class AuditOutcome {
  kPass,                   // Every comparison matched.
  kIncomplete,             // No mismatch, but some results never arrived.
  kFaulty,                 // Ranks attributed; nothing left open.
  kTieBreakPending,        // Tie-break replays will decide.
  kInconclusive,           // Mismatch that cannot be attributed.
  kSystemic,               // Non-determinism or software; nobody blamed.
  kAttributionImpossible,  // Mismatch with fewer than three domains.
};

const char* AuditOutcomeName(AuditOutcome outcome);

// True for outcomes that must skip the step and veto checkpoints.
bool IsFailure(AuditOutcome outcome);

struct Comparison {
  Rank subject = 0;
  Rank replayer = 0;
  enum class State { kMatch, kMismatch, kMissing } state = State::kMatch;
  bool loss_differs = false;
  std::vector<uint32_t> differing_parameters;  // First few, ascending.
};

struct TieBreak {
  Rank subject = 0;    // j: whose micro-batch.
  Rank disputed = 0;   // k: the replayer that disagreed with j.
  Rank tiebreaker = 0; // t: in a third domain.
  friend bool operator==(const TieBreak& a, const TieBreak& b) {
    return a.subject == b.subject && a.disputed == b.disputed &&
           a.tiebreaker == b.tiebreaker;
  }
};

struct AuditVerdict {
  AuditOutcome outcome = AuditOutcome::kPass;
  std::vector<Comparison> comparisons;  // One per assignment, plan order.
  std::vector<Rank> faulty;             // Ascending.
  std::vector<Rank> suspects;           // Ascending; never includes faulty.
  std::vector<Rank> missing;            // Ranks whose results never arrived.
  std::vector<TieBreak> tiebreaks;
  std::vector<uint32_t> differing_parameters;  // First few over mismatches.
  int mismatches = 0;
  std::string explanation;
};

struct AuditInput {
  const ReplayPlan* plan = nullptr;
  const Topology* topology = nullptr;
  // Original results by subject rank; replays by replayer rank.
  const absl::flat_hash_map<Rank, Evidence>* originals = nullptr;
  const absl::flat_hash_map<Rank, Evidence>* replays = nullptr;
  bool compare_gradients = false;  // The job runs deterministic kernels.
  uint64_t salt = 0;               // Rotates tie-breaker choice.
};

// How many differing parameters a comparison names at most.
inline constexpr size_t kMaxNamedParameters = 8;

AuditVerdict Attribute(const AuditInput& input);

enum class TieBreakOutcome {
  kSubjectFaulty,   // t agrees with the replay: j's original was wrong.
  kReplayerFaulty,  // t agrees with j's original: k's replay was wrong.
  kInconclusive,    // t agrees with neither.
};

const char* TieBreakOutcomeName(TieBreakOutcome outcome);

TieBreakOutcome ResolveTieBreak(const Evidence& original, const Evidence& replay,
                                const Evidence& tiebreak, bool compare_gradients);

// Compares two results; fills `differing` (first kMaxNamedParameters) when
// gradients are compared and both carry per-parameter fingerprints.
bool SameResult(const Evidence& a, const Evidence& b, bool compare_gradients,
                bool* loss_differs = nullptr,
                std::vector<uint32_t>* differing = nullptr);

}  // namespace sdc::protocol

#endif  // SDC_PROTOCOL_ATTRIBUTION_H_
