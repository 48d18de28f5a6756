#ifndef SDC_DAEMON_CORE_COORDINATOR_INTERNAL_H_
#define SDC_DAEMON_CORE_COORDINATOR_INTERNAL_H_

// Helpers shared by the files that define Coordinator's members (private to
// //daemon/core:coordinator): how messages quote values and list ranks, and
// the key a pending report is stored under.

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "daemon/core/records.h"
#include "daemon/core/types.h"

namespace sdc::core::internal {

inline constexpr size_t kMaxJobIdLength = 128;
// Steps above this (2^48) are implausible: reports and resume steps.
inline constexpr Step kMaxStep = Step{1} << 48;

// How the engine words a step every rank skipped for a finding of the
// sharded layouts' in-band checks (the buddy check and the sharded replay
// audit, client/python/sdc_guard/buddy.py): "step N failed on rank R" then
// this, then "faulty): " or "suspect): " (step_checks.cc parses it).
inline constexpr absl::string_view kBuddyCheckSkip =
    " and was skipped on every rank: buddy check (";

// A value an error message echoes: quoted, at most 64 characters of it, with
// bytes outside printable ASCII escaped.
std::string Echo(absl::string_view value);

// A job id as an error message may echo it: as it came, when it could be a
// valid one (at most kMaxJobIdLength characters), else its first characters
// and its length (a 1 MB id must not make a 1 MB message).
std::string EchoJobId(const std::string& id);

// "3, 7, 9" or "3, 7, ... (12 ranks)": at most 8 ranks are named.
std::string RankList(const std::vector<Rank>& ranks);

// The ranks of `s`, ascending.
std::vector<Rank> ToVector(const std::set<Rank>& s);

// The key under which report `r` is stored while its check is open.
PendingKey KeyOf(const Report& r);

// The key under which a rank slot's identity holds its share of a job: the
// node its caller proved, or for an unauthenticated rank "?" and the node it
// names (each such node counts as one more node of the job).
std::string IdentityKey(const RankRecord& r);

// The identity whose job count and layout bytes a key's slot uses: the
// proven node, or "" for every unauthenticated caller together.
std::string IdentityClass(const std::string& key);

}  // namespace sdc::core::internal

#endif  // SDC_DAEMON_CORE_COORDINATOR_INTERNAL_H_
