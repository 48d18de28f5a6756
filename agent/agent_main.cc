// sdc-agent: the sdc-guard node agent, one per node. Registers the node's
// identity (name, host, HyperPod instance id, GPUs from NVML) with sdcd,
// heartbeats, runs confirmation diagnostics sdcd asks for, and carries out
// approved actions for its node when sdcd runs --actuator=agent. Flags are
// parsed here, and only here, into a validated Config; everything else is
// wiring. See docs/operations.md.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <set>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent.pb.h"
#include "agent/agent_metrics.h"
#include "agent/config.h"
#include "agent/core/action_command.h"
#include "common/diagnostic_plan.h"
#include "common/identity.h"
#include "common/metrics/exposer.h"
#include "common/metrics/collector.h"
#include "common/version.h"
#include "agent/core/link_machine.h"
#include "agent/diagnostic.h"
#include "agent/diagnostic_process.h"
#include "agent/gpus.h"
#include "agent/link.h"
#include "agent/log.h"
#include "agent/node_action.h"
#include "agent/relay.h"
#include "agent/relay_socket.h"
#include "agent/worker.h"

namespace {
const sdc::agent::Config kDefaults;
}  // namespace

ABSL_FLAG(std::string, coordinator, "",
          "sdcd's agent address, HOST:PORT (its --agent_listen). Required.");
ABSL_FLAG(std::string, node_name, "",
          "This node's name as trainers report it and actuators address it. "
          "Default: $NODE_NAME, else the host name.");
ABSL_FLAG(absl::Duration, heartbeat, kDefaults.heartbeat,
          "Heartbeat period (1s..10m); sdcd calls the node stale after three missed.");
ABSL_FLAG(std::string, instance_id, "",
          "HyperPod instance id (i-...), shown to operators; sdcd never acts on an id an agent "
          "states. Default: taken from a node name hyperpod-i-..., else none.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of sdcd's certificate: connect with TLS.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate whose DNS name is this node's: proves the node to sdcd "
          "(--tls_client_ca; needs --tls_ca).");
ABSL_FLAG(std::string, token_file, "",
          "EKS: the pod's projected service-account token (audience sdcd), sent to prove the "
          "node instead of a certificate; read again for every stream.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, action_command, "",
          "Node-local program an approved action runs (sdcd --actuator=agent), split on "
          "spaces, no shell; {action}, {request} and {node} are substituted. Default: none "
          "(the agent reports that no node-local action is configured).");
ABSL_FLAG(absl::Duration, action_timeout, kDefaults.action_timeout,
          "Deadline of --action_command; keep it below sdcd's --actuator_timeout.");
ABSL_FLAG(absl::Duration, diagnostic_timeout, kDefaults.diagnostic_timeout,
          "Kill a device's diagnostic process still running after this long (the device "
          "then gets no verdict, saying why).");
ABSL_FLAG(std::string, nvml_library, kDefaults.nvml_library,
          "NVML library to load for the GPU inventory.");
ABSL_FLAG(std::string, relay_listen, "",
          "Relay this node's trainer ranks to sdcd: listen on this Unix socket (unix:PATH, mode "
          "0660) for their streams, and point their SDC_COORDINATOR at it. Empty: no relay "
          "(ranks connect to sdcd themselves).");
ABSL_FLAG(std::vector<std::string>, relay_allowed_uids, {},
          "Comma-separated uids whose processes may use the relay (checked with SO_PEERCRED). "
          "Default: the agent's own uid.");
ABSL_FLAG(int64_t, relay_group, -1,
          "Group id to own the relay socket (mode 0660), so trainers of that group may "
          "connect; -1: the agent's.");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus /metrics and /healthz (200 while the agent runs; the body says "
          "whether the link to sdcd is up) on HOST:PORT, e.g. 0.0.0.0:9465. Empty: off.");
ABSL_FLAG(std::string, inject_diagnostic_fault, "",
          "TESTS ONLY: =yes-i-am-testing corrupts one element of every diagnostic so tests "
          "can prove the comparison catches it.");

