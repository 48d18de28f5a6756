#include "agent/config.h"

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/core/action_command.h"
#include "common/identity.h"

namespace sdc::agent {
namespace {

absl::Status Bad(const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

absl::Status Readable(const std::string& flag, const std::string& path) {
  if (access(path.c_str(), R_OK) != 0) return Bad(flag, absl::StrCat("cannot read ", path));
  return absl::OkStatus();
}

}  // namespace

// sockaddr_un's sun_path, less its terminating NUL.
constexpr size_t kMaxUnixPath = 107;

bool RelayAddressIsLocal(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return address.size() > 5;  // Length: see Validate.
  for (const char* host : {"127.0.0.1:", "[::1]:", "localhost:"}) {
    const std::string prefix = host;
    if (address.rfind(prefix, 0) == 0) {
      int port = 0;
      return absl::SimpleAtoi(address.substr(prefix.size()), &port) && port > 0 && port < 65536;
    }
  }
  return false;
}

absl::Status Validate(const Config& c) {
  if (c.coordinator.empty()) return Bad("coordinator", "required (sdcd's address, HOST:PORT)");
  const size_t colon = c.coordinator.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(c.coordinator.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return Bad("coordinator", absl::StrCat("expected HOST:PORT, got '", c.coordinator, "'"));
  }
  // The rule sdcd and its actuators apply to node names.
  if (!common::IsSafeNodeName(c.node_name)) {
    return Bad("node_name", absl::StrCat("'", c.node_name,
                                         "' is not a node name ([A-Za-z0-9._-], 1 to 253 "
                                         "characters, not starting with '-'); set --node_name "
                                         "or $NODE_NAME"));
  }
  if (!c.instance_id.empty() && !common::IsInstanceId(c.instance_id)) {
    return Bad("instance_id", absl::StrCat("expected i- and 8 to 17 hex digits, got '",
                                           c.instance_id, "'"));
  }
  if (c.heartbeat < absl::Seconds(1) || c.heartbeat > absl::Minutes(10)) {
    return Bad("heartbeat", absl::StrCat("must be between 1s and 10m, got ",
                                         absl::FormatDuration(c.heartbeat)));
  }
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return Bad(c.tls_cert.empty() ? "tls_cert" : "tls_key", "--tls_cert and --tls_key go together");
  }
  if (!c.tls_cert.empty() && c.tls_ca.empty()) {
    return Bad("tls_cert", "a client certificate needs --tls_ca (TLS to sdcd)");
  }
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"tls_ca", c.tls_ca},
                                   {"tls_cert", c.tls_cert},
                                   {"tls_key", c.tls_key}}) {
    if (!path.empty()) {
      if (absl::Status s = Readable(flag, path); !s.ok()) return s;
    }
  }
  if (absl::Status s = core::ParseActionTemplate(c.action_command).status(); !s.ok()) {
    return Bad("action_command", std::string(s.message()));
  }
  if (c.action_timeout <= absl::ZeroDuration()) return Bad("action_timeout", "must be positive");
  if (c.diagnostic_timeout <= absl::ZeroDuration()) {
    return Bad("diagnostic_timeout", "must be positive");
  }
  if (c.nvml_library.empty()) return Bad("nvml_library", "empty");
  if (!c.relay_listen.empty() && !RelayAddressIsLocal(c.relay_listen)) {
    // The relay speaks for ranks with no credentials of its own: only this
    // node's processes may reach it.
    return Bad("relay_listen",
               absl::StrCat("must be unix:PATH or a loopback address (127.0.0.1:PORT, "
                            "[::1]:PORT, localhost:PORT), got \"", c.relay_listen, "\""));
  }
  if (c.relay_listen.rfind("unix:", 0) == 0 && c.relay_listen.size() - 5 > kMaxUnixPath) {
    return Bad("relay_listen", absl::StrCat("a Unix socket path has at most ", kMaxUnixPath,
                                            " characters, this one ", c.relay_listen.size() - 5));
  }
  if (!c.inject_diagnostic_fault.empty() && !c.inject_fault()) {
    return Bad("inject_diagnostic_fault",
               absl::StrCat("corrupts diagnostic results for tests; the only accepted value is ",
                            kInjectFaultConfirmation));
  }
  return absl::OkStatus();
}

}  // namespace sdc::agent
