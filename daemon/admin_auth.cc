#include "daemon/admin_auth.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
    std::vector<std::string> names;
    for (const grpc::string_ref& v :
         c->auth_context()->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
      names.emplace_back(v.data(), v.size());
    }
    if (names.empty()) {
      for (const grpc::string_ref& v :
           c->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
        names.emplace_back(v.data(), v.size());
      }
    }
    credentials.certificate_names = std::move(names);
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
  } else if (credentials.certificate_names.has_value()) {
    for (const std::string& name : *credentials.certificate_names) {
      if (auth.operators != nullptr) principal = auth.operators->ByName(name);
      if (principal.has_value()) break;
    }
    if (!principal.has_value()) {
      std::vector<std::string> quoted;
      for (const std::string& n : *credentials.certificate_names) {
        quoted.push_back(absl::StrCat("\"", absl::CHexEscape(n.substr(0, 80)), "\""));
      }
      return absl::UnauthenticatedError(absl::StrCat(
          "the client certificate's names (", absl::StrJoin(quoted, ", "),
          ") name no operator (an admin adds one: sdcctl operator add NAME)"));
    }
  } else {
    return absl::UnauthenticatedError(
        "admin calls need 'authorization: Bearer <token>' (sdcctl --token_file) or a "
        "TLS client certificate");
  }
  if (principal->pending) {
    return absl::PermissionDeniedError(absl::StrCat(
        "operator ", principal->name, "'s enrollment waits for a second admin's consent "
        "(another admin runs: sdcctl operator approve ", principal->name, ")"));
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
