// sdcctl: the operator's command line over sdcd's AdminService. This file is
// the edge: flags and environment into a validated Config, the channel and
// its credentials, one deadline per call, and exit codes. What is printed is
// decided by the pure functions of ctl/sdcctl_format.h.

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "yaml-cpp/yaml.h"
#include "admin.grpc.pb.h"
#include "agent.pb.h"
#include "common/version.h"
#include "ctl/sdcctl_format.h"
#include "grpcpp/grpcpp.h"

// Empty defaults are resolved from the environment in ConfigFromFlags.
ABSL_FLAG(std::string, server, "",
          "Admin address, HOST:PORT or unix:PATH. Default: $SDC_ADMIN_ADDR, else 127.0.0.1:7401.");
ABSL_FLAG(std::string, token_file, "",
          "Bearer token file. Default: $SDC_ADMIN_TOKEN_FILE, else /var/lib/sdc/admin.token.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of sdcd's certificate: connect with TLS.");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (authenticates instead of a token).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, output, "table", "table, wide, json, yaml or name.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of every call.");
ABSL_FLAG(bool, no_headers, false, "Tables without their header line.");
ABSL_FLAG(std::string, selector, "", "get: only items whose labels match key=value[,key=value].");
ABSL_FLAG(bool, watch, false, "get: list again every --interval until interrupted.");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(2), "get --watch: time between lists.");
ABSL_FLAG(std::string, role, "operator", "operator add: viewer, operator or admin.");
ABSL_FLAG(std::string, state, "", "get requests: only requests in this state.");
ABSL_FLAG(std::string, job, "", "get incidents: only incidents of this job.");
ABSL_FLAG(std::string, reason, "", "approve, deny: why (required).");
ABSL_FLAG(bool, dry_run, false, "approve, deny: validate and report, change nothing.");
ABSL_FLAG(bool, force, false, "approve, deny: decide even if already decided.");
ABSL_FLAG(std::string, gpu, "", "diagnose: one GPU (UUID) or cpu; default: every GPU of the node.");
ABSL_FLAG(int, size, 0, "diagnose: n of the n x n matrices (1..8192; default 1024).");
ABSL_FLAG(int, repetitions, 0, "diagnose: products per device (1..1000; default 3).");

