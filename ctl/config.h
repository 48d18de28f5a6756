#ifndef SDC_CTL_CONFIG_H_
#define SDC_CTL_CONFIG_H_

// Everything one sdcctl run needs, resolved once from the command line, the
// environment and the config file (in that order of precedence), and
// validated before anything is sent.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "admin.pb.h"
#include "ctl/admin_client.h"
#include "ctl/names.h"
#include "ctl/resource.h"
#include "ctl/selector.h"

namespace sdc::sdcctl {

struct Command;
struct CommandLine;

// What sdcctl reads from its environment, read in exactly one place
// (ReadEnvironment, called by main).
struct Environment {
  std::string admin_addr;   // $SDC_ADMIN_ADDR
  std::string token_file;   // $SDC_ADMIN_TOKEN_FILE
  std::string config_file;  // $SDCCTL_CONFIG
  std::string home;         // $HOME
};

Environment ReadEnvironment();

inline constexpr char kDefaultServer[] = "127.0.0.1:7401";
inline constexpr char kDefaultTokenFile[] = "/var/lib/sdc/admin.token";

struct Config {
  Connection connection;  // Default: kDefaultServer, kDefaultTokenFile.
  OutputFormat output = OutputFormat::kTable;
  bool no_headers = false;

  const Command* command = nullptr;
  std::vector<std::string> args;  // Its arguments, parsed (Argument::Parse).

  // Command flags; each read by the commands whose entry takes it.
  ListFilter filter;                           // get: --state, --job.
  Selector selector;                           // get: -l.
  bool watch = false;                          // get: -w.
  absl::Duration interval = absl::Seconds(2);  // get -w.
  std::string reason;                          // approve, deny, resolve.
  bool dry_run = false;                        // approve, deny.
  bool force = false;                          // approve, deny.
  v1::OperatorRole role = v1::ROLE_OPERATOR;   // operator add.
  std::string gpu;                             // diagnose: a GPU UUID or "cpu"; "": all.
  uint32_t size = 0;                           // diagnose; 0: sdcd's default.
  uint32_t repetitions = 0;                    // diagnose; 0: sdcd's default.
};

// The config file: $SDCCTL_CONFIG (which must exist), else
// ~/.config/sdc-guard/sdcctl.yaml when it exists. Keys: server, token_file,
// tls_ca, tls_cert, tls_key, output; "~/" in a value means $HOME/.
struct FileConfig {
  std::string server;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string output;
};

// InvalidArgument naming the file for unreadable YAML, a value that is not a
// string, or an unknown key; an empty FileConfig when there is no file.
absl::StatusOr<FileConfig> ReadConfigFile(const Environment& env);

// The command the line names, its arguments, and every setting: flags over
// the environment over the config file (read unless the command needs
// nothing) over defaults. InvalidArgument (a usage error) for an unknown
// command, bad arguments, a flag the command does not take, a missing
// required flag or a bad value.
absl::StatusOr<Config> MakeConfig(const CommandLine& line, const Environment& env);

// InvalidArgument (a usage error) when the Config cannot make its call: a
// non-positive --timeout or --interval, a label the resource lacks, a TLS
// certificate without its key.
absl::Status Validate(const Config& config);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_CONFIG_H_
