#ifndef SDC_PROTOCOL_CONVERT_H_
#define SDC_PROTOCOL_CONVERT_H_

// The trainer wire (sdc.v1's Hello, Report, CoordinatorMessage) <-> the
// protocol's plain structs, and the wire's one time convention. Trainers
// convert what they send (client/coordinator_link); sdcd converts what it
// receives and what its core decides. sdcd's admin-only records (incidents,
// requests, jobs) convert in daemon/convert.h, which builds on this.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protocol/attribution.h"
#include "protocol/messages.h"
#include "protocol/types.h"
#include "trainer.pb.h"

namespace sdc::protocol {

Placement FromProto(const v1::RankPlacement& p);
void ToProto(const Placement& p, v1::RankPlacement* out);

Hello FromProto(const v1::Hello& h);
v1::Hello ToProto(const Hello& h);

// InvalidArgument when the report has no body, or fingerprints that are not
// (length, s1, s2) triplets.
absl::StatusOr<Report> FromProto(const v1::Report& r);
v1::Report ToProto(const Report& r);

v1::CoordinatorMessage ToProto(const CoordinatorMessage& m);
v1::AuditPlan ToProto(const PlanMessage& p);
// kIncomplete is PASS on the wire: nothing failed.
v1::VerdictOutcome ToProto(AuditOutcome o);

// Every *_unix_ms field of sdc.v1: milliseconds since the Unix epoch,
// rounded down. absl::InfinitePast(), how sdcd's records say "never" or "not
// yet" (a diagnostic still running), is 0, as an unset field reads.
// FromUnixMillis is its inverse for every other time; 0 reads back as the
// epoch, not as InfinitePast.
int64_t UnixMillis(absl::Time t);
absl::Time FromUnixMillis(int64_t ms);

}  // namespace sdc::protocol

#endif  // SDC_PROTOCOL_CONVERT_H_
