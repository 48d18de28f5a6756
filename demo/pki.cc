#include "demo/pki.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::demo {
namespace {

constexpr long kValidSeconds = 2 * 24 * 3600;

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;
using Bio = std::unique_ptr<BIO, BioFree>;

absl::Status OpenSslError(const std::string& what) {
  char text[256] = "unknown error";
  if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, text, sizeof(text));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", text));
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("EC key generation");
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(absl::StrCat("extension ", OBJ_nid2sn(nid), "=", value));
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) return OpenSslError("adding an extension");
  return absl::OkStatus();
}

// A certificate for `subject_key` named `cn`, signed by `issuer_key`
// (`issuer` null: self-signed).
absl::StatusOr<Cert> NewCertificate(const std::string& cn, EVP_PKEY* subject_key,
                                    X509* issuer, EVP_PKEY* issuer_key) {
  Cert cert(X509_new());
  if (cert == nullptr) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);  // v3
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("serial number");
  serial[0] &= 0x7f;  // Positive.
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), kValidSeconds);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(),
                       issuer == nullptr ? name : X509_get_subject_name(issuer));
  if (X509_set_pubkey(cert.get(), subject_key) != 1) return OpenSslError("X509_set_pubkey");
  return cert;
}

absl::Status Sign(X509* cert, EVP_PKEY* key) {
  if (X509_sign(cert, key, EVP_sha256()) == 0) return OpenSslError("signing");
  return absl::OkStatus();
}

absl::StatusOr<std::string> Pem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) {
    return OpenSslError("writing a certificate");
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> Pem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("writing a key");
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::Status WriteFile(const std::string& path, const std::string& data, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  const bool ok = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

struct Pki::Impl {
  Key key;
  Cert cert;
};

Pki::Pki(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pki::Pki(Pki&&) noexcept = default;
Pki& Pki::operator=(Pki&&) noexcept = default;
Pki::~Pki() = default;

absl::StatusOr<Pki> Pki::Create(const std::string& common_name) {
  auto impl = std::make_unique<Impl>();
  absl::StatusOr<Key> key = NewKey();
  if (!key.ok()) return key.status();
  impl->key = *std::move(key);
  absl::StatusOr<Cert> cert = NewCertificate(common_name, impl->key.get(), nullptr, nullptr);
  if (!cert.ok()) return cert.status();
  impl->cert = *std::move(cert);
  X509* c = impl->cert.get();
  for (const auto& [nid, value] :
       {std::pair<int, std::string>{NID_basic_constraints, "critical,CA:TRUE"},
        {NID_key_usage, "critical,keyCertSign,cRLSign"},
        {NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(c, c, nid, value); !s.ok()) return s;
  }
  if (absl::Status s = Sign(c, impl->key.get()); !s.ok()) return s;
  return Pki(std::move(impl));
}

std::string Pki::ca_pem() const {
  absl::StatusOr<std::string> pem = Pem(impl_->cert.get());
  return pem.ok() ? *pem : "";
}

absl::Status Pki::WriteCa(const std::string& path) const {
  absl::StatusOr<std::string> pem = Pem(impl_->cert.get());
  if (!pem.ok()) return pem.status();
  return WriteFile(path, *pem, 0644);
}

absl::Status Pki::Issue(const CertificateSpec& spec, const std::string& cert_path,
                        const std::string& key_path) const {
  absl::StatusOr<Key> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<Cert> cert =
      NewCertificate(spec.common_name, key->get(), impl_->cert.get(), impl_->key.get());
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  std::vector<std::string> san;
  for (const std::string& d : spec.dns_names) san.push_back(absl::StrCat("DNS:", d));
  for (const std::string& ip : spec.ips) san.push_back(absl::StrCat("IP:", ip));
  for (const std::string& e : spec.emails) san.push_back(absl::StrCat("email:", e));
  std::vector<std::pair<int, std::string>> extensions = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
      {NID_ext_key_usage, spec.server ? "serverAuth" : "clientAuth"},
      {NID_subject_key_identifier, "hash"},
      {NID_authority_key_identifier, "keyid"}};
  if (!san.empty()) extensions.push_back({NID_subject_alt_name, absl::StrJoin(san, ",")});
  for (const auto& [nid, value] : extensions) {
    if (absl::Status s = AddExtension(c, impl_->cert.get(), nid, value); !s.ok()) return s;
  }
  if (absl::Status s = Sign(c, impl_->key.get()); !s.ok()) return s;
  absl::StatusOr<std::string> cert_pem = Pem(c);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = Pem(key->get());
  if (!key_pem.ok()) return key_pem.status();
  if (absl::Status s = WriteFile(cert_path, *cert_pem, 0644); !s.ok()) return s;
  return WriteFile(key_path, *key_pem, 0600);
}

std::string ClusterPki::NodeCert(const std::string& node) const {
  return absl::StrCat(dir, "/node-", node, ".pem");
}

std::string ClusterPki::NodeKey(const std::string& node) const {
  return absl::StrCat(dir, "/node-", node, ".key");
}

absl::StatusOr<ClusterPki> WriteClusterPki(const std::string& dir,
                                           const std::vector<std::string>& nodes) {
  absl::StatusOr<Pki> pki = Pki::Create("sdc-guard throwaway CA");
  if (!pki.ok()) return pki.status();
  ClusterPki files;
  files.dir = dir;
  files.ca = dir + "/ca.pem";
  files.server_cert = dir + "/server.pem";
  files.server_key = dir + "/server.key";
  if (absl::Status s = pki->WriteCa(files.ca); !s.ok()) return s;
  if (absl::Status s = pki->Issue({"localhost", {"localhost"}, {"127.0.0.1"}, {}, true},
                                  files.server_cert, files.server_key);
      !s.ok()) {
    return s;
  }
  for (const std::string& node : nodes) {
    if (absl::Status s = pki->Issue({node, {node}, {}, {}, false}, files.NodeCert(node),
                                    files.NodeKey(node));
        !s.ok()) {
      return s;
    }
  }
  return files;
}

}  // namespace sdc::demo
