#include "tests/testing/token_issuer.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sdc::testing {

struct TokenIssuer::Impl {
  Algorithm algorithm = Algorithm::kRS256;
  std::string kid;
  EVP_PKEY* key = nullptr;
  ~Impl() { EVP_PKEY_free(key); }
};

namespace {

std::string B64(const std::string& bytes) {
  std::string out;
  absl::WebSafeBase64Escape(bytes, &out);  // No padding.
  return out;
}

std::string BnParam(EVP_PKEY* key, const char* name, int pad) {
  BIGNUM* bn = nullptr;
  if (EVP_PKEY_get_bn_param(key, name, &bn) != 1) return "";
  std::string out(pad > 0 ? pad : BN_num_bytes(bn), '\0');
  if (pad > 0) {
    BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), pad);
  } else {
    BN_bn2bin(bn, reinterpret_cast<unsigned char*>(out.data()));
  }
  BN_free(bn);
  return out;
}

}  // namespace

TokenIssuer::TokenIssuer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenIssuer::TokenIssuer(TokenIssuer&&) noexcept = default;
TokenIssuer::~TokenIssuer() = default;

absl::StatusOr<TokenIssuer> TokenIssuer::Create(Algorithm algorithm, const std::string& kid) {
  auto impl = std::make_unique<Impl>();
  impl->algorithm = algorithm;
  impl->kid = kid;
  impl->key = algorithm == Algorithm::kRS256 ? EVP_RSA_gen(2048) : EVP_EC_gen("P-256");
  if (impl->key == nullptr) return absl::InternalError("key generation failed");
  return TokenIssuer(std::move(impl));
}

std::string TokenIssuer::Jwks() const {
  nlohmann::json jwk;
  jwk["kid"] = impl_->kid;
  jwk["use"] = "sig";
  if (impl_->algorithm == Algorithm::kRS256) {
    jwk["kty"] = "RSA";
    jwk["alg"] = "RS256";
    jwk["n"] = B64(BnParam(impl_->key, OSSL_PKEY_PARAM_RSA_N, 0));
    jwk["e"] = B64(BnParam(impl_->key, OSSL_PKEY_PARAM_RSA_E, 0));
  } else {
    jwk["kty"] = "EC";
    jwk["alg"] = "ES256";
    jwk["crv"] = "P-256";
    jwk["x"] = B64(BnParam(impl_->key, OSSL_PKEY_PARAM_EC_PUB_X, 32));
    jwk["y"] = B64(BnParam(impl_->key, OSSL_PKEY_PARAM_EC_PUB_Y, 32));
  }
  nlohmann::json doc;
  doc["keys"] = nlohmann::json::array({jwk});
  return doc.dump();
}

std::string TokenIssuer::PublicPem() const {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PUBKEY(bio, impl_->key);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

std::string TokenIssuer::Sign(const std::string& claims_json, const std::string& alg) const {
  const bool rsa = impl_->algorithm == Algorithm::kRS256;
  nlohmann::json header;
  header["alg"] = alg.empty() ? (rsa ? "RS256" : "ES256") : alg;
  header["kid"] = impl_->kid;
  const std::string signed_part = absl::StrCat(B64(header.dump()), ".", B64(claims_json));
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  size_t length = 0;
  EVP_DigestSignInit(md, nullptr, EVP_sha256(), nullptr, impl_->key);
  EVP_DigestSign(md, nullptr, &length,
                 reinterpret_cast<const unsigned char*>(signed_part.data()), signed_part.size());
  std::string signature(length, '\0');
  EVP_DigestSign(md, reinterpret_cast<unsigned char*>(signature.data()), &length,
                 reinterpret_cast<const unsigned char*>(signed_part.data()), signed_part.size());
  signature.resize(length);
  EVP_MD_CTX_free(md);
  if (!rsa) {  // DER -> JWS's r || s.
    const unsigned char* p = reinterpret_cast<const unsigned char*>(signature.data());
    ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(signature.size()));
    std::string raw(64, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(sig), reinterpret_cast<unsigned char*>(raw.data()), 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(sig), reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
    ECDSA_SIG_free(sig);
    signature = raw;
  }
  return absl::StrCat(signed_part, ".", B64(signature));
}

std::string TokenIssuer::PodToken(const PodTokenClaims& c) const {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  nlohmann::json claims;
  claims["aud"] = nlohmann::json::array({c.audience});
  claims["exp"] = absl::ToUnixSeconds(c.expiry);
  claims["iat"] = now;
  claims["nbf"] = now;
  claims["iss"] = c.issuer;
  claims["jti"] = "4b7e2a53-0000-4000-8000-000000000000";
  claims["sub"] = absl::StrCat("system:serviceaccount:", c.namespace_name, ":", c.service_account);
  nlohmann::json k8s;
  k8s["namespace"] = c.namespace_name;
  k8s["serviceaccount"] = {{"name", c.service_account}, {"uid", "0f1e2d3c-sa"}};
  k8s["pod"] = {{"name", c.pod}, {"uid", "0f1e2d3c-pod"}};
  if (!c.node.empty()) k8s["node"] = {{"name", c.node}, {"uid", "0f1e2d3c-node"}};
  claims["kubernetes.io"] = k8s;
  return Sign(claims.dump());
}

}  // namespace sdc::testing