namespace sdc::sdcctl {
namespace {

constexpr char kUsage[] =
    R"(sdcctl: the sdc-guard operator CLI (talks to sdcd's admin service).

Usage:
  sdcctl [global flags] COMMAND [ARGS] [command flags]
  sdcctl COMMAND --help   one command's usage

Commands:
  get requests [ID] [--state=pending|approved|executing|done|failed|denied|expired]
                          all requests, or one with every detail (approvals too)
  get incidents [--job=ID]
  get suspects
  get jobs
  get nodes               node agents: instance id, GPUs, status, time since heartbeat
      get flags: -l key=value[,key=value] (labels: requests node,gpu,state;
      incidents job,node,gpu,check,outcome,state; suspects job,node,gpu; jobs
      job; nodes node,gpu,status), -w/--watch [--interval=2s], --no-headers
  describe request ID     state, approvals, transitions, actuator and evidence
  describe incident ID    every field of one incident
  describe job NAME       a job's ranks and incidents
  describe node NAME      a node's agent, GPUs and recent diagnostics
  diagnose node NAME [--gpu=UUID|cpu] [--size=N] [--repetitions=N]
                          run the agent's confirmation diagnostic and wait for it
  approve ID --reason=TEXT [--dry-run] [--force]
  deny ID --reason=TEXT [--dry-run] [--force]
  resolve incident ID --reason=TEXT
                          close an incident whose GPU was dealt with by hand (no
                          request to deny: the open-request cap or a never-replace
                          node suppressed it); it stops vetoing checkpoints
  history gpu UUID        every incident and request involving a GPU
  history node NAME       every incident and request involving a node
  operator add NAME [--role=viewer|operator|admin]
                          (admin) a new operator; prints its token once, on stdout
  operator list           (admin) operators and their roles
  operator remove NAME    (admin) its token stops working at once
  whoami                  the operator your credential names, and its role
  version                 sdcctl's version and, when reachable, sdcd's
  completion bash|zsh     a shell completion script: source <(sdcctl completion bash)

sdcd records who approves, denies or resolves from the credential: the
token (or client certificate) of an operator added with `operator add`; the
bootstrap token from sdcd's --admin_token_file is "root".

Global flags (accepted anywhere on the line):
  --server=ADDR         admin address, HOST:PORT or unix:PATH
                        (default: $SDC_ADMIN_ADDR, the config file, else 127.0.0.1:7401)
  --token_file=PATH     bearer token file (default: $SDC_ADMIN_TOKEN_FILE, the config
                        file, else /var/lib/sdc/admin.token); required unless --tls_cert
  --tls_ca=PATH         PEM CA of sdcd's certificate: connect with TLS
  --tls_cert=PATH       PEM client certificate (authenticates instead of a token)
  --tls_key=PATH        PEM private key of --tls_cert
  -o, --output=FORMAT   table (default), wide, json, yaml or name
  --no-headers          tables without their header line
  --timeout=DURATION    deadline of every call (default: 10s)
  --version             print sdcctl's version and exit

Config file: $SDCCTL_CONFIG, else ~/.config/sdc-guard/sdcctl.yaml when it
exists. Keys: server, token_file, tls_ca, tls_cert, tls_key, output (any
other key is an error). Flags and environment variables override it.

Command flags:
  --state=STATE         get requests: only requests in STATE
  --job=ID              get incidents: only incidents of job ID
  -l, --selector=SEL    get: only items whose labels match key=value[,key=value]
  -w, --watch           get: list again every --interval until Ctrl-C
  --interval=DURATION   get --watch: time between lists (default 2s)
  --reason=TEXT         approve, deny, resolve: why; required, kept in the history
  --dry-run             approve, deny: validate and report, change nothing
  --force               approve, deny: decide a request already decided (not one
                        executing or done), or approve past the blast-radius cap
  --role=ROLE           operator add: viewer, operator (default) or admin
  --gpu=UUID            diagnose: one GPU, or cpu (default: every GPU of the node)
  --size=N              diagnose: n x n fp32 matrices, 1..8192 (default 1024)
  --repetitions=N       diagnose: products per device, 1..1000 (default 3)

diagnose waits for the result; its deadline is --timeout when given, else 10m.

Exit codes:
  0 success, 1 other error, 2 usage error, 3 not found, 4 already decided or
  other failed precondition, 5 sdcd unreachable, 6 permission denied or no
  readable token; diagnose: 0 passed, 7 a device computed wrong values,
  8 no verdict (could not run, agent lost, or still running at the deadline).
)";

// `sdcctl COMMAND --help`: the command's lines of kUsage.
std::string CommandUsage(const std::string& command) {
  static const auto* const kForms = new std::map<std::string, std::string>{
      {"get",
       "sdcctl get requests [ID] [--state=STATE] | incidents [--job=ID] | suspects | jobs | "
       "nodes\n  [-l key=value[,key=value]] [-w|--watch [--interval=2s]] [--no-headers] "
       "[-o FORMAT]\nLabels: requests node,gpu,state; incidents job,node,gpu,check,outcome,"
       "state;\n  suspects job,node,gpu; jobs job; nodes node,gpu,status.\n"},
      {"describe",
       "sdcctl describe request ID | incident ID | job NAME | node NAME [-o FORMAT]\n"},
      {"approve",
       "sdcctl approve ID --reason=TEXT [--dry-run] [--force]\n"
       "Approves replacement request ID as the operator your credential names (role\n"
       "operator or admin). With sdcd --approvals_required=N the request runs after N\n"
       "distinct operators approve.\n"},
      {"deny",
       "sdcctl deny ID --reason=TEXT [--dry-run] [--force]\n"
       "Denies replacement request ID as the operator your credential names; one deny\n"
       "ends the request.\n"},
      {"resolve", "sdcctl resolve incident ID --reason=TEXT\n"},
      {"history", "sdcctl history gpu UUID | history node NAME\n"},
      {"diagnose",
       "sdcctl diagnose node NAME [--gpu=UUID|cpu] [--size=N] [--repetitions=N]\n"},
      {"operator",
       "sdcctl operator add NAME [--role=viewer|operator|admin] | list | remove NAME\n"
       "Needs role admin (the bootstrap token is root, an admin). `add` prints the new\n"
       "token once on stdout: sdcctl operator add alice > alice.token\n"},
      {"whoami", "sdcctl whoami\nThe operator your credential names, its role, sdcd's version.\n"},
      {"version", "sdcctl version\nsdcctl's version and, when reachable, sdcd's.\n"},
      {"completion",
       "sdcctl completion bash|zsh\nbash: source <(sdcctl completion bash); zsh: "
       "source <(sdcctl completion zsh)\n"},
  };
  auto it = kForms->find(command);
  if (it == kForms->end()) return kUsage;
  return absl::StrCat("Usage:\n  ", it->second, "\nGlobal flags: see sdcctl --help.\n");
}

constexpr char kDefaultServer[] = "127.0.0.1:7401";
constexpr char kDefaultTokenFile[] = "/var/lib/sdc/admin.token";
// sdcd sends messages of up to 16 MiB (daemon/service.h kMaxMessageBytes);
// gRPC clients accept 4 MiB by default.
constexpr int kMaxReceiveBytes = 16 << 20;

// The flags sdcctl accepts (absl flags of other libraries are not ours to
// take), and the commands each command flag applies to.
const std::set<std::string>& GlobalFlags() {
  static const auto* const kFlags = new std::set<std::string>{
      "server", "token_file", "tls_ca", "tls_cert", "tls_key", "output", "timeout", "no_headers"};
  return *kFlags;
}

enum class Verb {
  kGetRequests,
  kGetIncidents,
  kGetSuspects,
  kGetJobs,
  kDescribeRequest,
  kApprove,
  kDeny,
  kResolveIncident,
  kHistoryGpu,
  kHistoryNode,
  kGetNodes,
  kDescribeNode,
  kDiagnoseNode,
  kGetRequest,
  kDescribeIncident,
  kDescribeJob,
  kOperatorAdd,
  kOperatorList,
  kOperatorRemove,
  kWhoAmI,
  kVersion,
  kCompletion,
};


// diagnose's deadline when --timeout is not given: a large diagnostic on the
// CPU takes minutes.
constexpr absl::Duration kDiagnoseTimeout = absl::Minutes(10);

std::set<std::string> CommandFlags(Verb verb) {
  switch (verb) {
    case Verb::kGetRequests:
      return {"state", "selector", "watch", "interval"};
    case Verb::kGetIncidents:
      return {"job", "selector", "watch", "interval"};
    case Verb::kGetSuspects:
    case Verb::kGetJobs:
    case Verb::kGetNodes:
      return {"selector", "watch", "interval"};
    case Verb::kOperatorAdd:
      return {"role"};
    case Verb::kApprove:
    case Verb::kDeny:
      return {"reason", "dry_run", "force"};
    case Verb::kResolveIncident:
      return {"reason"};
    case Verb::kDiagnoseNode:
      return {"gpu", "size", "repetitions"};
    default:
      return {};
  }
}

bool IsCommandFlag(const std::string& name) {
  return name == "state" || name == "job" || name == "reason" || name == "dry_run" ||
         name == "force" || name == "gpu" || name == "size" || name == "repetitions" ||
         name == "selector" || name == "watch" || name == "interval" || name == "role";
}

// What sdcctl reads from its environment, read in exactly one place.
struct Environment {
  std::string admin_addr;     // $SDC_ADMIN_ADDR
  std::string token_file;     // $SDC_ADMIN_TOKEN_FILE
  std::string config_file;    // $SDCCTL_CONFIG
  std::string home;           // $HOME
};

Environment ReadEnvironment() {
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  return {get("SDC_ADMIN_ADDR"), get("SDC_ADMIN_TOKEN_FILE"), get("SDCCTL_CONFIG"),
          get("HOME")};
}

// argv once flags are applied: the positional words, and which flags the
// line named (to refuse a command flag on a command it means nothing to).
struct CommandLine {
  std::vector<std::string> words;
  std::set<std::string> flags_named;
  bool help = false;
  bool version = false;  // --version: print the version and exit.
};

// Applies every flag on the line, wherever it is, and keeps the rest. "-o X",
// "-oX" and "-o=X" mean --output=X; "--dry-run" means --dry_run; "--" ends the
// flags. InvalidArgument for an unknown flag or a bad value.
absl::StatusOr<CommandLine> ApplyFlags(int argc, char** argv) {
  CommandLine line;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      line.words.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      line.help = true;
      continue;
    }
    if (arg == "--version" || arg == "-version") {
      line.version = true;
      continue;
    }
    std::string name;
    std::string value;
    bool has_value = false;
    if ((arg[1] == 'o' && (arg.size() == 2 || arg[2] != 'u')) || (arg[1] == 'l' && arg[0] == '-' && (arg.size() == 2 || arg[2] == '='))) {
      // -o, -oX, -o=X (but not -output=X, which the general case takes);
      // -l X, -l=X (the label selector).
      name = arg[1] == 'o' ? "output" : "selector";
      if (arg.size() > 2) {
        value = arg.substr(arg[2] == '=' ? 3 : 2);
        has_value = true;
      }
    } else {
      absl::string_view body = absl::StripPrefix(absl::StripPrefix(arg, "-"), "-");
      const size_t eq = body.find('=');
      if (eq != absl::string_view::npos) {
        value = std::string(body.substr(eq + 1));
        has_value = true;
        body = body.substr(0, eq);
      }
      name = absl::StrReplaceAll(body, {{"-", "_"}});
      if (name == "o") name = "output";
      if (name == "w") name = "watch";
      if (name == "l") name = "selector";
    }
    if (name == "as") {
      return absl::InvalidArgumentError(
          "--as was removed: sdcd records who decides from the credential (each operator "
          "gets a token: sdcctl operator add NAME)");
    }
    absl::CommandLineFlag* flag = nullptr;
    if (GlobalFlags().count(name) > 0 || IsCommandFlag(name)) {
      flag = absl::FindCommandLineFlag(name);
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg, " (see sdcctl --help)"));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag ", arg, " needs a value"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value \"", value, "\" for --", name, ": ", error));
    }
    line.flags_named.insert(name);
  }
  return line;
}

