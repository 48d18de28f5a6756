#ifndef SDC_DAEMON_ADMIN_AUTH_H_
#define SDC_DAEMON_ADMIN_AUTH_H_

// The rule of every admin-side service (AdminService, NodeAdminService):
// who the caller is, whether its role suffices, and both decided before a
// byte of its request is parsed.
//
// The caller is named by the bearer token when one is sent, else by a
// verified TLS client certificate from the admin CA when accepted: a
// subject alternative name of it (DNS or email) that is a registered
// operator's name (its common name only for a certificate without SANs).
// The codes follow gRPC's meaning: UNAUTHENTICATED when the call names no
// principal (no credential, a header that is not a bearer token, a wrong or
// revoked token, a certificate that names no operator); PERMISSION_DENIED
// for a known principal short of the call: its role is below the call's,
// or (two-person mode) its enrollment still waits for a second admin's
// consent.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/operators.h"
#include "daemon/raw_unary.h"
#include "daemon/service_metrics.h"
#include "grpcpp/grpcpp.h"

namespace sdc::daemon {

struct AdminAuth {
  // The root token and per-operator tokens; must outlive the services.
  const Operators* operators = nullptr;
  // A verified TLS client certificate naming a registered operator
  // authenticates as that operator (when no bearer token is sent).
  bool accept_client_certs = false;
};

// What a caller presented.
struct AdminCredentials {
  // The `authorization` header's value, when sent.
  std::optional<std::string> authorization;
  // The names its verified TLS client certificate gives, when the peer was
  // verified and AdminAuth::accept_client_certs: its subject alternative
  // names, or its common name when it has none.
  std::optional<std::vector<std::string>> certificate_names;
};

// The credentials of call `c`.
AdminCredentials CredentialsOf(const AdminAuth& auth, grpc::CallbackServerContext* c);

// The principal `credentials` name, if its role is at least `needed`:
// UNAUTHENTICATED or PERMISSION_DENIED (see the top of this file), with a
// message that says what to do.
absl::StatusOr<Principal> Authenticate(const AdminAuth& auth,
                                       const AdminCredentials& credentials, Role needed);

// Authenticate on call `c`'s credentials: OK (with *who set, if given), or
// the refusal, counted in `metrics` under its code's name.
grpc::Status AuthorizeAdmin(const AdminAuth& auth, ServiceMetrics* metrics,
                            grpc::CallbackServerContext* c, Role needed = Role::kViewer,
                            Principal* who = nullptr);

// Serves a raw unary admin call: authenticates (needing `role`) before a
// byte of `in` is parsed, so an unauthenticated caller's message, however
// large or malformed, is never deserialized; then parses it as Request
// (INVALID_ARGUMENT if it is not one) and runs handler(principal, request,
// reactor), which must Reply.
template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* ServeAuthenticated(const AdminAuth& auth, ServiceMetrics* metrics,
                                             grpc::CallbackServerContext* c,
                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                             Role role, Handler handler) {
  auto* reactor = new RawUnaryReactor<Response>(out);
  Principal who;
  if (grpc::Status s = AuthorizeAdmin(auth, metrics, c, role, &who); !s.ok()) {
    reactor->Reply(std::move(s));
    return reactor;
  }
  Request request;
  if (!ParseRequest(metrics, in, &request, reactor)) return reactor;
  handler(who, request, reactor);
  return reactor;
}

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_ADMIN_AUTH_H_
