#include "daemon/grpc_edge.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace sdc::daemon {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // A message travels in the trailers, which a gRPC client takes up to 8 KiB
  // of by default: longer, the caller would see RESOURCE_EXHAUSTED instead
  // of the status. Messages that echo input are cut where they say so
  // (EchoJobId, ...); this holds for every other one.
  constexpr size_t kMaxMessage = 1024;
  std::string message(s.message());
  if (message.size() > kMaxMessage) {
    const size_t cut = message.size() - kMaxMessage;
    message.resize(kMaxMessage);
    absl::StrAppend(&message, "... (", cut, " more bytes)");
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::move(message));
}

std::string RejectReason(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

std::string RejectReason(grpc::StatusCode code) {
  return RejectReason(static_cast<absl::StatusCode>(code));
}

}  // namespace sdc::daemon