// Everything one run needs, checked by Validate before anything is sent.
struct Config {
  // Connection.
  std::string server;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  absl::Duration timeout;
  OutputFormat output = OutputFormat::kTable;
  bool no_headers = false;

  // Command.
  Verb verb = Verb::kGetJobs;
  uint64_t id = 0;                                         // describe, approve, deny.
  std::string subject;                                     // history: the GPU UUID or node name.
  std::string job;                                         // get incidents --job.
  v1::RequestState state = v1::REQUEST_STATE_UNSPECIFIED;  // get requests --state.
  std::string reason;                                      // approve, deny.
  Selector selector;                                       // get -l.
  bool watch = false;                                      // get --watch.
  absl::Duration interval;                                 // get --interval.
  std::string name;                                        // describe job, operator add/remove.
  v1::OperatorRole role = v1::ROLE_OPERATOR;               // operator add --role.
  std::string shell;                                       // completion.
  bool dry_run = false;
  bool force = false;
  std::string node;             // describe node, diagnose node.
  std::string gpu;              // diagnose --gpu.
  uint32_t size = 0;            // diagnose --size (0: sdcd's default).
  uint32_t repetitions = 0;     // diagnose --repetitions.
};

// "node-b" or "node/node-b" (what -o name prints).
std::string NodeName(absl::string_view word) {
  return std::string(absl::StripPrefix(word, "node/"));
}

// "7" or "request/7" (what -o name prints); a positive integer.
absl::StatusOr<uint64_t> ParseRequestId(absl::string_view text) {
  absl::string_view digits = absl::StripPrefix(text, "request/");
  uint64_t id = 0;
  if (digits.empty() || digits.size() > 20 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &id) || id == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad request id \"", text, "\" (want a positive integer)"));
  }
  return id;
}

