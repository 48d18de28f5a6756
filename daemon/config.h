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
  std::string admin_listen = "127.0.0.1:7401";  // Admin service: host:port or unix:PATH.
  std::string metrics_listen = "0.0.0.0:9464";  // Prometheus /metrics (host:port).
  std::string db = "/var/lib/sdc/sdcd.db";      // SQLite database file.
  // Bearer token for the admin service. Created (mode 0600, random) when the
  // file does not exist.
  std::string admin_token_file = "/var/lib/sdc/admin.token";
  std::string tls_cert;       // Server certificate (PEM) for the trainer service.
  std::string tls_key;        // Its private key.
  std::string tls_client_ca;  // If set, trainers must present a certificate from this CA.
  bool admin_tls = false;     // Serve the admin service with tls_cert/tls_key too.
  std::string admin_client_ca;  // If set, admin clients may authenticate with a cert from this CA.
  ActuatorConfig actuator;
  std::string hyperpod_node_ids_file;  // "node-name instance-id" per line.
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
};

// OK, or InvalidArgument whose message starts with the offending flag, e.g.
// "--listen: expected HOST:PORT, got 'x'".
absl::Status Validate(const Config& config);

// "HOST:PORT" with a port in 0..65535 (0 picks a free port), or for
// unix_allowed, "unix:PATH".
absl::Status ValidateAddress(const std::string& flag, const std::string& address,
                             bool unix_allowed);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_CONFIG_H_
