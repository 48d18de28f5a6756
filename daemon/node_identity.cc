#include "daemon/node_identity.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/identity.h"
#include "grpc/grpc_security_constants.h"

namespace sdc::daemon {

PeerCredentials CredentialsOf(const grpc::ServerContextBase& context) {
  PeerCredentials out;
  const auto& md = context.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    const std::string value(it->second.data(), it->second.size());
    if (absl::StartsWith(value, "Bearer ")) out.bearer = value.substr(7);
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_PEER_DNS_PROPERTY_NAME)) {
      std::string name(v.data(), v.size());
      if (common::IsSafeNodeName(name)) out.certificate_nodes.push_back(std::move(name));
    }
  }
  return out;
}

absl::StatusOr<ProvenNode> NodeAuthenticator::Agent(const PeerCredentials& c) const {
  std::optional<ProvenNode> by_token;
  if (c.bearer.has_value()) {
    if (tokens_ == nullptr) {
      return absl::UnauthenticatedError(
          "a bearer token was sent, but sdcd accepts none (it needs --agent_token_keys)");
    }
    absl::StatusOr<TokenClaims> claims = tokens_->Verify(*c.bearer, clock_->Now());
    if (!claims.ok()) return claims.status();
    by_token = ProvenNode{claims->node, absl::StrCat("service-account token of pod ",
                                                     claims->namespace_name, "/", claims->pod)};
  }
  if (c.certificate_nodes.size() > 1) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the client certificate names several nodes (", absl::StrJoin(c.certificate_nodes, ", "),
        "); a node's certificate names that node only"));
  }
  if (c.certificate_nodes.size() == 1) {
    const std::string& node = c.certificate_nodes.front();
    if (by_token.has_value() && by_token->node != node) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the client certificate names node ", node, " but the ", by_token->proof,
          " names node ", by_token->node));
    }
    return ProvenNode{node, "certificate"};
  }
  if (by_token.has_value()) return *by_token;
  if (insecure_dev_mode_) return ProvenNode{"", kStated};
  return absl::UnauthenticatedError(
      "a node agent proves its node: a client certificate from sdcd's --tls_client_ca whose DNS "
      "name is the node's, or (EKS) its pod's projected service-account token as a bearer "
      "token (sdc-agent --token_file)");
}

}  // namespace sdc::daemon
