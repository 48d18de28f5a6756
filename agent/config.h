#ifndef SDC_AGENT_CONFIG_H_
#define SDC_AGENT_CONFIG_H_

// sdc-agent's configuration: filled from flags (and $NODE_NAME, the host
// name) in agent_main.cc only, validated once. Each field's default is the
// flag's default.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/gpus.h"

namespace sdc::agent {

// The only value --inject_diagnostic_fault accepts.
inline constexpr char kInjectFaultConfirmation[] = "yes-i-am-testing";

struct Config {
  std::string coordinator;  // sdcd's agent address (its --agent_listen), HOST:PORT. Required.
  std::string node_name;    // Default: $NODE_NAME, else the host name.
  std::string hostname;     // gethostname(); not a flag.
  // Default: from a node name "hyperpod-i-...", else "". Shown to operators;
  // sdcd never acts on an id an agent states.
  std::string instance_id;
  absl::Duration heartbeat = absl::Seconds(30);
  std::string tls_ca;    // PEM CA of sdcd's certificate: connect with TLS.
  // PEM client certificate (sdcd --tls_client_ca) whose DNS name is this
  // node's: how the agent proves its node to sdcd.
  std::string tls_cert;
  std::string tls_key;   // Its private key.
  // Or (EKS) a file holding the pod's projected service-account token
  // (audience sdcd), re-read for every stream: kubelet rotates it.
  std::string token_file;
  // Template of the node-local command an approved action runs ({action},
  // {request}, {node}); empty: none, the agent answers that it has none.
  std::string action_command;
  // Deadline of that command; keep it below sdcd's --actuator_timeout.
  absl::Duration action_timeout = absl::Seconds(45);
  // A diagnostic process (one per device) still running after this long is
  // killed and its device reported without a verdict.
  absl::Duration diagnostic_timeout = absl::Minutes(30);
  std::string nvml_library = kNvmlLibrary;
  // "" or kInjectFaultConfirmation (tests only).
  std::string inject_diagnostic_fault;
  // Where the trainer relay listens for this node's ranks (agent/relay.h):
  // unix:PATH; empty: no relay. Only processes of relay_allowed_uids may
  // connect (SO_PEERCRED; agent/relay_socket.h); the socket is mode 0660,
  // group relay_group when set (-1: the agent's).
  std::string relay_listen;
  std::vector<uint32_t> relay_allowed_uids;  // Default: the agent's own uid.
  int64_t relay_group = -1;
  // Where /metrics and /healthz are served, HOST:PORT (common/metrics/
  // exposer.h); empty: not served.
  std::string metrics_listen;

  bool inject_fault() const { return inject_diagnostic_fault == kInjectFaultConfirmation; }
};

// OK, or InvalidArgument whose message starts with the offending flag, e.g.
// "--heartbeat: must be between 1s and 10m, got 0".
absl::Status Validate(const Config& config);

// unix:PATH with a path.
bool RelayAddressIsLocal(const std::string& address);

}  // namespace sdc::agent

#endif  // SDC_AGENT_CONFIG_H_
