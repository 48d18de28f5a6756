#ifndef SDC_DEMO_PKI_H_
#define SDC_DEMO_PKI_H_

// A throwaway public-key infrastructure for the demo and the tests: a
// certificate authority made at start, and the certificates a cluster's
// parts present to each other, written as PEM files. Made with OpenSSL's
// API (no openssl program needed), EC P-256 keys and SHA-256 signatures,
// valid for two days. Never for production: the CA's key is in this
// process's memory and nowhere safer.
//
// What sdcd reads from them (docs/operations.md, "Trust model"): a node
// certificate's DNS subject alternative name is the node's name; an admin
// certificate's SAN is the operator's name.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sdc::demo {

// What one certificate says about its holder.
struct CertificateSpec {
  std::string common_name;
  std::vector<std::string> dns_names;  // subjectAltName DNS entries.
  std::vector<std::string> ips;        // subjectAltName IP entries.
  std::vector<std::string> emails;     // subjectAltName email entries.
  bool server = false;                 // serverAuth; otherwise clientAuth.
};

// Not thread-safe.
class Pki {
 public:
  // A fresh CA named `common_name`. Internal if OpenSSL fails.
  static absl::StatusOr<Pki> Create(const std::string& common_name);

  Pki(Pki&&) noexcept;
  Pki& operator=(Pki&&) noexcept;
  ~Pki();

  // The CA's certificate, PEM.
  std::string ca_pem() const;
  // Writes the CA's certificate to `path`.
  absl::Status WriteCa(const std::string& path) const;
  // Issues a certificate for `spec` with a fresh key; writes the
  // certificate to `cert_path` and the key (mode 0600) to `key_path`.
  absl::Status Issue(const CertificateSpec& spec, const std::string& cert_path,
                     const std::string& key_path) const;

 private:
  struct Impl;
  explicit Pki(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The files WriteClusterPki wrote into its directory.
struct ClusterPki {
  std::string dir;
  std::string ca;                    // ca.pem
  std::string server_cert, server_key;  // server.pem/.key: localhost, 127.0.0.1
  // Node NAME's certificate (DNS SAN NAME) and key: node-NAME.pem/.key.
  std::string NodeCert(const std::string& node) const;
  std::string NodeKey(const std::string& node) const;
};

// A CA, sdcd's server certificate and one node certificate per name of
// `nodes`, written into `dir` (which must exist).
absl::StatusOr<ClusterPki> WriteClusterPki(const std::string& dir,
                                           const std::vector<std::string>& nodes);

}  // namespace sdc::demo

#endif  // SDC_DEMO_PKI_H_
