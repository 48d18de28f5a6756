#ifndef SDC_CTL_ERRORS_H_
#define SDC_CTL_ERRORS_H_

// sdcctl's exit codes and the one line it prints for a failed call. Scripts
// branch on the codes, so they are part of the CLI's contract. Pure
// functions; all thread-safe.

#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace sdc::sdcctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;         // Anything not listed below.
inline constexpr int kExitUsage = 2;         // Bad command line; nothing was sent.
inline constexpr int kExitNotFound = 3;      // NOT_FOUND.
inline constexpr int kExitPrecondition = 4;  // FAILED_PRECONDITION (e.g. already decided).
inline constexpr int kExitUnreachable = 5;   // UNAVAILABLE or DEADLINE_EXCEEDED.
// UNAUTHENTICATED (sdcd did not accept the credential), PERMISSION_DENIED
// (the credential's role may not make the call), or no credential to send.
inline constexpr int kExitPermission = 6;
// `diagnose`: the diagnostic ran and a device computed wrong values.
inline constexpr int kExitDiagnosticFailed = 7;
// `diagnose`: no verdict (the agent could not run it, its stream ended, or
// it was still running at the deadline).
inline constexpr int kExitDiagnosticNoVerdict = 8;

// The exit code for an RPC that ended with `code` (kExitOk for OK).
int ExitCodeFor(grpc::StatusCode code);

// The text after "sdcctl: error: " for a failed RPC to `server`, on one line
// (newlines in the server's message become spaces):
//   UNAVAILABLE, DEADLINE_EXCEEDED: "cannot reach sdcd at SERVER: ..."
//   UNAUTHENTICATED: "credential not accepted: ..." (a wrong, unknown or
//     removed operator's token, or a certificate naming no operator)
//   PERMISSION_DENIED: "permission denied: ..." (the role may not do this)
//   NOT_FOUND, FAILED_PRECONDITION: the server's message alone, whole, so
//     one that suggests --force still does
//   anything else: "CODE: message".
// REQUIRES: !status.ok().
std::string RpcErrorMessage(const grpc::Status& status, absl::string_view server);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_ERRORS_H_
