#include "ctl/errors.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sdc::sdcctl {

int ExitCodeFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::NOT_FOUND:
      return kExitNotFound;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return kExitPrecondition;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnreachable;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return kExitPermission;
    default:
      return kExitError;
  }
}

std::string RpcErrorMessage(const grpc::Status& status, absl::string_view server) {
  const grpc::StatusCode code = status.error_code();
  const std::string code_name =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(static_cast<int>(code)));
  std::string message = status.error_message().empty() ? code_name : status.error_message();
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StrCat("cannot reach sdcd at ", server, ": ", message);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StrCat("cannot reach sdcd at ", server, ": no answer before the deadline (",
                          message, "; see --timeout)");
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::StrCat("credential not accepted: ", message);
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StrCat("permission denied: ", message);
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return message;
    default:
      return absl::StrCat(code_name, ": ", message);
  }
}

}  // namespace sdc::sdcctl
