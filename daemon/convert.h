#ifndef SDC_DAEMON_CONVERT_H_
#define SDC_DAEMON_CONVERT_H_

// sdcd's records (incidents, replacement requests, suspects, jobs, ranks)
// <-> their wire messages, for the admin API and the SQLite store, which
// keeps records and pending reports in their wire form so one encoding is
// ever written. The trainer wire's converters and the time convention are
// the protocol's (protocol/convert.h): they join this overload set, so sdcd
// converts any message with an unqualified ToProto / FromProto.

#include "admin.pb.h"
#include "common.pb.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/records.h"
#include "daemon/core/types.h"
#include "protocol/convert.h"
#include "trainer.pb.h"

namespace sdc::daemon {

using protocol::FromProto;
using protocol::FromUnixMillis;
using protocol::ToProto;
using protocol::UnixMillis;

// The message's body; its recipients route it.
v1::CoordinatorMessage ToProto(const core::OutMessage& m);

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

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_CONVERT_H_
