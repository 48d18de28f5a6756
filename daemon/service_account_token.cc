#include "daemon/service_account_token.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/identity.h"
#include "nlohmann/json.hpp"

namespace sdc::daemon {

struct TokenVerifier::Key {
  std::string kid;  // Empty for a PEM key.
  EVP_PKEY* pkey = nullptr;
  ~Key() { EVP_PKEY_free(pkey); }
};

namespace {

using Json = nlohmann::json;

absl::Status Refused(const std::string& why) {
  return absl::UnauthenticatedError(absl::StrCat("service-account token refused: ", why));
}

bool Base64Url(absl::string_view in, std::string* out) {
  return absl::WebSafeBase64Unescape(in, out);
}

BIGNUM* Bignum(const std::string& b64) {
  std::string bytes;
  if (!Base64Url(b64, &bytes) || bytes.empty()) return nullptr;
  return BN_bin2bn(reinterpret_cast<const unsigned char*>(bytes.data()),
                   static_cast<int>(bytes.size()), nullptr);
}

EVP_PKEY* FromParams(const char* type, OSSL_PARAM_BLD* bld) {
  OSSL_PARAM* params = OSSL_PARAM_BLD_to_param(bld);
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr);
  EVP_PKEY* pkey = nullptr;
  if (params == nullptr || ctx == nullptr || EVP_PKEY_fromdata_init(ctx) != 1 ||
      EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1) {
    pkey = nullptr;
  }
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  return pkey;
}

// One JWK: RSA (n, e) or EC P-256 (x, y); null for anything else.
EVP_PKEY* FromJwk(const Json& jwk) {
  const std::string kty = jwk.value("kty", "");
  OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
  if (bld == nullptr) return nullptr;
  EVP_PKEY* pkey = nullptr;
  if (kty == "RSA") {
    BIGNUM* n = Bignum(jwk.value("n", ""));
    BIGNUM* e = Bignum(jwk.value("e", ""));
    if (n != nullptr && e != nullptr && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n) &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e)) {
      pkey = FromParams("RSA", bld);
    }
    BN_free(n);
    BN_free(e);
  } else if (kty == "EC" && jwk.value("crv", "") == "P-256") {
    std::string x, y;
    if (Base64Url(jwk.value("x", ""), &x) && Base64Url(jwk.value("y", ""), &y) &&
        x.size() == 32 && y.size() == 32) {
      const std::string point = std::string(1, '\x04') + x + y;
      static char kGroup[] = "prime256v1";
      if (OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, kGroup, 0) &&
          OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point.data(),
                                           point.size())) {
        pkey = FromParams("EC", bld);
      }
    }
  }
  OSSL_PARAM_BLD_free(bld);
  return pkey;
}

// JWS ES256 signatures are r || s (32 bytes each); OpenSSL verifies DER.
bool EcdsaDer(const std::string& raw, std::string* der) {
  if (raw.size() != 64) return false;
  ECDSA_SIG* sig = ECDSA_SIG_new();
  BIGNUM* r = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()), 32, nullptr);
  BIGNUM* s = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()) + 32, 32, nullptr);
  if (sig == nullptr || r == nullptr || s == nullptr || ECDSA_SIG_set0(sig, r, s) != 1) {
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(sig);
    return false;
  }
  unsigned char* out = nullptr;
  const int n = i2d_ECDSA_SIG(sig, &out);
  ECDSA_SIG_free(sig);
  if (n <= 0) return false;
  der->assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  OPENSSL_free(out);
  return true;
}

bool VerifySha256(EVP_PKEY* key, absl::string_view data, const std::string& signature) {
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  const bool ok =
      md != nullptr && EVP_DigestVerifyInit(md, nullptr, EVP_sha256(), nullptr, key) == 1 &&
      EVP_DigestVerify(md, reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(data.data()),
                       data.size()) == 1;
  EVP_MD_CTX_free(md);
  ERR_clear_error();
  return ok;
}

// A NumericDate claim, or nullopt when absent; false when present but not a
// number.
bool NumericDate(const Json& claims, const char* name, std::optional<absl::Time>* out) {
  auto it = claims.find(name);
  if (it == claims.end()) return true;
  if (!it->is_number()) return false;
  *out = absl::FromUnixSeconds(it->get<int64_t>());
  return true;
}

// claims["kubernetes.io"][object]["name"], or "".
std::string RefName(const Json& k8s, const char* object) {
  auto it = k8s.find(object);
  if (it == k8s.end() || !it->is_object()) return "";
  auto name = it->find("name");
  return name != it->end() && name->is_string() ? name->get<std::string>() : "";
}

}  // namespace

TokenVerifier::TokenVerifier(TokenPolicy policy, std::vector<std::unique_ptr<Key>> keys)
    : policy_(std::move(policy)), keys_(std::move(keys)) {}

TokenVerifier::~TokenVerifier() = default;

size_t TokenVerifier::keys() const { return keys_.size(); }