namespace sdc::agent {
namespace {

// What the agent reads from its environment, read in exactly one place.
struct Environment {
  std::string node_name;  // $NODE_NAME
  std::string hostname;   // gethostname()
  // $SDC_BUNDLE_EXE: set by the release bundle's launcher to its own path;
  // the agent must re-execute that, since its /proc/self/exe is the loader.
  std::string bundle_exe;
};

Environment ReadEnvironment() {
  Environment env;
  const char* node = std::getenv("NODE_NAME");
  env.node_name = node == nullptr ? "" : node;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) env.hostname = host;
  const char* bundle_exe = std::getenv("SDC_BUNDLE_EXE");
  env.bundle_exe = bundle_exe == nullptr ? "" : bundle_exe;
  return env;
}

Config ConfigFromFlags(const Environment& env) {
  Config c;
  c.coordinator = absl::GetFlag(FLAGS_coordinator);
  c.hostname = env.hostname;
  c.node_name = absl::GetFlag(FLAGS_node_name);
  if (c.node_name.empty()) c.node_name = !env.node_name.empty() ? env.node_name : env.hostname;
  c.instance_id = absl::GetFlag(FLAGS_instance_id);
  if (c.instance_id.empty()) c.instance_id = common::InstanceIdFromNodeName(c.node_name);
  c.heartbeat = absl::GetFlag(FLAGS_heartbeat);
  c.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  c.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  c.tls_key = absl::GetFlag(FLAGS_tls_key);
  c.token_file = absl::GetFlag(FLAGS_token_file);
  c.relay_group = absl::GetFlag(FLAGS_relay_group);
  c.action_command = absl::GetFlag(FLAGS_action_command);
  c.action_timeout = absl::GetFlag(FLAGS_action_timeout);
  c.diagnostic_timeout = absl::GetFlag(FLAGS_diagnostic_timeout);
  c.nvml_library = absl::GetFlag(FLAGS_nvml_library);
  c.inject_diagnostic_fault = absl::GetFlag(FLAGS_inject_diagnostic_fault);
  c.relay_listen = absl::GetFlag(FLAGS_relay_listen);
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  return c;
}

int Main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == kDiagnosticChildCommand) {
    return DiagnosticChildMain(std::vector<std::string>(argv + 2, argv + argc));
  }
  absl::SetProgramUsageMessage(
      "the sdc-guard node agent.\n  sdc-agent --coordinator=HOST:PORT [--node_name=NAME] "
      "[--heartbeat=30s] [--action_command='PROG {action} {request}'] ...");
  // --help lists the flags of the main file, which Abseil looks for by the
  // binary's name: sdc-agent's are in agent_main.cc.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "agent/agent_main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] { return absl::StrCat("sdc-agent ", kVersion, "\n"); };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  const Environment env = ReadEnvironment();
  Config config = ConfigFromFlags(env);
  for (const std::string& uid : absl::GetFlag(FLAGS_relay_allowed_uids)) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(uid, &n)) {
      std::fprintf(stderr, "sdc-agent: --relay_allowed_uids: '%s' is not a uid\n", uid.c_str());
      return 2;
    }
    config.relay_allowed_uids.push_back(n);
  }
  if (config.relay_allowed_uids.empty()) config.relay_allowed_uids.push_back(getuid());
  if (absl::Status s = Validate(config); !s.ok()) {
    std::fprintf(stderr, "sdc-agent: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const std::vector<std::string> action_words = *core::ParseActionTemplate(config.action_command);
  // Signals go to sigwait below, not to whichever thread runs.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // CUDA's default device order is "fastest first"; NVML's is the PCI bus.
  // The diagnostic addresses GPU i (NVML) as CUDA device i.
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", /*overwrite=*/1);

  v1::NodeIdentity identity;
  identity.set_node_name(config.node_name);
  identity.set_hostname(config.hostname);
  identity.set_instance_id(config.instance_id);
  identity.set_agent_version(kVersion);
  identity.set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(config.heartbeat)));
  std::vector<common::GpuRef> gpu_refs;
  absl::StatusOr<std::vector<Gpu>> gpus = ListGpus(config.nvml_library);
  if (gpus.ok()) {
    for (const Gpu& g : *gpus) {
      v1::GpuIdentity* p = identity.add_gpus();
      p->set_uuid(g.uuid);
      p->set_model(g.model);
      p->set_index(g.index);
      gpu_refs.push_back({g.uuid, g.index});
      Log(absl::StrCat("GPU ", g.index, ": ", g.uuid, " ", g.model));
    }
  } else {
    identity.set_gpu_note(std::string(gpus.status().message()));
    Log(absl::StrCat("no GPUs: ", gpus.status().message(),
                     "; diagnostics run on the CPU"));
  }
  if (config.inject_fault()) {
    Log("--inject_diagnostic_fault: every diagnostic will report one wrong element (TESTS ONLY)");
  }

  DiagnosticProcessOptions process_options;
  // Exec'd in the forked child, /proc/self/exe is the running agent's own
  // file, even after an upgrade replaced or removed it on disk. Started by
  // the release bundle's launcher, it is the bundle's loader instead, so the
  // child runs the launcher (a versioned path an upgrade does not replace).
  process_options.agent_binary =
      env.bundle_exe.empty() ? std::string("/proc/self/exe") : env.bundle_exe;
  process_options.timeout = config.diagnostic_timeout;
  process_options.inject_fault = config.inject_fault();
  std::atomic<uint32_t> diagnostics_queued{0};
  std::atomic<uint32_t> actions_running{0};
  SerialWorker diagnostics;
  SerialWorker actions;
  AgentLink* link = nullptr;  // Set below; the handlers run only after Start().
  std::unique_ptr<TrainerRelay> relay;
  metrics::Collector registry;
  // Scrapes start only after both are set (the exposer starts below them).
  AgentMetrics agent_metrics(
      &registry, kVersion, [&] { return link != nullptr ? link->Stats() : LinkStats{}; },
      [&]() -> RelayStats {
        if (relay == nullptr) return {};
        return {relay->sessions(), relay->sessions_opened()};
      });
  AgentLink::DiagnosticHandler on_diagnostic = [&](uint64_t session,
                                                   const v1::DiagnosticRequest& request) {
    ++diagnostics_queued;
    diagnostics.Post([&, session, request] {
      auto send = [&](const v1::DiagnosticResult& r) {
        v1::AgentMessage m;
        *m.mutable_diagnostic_result() = r;
        link->Send(session, std::move(m));
      };
      absl::StatusOr<common::Shape> shape = common::ResolveShape(request.size(), request.repetitions());
      absl::StatusOr<std::vector<common::PlannedDevice>> devices =
          shape.ok() ? common::PlanDevices(request.gpu_uuid(), gpu_refs)
                     : absl::StatusOr<std::vector<common::PlannedDevice>>(shape.status());
      if (!devices.ok()) {
        DeviceOutcome refused;
        refused.gpu = request.gpu_uuid().empty() ? common::kCpuDevice : request.gpu_uuid();
        refused.error = std::string(devices.status().message());
        refused.detail = absl::StrCat("refused: ", refused.error);
        Log(absl::StrCat("diagnostic ", request.id(), " ", refused.detail));
        agent_metrics.DiagnosticDone(/*pass=*/false, /*error=*/true);
        v1::DiagnosticResult r = ToProto(refused);
        r.set_id(request.id());
        r.set_device_count(1);
        send(r);
      } else {
        RunDiagnosticProcesses(*shape, *devices, process_options, [&](v1::DiagnosticResult r) {
          Log(absl::StrCat("diagnostic ", request.id(), " on ", r.gpu(), ": ",
                           r.error().empty() ? (r.pass() ? "pass" : "FAIL") : "error", ": ",
                           r.detail()));
          agent_metrics.DiagnosticDone(r.pass(), !r.error().empty());
          r.set_id(request.id());
          r.set_device_count(static_cast<uint32_t>(devices->size()));
          send(r);
        });
      }
      --diagnostics_queued;
    });
  };
  AgentLink::ActionHandler on_action = [&](uint64_t session, const v1::NodeAction& action) {
    ++actions_running;
    Log(absl::StrCat("request ", action.request_id(), ": sdcd asks to ", action.action(),
                     " this node"));
    actions.Post([&, session, action] {
      const ActionOutcome out =
          RunNodeAction(action_words, action.action(), action.request_id(),
                        action.command_hint(), config.node_name, config.action_timeout);
      Log(absl::StrCat("request ", action.request_id(), ": ", out.ok ? "ok: " : "failed: ",
                       out.detail));
      v1::AgentMessage m;
      m.mutable_action_result()->set_request_id(action.request_id());
      m.mutable_action_result()->set_ok(out.ok);
      m.mutable_action_result()->set_detail(out.detail);
      link->Send(session, std::move(m));
      --actions_running;
    });
  };
  LinkOptions options;
  options.coordinator = config.coordinator;
  options.tls_ca = config.tls_ca;
  options.tls_cert = config.tls_cert;
  options.tls_key = config.tls_key;
  options.token_file = config.token_file;
  options.timing.heartbeat = config.heartbeat;
  AgentLink agent_link(options, identity, on_diagnostic, on_action, [&](v1::Heartbeat* h) {
    h->set_diagnostics_queued(diagnostics_queued);
    h->set_actions_running(actions_running);
  });
  link = &agent_link;
  Log(absl::StrCat("sdc-agent ", kVersion, " on node ", config.node_name, " (host ",
                   config.hostname, ", instance ",
                   config.instance_id.empty() ? "unknown" : config.instance_id,
                   "), coordinator ", config.coordinator, ", heartbeat ",
                   absl::FormatDuration(config.heartbeat), ", action command ",
                   config.action_command.empty() ? "none" : config.action_command));
  std::unique_ptr<grpc::Server> relay_server;
  std::unique_ptr<RelaySocket> relay_socket;
  if (!config.relay_listen.empty()) {
    std::function<std::string()> bearer;
    if (!config.token_file.empty()) bearer = [&config] { return ReadToken(config.token_file); };
    relay = std::make_unique<TrainerRelay>(MakeRelayChannel(options), config.node_name, bearer);
    absl::StatusOr<std::unique_ptr<RelaySocket>> socket = RelaySocket::Listen(
        config.relay_listen.substr(5),
        std::set<uid_t>(config.relay_allowed_uids.begin(), config.relay_allowed_uids.end()),
        static_cast<gid_t>(config.relay_group));
    if (!socket.ok()) {
      std::fprintf(stderr, "sdc-agent: --relay_listen: %s\n",
                   std::string(socket.status().message()).c_str());
      return 2;
    }
    relay_socket = *std::move(socket);
    grpc::ServerBuilder builder;
    // No listening port: RelaySocket hands it the connections it admits.
    // The ranks' channel settings (common/channel.h), as sdcd accepts them.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    builder.SetMaxReceiveMessageSize(TrainerRelay::kMaxRankMessageBytes);
    builder.SetMaxSendMessageSize(16 << 20);
    builder.RegisterService(relay.get());
    relay_server = builder.BuildAndStart();
    if (relay_server == nullptr) {
      std::fprintf(stderr, "sdc-agent: --relay_listen: cannot start the relay on %s\n",
                   config.relay_listen.c_str());
      return 2;
    }
    relay_socket->Serve(relay_server.get());
    std::vector<std::string> uids;
    for (uint32_t u : config.relay_allowed_uids) uids.push_back(absl::StrCat(u));
    Log(absl::StrCat("relaying trainer streams from ", config.relay_listen, " (uids ",
                     absl::StrJoin(uids, ","), ") to ", config.coordinator, " as node ",
                     config.node_name));
  }

  std::unique_ptr<metrics::Exposer> exposer;
  if (!config.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::Exposer>> started = metrics::Exposer::Start(
        config.metrics_listen, &registry, [&] { return agent_metrics.HealthDetail(); });
    if (!started.ok()) {
      std::fprintf(stderr, "sdc-agent: --metrics_listen: %s\n",
                   std::string(started.status().message()).c_str());
      return 2;
    }
    exposer = *std::move(started);
    Log(absl::StrCat("serving /metrics and /healthz on port ", exposer->port()));
  }

  agent_link.Start();

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  Log(absl::StrCat("signal ", signal_number, ": shutting down"));
  if (relay != nullptr) {
    relay_socket->Stop();
    relay->Shutdown();  // Ranks reconnect (to a restarted agent, or elsewhere).
    relay_server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  }
  if (exposer != nullptr) exposer->Stop();
  agent_link.Stop();
  // A diagnostic may be in the middle of a matmul that cannot be
  // interrupted; nothing is persisted, so leave without waiting for it.
  std::fflush(stderr);
  std::_Exit(0);
}

}  // namespace
}  // namespace sdc::agent

int main(int argc, char** argv) { return sdc::agent::Main(argc, argv); }
