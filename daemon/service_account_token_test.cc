#include "daemon/service_account_token.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/token_issuer.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;
using testing::PodTokenClaims;
using testing::TokenIssuer;

TokenPolicy Policy() {
  TokenPolicy p;
  p.issuer = "https://oidc.test.example/id/TEST";
  p.subjects = {"system:serviceaccount:sdc-agent:sdc-agent"};
  return p;
}

PodTokenClaims OnNode(const std::string& node) {
  PodTokenClaims c;
  c.node = node;
  return c;
}

// RS256 with a JWKS document and ES256 with a PEM key: the pod's node is the
// token's.
TEST(ServiceAccountTokenTest, APodBoundTokenNamesItsNode) {
  for (auto alg : {TokenIssuer::Algorithm::kRS256, TokenIssuer::Algorithm::kES256}) {
    absl::StatusOr<TokenIssuer> issuer = TokenIssuer::Create(alg, "key-1");
    ASSERT_TRUE(issuer.ok());
    for (const std::string& keys : {issuer->Jwks(), issuer->PublicPem()}) {
      absl::StatusOr<std::unique_ptr<TokenVerifier>> v = TokenVerifier::Create(keys, Policy());
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ((*v)->keys(), 1u);
      absl::StatusOr<TokenClaims> claims =
          (*v)->Verify(issuer->PodToken(OnNode("hyperpod-i-0123456789abcdef0")), absl::Now());
      ASSERT_TRUE(claims.ok()) << claims.status();
      EXPECT_EQ(claims->node, "hyperpod-i-0123456789abcdef0");
      EXPECT_EQ(claims->pod, "sdc-agent-x7k2p");
      EXPECT_EQ(claims->namespace_name, "sdc-agent");
    }
  }
}

// Every reason a token is refused, each UNAUTHENTICATED with its reason.
TEST(ServiceAccountTokenTest, ForgedExpiredOrMisaddressedTokensAreRefused) {
  absl::StatusOr<TokenIssuer> cluster = TokenIssuer::Create(TokenIssuer::Algorithm::kRS256, "k");
  absl::StatusOr<TokenIssuer> other = TokenIssuer::Create(TokenIssuer::Algorithm::kRS256, "k");
  ASSERT_TRUE(cluster.ok() && other.ok());
  auto v = TokenVerifier::Create(cluster->Jwks(), Policy());
  ASSERT_TRUE(v.ok());
  const absl::Time now = absl::Now();
  PodTokenClaims wrong_aud = OnNode("node-a");
  wrong_aud.audience = "https://kubernetes.default.svc";
  PodTokenClaims wrong_iss = OnNode("node-a");
  wrong_iss.issuer = "https://evil.example";
  PodTokenClaims expired = OnNode("node-a");
  expired.expiry = now - absl::Minutes(5);
  PodTokenClaims other_sa = OnNode("node-a");
  other_sa.namespace_name = "team-ml";
  other_sa.service_account = "default";
  PodTokenClaims no_pod = OnNode("node-a");
  no_pod.pod = "";
  const std::string good = cluster->PodToken(OnNode("node-a"));
  std::string tampered = good;
  tampered[tampered.find('.') + 5] ^= 1;  // One byte of the claims.
  struct Case {
    std::string token;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {other->PodToken(OnNode("node-a")), "matches none of the issuer's keys"},
           {tampered, ""},
           {cluster->PodToken(wrong_aud), "audience does not include \"sdcd\""},
           {cluster->PodToken(wrong_iss), "issuer \"https://evil.example\""},
           {cluster->PodToken(expired), "it expired"},
           {cluster->PodToken(other_sa), "service account \"system:serviceaccount:team-ml:default\""},
           {cluster->PodToken(OnNode("")), "names no node"},
           {cluster->PodToken(no_pod), "not bound to a pod"},
           {cluster->Sign(R"({"iss":"x"})", "none"), "algorithm \"none\""},
           {cluster->Sign(R"({"iss":"x"})", "HS256"), "algorithm \"HS256\""},
           {"not-a-token", "not a JWS"}}) {
    absl::StatusOr<TokenClaims> r = (*v)->Verify(c.token, now);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << c.why;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.why));
  }
  // Expired within the leeway still passes; a minute past it does not.
  PodTokenClaims just = OnNode("node-a");
  just.expiry = now - absl::Seconds(30);
  EXPECT_TRUE((*v)->Verify(cluster->PodToken(just), now).ok());
  EXPECT_FALSE((*v)->Verify(cluster->PodToken(just), now + absl::Minutes(1)).ok());
}

TEST(ServiceAccountTokenTest, KeysAndPolicyAreRequired) {
  EXPECT_EQ(TokenVerifier::Create("{}", Policy()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenVerifier::Create("garbage", Policy()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<TokenIssuer> issuer = TokenIssuer::Create(TokenIssuer::Algorithm::kES256, "k");
  ASSERT_TRUE(issuer.ok());
  TokenPolicy no_issuer = Policy();
  no_issuer.issuer = "";
  EXPECT_EQ(TokenVerifier::Create(issuer->Jwks(), no_issuer).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sdc::daemon
