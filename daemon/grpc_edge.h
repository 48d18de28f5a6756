#ifndef SDC_DAEMON_GRPC_EDGE_H_
#define SDC_DAEMON_GRPC_EDGE_H_

// Where sdcd's services meet gRPC: the status every handler ends with, the
// label a refusal is counted under, and the message size both of sdcd's
// listeners accept.

#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace sdc::daemon {

// Largest message either side accepts: a weight report of 100,000 tensors is
// about 3 MiB.
inline constexpr int kMaxMessageBytes = 16 << 20;

// Converts at the edge; the codes are the same numbers. A message longer
// than 1 KiB is cut (saying how much), so the status always reaches the
// caller.
grpc::Status ToGrpc(const absl::Status& s);

// The `reason` label of sdc_rejected_inputs_total: the code's name in
// lower_snake ("invalid_argument", "unauthenticated"), a bounded set.
std::string RejectReason(absl::StatusCode code);
std::string RejectReason(grpc::StatusCode code);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_GRPC_EDGE_H_