// The command words into the Config's verb and arguments.
absl::Status ParseCommand(const std::vector<std::string>& w, Config* c) {
  auto want = [&](size_t n, absl::string_view form) -> absl::Status {
    if (w.size() < n) return absl::InvalidArgumentError(absl::StrCat("usage: sdcctl ", form));
    if (w.size() > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", w[n], "\" (usage: sdcctl ", form, ")"));
    }
    return absl::OkStatus();
  };
  if (w.empty()) return absl::InvalidArgumentError("no command given (see sdcctl --help)");
  const std::string& command = w[0];
  if (command == "get") {
    if (w.size() < 2) {
      return absl::InvalidArgumentError(
          "get what? (requests, incidents, suspects, jobs or nodes)");
    }
    const std::string& what = w[1];
    if ((what == "requests" || what == "request") && w.size() >= 3) {
      c->verb = Verb::kGetRequest;
      if (absl::Status s = want(3, "get requests ID"); !s.ok()) return s;
      absl::StatusOr<uint64_t> id = ParseRequestId(w[2]);
      if (!id.ok()) return id.status();
      c->id = *id;
      return absl::OkStatus();
    }
    if (what == "requests" || what == "request") {
      c->verb = Verb::kGetRequests;
    } else if (what == "incidents" || what == "incident") {
      c->verb = Verb::kGetIncidents;
    } else if (what == "suspects" || what == "suspect") {
      c->verb = Verb::kGetSuspects;
    } else if (what == "jobs" || what == "job") {
      c->verb = Verb::kGetJobs;
    } else if (what == "nodes" || what == "node") {
      c->verb = Verb::kGetNodes;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown resource \"", what, "\" (want requests, incidents, suspects, jobs or nodes)"));
    }
    return want(2, absl::StrCat("get ", what));
  }
  if (command == "describe" && w.size() >= 2 &&
      (w[1] == "node" || w[1] == "nodes" || absl::StartsWith(w[1], "node/"))) {
    c->verb = Verb::kDescribeNode;
    if (absl::StartsWith(w[1], "node/")) {
      if (absl::Status s = want(2, "describe node NAME"); !s.ok()) return s;
      c->node = NodeName(w[1]);
    } else {
      if (absl::Status s = want(3, "describe node NAME"); !s.ok()) return s;
      c->node = NodeName(w[2]);
    }
    return absl::OkStatus();
  }
  if (command == "diagnose") {
    c->verb = Verb::kDiagnoseNode;
    constexpr char kForm[] = "diagnose node NAME [--gpu=UUID] [--size=N] [--repetitions=N]";
    if (w.size() == 2 && absl::StartsWith(w[1], "node/")) {
      c->node = NodeName(w[1]);
    } else if (w.size() >= 2 && (w[1] == "node" || w[1] == "nodes")) {
      if (absl::Status s = want(3, kForm); !s.ok()) return s;
      c->node = NodeName(w[2]);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("usage: sdcctl ", kForm));
    }
    return absl::OkStatus();
  }
  if (command == "describe" && w.size() >= 2 &&
      (w[1] == "incident" || w[1] == "incidents" || absl::StartsWith(w[1], "incident/"))) {
    c->verb = Verb::kDescribeIncident;
    std::string id_text;
    if (absl::StartsWith(w[1], "incident/")) {
      if (absl::Status s = want(2, "describe incident ID"); !s.ok()) return s;
      id_text = w[1].substr(9);
    } else {
      if (absl::Status s = want(3, "describe incident ID"); !s.ok()) return s;
      id_text = w[2];
    }
    if (!absl::SimpleAtoi(id_text, &c->id) || c->id == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("incident ID must be a positive integer, got \"", id_text, "\""));
    }
    return absl::OkStatus();
  }
  if (command == "describe" && w.size() >= 2 &&
      (w[1] == "job" || w[1] == "jobs" || absl::StartsWith(w[1], "job/"))) {
    c->verb = Verb::kDescribeJob;
    if (absl::StartsWith(w[1], "job/")) {
      if (absl::Status s = want(2, "describe job NAME"); !s.ok()) return s;
      c->name = w[1].substr(4);
    } else {
      if (absl::Status s = want(3, "describe job NAME"); !s.ok()) return s;
      c->name = w[2];
    }
    return absl::OkStatus();
  }
  if (command == "operator" || command == "operators") {
    if (w.size() >= 2 && w[1] == "add") {
      c->verb = Verb::kOperatorAdd;
      if (absl::Status s = want(3, "operator add NAME [--role=ROLE]"); !s.ok()) return s;
      c->name = w[2];
    } else if (w.size() >= 2 && w[1] == "list") {
      c->verb = Verb::kOperatorList;
      if (absl::Status s = want(2, "operator list"); !s.ok()) return s;
    } else if (w.size() >= 2 && w[1] == "remove") {
      c->verb = Verb::kOperatorRemove;
      if (absl::Status s = want(3, "operator remove NAME"); !s.ok()) return s;
      c->name = std::string(absl::StripPrefix(w[2], "operator/"));
    } else {
      return absl::InvalidArgumentError(
          "usage: sdcctl operator add NAME [--role=ROLE] | operator list | operator remove NAME");
    }
    return absl::OkStatus();
  }
  if (command == "whoami") {
    c->verb = Verb::kWhoAmI;
    return want(1, "whoami");
  }
  if (command == "version") {
    c->verb = Verb::kVersion;
    return want(1, "version");
  }
  if (command == "completion") {
    c->verb = Verb::kCompletion;
    if (absl::Status s = want(2, "completion bash|zsh"); !s.ok()) return s;
    if (w[1] != "bash" && w[1] != "zsh") {
      return absl::InvalidArgumentError(
          absl::StrCat("no completion for \"", w[1], "\" (want bash or zsh)"));
    }
    c->shell = w[1];
    return absl::OkStatus();
  }
  if (command == "describe") {
    c->verb = Verb::kDescribeRequest;
    // "describe request ID", or "describe request/ID" as -o name prints it.
    if (w.size() == 2 && absl::StartsWith(w[1], "request/")) {
      absl::StatusOr<uint64_t> id = ParseRequestId(w[1]);
      if (!id.ok()) return id.status();
      c->id = *id;
      return absl::OkStatus();
    }
    if (w.size() >= 2 && w[1] != "request" && w[1] != "requests") {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot describe \"", w[1],
          "\" (usage: sdcctl describe request ID | incident ID | job NAME | node NAME)"));
    }
    if (absl::Status s = want(3, "describe request ID"); !s.ok()) return s;
    absl::StatusOr<uint64_t> id = ParseRequestId(w[2]);
    if (!id.ok()) return id.status();
    c->id = *id;
    return absl::OkStatus();
  }
  if (command == "approve" || command == "deny") {
    c->verb = command == "approve" ? Verb::kApprove : Verb::kDeny;
    if (absl::Status s = want(2, absl::StrCat(command, " ID --reason=TEXT")); !s.ok()) return s;
    absl::StatusOr<uint64_t> id = ParseRequestId(w[1]);
    if (!id.ok()) return id.status();
    c->id = *id;
    return absl::OkStatus();
  }
  if (command == "resolve") {
    c->verb = Verb::kResolveIncident;
    if (w.size() < 2 || w[1] != "incident") {
      return absl::InvalidArgumentError("usage: sdcctl resolve incident ID --reason=TEXT");
    }
    if (absl::Status s = want(3, "resolve incident ID --reason=TEXT"); !s.ok()) return s;
    uint64_t id = 0;
    if (!absl::SimpleAtoi(w[2], &id) || id == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("incident ID must be a positive integer, got \"", w[2], "\""));
    }
    c->id = id;
    return absl::OkStatus();
  }
  if (command == "history") {
    if (w.size() >= 2 && w[1] == "gpu") {
      c->verb = Verb::kHistoryGpu;
      if (absl::Status s = want(3, "history gpu UUID"); !s.ok()) return s;
    } else if (w.size() >= 2 && w[1] == "node") {
      c->verb = Verb::kHistoryNode;
      if (absl::Status s = want(3, "history node NAME"); !s.ok()) return s;
    } else {
      return absl::InvalidArgumentError("usage: sdcctl history gpu UUID | history node NAME");
    }
    c->subject = w[2];
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown command \"", command, "\" (see sdcctl --help)"));
}

// Flags, environment and command words into a Config. InvalidArgument for a
// usage error.
// What the config file may set (ConfigFromFlags applies it under flags and
// the environment).
struct FileConfig {
  std::string server;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string output;
};

