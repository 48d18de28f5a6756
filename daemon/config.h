#ifndef SDC_DAEMON_CONFIG_H_
#define SDC_DAEMON_CONFIG_H_

// sdcd's configuration: filled from flags in sdcd_main.cc only, validated
// once. Each field's default is the flag's default.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/actuator.h"

namespace sdc::daemon {

struct Config {
  std::string listen = "0.0.0.0:7400";          // Trainer service (host:port).
  // Node agents (AgentService, and relays of their node's ranks): host:port;
  // empty: none. Off loopback it needs TLS (tls_cert): agents prove their
  // node with a client certificate or a service-account token there.
  std::string agent_listen;
  std::string admin_listen = "127.0.0.1:7401";  // Admin service: host:port or unix:PATH.
  std::string metrics_listen = "0.0.0.0:9464";  // Prometheus /metrics (host:port).
  std::string db = "/var/lib/sdc/sdcd.db";      // SQLite database file.
  // Bearer token for the admin service. Created (mode 0600, random) when the
  // file does not exist.
  std::string admin_token_file = "/var/lib/sdc/admin.token";
  std::string tls_cert;       // Server certificate (PEM) for the trainer service.
  std::string tls_key;        // Its private key.
  // If set, trainers must present a certificate from this CA (on the
  // trainer port), and agents may (on the agent port); a certificate's DNS
  // name is the node it proves.
  std::string tls_client_ca;
  bool admin_tls = false;     // Serve the admin service with tls_cert/tls_key too.
  // If set, admin clients may authenticate with a cert from this CA (a
  // separate one: its certificates name people, matched on their SAN).
  std::string admin_client_ca;
  // Agents' projected service-account tokens (EKS): the issuer's public
  // keys (JWKS or PEM file), its `iss`, the audience, the accepted service
  // accounts. Empty keys: tokens are refused.
  std::string agent_token_keys;
  std::string agent_token_issuer;
  std::string agent_token_audience = "sdcd";
  std::vector<std::string> agent_token_service_accounts = {
      "system:serviceaccount:sdc-agent:sdc-agent"};
  // Takes callers at their word, as before node identities: every Hello's
  // placement and every agent's node. Refused unless every listener is
  // loopback (or a unix socket). For development and benchmarks only.
  bool insecure_dev_mode = false;
  ActuatorConfig actuator;
  std::string hyperpod_node_ids_file;  // "node-name instance-id" per line.
  // Quotas by identity (core::CoordinatorOptions).
  int max_ranks_per_node = 16;
  int64_t max_unauthenticated_ranks = 4096;
  int max_jobs_per_identity = 64;
  int max_open_requests_per_job = 0;  // 0: half of max_open_requests, at least 1.
  std::string action = "replace";      // replace | reboot
  std::string approval = "require";    // require | auto
  int approvals_required = 1;  // Distinct operators who must approve a request (1 or 2..10).
  int max_open_requests = 4;
  int max_executions = 2;
  absl::Duration execution_window = absl::Hours(24);
  absl::Duration request_ttl = absl::Hours(24);
  std::vector<std::string> never_replace;
  absl::Duration report_deadline = absl::Seconds(120);
  int targeted_audits = 3;
  int max_jobs = 1024;
  int64_t max_ranks = int64_t{1} << 18;
  absl::Duration job_expiry = absl::Hours(72);
  // A new attempt resuming from a checkpoint that is not final: warn | refuse.
  std::string resume_policy = "warn";
};

// OK, or InvalidArgument whose message starts with the offending flag, e.g.
// "--listen: expected HOST:PORT, got 'x'".
absl::Status Validate(const Config& config);

// "HOST:PORT" with a port in 0..65535 (0 picks a free port), or for
// unix_allowed, "unix:PATH".
absl::Status ValidateAddress(const std::string& flag, const std::string& address,
                             bool unix_allowed);

// unix:PATH, or HOST:PORT whose host is loopback (127.0.0.0/8, ::1,
// localhost): reachable from this machine only.
bool IsLocalAddress(const std::string& address);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_CONFIG_H_
