#ifndef SDC_DAEMON_CONVERT_H_
#define SDC_DAEMON_CONVERT_H_

// Wire messages (sdc.v1) <-> the core's plain structs. The service converts
// at the edge; the SQLite store serializes pending reports through the wire
// form, so one encoding is ever written.

#include "absl/status/statusor.h"
#include "common.pb.h"
#include "admin.pb.h"
#include "trainer.pb.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/records.h"
#include "daemon/core/types.h"

namespace sdc::daemon {

core::Hello FromProto(const v1::Hello& h);
v1::Hello ToProto(const core::Hello& h);

// InvalidArgument when the report has no body.
absl::StatusOr<core::Report> FromProto(const v1::Report& r);
v1::Report ToProto(const core::Report& r);

v1::CoordinatorMessage ToProto(const core::OutMessage& m);
v1::AuditPlan ToProto(const core::PlanMessage& p);

v1::Incident ToProto(const core::Incident& i);
v1::ReplacementRequest ToProto(const core::ReplacementRequest& r);
v1::Suspect ToProto(const core::Suspect& s);
v1::Job ToProto(const core::JobSummary& j);
v1::Rank ToProto(const core::RankSummary& r);

core::Incident FromProto(const v1::Incident& i);
core::ReplacementRequest FromProto(const v1::ReplacementRequest& r);
core::Suspect FromProto(const v1::Suspect& s);

v1::RequestState ToProto(core::RequestState s);
core::RequestState FromProto(v1::RequestState s);
v1::CheckKind ToProto(core::CheckKind k);
core::CheckKind FromProto(v1::CheckKind k);
v1::VerdictOutcome ToProto(core::AuditOutcome o);

int64_t UnixMillis(absl::Time t);
absl::Time FromUnixMillis(int64_t ms);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_CONVERT_H_