// $SDCCTL_CONFIG (which must exist), else ~/.config/sdc-guard/sdcctl.yaml
// when it exists. InvalidArgument naming the file for unreadable YAML, a
// value that is not a string, or an unknown key.
absl::StatusOr<FileConfig> ReadConfigFile(const Environment& env) {
  std::string path = env.config_file;
  const bool required = !path.empty();
  if (path.empty()) {
    if (env.home.empty()) return FileConfig{};
    path = absl::StrCat(env.home, "/.config/sdc-guard/sdcctl.yaml");
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (!required && errno == ENOENT) return FileConfig{};
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  std::fclose(f);
  FileConfig out;
  const std::map<std::string, std::string*> keys = {
      {"server", &out.server},     {"token_file", &out.token_file}, {"tls_ca", &out.tls_ca},
      {"tls_cert", &out.tls_cert}, {"tls_key", &out.tls_key},       {"output", &out.output}};
  try {
    YAML::Node root = YAML::Load(text);
    if (root.IsNull()) return out;
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file ", path, ": expected a mapping of key: value"));
    }
    for (const auto& entry : root) {
      const std::string key = entry.first.as<std::string>();
      auto it = keys.find(key);
      if (it == keys.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config file ", path, ": unknown key \"", key,
            "\" (known: output, server, tls_ca, tls_cert, tls_key, token_file)"));
      }
      if (!entry.second.IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config file ", path, ": ", key, " must be a string"));
      }
      std::string value = entry.second.as<std::string>();
      // "~/x" means $HOME/x, as in a shell.
      if (absl::StartsWith(value, "~/") && !env.home.empty()) {
        value = absl::StrCat(env.home, value.substr(1));
      }
      *it->second = value;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": ", e.what()));
  }
  return out;
}

absl::StatusOr<Config> ConfigFromFlags(const CommandLine& line, const Environment& env) {
  Config c;
  if (absl::Status s = ParseCommand(line.words, &c); !s.ok()) return s;
  const std::set<std::string> allowed = CommandFlags(c.verb);
  for (const std::string& name : line.flags_named) {
    if (IsCommandFlag(name) && allowed.count(name) == 0) {
      // "get jobs", "approve": the words that name the command.
      const bool two_words = line.words[0] == "get" || line.words[0] == "describe" ||
                             line.words[0] == "history" || line.words[0] == "diagnose" ||
                             line.words[0] == "resolve" || line.words[0] == "operator";
      const std::string command =
          two_words ? absl::StrCat(line.words[0], " ", line.words[1]) : line.words[0];
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name == "dry_run" ? "dry-run" : name, " does not apply to \"",
                       command, "\" (see sdcctl --help)"));
    }
  }
  absl::StatusOr<FileConfig> file = ReadConfigFile(env);
  if (!file.ok()) return file.status();
  auto first = [](const std::string& a, const std::string& b, const std::string& c,
                  const char* fallback) {
    return !a.empty() ? a : !b.empty() ? b : !c.empty() ? c : std::string(fallback);
  };
  c.server = first(absl::GetFlag(FLAGS_server), env.admin_addr, file->server, kDefaultServer);
  c.token_file = first(absl::GetFlag(FLAGS_token_file), env.token_file, file->token_file,
                       kDefaultTokenFile);
  c.tls_ca = first(absl::GetFlag(FLAGS_tls_ca), "", file->tls_ca, "");
  c.tls_cert = first(absl::GetFlag(FLAGS_tls_cert), "", file->tls_cert, "");
  c.tls_key = first(absl::GetFlag(FLAGS_tls_key), "", file->tls_key, "");
  c.no_headers = absl::GetFlag(FLAGS_no_headers);
  c.watch = absl::GetFlag(FLAGS_watch);
  c.interval = absl::GetFlag(FLAGS_interval);
  if (!absl::GetFlag(FLAGS_selector).empty()) {
    absl::StatusOr<Selector> selector = ParseSelector(absl::GetFlag(FLAGS_selector));
    if (!selector.ok()) return selector.status();
    c.selector = *std::move(selector);
  }
  if (c.verb == Verb::kOperatorAdd) {
    absl::StatusOr<v1::OperatorRole> role = ParseRole(absl::GetFlag(FLAGS_role));
    if (!role.ok()) return role.status();
    c.role = *role;
  }
  c.timeout = absl::GetFlag(FLAGS_timeout);
  if (c.verb == Verb::kDiagnoseNode && line.flags_named.count("timeout") == 0) {
    c.timeout = kDiagnoseTimeout;
  }
  absl::StatusOr<OutputFormat> output = ParseOutputFormat(
      line.flags_named.count("output") == 0 && !file->output.empty() ? file->output
                                                                     : absl::GetFlag(FLAGS_output));
  if (!output.ok()) return output.status();
  c.output = *output;
  if (c.verb == Verb::kGetRequests && !absl::GetFlag(FLAGS_state).empty()) {
    absl::StatusOr<v1::RequestState> state = ParseRequestState(absl::GetFlag(FLAGS_state));
    if (!state.ok()) return state.status();
    c.state = *state;
  }
  c.job = absl::GetFlag(FLAGS_job);
  c.reason = absl::GetFlag(FLAGS_reason);
  c.dry_run = absl::GetFlag(FLAGS_dry_run);
  c.force = absl::GetFlag(FLAGS_force);
  c.gpu = absl::GetFlag(FLAGS_gpu);
  const int size = absl::GetFlag(FLAGS_size);
  const int repetitions = absl::GetFlag(FLAGS_repetitions);
  // sdcd checks the upper bounds (the agent's limits); a negative number is
  // a usage error here.
  if (size < 0) return absl::InvalidArgumentError("--size must not be negative");
  if (repetitions < 0) return absl::InvalidArgumentError("--repetitions must not be negative");
  c.size = static_cast<uint32_t>(size);
  c.repetitions = static_cast<uint32_t>(repetitions);
  return c;
}

// InvalidArgument (a usage error) when the Config cannot make its call.
absl::Status Validate(const Config& c) {
  if (c.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeout must be positive");
  }
  if (c.watch && c.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--interval must be positive");
  }
  // Unknown label keys: filtering an empty list checks them.
  const auto check_keys = [&c](auto empty) { return Filter(&empty, c.selector); };
  absl::Status keys = absl::OkStatus();
  switch (c.verb) {
    case Verb::kGetRequests: keys = check_keys(v1::ListRequestsResponse()); break;
    case Verb::kGetIncidents: keys = check_keys(v1::ListIncidentsResponse()); break;
    case Verb::kGetSuspects: keys = check_keys(v1::ListSuspectsResponse()); break;
    case Verb::kGetJobs: keys = check_keys(v1::ListJobsResponse()); break;
    case Verb::kGetNodes: keys = check_keys(v1::ListNodesResponse()); break;
    default: break;
  }
  if (!keys.ok()) return keys;
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (c.verb == Verb::kApprove || c.verb == Verb::kDeny) {
    const char* verb = c.verb == Verb::kApprove ? "approve" : "deny";
    if (absl::StripAsciiWhitespace(c.reason).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(verb, " needs --reason=TEXT (why; it is kept in the request's history)"));
    }
  }
  if (c.verb == Verb::kResolveIncident) {
    if (absl::StripAsciiWhitespace(c.reason).empty()) {
      return absl::InvalidArgumentError(
          "resolve needs --reason=TEXT (why; it is kept with the incident)");
    }
  }
  if ((c.verb == Verb::kHistoryGpu || c.verb == Verb::kHistoryNode) && c.subject.empty()) {
    return absl::InvalidArgumentError("history needs a GPU UUID or a node name");
  }
  if ((c.verb == Verb::kDescribeNode || c.verb == Verb::kDiagnoseNode) && c.node.empty()) {
    return absl::InvalidArgumentError("name a node");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) out.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  const int error = errno;
  std::fclose(f);
  if (failed) return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(error)));
  return out;
}

