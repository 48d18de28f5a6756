#ifndef SDC_TESTS_TESTING_SDCD_H_
#define SDC_TESTS_TESTING_SDCD_H_

// A real sdcd for integration tests: its own directory, database and token,
// loopback ports chosen by the kernel (port 0) and read back from its log.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "admin.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "demo/pki.h"
#include "tests/testing/process.h"

namespace sdc::testing {

class Sdcd {
 public:
  // Starts sdcd in `dir` (database dir/sdcd.db, token dir/admin.token) with
  // `extra_flags`, on the given ports (0: any free one). Its agent listener
  // is on loopback too (agent_address). Without identities it runs with
  // --insecure_dev_mode (every listener is loopback): callers are taken at
  // their word, ranks' placements and agents' nodes alike, as before node
  // identities, for tests about something else.
  static absl::StatusOr<std::unique_ptr<Sdcd>> Start(
      const std::string& dir, const std::vector<std::string>& extra_flags = {},
      const std::map<std::string, std::string>& env = {}, int trainer_port = 0,
      int admin_port = 0, int metrics_port = 0);

  // The same with node identities on: a throwaway CA (dir/pki) with sdcd's
  // server certificate and one certificate per node of `nodes`, TLS on the
  // trainer and agent ports, trainers required to present a certificate
  // from the CA (--tls_client_ca). NodeChannel dials as one of the nodes.
  // A PKI already in dir/pki is kept (a restart on the same directory).
  static absl::StatusOr<std::unique_ptr<Sdcd>> StartWithIdentities(
      const std::string& dir, const std::vector<std::string>& nodes,
      const std::vector<std::string>& extra_flags = {},
      const std::map<std::string, std::string>& env = {}, int trainer_port = 0,
      int agent_port = 0);

  std::string trainer_address() const { return "127.0.0.1:" + std::to_string(trainer_port_); }
  std::string agent_address() const { return "127.0.0.1:" + std::to_string(agent_port_); }
  std::string admin_address() const { return "127.0.0.1:" + std::to_string(admin_port_); }
  int trainer_port() const { return trainer_port_; }
  int agent_port() const { return agent_port_; }
  // With identities: the PKI's files; NodeChannel(node) dials the trainer
  // port presenting `node`'s certificate ("" : none), NodeAgentChannel the
  // agent port.
  const demo::ClusterPki& pki() const { return pki_; }
  std::shared_ptr<grpc::Channel> NodeChannel(const std::string& node) const;
  std::shared_ptr<grpc::Channel> NodeAgentChannel(const std::string& node) const;
  // sdc-agent's TLS flags to prove `node` (--tls_ca, --tls_cert, --tls_key).
  std::vector<std::string> AgentTlsFlags(const std::string& node) const;
  int admin_port() const { return admin_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string token_file() const { return dir_ + "/admin.token"; }
  std::string db() const { return dir_ + "/sdcd.db"; }
  Process& process() { return process_; }

  // An admin stub; calls need AdminContext() for the token.
  std::unique_ptr<v1::AdminService::Stub> Admin() const;
  // A client context carrying the bearer token and a 10 s deadline.
  std::unique_ptr<grpc::ClientContext> AdminContext() const;
  // sdcctl against this daemon, with its token; returns exit code + output.
  RunResult Sdcctl(const std::vector<std::string>& args) const;
  // sdc_rejected_inputs_total{reason} from a scrape of /metrics (0 when the
  // series is absent, -1 when the scrape failed).
  double Rejected(const std::string& reason) const;
  // A counter's value name{label="value"} from a scrape, as Rejected.
  double Counter(const std::string& name, const std::string& label,
                 const std::string& value) const;

 private:
  static absl::StatusOr<std::unique_ptr<Sdcd>> Launch(
      const std::string& dir, const std::vector<std::string>& extra_flags,
      const std::map<std::string, std::string>& env, int trainer_port, int admin_port,
      int metrics_port, bool insecure_dev_mode);

  std::string dir_;
  Process process_;
  demo::ClusterPki pki_;
  int trainer_port_ = 0;
  int agent_port_ = 0;
  int admin_port_ = 0;
  int metrics_port_ = 0;
};

// Opens a bidirectional stream `method` ("/sdc.v1.TrainerService/Attach"),
// writes `frame` as one raw message, reads until the server ends the call
// and returns its status (10 s deadline).
grpc::Status SendRawFrame(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& method, const std::string& frame);
// The same with several frames, then a half-close: OK only when the server
// took every frame and ended the call after the client's close.
grpc::Status SendRawFrames(const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& method, const std::vector<std::string>& frames);

// Writes a throwaway PKI into `dir` with the openssl CLI: ca.pem (and
// ca.key), server.pem/server.key for localhost and 127.0.0.1, and
// client.pem/client.key signed by the same CA (sdcd --tls_client_ca=ca.pem).
absl::Status WriteTestCertificates(const std::string& dir);

}  // namespace sdc::testing

#endif  // SDC_TESTS_TESTING_SDCD_H_
