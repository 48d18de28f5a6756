#include "daemon/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace sdc::daemon {
namespace {

absl::Status Bad(const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status ReadableFile(const std::string& flag, const std::string& path) {
  if (access(path.c_str(), R_OK) != 0) return Bad(flag, absl::StrCat("cannot read ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateAddress(const std::string& flag, const std::string& address,
                             bool unix_allowed) {
  if (unix_allowed && absl::StartsWith(address, "unix:")) {
    const std::string path(absl::StripPrefix(address, "unix:"));
    if (path.empty() || access(ParentDir(path).c_str(), W_OK) != 0) {
      return Bad(flag, absl::StrCat("cannot create a socket at '", path, "'"));
    }
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return Bad(flag, absl::StrCat("expected HOST:PORT", unix_allowed ? " or unix:PATH" : "",
                                  ", got '", address, "'"));
  }
  return absl::OkStatus();
}

bool IsLocalAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:")) return true;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = address.substr(0, colon);
  return host == "localhost" || host == "[::1]" || host == "::1" ||
         absl::StartsWith(host, "127.");
}

absl::Status Validate(const Config& c) {
  if (absl::Status s = ValidateAddress("listen", c.listen, false); !s.ok()) return s;
  if (absl::Status s = ValidateAddress("admin_listen", c.admin_listen, true); !s.ok()) return s;
  if (!c.agent_listen.empty()) {
    if (absl::Status s = ValidateAddress("agent_listen", c.agent_listen, false); !s.ok()) return s;
    if (c.agent_listen == c.listen && !absl::EndsWith(c.listen, ":0")) {
      return Bad("agent_listen", "must differ from --listen: agents have their own port");
    }
  }
  // Bearer tokens and agents' credentials never cross a network in clear.
  if (!IsLocalAddress(c.admin_listen) && !c.admin_tls) {
    return Bad("admin_listen",
               absl::StrCat(c.admin_listen, " is not a loopback address, and the admin service "
                            "would carry bearer tokens in clear there: add --admin_tls (with "
                            "--tls_cert and --tls_key), or listen on 127.0.0.1 or unix:PATH"));
  }
  if (!c.agent_listen.empty() && !IsLocalAddress(c.agent_listen) && c.tls_cert.empty()) {
    return Bad("agent_listen",
               absl::StrCat(c.agent_listen, " is not a loopback address, and agents prove "
                            "their node there with certificates or tokens: add --tls_cert and "
                            "--tls_key"));
  }
  if (c.insecure_dev_mode) {
    for (const auto& [flag, address] :
         {std::pair<const char*, const std::string&>{"listen", c.listen},
          {"agent_listen", c.agent_listen},
          {"admin_listen", c.admin_listen}}) {
      if (!address.empty() && !IsLocalAddress(address)) {
        return Bad("insecure_dev_mode",
                   absl::StrCat("takes every caller at its word, so every listener must be "
                                "loopback; --", flag, " is ", address));
      }
    }
  }
  if (c.agent_token_keys.empty() != c.agent_token_issuer.empty()) {
    return Bad(c.agent_token_keys.empty() ? "agent_token_keys" : "agent_token_issuer",
               "--agent_token_keys and --agent_token_issuer go together");
  }
  if (!c.agent_token_keys.empty() && c.agent_token_service_accounts.empty()) {
    return Bad("agent_token_service_accounts", "name the agents' service account");
  }
  for (const std::string& sa : c.agent_token_service_accounts) {
    if (!absl::StartsWith(sa, "system:serviceaccount:")) {
      return Bad("agent_token_service_accounts",
                 absl::StrCat("expected system:serviceaccount:NAMESPACE:NAME, got '", sa, "'"));
    }
  }
  if (!c.admin_client_ca.empty() && c.admin_client_ca == c.tls_client_ca) {
    return Bad("admin_client_ca",
               "must be a CA of its own, not --tls_client_ca's: a node's certificate is no "
               "person's");
  }
  for (const std::string& n : c.never_replace) {
    if (!core::IsSafeNodeName(n)) {
      return Bad("never_replace", absl::StrCat("'", n, "' is neither a node name nor an instance id"));
    }
  }
  if (c.max_ranks_per_node < 1) return Bad("max_ranks_per_node", "must be at least 1");
  if (c.max_unauthenticated_ranks < 0) {
    return Bad("max_unauthenticated_ranks", "must not be negative");
  }
  if (c.max_jobs_per_identity < 1) return Bad("max_jobs_per_identity", "must be at least 1");
  if (c.max_open_requests_per_job < 0 || c.max_open_requests_per_job > c.max_open_requests) {
    return Bad("max_open_requests_per_job",
               absl::StrCat("expected 0 (half of --max_open_requests) to --max_open_requests (",
                            c.max_open_requests, "), got ", c.max_open_requests_per_job));
  }
  if (absl::Status s = ValidateAddress("metrics_listen", c.metrics_listen, false); !s.ok()) {
    return s;
  }
  if (c.listen == c.admin_listen && !absl::EndsWith(c.listen, ":0")) {
    return Bad("admin_listen", "must differ from --listen: the admin service is served apart");
  }
  if (c.db.empty()) return Bad("db", "empty path");
  if (access(ParentDir(c.db).c_str(), W_OK) != 0) {
    return Bad("db", absl::StrCat("directory ", ParentDir(c.db), " is not writable"));
  }
  if (c.admin_token_file.empty() && c.admin_client_ca.empty()) {
    return Bad("admin_token_file",
               "the admin service needs a token file or --admin_client_ca");
  }
  if (!c.admin_token_file.empty()) {
    struct stat st;
    if (stat(c.admin_token_file.c_str(), &st) == 0) {
      if (absl::Status s = ReadableFile("admin_token_file", c.admin_token_file); !s.ok()) return s;
    } else if (access(ParentDir(c.admin_token_file).c_str(), W_OK) != 0) {
      return Bad("admin_token_file", absl::StrCat("cannot create ", c.admin_token_file));
    }
  }
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return Bad(c.tls_cert.empty() ? "tls_cert" : "tls_key",
               "--tls_cert and --tls_key go together");
  }
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"tls_cert", c.tls_cert},
                                   {"tls_key", c.tls_key},
                                   {"tls_client_ca", c.tls_client_ca},
                                   {"admin_client_ca", c.admin_client_ca},
                                   {"agent_token_keys", c.agent_token_keys},
                                   {"hyperpod_node_ids_file", c.hyperpod_node_ids_file}}) {
    if (!path.empty()) {
      if (absl::Status s = ReadableFile(flag, path); !s.ok()) return s;
    }
  }
  if (!c.tls_client_ca.empty() && c.tls_cert.empty()) {
    return Bad("tls_client_ca", "client certificates need --tls_cert and --tls_key");
  }
  if ((c.admin_tls || !c.admin_client_ca.empty()) && c.tls_cert.empty()) {
    return Bad(c.admin_tls ? "admin_tls" : "admin_client_ca", "needs --tls_cert and --tls_key");
  }
  if (c.action != "replace" && c.action != "reboot") {
    return Bad("action", absl::StrCat("expected replace or reboot, got '", c.action, "'"));
  }
  if (c.approval != "require" && c.approval != "auto") {
    return Bad("approval", absl::StrCat("expected require or auto, got '", c.approval, "'"));
  }
  if (c.approvals_required < 1 || c.approvals_required > 10) {
    return Bad("approvals_required", absl::StrCat("expected 1..10, got ", c.approvals_required));
  }
  if (c.approvals_required > 1 && c.approval == "auto") {
    return Bad("approvals_required", "conflicts with --approval=auto (nobody approves)");
  }
  if (c.max_open_requests < 1) return Bad("max_open_requests", "must be at least 1");
  if (c.max_executions < 0) return Bad("max_executions", "must not be negative");
  if (c.execution_window <= absl::ZeroDuration()) return Bad("execution_window", "must be positive");
  if (c.request_ttl <= absl::ZeroDuration()) return Bad("request_ttl", "must be positive");
  if (c.report_deadline <= absl::ZeroDuration()) return Bad("report_deadline", "must be positive");
  if (c.targeted_audits < 0) return Bad("targeted_audits", "must not be negative");
  if (c.max_jobs < 1) return Bad("max_jobs", "must be at least 1");
  if (c.max_ranks < 1) return Bad("max_ranks", "must be at least 1");
  if (c.job_expiry <= absl::ZeroDuration()) return Bad("job_expiry", "must be positive");
  if (c.resume_policy != "warn" && c.resume_policy != "refuse") {
    return Bad("resume_policy",
               absl::StrCat("expected warn or refuse, got '", c.resume_policy, "'"));
  }
  if (c.actuator.timeout <= absl::ZeroDuration()) return Bad("actuator_timeout", "must be positive");
  absl::StatusOr<std::unique_ptr<Actuator>> actuator = MakeActuator(c.actuator);
  if (!actuator.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::StartsWith(actuator.status().message(), "--") ? "" : "--actuator: ",
                     actuator.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace sdc::daemon