struct Credentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;
  std::string bearer_token;  // Empty: authenticate by client certificate.
};

// PermissionDenied when there is nothing to authenticate with;
// FailedPrecondition when a TLS file cannot be read.
absl::StatusOr<Credentials> LoadCredentials(const Config& c) {
  Credentials creds;
  absl::StatusOr<std::string> token = ReadFile(c.token_file);
  if (token.ok()) {
    creds.bearer_token = std::string(absl::StripAsciiWhitespace(*token));
    if (creds.bearer_token.empty() && c.tls_cert.empty()) {
      return absl::PermissionDeniedError(
          absl::StrCat("the admin token file ", c.token_file, " is empty"));
    }
  } else if (c.tls_cert.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read the admin token: ", token.status().message(),
                     " (pass --token_file=PATH or set $SDC_ADMIN_TOKEN_FILE, or use --tls_cert)"));
  }
  if (c.tls_ca.empty() && c.tls_cert.empty()) {
    creds.channel = grpc::InsecureChannelCredentials();
    return creds;
  }
  grpc::SslCredentialsOptions options;
  if (!c.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(c.tls_ca);
    if (!ca.ok())
      return absl::FailedPreconditionError(absl::StrCat("--tls_ca: ", ca.status().message()));
    options.pem_root_certs = *ca;
  }
  if (!c.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(c.tls_cert);
    if (!cert.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--tls_cert: ", cert.status().message()));
    }
    absl::StatusOr<std::string> key = ReadFile(c.tls_key);
    if (!key.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--tls_key: ", key.status().message()));
    }
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  creds.channel = grpc::SslCredentials(options);
  return creds;
}

// The admin stub, with the token and a fresh deadline on every call.
class AdminClient {
 public:
  AdminClient(const Config& config, Credentials creds)
      : timeout_(config.timeout), bearer_token_(std::move(creds.bearer_token)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
    args.SetUserAgentPrefix("sdcctl");
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(config.server, creds.channel, args);
    stub_ = v1::AdminService::NewStub(channel);
    node_stub_ = v1::NodeAdminService::NewStub(channel);
  }

  // Runs `call(stub, context)` under the deadline. Returns its status.
  template <typename Call>
  grpc::Status Run(Call call) {
    grpc::ClientContext context;
    Prepare(&context);
    return call(*stub_, &context);
  }

  // The same for the node agents' service.
  template <typename Call>
  grpc::Status RunNodes(Call call) {
    grpc::ClientContext context;
    Prepare(&context);
    return call(*node_stub_, &context);
  }

 private:
  void Prepare(grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    if (!bearer_token_.empty()) {
      context->AddMetadata("authorization", absl::StrCat("Bearer ", bearer_token_));
    }
  }

  const absl::Duration timeout_;
  const std::string bearer_token_;
  std::unique_ptr<v1::AdminService::Stub> stub_;
  std::unique_ptr<v1::NodeAdminService::Stub> node_stub_;
};

int Fail(int exit_code, absl::string_view message) {
  std::fprintf(stderr, "sdcctl: error: %.*s\n", static_cast<int>(message.size()), message.data());
  return exit_code;
}

void Print(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

// Prints a list, or says on stderr that there was nothing (as kubectl does;
// json and yaml still print the empty document on stdout).
void PrintList(const std::string& text, bool empty) {
  if (empty) std::fputs("No resources found.\n", stderr);
  Print(text);
}

// describe: the message as JSON or YAML, its kind/name line, or `describe()`.
template <typename Message, typename Describe>
void PrintDescribed(const Message& m, OutputFormat format, const std::string& name,
                    Describe describe) {
  switch (format) {
    case OutputFormat::kJson:
      Print(ToJson(m));
      break;
    case OutputFormat::kYaml:
      Print(ToYaml(m));
      break;
    case OutputFormat::kName:
      Print(name + "\n");
      break;
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      Print(describe());
      break;
  }
}

// A list on stdout, without its header line under --no-headers (tables only).
void PrintTable(const std::string& text, bool empty, const Config& c) {
  const bool table = c.output == OutputFormat::kTable || c.output == OutputFormat::kWide;
  PrintList(c.no_headers && table ? WithoutHeaders(text) : text, empty);
}

// Set by SIGINT or SIGTERM: `get --watch` ends cleanly at its next pause.
std::atomic<bool> interrupted{false};
extern "C" void OnInterrupt(int) { interrupted.store(true); }

// One list for a get command, fetched, filtered by -l and formatted; *empty
// when nothing is left.
grpc::Status ListOnce(const Config& c, AdminClient& admin, std::string* text, bool* empty) {
  grpc::Status status;
  const absl::Time now = absl::Now();
  switch (c.verb) {
    case Verb::kGetRequests: {
      v1::ListRequestsRequest q;
      q.set_state(c.state);
      v1::ListRequestsResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ListRequests(ctx, q, &r); });
      if (status.ok()) Filter(&r, c.selector).IgnoreError();  // Keys checked by Validate.
      *text = FormatRequests(r, c.output, now);
      *empty = r.requests().empty();
      break;
    }
    case Verb::kGetIncidents: {
      v1::ListIncidentsRequest q;
      q.set_job_id(c.job);
      v1::ListIncidentsResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ListIncidents(ctx, q, &r); });
      if (status.ok()) Filter(&r, c.selector).IgnoreError();
      *text = FormatIncidents(r, c.output, now);
      *empty = r.incidents().empty();
      break;
    }
    case Verb::kGetSuspects: {
      v1::ListSuspectsResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ListSuspects(ctx, {}, &r); });
      if (status.ok()) Filter(&r, c.selector).IgnoreError();
      *text = FormatSuspects(r, c.output, now);
      *empty = r.suspects().empty();
      break;
    }
    case Verb::kGetJobs: {
      v1::ListJobsResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ListJobs(ctx, {}, &r); });
      if (status.ok()) Filter(&r, c.selector).IgnoreError();
      *text = FormatJobs(r, c.output, now);
      *empty = r.jobs().empty();
      break;
    }
    case Verb::kGetNodes: {
      v1::ListNodesResponse r;
      status = admin.RunNodes([&](auto& s, auto* ctx) { return s.ListNodes(ctx, {}, &r); });
      if (status.ok()) Filter(&r, c.selector).IgnoreError();
      *text = FormatNodes(r, c.output, now);
      *empty = r.nodes().empty();
      break;
    }
    default:
      return {grpc::StatusCode::INTERNAL, "not a get command"};
  }
  return status;
}