absl::StatusOr<std::unique_ptr<TokenVerifier>> TokenVerifier::Create(absl::string_view text,
                                                                     TokenPolicy policy) {
  if (policy.issuer.empty()) return absl::InvalidArgumentError("no issuer to accept");
  if (policy.subjects.empty()) return absl::InvalidArgumentError("no service account to accept");
  std::vector<std::unique_ptr<Key>> keys;
  const Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_object() && doc.contains("keys") && doc["keys"].is_array()) {
    for (const Json& jwk : doc["keys"]) {
      if (!jwk.is_object()) continue;
      EVP_PKEY* pkey = FromJwk(jwk);
      if (pkey == nullptr) continue;  // A key type we do not verify with.
      auto key = std::make_unique<Key>();
      key->kid = jwk.value("kid", "");
      key->pkey = pkey;
      keys.push_back(std::move(key));
    }
  } else {
    BIO* bio = BIO_new_mem_buf(text.data(), static_cast<int>(text.size()));
    while (bio != nullptr) {
      EVP_PKEY* pkey = PEM_read_bio_PUBKEY(bio, nullptr, nullptr, nullptr);
      if (pkey == nullptr) break;
      auto key = std::make_unique<Key>();
      key->pkey = pkey;
      keys.push_back(std::move(key));
    }
    BIO_free(bio);
    ERR_clear_error();
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        "no RSA or EC P-256 public key in it (expected a JWKS document or PEM public keys)");
  }
  return std::unique_ptr<TokenVerifier>(new TokenVerifier(std::move(policy), std::move(keys)));
}

absl::StatusOr<TokenClaims> TokenVerifier::Verify(absl::string_view token, absl::Time now) const {
  const std::vector<absl::string_view> parts = absl::StrSplit(token, '.');
  if (parts.size() != 3) return Refused("not a JWS (three dot-separated parts)");
  std::string header_text, claims_text, signature;
  if (!Base64Url(parts[0], &header_text) || !Base64Url(parts[1], &claims_text) ||
      !Base64Url(parts[2], &signature)) {
    return Refused("not base64url");
  }
  const Json header = Json::parse(header_text, nullptr, false);
  const Json claims = Json::parse(claims_text, nullptr, false);
  if (!header.is_object() || !claims.is_object()) return Refused("not JSON objects");
  const std::string alg = header.value("alg", "");
  const std::string kid = header.value("kid", "");
  int key_type = 0;
  if (alg == "RS256") {
    key_type = EVP_PKEY_RSA;
  } else if (alg == "ES256") {
    key_type = EVP_PKEY_EC;
    std::string der;
    if (!EcdsaDer(signature, &der)) return Refused("an ES256 signature is 64 bytes");
    signature = std::move(der);
  } else {
    return Refused(absl::StrCat("algorithm \"", alg.substr(0, 16),
                                "\" (only RS256 and ES256 are accepted)"));
  }
  const absl::string_view signed_part = token.substr(0, parts[0].size() + 1 + parts[1].size());
  bool verified = false;
  for (const auto& key : keys_) {
    if (EVP_PKEY_get_base_id(key->pkey) != key_type) continue;
    if (!kid.empty() && !key->kid.empty() && kid != key->kid) continue;
    if (VerifySha256(key->pkey, signed_part, signature)) {
      verified = true;
      break;
    }
  }
  if (!verified) return Refused("its signature matches none of the issuer's keys");

  if (claims.value("iss", "") != policy_.issuer) {
    return Refused(absl::StrCat("issuer \"", claims.value("iss", "").substr(0, 200),
                                "\" is not \"", policy_.issuer, "\""));
  }
  bool audience = false;
  if (auto aud = claims.find("aud"); aud != claims.end()) {
    if (aud->is_string()) {
      audience = aud->get<std::string>() == policy_.audience;
    } else if (aud->is_array()) {
      for (const Json& a : *aud) audience = audience || (a.is_string() && a == policy_.audience);
    }
  }
  if (!audience) return Refused(absl::StrCat("its audience does not include \"", policy_.audience, "\""));
  std::optional<absl::Time> exp, nbf;
  if (!NumericDate(claims, "exp", &exp) || !NumericDate(claims, "nbf", &nbf)) {
    return Refused("exp or nbf is not a number");
  }
  if (!exp.has_value()) return Refused("it has no expiry");
  if (now > *exp + policy_.leeway) {
    return Refused(absl::StrCat("it expired at ", absl::FormatTime(*exp)));
  }
  if (nbf.has_value() && now + policy_.leeway < *nbf) {
    return Refused(absl::StrCat("it is not valid before ", absl::FormatTime(*nbf)));
  }
  TokenClaims out;
  out.subject = claims.value("sub", "");
  out.expiry = *exp;
  if (std::find(policy_.subjects.begin(), policy_.subjects.end(), out.subject) ==
      policy_.subjects.end()) {
    return Refused(absl::StrCat("service account \"", out.subject.substr(0, 200),
                                "\" is not one sdcd accepts (",
                                absl::StrJoin(policy_.subjects, ", "), ")"));
  }
  auto k8s = claims.find("kubernetes.io");
  if (k8s == claims.end() || !k8s->is_object()) {
    return Refused("no kubernetes.io claim (not a Kubernetes service-account token)");
  }
  out.namespace_name = k8s->value("namespace", "");
  out.pod = RefName(*k8s, "pod");
  out.node = RefName(*k8s, "node");
  if (out.pod.empty()) {
    return Refused("it is not bound to a pod (mount it as a projected volume)");
  }
  if (out.node.empty()) {
    return Refused(
        "it names no node (kubernetes.io.node: Kubernetes 1.30 or later puts the pod's node "
        "in pod-bound tokens)");
  }
  if (!common::IsSafeNodeName(out.node)) return Refused("its node name is not a node name");
  return out;
}

}  // namespace sdc::daemon
