// The table of sdcctl's flags (ctl/command.h): what each is called, what it
// takes, its help line, and where its value goes in the Config.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ctl/command.h"
#include "ctl/config.h"

namespace sdc::sdcctl {
namespace {

absl::Status BadValue(absl::string_view flag, absl::string_view value, absl::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad value \"", value, "\" for --", flag, ": want ", want));
}

absl::Status SetDuration(absl::string_view flag, absl::string_view value, absl::Duration* out) {
  if (!absl::ParseDuration(value, out)) return BadValue(flag, value, "a duration like 10s or 2m");
  return absl::OkStatus();
}

absl::Status SetBool(absl::string_view flag, absl::string_view value, bool* out) {
  if (!absl::SimpleAtob(value, out)) return BadValue(flag, value, "true or false");
  return absl::OkStatus();
}

// sdcd checks the upper bounds (the agent's limits); a negative number is a
// usage error here.
absl::Status SetCount(absl::string_view flag, absl::string_view value, uint32_t* out) {
  int n = 0;
  if (!absl::SimpleAtoi(value, &n)) return BadValue(flag, value, "an integer");
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("--", flag, " must not be negative"));
  *out = static_cast<uint32_t>(n);
  return absl::OkStatus();
}

// Connection settings: an empty value leaves what the environment, the
// config file or the default gave.
void SetIfGiven(absl::string_view value, std::string* out) {
  if (!value.empty()) *out = std::string(value);
}

template <typename T>
absl::Status Assign(absl::StatusOr<T> parsed, T* out) {
  if (!parsed.ok()) return parsed.status();
  *out = *std::move(parsed);
  return absl::OkStatus();
}

}  // namespace

const std::vector<Flag>& Flags() {
  static const auto* const kFlags = new std::vector<Flag>{
      // Global.
      {"server", 0, "ADDR", {},
       "admin address, HOST:PORT or unix:PATH (default: $SDC_ADMIN_ADDR, the config file, else "
       "127.0.0.1:7401)",
       true,
       [](absl::string_view v, Config* c) {
         SetIfGiven(v, &c->connection.server);
         return absl::OkStatus();
       }},
      {"token_file", 0, "PATH", {},
       "bearer token file (default: $SDC_ADMIN_TOKEN_FILE, the config file, else "
       "/var/lib/sdc/admin.token); required unless --tls_cert",
       true,
       [](absl::string_view v, Config* c) {
         SetIfGiven(v, &c->connection.token_file);
         return absl::OkStatus();
       }},
      {"tls_ca", 0, "PATH", {}, "PEM CA of sdcd's certificate: connect with TLS", true,
       [](absl::string_view v, Config* c) {
         SetIfGiven(v, &c->connection.tls_ca);
         return absl::OkStatus();
       }},
      {"tls_cert", 0, "PATH", {}, "PEM client certificate (authenticates instead of a token)",
       true,
       [](absl::string_view v, Config* c) {
         SetIfGiven(v, &c->connection.tls_cert);
         return absl::OkStatus();
       }},
      {"tls_key", 0, "PATH", {}, "PEM private key of --tls_cert", true,
       [](absl::string_view v, Config* c) {
         SetIfGiven(v, &c->connection.tls_key);
         return absl::OkStatus();
       }},
      {"output", 'o', "FORMAT", {"table", "wide", "json", "yaml", "name"},
       "table (default), wide, json, yaml or name", true,
       [](absl::string_view v, Config* c) { return Assign(ParseOutputFormat(v), &c->output); }},
      {"no-headers", 0, "", {}, "tables without their header line", true,
       [](absl::string_view v, Config* c) { return SetBool("no-headers", v, &c->no_headers); }},
      {"timeout", 0, "DURATION", {}, "deadline of every call (default: see below)", true,
       [](absl::string_view v, Config* c) {
         return SetDuration("timeout", v, &c->connection.timeout);
       }},

      // Command flags.
      {"state", 0, "STATE",
       {"pending", "approved", "executing", "done", "failed", "denied", "expired"},
       "only requests in STATE (pending, approved, executing, done, failed, denied, expired)",
       false,
       [](absl::string_view v, Config* c) {
         return Assign(ParseRequestState(v), &c->filter.state);
       }},
      {"job", 0, "ID", {}, "only incidents of job ID", false,
       [](absl::string_view v, Config* c) {
         c->filter.job = std::string(v);
         return absl::OkStatus();
       }},
      {"selector", 'l', "SELECTOR", {},
       "only items whose labels match key=value[,key=value] (the labels are listed above)", false,
       [](absl::string_view v, Config* c) { return Assign(ParseSelector(v), &c->selector); }},
      {"watch", 'w', "", {}, "list again every --interval until Ctrl-C", false,
       [](absl::string_view v, Config* c) { return SetBool("watch", v, &c->watch); }},
      {"interval", 0, "DURATION", {}, "time between lists of -w (default 2s)", false,
       [](absl::string_view v, Config* c) { return SetDuration("interval", v, &c->interval); }},
      {"reason", 0, "TEXT", {}, "why; required, kept in the history", false,
       [](absl::string_view v, Config* c) {
         c->reason = std::string(v);
         return absl::OkStatus();
       }},
      {"dry-run", 0, "", {}, "validate and report, change nothing", false,
       [](absl::string_view v, Config* c) { return SetBool("dry-run", v, &c->dry_run); }},
      {"force", 0, "", {},
       "decide a request already decided (not one executing or done), or approve past the "
       "blast-radius cap",
       false, [](absl::string_view v, Config* c) { return SetBool("force", v, &c->force); }},
      {"role", 0, "ROLE", {"viewer", "operator", "admin"}, "viewer, operator (default) or admin",
       false, [](absl::string_view v, Config* c) { return Assign(ParseRole(v), &c->role); }},
      {"gpu", 0, "UUID|cpu", {}, "one GPU, or cpu (default: every GPU of the node)", false,
       [](absl::string_view v, Config* c) {
         c->gpu = std::string(v);
         return absl::OkStatus();
       }},
      {"size", 0, "N", {}, "n x n fp32 matrices, 1..8192 (default 1024)", false,
       [](absl::string_view v, Config* c) { return SetCount("size", v, &c->size); }},
      {"repetitions", 0, "N", {}, "products per device, 1..1000 (default 3)", false,
       [](absl::string_view v, Config* c) {
         return SetCount("repetitions", v, &c->repetitions);
       }},
  };
  return *kFlags;
}

}  // namespace sdc::sdcctl