// get: one list, or with --watch one every --interval (a blank line
// between) until SIGINT or SIGTERM, which exit 0.
int Get(const Config& c, AdminClient& admin) {
  if (c.watch) {
    std::signal(SIGINT, OnInterrupt);
    std::signal(SIGTERM, OnInterrupt);
  }
  for (bool first = true;; first = false) {
    std::string text;
    bool empty = false;
    grpc::Status status = ListOnce(c, admin, &text, &empty);
    if (!status.ok()) return Fail(ExitCodeFor(status.error_code()), RpcErrorMessage(status, c.server));
    if (!first) Print("\n");
    PrintTable(text, empty, c);
    std::fflush(stdout);
    if (!c.watch) return kExitOk;
    const absl::Time next = absl::Now() + c.interval;
    while (absl::Now() < next) {
      if (interrupted.load()) return kExitOk;
      absl::SleepFor(std::min(absl::Milliseconds(50), next - absl::Now()));
    }
    if (interrupted.load()) return kExitOk;
  }
}

int Execute(const Config& c, AdminClient& admin) {
  grpc::Status status;
  auto failed = [&] {
    return Fail(ExitCodeFor(status.error_code()), RpcErrorMessage(status, c.server));
  };
  switch (c.verb) {
    case Verb::kGetRequests:
    case Verb::kGetIncidents:
    case Verb::kGetSuspects:
    case Verb::kGetJobs:
    case Verb::kGetNodes:
      return Get(c, admin);
    case Verb::kGetRequest: {
      v1::GetRequestRequest q;
      q.set_id(c.id);
      v1::ReplacementRequest r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.GetRequest(ctx, q, &r); });
      if (!status.ok()) return failed();
      PrintDescribed(r, c.output, absl::StrCat("request/", r.id()),
                     [&] { return DescribeRequest(r, absl::Now()); });
      return kExitOk;
    }
    case Verb::kDescribeIncident: {
      v1::ListIncidentsResponse all;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ListIncidents(ctx, {}, &all); });
      if (!status.ok()) return failed();
      for (const v1::Incident& i : all.incidents()) {
        if (i.id() != c.id) continue;
        PrintDescribed(i, c.output, absl::StrCat("incident/", i.id()),
                       [&] { return DescribeIncident(i, absl::Now()); });
        return kExitOk;
      }
      return Fail(kExitNotFound, absl::StrCat("no incident ", c.id));
    }
    case Verb::kDescribeJob: {
      v1::ListJobsResponse jobs;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ListJobs(ctx, {}, &jobs); });
      if (!status.ok()) return failed();
      for (const v1::Job& job : jobs.jobs()) {
        if (job.job_id() != c.name) continue;
        v1::ListRanksRequest rq;
        rq.set_job_id(c.name);
        v1::ListRanksResponse ranks;
        status = admin.Run([&](auto& s, auto* ctx) { return s.ListRanks(ctx, rq, &ranks); });
        if (!status.ok()) return failed();
        v1::ListIncidentsRequest iq;
        iq.set_job_id(c.name);
        v1::ListIncidentsResponse incidents;
        status =
            admin.Run([&](auto& s, auto* ctx) { return s.ListIncidents(ctx, iq, &incidents); });
        if (!status.ok()) return failed();
        PrintDescribed(job, c.output, absl::StrCat("job/", job.job_id()),
                       [&] { return DescribeJob(job, ranks, incidents, absl::Now()); });
        return kExitOk;
      }
      return Fail(kExitNotFound, absl::StrCat("no job ", c.name));
    }
    case Verb::kOperatorAdd: {
      v1::AddOperatorRequest q;
      q.set_name(c.name);
      q.set_role(c.role);
      v1::AddOperatorResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.AddOperator(ctx, q, &r); });
      if (!status.ok()) return failed();
      if (c.output == OutputFormat::kJson || c.output == OutputFormat::kYaml) {
        Print(c.output == OutputFormat::kJson ? ToJson(r) : ToYaml(r));
        return kExitOk;
      }
      // The token alone on stdout (sdcctl operator add alice > alice.token).
      std::fprintf(stderr,
                   "operator/%s added (role %s). Its token follows, shown this once: give it "
                   "to %s to keep in a file only they can read (token_file in sdcctl.yaml).\n",
                   r.operator_().name().c_str(), RoleName(r.operator_().role()).c_str(),
                   r.operator_().name().c_str());
      Print(r.token() + "\n");
      return kExitOk;
    }
    case Verb::kOperatorList: {
      v1::ListOperatorsResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ListOperators(ctx, {}, &r); });
      if (!status.ok()) return failed();
      PrintTable(FormatOperators(r, c.output, absl::Now()), r.operators().empty(), c);
      return kExitOk;
    }
    case Verb::kOperatorRemove: {
      v1::RemoveOperatorRequest q;
      q.set_name(c.name);
      v1::Operator r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.RemoveOperator(ctx, q, &r); });
      if (!status.ok()) return failed();
      Print(absl::StrCat("operator/", r.name(), " removed\n"));
      return kExitOk;
    }
    case Verb::kWhoAmI: {
      v1::WhoAmIResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.WhoAmI(ctx, {}, &r); });
      if (!status.ok()) return failed();
      PrintDescribed(r, c.output, absl::StrCat("operator/", r.name()), [&] {
        return absl::StrCat("Name:                ", r.name(), "\nRole:                ",
                            RoleName(r.role()), "\nApprovals Required:  ",
                            r.approvals_required(), "\nServer Version:      ",
                            r.server_version(), "\n");
      });
      return kExitOk;
    }
    case Verb::kVersion:
    case Verb::kCompletion:
      break;  // Handled in Main: they need no server.
    case Verb::kDescribeRequest: {
      v1::GetRequestRequest q;
      q.set_id(c.id);
      v1::ReplacementRequest r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.GetRequest(ctx, q, &r); });
      if (!status.ok()) return failed();
      PrintDescribed(r, c.output, absl::StrCat("request/", r.id()),
                     [&] { return DescribeRequest(r, absl::Now()); });
      return kExitOk;
    }
    case Verb::kApprove:
    case Verb::kDeny: {
      const bool approve = c.verb == Verb::kApprove;
      if (approve) {
        // The notice names the node and the action, which only sdcd knows.
        v1::GetRequestRequest q;
        q.set_id(c.id);
        v1::ReplacementRequest current;
        status = admin.Run([&](auto& s, auto* ctx) { return s.GetRequest(ctx, q, &current); });
        if (!status.ok()) return failed();
        std::fputs(ApprovalNotice(current).c_str(), stderr);
      }
      v1::DecideRequest q;
      q.set_id(c.id);
      q.set_reason(c.reason);
      q.set_dry_run(c.dry_run);
      q.set_force(c.force);
      v1::ReplacementRequest r;
      status = admin.Run(
          [&](auto& s, auto* ctx) { return approve ? s.Approve(ctx, q, &r) : s.Deny(ctx, q, &r); });
      if (!status.ok()) return failed();
      Print(FormatDecision(r, approve, c.dry_run, c.output));
      return kExitOk;
    }
    case Verb::kResolveIncident: {
      v1::ResolveIncidentRequest q;
      q.set_id(c.id);
      q.set_reason(c.reason);
      v1::Incident r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.ResolveIncident(ctx, q, &r); });
      if (!status.ok()) return failed();
      v1::ListIncidentsResponse one;
      *one.add_incidents() = r;
      Print(FormatIncidents(one, c.output, absl::Now()));
      return kExitOk;
    }
    case Verb::kHistoryGpu:
    case Verb::kHistoryNode: {
      v1::HistoryRequest q;
      if (c.verb == Verb::kHistoryGpu) {
        q.set_gpu_uuid(c.subject);
      } else {
        q.set_node_name(c.subject);
      }
      v1::HistoryResponse r;
      status = admin.Run([&](auto& s, auto* ctx) { return s.History(ctx, q, &r); });
      if (!status.ok()) return failed();
      PrintList(FormatHistory(r, c.output, absl::Now()), IsEmpty(r));
      return kExitOk;
    }
    case Verb::kDescribeNode: {
      v1::GetNodeRequest q;
      q.set_node_name(c.node);
      v1::Node r;
      status = admin.RunNodes([&](auto& s, auto* ctx) { return s.GetNode(ctx, q, &r); });
      if (!status.ok()) return failed();
      PrintDescribed(r, c.output, absl::StrCat("node/", r.node_name()),
                     [&] { return DescribeNode(r, absl::Now()); });
      return kExitOk;
    }
    case Verb::kDiagnoseNode: {
      v1::DiagnoseRequest q;
      q.set_node_name(c.node);
      q.set_gpu_uuid(c.gpu);
      q.set_size(c.size);
      q.set_repetitions(c.repetitions);
      q.set_wait(true);
      v1::Diagnostic r;
      status = admin.RunNodes([&](auto& s, auto* ctx) { return s.Diagnose(ctx, q, &r); });
      if (!status.ok()) return failed();
      Print(FormatDiagnostic(r, c.output));
      return DiagnosticExitCode(r);
    }
  }
  return Fail(kExitError, "internal: unhandled command");
}

