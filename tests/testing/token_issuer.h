#ifndef SDC_TESTS_TESTING_TOKEN_ISSUER_H_
#define SDC_TESTS_TESTING_TOKEN_ISSUER_H_

// A stand-in for a Kubernetes service-account issuer, for tests: a signing
// key made here (RSA-2048 for RS256, or EC P-256 for ES256), its public half
// as a JWKS document (what /openid/v1/jwks serves) or PEM, and signed tokens
// shaped like kubelet's projected, pod-bound ones. There is no API server
// here; sdcd verifies what this signs exactly as it would the cluster's.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sdc::testing {

// What a pod-bound projected token says (daemon/service_account_token.h).
struct PodTokenClaims {
  std::string issuer = "https://oidc.test.example/id/TEST";
  std::string audience = "sdcd";
  std::string namespace_name = "sdc-agent";
  std::string service_account = "sdc-agent";
  std::string pod = "sdc-agent-x7k2p";
  std::string node;  // Empty: no kubernetes.io.node claim.
  absl::Time expiry = absl::Now() + absl::Hours(1);
};

class TokenIssuer {
 public:
  enum class Algorithm { kRS256, kES256 };
  static absl::StatusOr<TokenIssuer> Create(Algorithm algorithm, const std::string& kid);
  TokenIssuer(TokenIssuer&&) noexcept;
  ~TokenIssuer();

  // {"keys": [<this key's JWK>]}.
  std::string Jwks() const;
  // The public key, PEM.
  std::string PublicPem() const;
  // A JWS of `claims_json` (a JSON object), signed with this key; `alg`
  // overrides the header's algorithm name (tests of refusals).
  std::string Sign(const std::string& claims_json, const std::string& alg = "") const;
  // A token as kubelet projects it for a pod.
  std::string PodToken(const PodTokenClaims& claims) const;

 private:
  struct Impl;
  explicit TokenIssuer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdc::testing

#endif  // SDC_TESTS_TESTING_TOKEN_ISSUER_H_
