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
  return address.rfind("unix:", 0) == 0 && address.size() > 5;  // Length: see Validate.
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
  if (!c.token_file.empty()) {
    if (absl::Status s = Readable("token_file", c.token_file); !s.ok()) return s;
    const size_t colon = c.coordinator.rfind(':');
    const std::string host = c.coordinator.substr(0, colon);
    const bool loopback = host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
    if (c.tls_ca.empty() && !loopback) {
      return Bad("token_file", "a token is sent over TLS only: add --tls_ca");
    }
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
    // The relay speaks for ranks with no credentials of its own: only the
    // node's processes of allowed users may reach it (SO_PEERCRED).
    return Bad("relay_listen",
               absl::StrCat("must be unix:PATH (only a Unix socket tells the relay which user "
                            "connects), got \"", c.relay_listen, "\""));
  }
  if (c.relay_listen.rfind("unix:", 0) == 0 && c.relay_listen.size() - 5 > kMaxUnixPath) {
    return Bad("relay_listen", absl::StrCat("a Unix socket path has at most ", kMaxUnixPath,
                                            " characters, this one ", c.relay_listen.size() - 5));
  }
  if (c.relay_group < -1 || c.relay_group > 0x7fffffff) {
    return Bad("relay_group", absl::StrCat("expected a group id, got ", c.relay_group));
  }
  if (!c.inject_diagnostic_fault.empty() && !c.inject_fault()) {
    return Bad("inject_diagnostic_fault",
               absl::StrCat("corrupts diagnostic results for tests; the only accepted value is ",
                            kInjectFaultConfirmation));
  }
  return absl::OkStatus();
}

}  // namespace sdc::agent