int Main(int argc, char** argv) {
  absl::StatusOr<CommandLine> line = ApplyFlags(argc, argv);
  if (!line.ok()) return Fail(kExitUsage, line.status().message());
  if (line->version) {
    std::printf("sdcctl %s\n", kVersion);
    return kExitOk;
  }
  if (line->help || (!line->words.empty() && line->words[0] == "help")) {
    // "sdcctl approve --help", "sdcctl help approve": that command's usage.
    const std::vector<std::string>& w = line->words;
    const std::string command = w.empty() ? "" : w[0] == "help" ? (w.size() > 1 ? w[1] : "") : w[0];
    std::fputs(command.empty() ? kUsage : CommandUsage(command).c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<Config> config = ConfigFromFlags(*line, ReadEnvironment());
  if (!config.ok()) return Fail(kExitUsage, config.status().message());
  if (absl::Status s = Validate(*config); !s.ok()) return Fail(kExitUsage, s.message());
  if (config->verb == Verb::kCompletion) {
    Print(config->shell == "bash" ? BashCompletion() : ZshCompletion());
    return kExitOk;
  }
  absl::StatusOr<Credentials> creds = LoadCredentials(*config);
  if (config->verb == Verb::kVersion) {
    // sdcd's version when it answers; sdcctl's in any case.
    Print(absl::StrCat("sdcctl ", kVersion, "\n"));
    if (!creds.ok()) {
      Print(absl::StrCat("sdcd   unknown (", creds.status().message(), ")\n"));
      return kExitOk;
    }
    Config quick = *config;
    quick.timeout = std::min(config->timeout, absl::Seconds(3));
    AdminClient admin(quick, *std::move(creds));
    v1::WhoAmIResponse r;
    grpc::Status status = admin.Run([&](auto& s, auto* ctx) { return s.WhoAmI(ctx, {}, &r); });
    Print(status.ok() ? absl::StrCat("sdcd   ", r.server_version(), " at ", config->server, "\n")
                      : absl::StrCat("sdcd   unknown (", RpcErrorMessage(status, config->server),
                                     ")\n"));
    return kExitOk;
  }
  if (!creds.ok()) {
    return Fail(
        creds.status().code() == absl::StatusCode::kPermissionDenied ? kExitPermission : kExitError,
        creds.status().message());
  }
  AdminClient admin(*config, *std::move(creds));
  return Execute(*config, admin);
}

}  // namespace
}  // namespace sdc::sdcctl

int main(int argc, char** argv) { return sdc::sdcctl::Main(argc, argv); }
