#ifndef SDC_DAEMON_SERVICE_ACCOUNT_TOKEN_H_
#define SDC_DAEMON_SERVICE_ACCOUNT_TOKEN_H_

// Kubernetes projected service-account tokens, verified by sdcd itself: how
// a node agent on EKS proves which node it runs on without a certificate of
// its own. kubelet mounts the agent pod a token (a JWT) bound to the pod,
// with audience "sdcd"; the API server signs it with the cluster's
// service-account issuer key and, for a pod-bound token (Kubernetes 1.30+),
// names the pod's node in the private claim
//
//   "kubernetes.io": {"namespace": "sdc-agent",
//                     "serviceaccount": {"name": "sdc-agent", "uid": "..."},
//                     "pod": {"name": "sdc-agent-x7k2p", "uid": "..."},
//                     "node": {"name": "hyperpod-i-0abc...", "uid": "..."}}
//
// A token is accepted when its signature verifies (RS256 or ES256) against
// one of the issuer's public keys (a JWKS document, as the issuer's
// /openid/v1/jwks serves it, or PEM public keys), its `iss` is the issuer,
// its `aud` holds the audience, it has not expired (and `nbf` has passed),
// `sub` is one of the accepted service accounts, and it names a pod and a
// node. No other algorithm is accepted ("none" and HMAC are refused: the
// keys are public). Pure: no network, no clock of its own.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sdc::daemon {

struct TokenPolicy {
  std::string issuer;               // The `iss` accepted, exactly.
  std::string audience = "sdcd";    // Must be in `aud`.
  // Accepted `sub`s ("system:serviceaccount:NAMESPACE:NAME").
  std::vector<std::string> subjects;
  absl::Duration leeway = absl::Seconds(60);  // Clock skew allowed on exp/nbf.
};

// What a verified token says.
struct TokenClaims {
  std::string subject;
  std::string namespace_name;
  std::string pod;
  std::string node;
  absl::Time expiry;
};

// Thread-safe (immutable once made).
class TokenVerifier {
 public:
  // Keys from `text`: a JWKS document ({"keys": [...]}, RSA and EC P-256
  // keys, by "kid") or PEM public keys. InvalidArgument when it holds none,
  // or the policy lacks an issuer or subjects.
  static absl::StatusOr<std::unique_ptr<TokenVerifier>> Create(absl::string_view text,
                                                               TokenPolicy policy);
  ~TokenVerifier();

  // The claims of `token` if it is accepted at `now`; Unauthenticated
  // naming the first reason it is not.
  absl::StatusOr<TokenClaims> Verify(absl::string_view token, absl::Time now) const;

  size_t keys() const;

 private:
  struct Key;
  TokenVerifier(TokenPolicy policy, std::vector<std::unique_ptr<Key>> keys);

  const TokenPolicy policy_;
  const std::vector<std::unique_ptr<Key>> keys_;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_SERVICE_ACCOUNT_TOKEN_H_
