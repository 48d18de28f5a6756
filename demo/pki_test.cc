#include "demo/pki.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "demo/process.h"
#include "gtest/gtest.h"

namespace sdc::demo {
namespace {

X509* ReadCert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return nullptr;
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  return cert;
}

std::vector<std::string> DnsNames(X509* cert) {
  std::vector<std::string> out;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type == GEN_DNS) {
      out.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.dNSName)),
                       ASN1_STRING_length(n->d.dNSName));
    }
  }
  GENERAL_NAMES_free(names);
  return out;
}

// The node certificates chain to the CA and name their node (and only it);
// the keys are private to their owner.
TEST(PkiTest, NodeCertificatesChainToTheCaAndNameTheirNode) {
  const std::string dir = TestDir("pki");
  absl::StatusOr<ClusterPki> pki = WriteClusterPki(dir, {"node-a", "node-b"});
  ASSERT_TRUE(pki.ok()) << pki.status();
  X509* ca = ReadCert(pki->ca);
  ASSERT_NE(ca, nullptr);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  for (const std::string node : {"node-a", "node-b"}) {
    X509* cert = ReadCert(pki->NodeCert(node));
    ASSERT_NE(cert, nullptr) << node;
    X509_STORE_CTX* ctx = X509_STORE_CTX_new();
    X509_STORE_CTX_init(ctx, store, cert, nullptr);
    EXPECT_EQ(X509_verify_cert(ctx), 1)
        << X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx));
    X509_STORE_CTX_free(ctx);
    EXPECT_EQ(DnsNames(cert), std::vector<std::string>{node});
    X509_free(cert);
    struct stat st;
    ASSERT_EQ(stat(pki->NodeKey(node).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  // A certificate from another CA does not chain to this one.
  absl::StatusOr<Pki> other = Pki::Create("other");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(other->Issue({"node-a", {"node-a"}, {}, {}, false}, dir + "/forged.pem",
                           dir + "/forged.key")
                  .ok());
  X509* forged = ReadCert(dir + "/forged.pem");
  ASSERT_NE(forged, nullptr);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, forged, nullptr);
  EXPECT_NE(X509_verify_cert(ctx), 1);
  X509_STORE_CTX_free(ctx);
  X509_free(forged);
  X509_STORE_free(store);
  X509_free(ca);
}

}  // namespace
}  // namespace sdc::demo
