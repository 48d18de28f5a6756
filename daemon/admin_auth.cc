#include "daemon/admin_auth.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/grpc_edge.h"
#include "grpc/grpc_security_constants.h"

namespace sdc::daemon {

AdminCredentials CredentialsOf(const AdminAuth& auth, grpc::CallbackServerContext* c) {
  AdminCredentials credentials;
  const auto& md = c->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    credentials.authorization.emplace(it->second.data(), it->second.size());
  }
  if (auth.accept_client_certs && c->auth_context() != nullptr &&
      c->auth_context()->IsPeerAuthenticated()) {
    std::string cn;
    for (const grpc::string_ref& v :
         c->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      cn.assign(v.data(), v.size());
    }
    credentials.certificate_name = std::move(cn);
  }
  return credentials;
}

absl::StatusOr<Principal> Authenticate(const AdminAuth& auth,
                                       const AdminCredentials& credentials, Role needed) {
  std::optional<Principal> principal;
  if (credentials.authorization.has_value()) {
    const absl::string_view presented = *credentials.authorization;
    if (absl::StartsWith(presented, "Bearer ") && auth.operators != nullptr) {
      principal = auth.operators->ByToken(presented.substr(7));
    }
    if (!principal.has_value()) {
      return absl::UnauthenticatedError("the admin token is not valid");
    }
  } else if (credentials.certificate_name.has_value()) {
    const std::string& cn = *credentials.certificate_name;
    if (auth.operators != nullptr) principal = auth.operators->ByName(cn);
    if (!principal.has_value()) {
      return absl::UnauthenticatedError(
          absl::StrCat("the client certificate's common name \"", absl::CHexEscape(cn),
                       "\" names no operator (an admin adds it: sdcctl operator add NAME)"));
    }
  } else {
    return absl::UnauthenticatedError(
        "admin calls need 'authorization: Bearer <token>' (sdcctl --token_file) or a "
        "TLS client certificate");
  }
  if (principal->role < needed) {
    return absl::PermissionDeniedError(absl::StrCat(principal->name, " has role ",
                                                    RoleName(principal->role),
                                                    "; this call needs ", RoleName(needed)));
  }
  return *std::move(principal);
}

grpc::Status AuthorizeAdmin(const AdminAuth& auth, ServiceMetrics* metrics,
                            grpc::CallbackServerContext* c, Role needed, Principal* who) {
  absl::StatusOr<Principal> principal = Authenticate(auth, CredentialsOf(auth, c), needed);
  if (!principal.ok()) {
    metrics->Rejected(RejectReason(principal.status().code()));
    return ToGrpc(principal.status());
  }
  if (who != nullptr) *who = *std::move(principal);
  return grpc::Status::OK;
}

}  // namespace sdc::daemon
