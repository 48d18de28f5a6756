// sdcd: the per-cluster coordinator daemon. Flags are parsed here, and only
// here, into a validated Config; everything else is wiring. See
// docs/ARCHITECTURE.md ("sdcd") and docs/operations.md.

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/version.h"
#include "daemon/actuator.h"
#include "daemon/admin_service.h"
#include "daemon/agent_service.h"
#include "daemon/agents.h"
#include "daemon/agents_actuator.h"
#include "daemon/config.h"
#include "daemon/core/coordinator.h"
#include "common/metrics/collector.h"
#include "common/metrics/pull_exposer.h"
#include "daemon/delivery.h"
#include "daemon/grpc_edge.h"
#include "daemon/node_identity.h"
#include "daemon/service_account_token.h"
#include "daemon/service_metrics.h"
#include "daemon/sqlite_store.h"
#include "daemon/stream_registry.h"
#include "daemon/trainer_service.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace {
const sdc::daemon::Config kDefaults;
}  // namespace

ABSL_FLAG(std::string, listen, kDefaults.listen, "Trainer service address, HOST:PORT.");
ABSL_FLAG(std::string, agent_listen, kDefaults.agent_listen,
          "Node agents' address, HOST:PORT (their AgentService streams and the relays of their "
          "node's ranks). Off loopback it needs --tls_cert: agents prove their node there with a "
          "client certificate (--tls_client_ca) or a service-account token "
          "(--agent_token_keys). Empty: no agents.");
ABSL_FLAG(std::string, admin_listen, kDefaults.admin_listen,
          "Admin service address: HOST:PORT (loopback by default) or unix:PATH.");
ABSL_FLAG(std::string, metrics_listen, kDefaults.metrics_listen,
          "Prometheus /metrics address, HOST:PORT.");
ABSL_FLAG(std::string, db, kDefaults.db, "SQLite database file.");
ABSL_FLAG(std::string, admin_token_file, kDefaults.admin_token_file,
          "Admin bearer token file; created with a random token if missing.");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate for the trainer service.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "If set, trainers must present a client certificate signed by this CA, and agents may; "
          "a certificate's DNS name is the node it proves.");
ABSL_FLAG(bool, admin_tls, false, "Serve the admin service over TLS with --tls_cert.");
ABSL_FLAG(std::string, admin_client_ca, "",
          "If set, admin clients may authenticate with a certificate from this CA (its own, not "
          "--tls_client_ca): a subject alternative name that is a registered operator's.");
ABSL_FLAG(std::string, agent_token_keys, "",
          "EKS: the service-account issuer's public keys (the JWKS of kubectl get --raw "
          "/openid/v1/jwks, or PEM), to verify agents' projected tokens.");
ABSL_FLAG(std::string, agent_token_issuer, "",
          "EKS: the issuer (iss) agents' tokens must carry (kubectl get --raw "
          "/.well-known/openid-configuration).");
ABSL_FLAG(std::string, agent_token_audience, kDefaults.agent_token_audience,
          "The audience agents' tokens must carry.");
ABSL_FLAG(std::vector<std::string>, agent_token_service_accounts,
          kDefaults.agent_token_service_accounts,
          "Comma-separated service accounts (system:serviceaccount:NS:NAME) whose tokens prove "
          "an agent's node.");
ABSL_FLAG(bool, insecure_dev_mode, false,
          "DEVELOPMENT ONLY: take callers at their word (a Hello's placement, an agent's node), "
          "as before node identities. Refused unless every listener is loopback.");
ABSL_FLAG(int, max_ranks_per_node, kDefaults.max_ranks_per_node,
          "Ranks a node may hold in a job when its agent lists no GPUs (else its GPU count); a "
          "job holds no more ranks than its nodes can.");
ABSL_FLAG(int64_t, max_unauthenticated_ranks, kDefaults.max_unauthenticated_ranks,
          "Ranks unauthenticated callers may hold together.");
ABSL_FLAG(int, max_jobs_per_identity, kDefaults.max_jobs_per_identity,
          "Jobs one identity (a proven node, or all unauthenticated callers) may hold.");
ABSL_FLAG(int, max_open_requests_per_job, kDefaults.max_open_requests_per_job,
          "Replacement requests one job may have open; 0: half of --max_open_requests.");
ABSL_FLAG(bool, hyperpod_instance_ids_from_kubernetes, false,
          "For --actuator=hyperpod: read a node's instance id from its Node's spec.providerID "
          "(kubectl get node) when --hyperpod_node_ids_file and its name give none.");
ABSL_FLAG(std::string, actuator, "dry-run",
          "What approval does: dry-run, eks, slurm, hyperpod, command or agent (the node's "
          "sdc-agent runs its --action_command).");
ABSL_FLAG(std::string, actuator_command, "",
          "For --actuator=command: program and arguments; {node}, {action}, {request} "
          "are substituted.");
ABSL_FLAG(absl::Duration, actuator_timeout, absl::Seconds(60),
          "Deadline for each program an actuator runs.");
ABSL_FLAG(std::string, hyperpod_cluster, "", "For --actuator=hyperpod: the cluster name.");
ABSL_FLAG(std::string, hyperpod_node_ids_file, "",
          "For --actuator=hyperpod: lines of 'node-name instance-id' (instance ids come from "
          "configuration or the cluster's records, never from what an agent says).");
ABSL_FLAG(std::string, action, kDefaults.action, "What a request asks for: replace or reboot.");
ABSL_FLAG(std::string, approval, kDefaults.approval,
          "require: a human approves every request; auto: approve at once.");
ABSL_FLAG(int, approvals_required, kDefaults.approvals_required,
          "Distinct operators who must approve a replacement request before it runs "
          "(2: two-person approval; a deny from anyone ends it).");
ABSL_FLAG(int, max_open_requests, kDefaults.max_open_requests,
          "Blast radius: requests open at once.");
ABSL_FLAG(int, max_executions, kDefaults.max_executions,
          "Blast radius: replacements executed per --execution_window.");
ABSL_FLAG(absl::Duration, execution_window, kDefaults.execution_window,
          "Window of --max_executions.");
ABSL_FLAG(absl::Duration, request_ttl, kDefaults.request_ttl,
          "Pending requests expire after this.");
ABSL_FLAG(std::vector<std::string>, never_replace, {},
          "Comma-separated nodes (names or instance ids i-...) that are never replaced "
          "(controllers).");
ABSL_FLAG(absl::Duration, report_deadline, kDefaults.report_deadline,
          "A step's checks are decided with what arrived after this long.");
ABSL_FLAG(std::string, resume_policy, kDefaults.resume_policy,
          "A new attempt of a job (its launcher restarted it) that resumes from a checkpoint "
          "the gate never called final: warn (start it, say so to the operator's log and its "
          "ranks) or refuse (refuse its Hellos).");
ABSL_FLAG(int, targeted_audits, kDefaults.targeted_audits,
          "Targeted audits scheduled for each unconfirmed suspect.");
ABSL_FLAG(int, max_jobs, kDefaults.max_jobs,
          "Jobs held at most; a Hello for one more is refused once abandoned jobs expired.");
ABSL_FLAG(int64_t, max_ranks, kDefaults.max_ranks,
          "Ranks held at most, over all jobs (the sum of their world sizes).");
ABSL_FLAG(absl::Duration, job_expiry, kDefaults.job_expiry,
          "A job with no rank attached and no report for this long is dropped "
          "(its incidents, requests and suspects stay).");

namespace sdc::daemon {
namespace {

class RealClock : public core::Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

void Log(const std::string& line) {
  std::fprintf(stderr, "%s sdcd: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%S", absl::Now(), absl::LocalTimeZone()).c_str(),
               line.c_str());
}

[[noreturn]] void Die(const std::string& line) {
  std::fprintf(stderr, "sdcd: %s\n", line.c_str());
  std::exit(2);
}

Config ConfigFromFlags() {
  Config c;
  c.listen = absl::GetFlag(FLAGS_listen);
  c.agent_listen = absl::GetFlag(FLAGS_agent_listen);
  c.agent_token_keys = absl::GetFlag(FLAGS_agent_token_keys);
  c.agent_token_issuer = absl::GetFlag(FLAGS_agent_token_issuer);
  c.agent_token_audience = absl::GetFlag(FLAGS_agent_token_audience);
  c.agent_token_service_accounts = absl::GetFlag(FLAGS_agent_token_service_accounts);
  c.insecure_dev_mode = absl::GetFlag(FLAGS_insecure_dev_mode);
  c.max_ranks_per_node = absl::GetFlag(FLAGS_max_ranks_per_node);
  c.max_unauthenticated_ranks = absl::GetFlag(FLAGS_max_unauthenticated_ranks);
  c.max_jobs_per_identity = absl::GetFlag(FLAGS_max_jobs_per_identity);
  c.max_open_requests_per_job = absl::GetFlag(FLAGS_max_open_requests_per_job);
  c.actuator.instance_ids_from_kubernetes =
      absl::GetFlag(FLAGS_hyperpod_instance_ids_from_kubernetes);
  c.admin_listen = absl::GetFlag(FLAGS_admin_listen);
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  c.db = absl::GetFlag(FLAGS_db);
  c.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  c.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  c.tls_key = absl::GetFlag(FLAGS_tls_key);
  c.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  c.admin_tls = absl::GetFlag(FLAGS_admin_tls);
  c.admin_client_ca = absl::GetFlag(FLAGS_admin_client_ca);
  c.actuator.kind = absl::GetFlag(FLAGS_actuator);
  c.actuator.command = absl::GetFlag(FLAGS_actuator_command);
  c.actuator.timeout = absl::GetFlag(FLAGS_actuator_timeout);
  c.actuator.hyperpod_cluster = absl::GetFlag(FLAGS_hyperpod_cluster);
  c.hyperpod_node_ids_file = absl::GetFlag(FLAGS_hyperpod_node_ids_file);
  c.action = absl::GetFlag(FLAGS_action);
  c.approval = absl::GetFlag(FLAGS_approval);
  c.approvals_required = absl::GetFlag(FLAGS_approvals_required);
  c.max_open_requests = absl::GetFlag(FLAGS_max_open_requests);
  c.max_executions = absl::GetFlag(FLAGS_max_executions);
  c.execution_window = absl::GetFlag(FLAGS_execution_window);
  c.request_ttl = absl::GetFlag(FLAGS_request_ttl);
  c.never_replace = absl::GetFlag(FLAGS_never_replace);
  c.actuator.never_replace = {c.never_replace.begin(), c.never_replace.end()};
  c.report_deadline = absl::GetFlag(FLAGS_report_deadline);
  c.targeted_audits = absl::GetFlag(FLAGS_targeted_audits);
  c.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  c.max_ranks = absl::GetFlag(FLAGS_max_ranks);
  c.job_expiry = absl::GetFlag(FLAGS_job_expiry);
  c.resume_policy = absl::GetFlag(FLAGS_resume_policy);
  return c;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The admin token, created (0600, 32 random hex bytes) if the file is absent.
std::string AdminToken(const std::string& path) {
  if (path.empty()) return "";
  if (access(path.c_str(), F_OK) != 0) {
    std::random_device rd;
    std::string token;
    for (int i = 0; i < 32; ++i) token += absl::StrFormat("%02x", rd() & 0xff);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || write(fd, token.data(), token.size()) != static_cast<ssize_t>(token.size())) {
      Die(absl::StrCat("--admin_token_file: cannot create ", path));
    }
    close(fd);
    Log(absl::StrCat("created admin token file ", path));
    return token;
  }
  std::string token(absl::StripAsciiWhitespace(ReadFile(path)));
  if (token.empty()) Die(absl::StrCat("--admin_token_file: ", path, " is empty"));
  return token;
}

std::shared_ptr<grpc::ServerCredentials> Credentials(const Config& c, bool tls,
                                                     const std::string& client_ca,
                                                     bool require_client_cert) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
      : require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = client_ca.empty() ? "" : ReadFile(client_ca);
  options.pem_key_cert_pairs.push_back({ReadFile(c.tls_key), ReadFile(c.tls_cert)});
  return grpc::SslServerCredentials(options);
}

// Keepalive settings; the client (client/) uses a 30 s ping interval, which
// these accept.
void ConfigureKeepalive(grpc::ServerBuilder& b) {
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  b.SetMaxReceiveMessageSize(kMaxMessageBytes);
  b.SetMaxSendMessageSize(kMaxMessageBytes);
}

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop = true; }

std::string ApproveHint(const core::ReplacementRequest& r) {
  return absl::StrCat("sdcctl describe request ", r.id, "; sdcctl approve ", r.id,
                      " --reason \"...\"");
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the sdc-guard coordinator daemon.\n  sdcd --db=PATH [--listen=HOST:PORT] "
      "[--admin_listen=HOST:PORT|unix:PATH] [--metrics_listen=HOST:PORT] ...");
  {
    // --version prints this and exits 0 (Abseil's built-in flag).
    absl::FlagsUsageConfig usage;
    usage.version_string = [] { return absl::StrCat("sdcd ", kVersion, "\n"); };
    absl::SetFlagsUsageConfig(usage);
  }
  absl::ParseCommandLine(argc, argv);
  // Abseil here is built with mutex deadlock detection on: a graph walk on
  // every lock. Production code does not pay for a debugging aid.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Config config = ConfigFromFlags();
  {
    // Validate knows the built-in actuators; the agent one is made below.
    Config checked = config;
    checked.actuator = ForValidation(config.actuator);
    if (absl::Status s = Validate(checked); !s.ok()) Die(std::string(s.message()));
  }
  if (!config.hyperpod_node_ids_file.empty()) {
    std::istringstream lines(ReadFile(config.hyperpod_node_ids_file));
    std::string line;
    while (std::getline(lines, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (f.size() == 2) config.actuator.node_ids[f[0]] = f[1];
    }
  }

  absl::StatusOr<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(config.db);
  if (!store.ok()) Die(absl::StrCat("--db: ", store.status().message()));
  RealClock clock;
  core::CoordinatorOptions options;
  options.report_deadline = config.report_deadline;
  options.targeted_audits_per_suspect = static_cast<uint32_t>(config.targeted_audits);
  options.max_jobs = static_cast<size_t>(config.max_jobs);
  options.max_ranks = static_cast<uint64_t>(config.max_ranks);
  options.job_expiry = config.job_expiry;
  options.resume_policy = config.resume_policy == "refuse"
                              ? core::CoordinatorOptions::ResumePolicy::kRefuse
                              : core::CoordinatorOptions::ResumePolicy::kWarn;
  options.max_ranks_per_node = static_cast<uint32_t>(config.max_ranks_per_node);
  options.max_unauthenticated_ranks = static_cast<uint64_t>(config.max_unauthenticated_ranks);
  options.max_jobs_per_identity = static_cast<size_t>(config.max_jobs_per_identity);
  options.max_open_requests_per_job = config.max_open_requests_per_job;
  options.escalation.request_ttl = config.request_ttl;
  options.escalation.max_open_requests = config.max_open_requests;
  options.escalation.max_executed_per_window = config.max_executions;
  options.escalation.execution_window = config.execution_window;
  options.escalation.require_approval = config.approval == "require";
  options.escalation.approvals_required = config.approvals_required;
  options.escalation.never_replace = {config.never_replace.begin(), config.never_replace.end()};
  options.escalation.action = config.action;
  core::Coordinator coordinator(options, &clock, store->get());
  if (absl::Status s = coordinator.Restore(); !s.ok()) {
    Die(absl::StrCat("--db: cannot restore from ", config.db, ": ", s.message()));
  }
  // Node agents: in memory, rebuilt as agents (re)register.
  AgentRegistry agents(AgentRegistryOptions{}, &clock);
  AgentHub agent_hub(&agents, &clock);
  std::unique_ptr<Actuator> actuator = *MakeActuatorWithAgents(config.actuator, &agent_hub);
  // How agents and trainers prove their node (daemon/node_identity.h).
  std::unique_ptr<TokenVerifier> tokens;
  if (!config.agent_token_keys.empty()) {
    TokenPolicy policy;
    policy.issuer = config.agent_token_issuer;
    policy.audience = config.agent_token_audience;
    policy.subjects = config.agent_token_service_accounts;
    absl::StatusOr<std::unique_ptr<TokenVerifier>> made =
        TokenVerifier::Create(ReadFile(config.agent_token_keys), policy);
    if (!made.ok()) Die(absl::StrCat("--agent_token_keys: ", made.status().message()));
    tokens = *std::move(made);
  }
  NodeAuthenticator authenticator(tokens.get(), &clock, config.insecure_dev_mode);
  if (config.insecure_dev_mode) {
    Log("--insecure_dev_mode: every caller is taken at its word (placements, agents' nodes); "
        "never run this where anyone else can reach sdcd");
  }

  // Shared with the exposer, which holds it weakly (prometheus-cpp's way).
  const auto collector = std::make_shared<metrics::Collector>();
  metrics::Collector& registry = *collector;
  ServiceMetrics service_metrics(registry);
  metrics::BuildGauge()
      .Name("sdc_build_info")
      .Help("sdcd's version; always 1.")
      .Register(registry)
      .Add({{"version", kVersion}, {"actuator", actuator->name()}})
      .Set(1);
  auto& attached = metrics::BuildGauge()
                       .Name("sdc_attached_ranks")
                       .Help("Trainer ranks with a live stream.")
                       .Register(registry)
                       .Add({});
  auto& suspects = metrics::BuildGauge()
                       .Name("sdc_suspects")
                       .Help("GPUs under suspicion, not yet attributed.")
                       .Register(registry)
                       .Add({});
  auto& requests = metrics::BuildGauge()
                       .Name("sdc_replacement_requests")
                       .Help("Replacement requests, by state.")
                       .Register(registry);
  auto& db_bytes = metrics::BuildGauge()
                       .Name("sdc_store_bytes")
                       .Help("Size of the SQLite database and its WAL.")
                       .Register(registry)
                       .Add({});
  auto& queue = metrics::BuildGauge()
                    .Name("sdc_store_queue_depth")
                    .Help("Changes waiting for their commit.")
                    .Register(registry)
                    .Add({});
  auto& settling = metrics::BuildGauge()
                       .Name("sdc_store_settling_reports")
                       .Help("Reports no longer pending but still in the database, removed "
                             "with their log row when the store is idle.")
                       .Register(registry)
                       .Add({});
  auto& commits = metrics::BuildCounter()
                      .Name("sdc_store_commits_total")
                      .Help("Commits since start (each holds many changes).")
                      .Register(registry)
                      .Add({});
  auto& agent_nodes = metrics::BuildGauge()
                          .Name("sdc_agent_nodes")
                          .Help("Nodes whose sdc-agent registered, by status (ready, stale, "
                                "disconnected).")
                          .Register(registry);
  SqliteStore* db = store->get();
  // Scrapes may overlap; the commits counter advances to the store's count
  // under this lock so that two scrapes never both add the same commits.
  absl::Mutex collect_mu;
  registry.AddCollectHook([&] {
    std::map<std::string, int> by_status = {{"ready", 0}, {"stale", 0}, {"disconnected", 0}};
    for (const NodeView& n : agents.ListNodes()) {
      ++by_status[absl::AsciiStrToLower(NodeStatusName(n.status))];
    }
    for (const auto& [status, n] : by_status) agent_nodes.Add({{"status", status}}).Set(n);
    attached.Set(coordinator.AttachedRanks());
    const std::vector<core::Suspect> suspect_list = coordinator.ListSuspects();
    suspects.Set(static_cast<double>(suspect_list.size()));
    service_metrics.SetSuspects(suspect_list);
    std::map<std::string, int> by_state;
    for (core::RequestState s :
         {core::RequestState::kPending, core::RequestState::kApproved,
          core::RequestState::kExecuting, core::RequestState::kDone, core::RequestState::kFailed,
          core::RequestState::kDenied, core::RequestState::kExpired}) {
      by_state[RequestStateLabel(s)] = 0;
    }
    const auto request_list = coordinator.ListRequests();
    for (const auto& r : request_list) ++by_state[RequestStateLabel(r.state)];
    for (const auto& [state, n] : by_state) requests.Add({{"state", state}}).Set(n);
    service_metrics.SetRequests(request_list);
    db_bytes.Set(static_cast<double>(db->file_bytes()));
    queue.Set(static_cast<double>(db->queue_depth()));
    settling.Set(static_cast<double>(db->settling_reports()));
    absl::MutexLock lock(&collect_mu);
    commits.Increment(static_cast<double>(db->commits()) - commits.Value());
  });
  absl::StatusOr<std::unique_ptr<metrics::PullExposer>> exposer =
      metrics::PullExposer::Start(config.metrics_listen, collector);
  if (!exposer.ok()) Die(absl::StrCat("--metrics_listen: ", exposer.status().message()));

  StreamRegistry streams;
  // Logs what the core decided, for operators watching the daemon: every
  // delivered decision, from ingestion, the timer, operators or the actuator.
  auto log_effects = [](const core::Effects& e) {
    for (const core::Incident& i : e.incidents) {
      Log(absl::StrCat("incident ", i.id, ": ", core::CheckKindName(i.check), " check, job ",
                       i.job_id, " step ", i.step, ", ", i.outcome, ": ", i.explanation));
    }
    for (const core::ReplacementRequest& r : e.requests) {
      Log(absl::StrCat("request ", r.id, " for node ", r.node, " is ",
                       core::RequestStateName(r.state),
                       r.state == core::RequestState::kPending ? absl::StrCat(" (", ApproveHint(r), ")")
                                                               : ""));
    }
    for (const std::string& line : e.notes) Log(line);
    for (const std::string& job : e.expired_jobs) {
      Log(absl::StrCat("job ", job, " expired: no rank attached and no report for ",
                       absl::FormatDuration(absl::GetFlag(FLAGS_job_expiry)),
                       "; its incidents and requests stay"));
    }
  };
  Delivery delivery(db, &streams, &service_metrics, log_effects);
  absl::Mutex wake_mu;
  bool wake = false;
  TrainerContext trainer_context{&coordinator, &delivery, &streams, &service_metrics};
  trainer_context.authenticator = &authenticator;
  trainer_context.node_gpus = [&agents](const std::string& node) { return agents.GpuIds(node); };
  TrainerService trainer(trainer_context);
  // The same service on the agent listener, where relays are served.
  TrainerContext agent_trainer_context = trainer_context;
  agent_trainer_context.agent_port = true;
  TrainerService agent_trainer(agent_trainer_context);
  auto& relays = metrics::BuildGauge()
                     .Name("sdc_relay_streams")
                     .Help("Relay streams open (sdc-agent --relay_listen), each carrying its "
                           "node's ranks; those ranks count in sdc_attached_ranks too.")
                     .Register(registry)
                     .Add({});
  registry.AddCollectHook([&] { relays.Set(static_cast<double>(agent_trainer.relays())); });
  absl::StatusOr<std::unique_ptr<Operators>> operators = Operators::Load(
      db, config.admin_token_file.empty() ? "" : AdminToken(config.admin_token_file),
      config.approvals_required);
  if (!operators.ok()) Die(absl::StrCat("--db: ", operators.status().message()));
  AdminAuth auth{operators->get(), !config.admin_client_ca.empty()};
  AdminService admin(&coordinator, &delivery, &service_metrics, auth, operators->get(),
                     config.approvals_required, [&] {
    absl::MutexLock lock(&wake_mu);
    wake = true;
  });
  // Agents dial their own listener; operators reach them on the admin one.
  AgentService agent_service(&agent_hub, &service_metrics, &authenticator);
  NodeAdminService node_admin(&agent_hub, &clock, &service_metrics, auth);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  int trainer_port = 0;
  int admin_port = 0;
  grpc::ServerBuilder trainer_builder;
  trainer_builder.AddListeningPort(
      config.listen, Credentials(config, !config.tls_cert.empty(), config.tls_client_ca, true),
      &trainer_port);
  trainer_builder.RegisterService(&trainer);
  ConfigureKeepalive(trainer_builder);
  // Trainer streams spread over this many completion queues, one thread
  // each (see daemon/stream_call.h): 1,024 streams per queue at 16,384 ranks.
  constexpr int kAttachQueues = 16;
  trainer.AddQueues(trainer_builder, kAttachQueues);
  std::unique_ptr<grpc::Server> trainer_server = trainer_builder.BuildAndStart();
  if (trainer_server == nullptr) Die(absl::StrCat("--listen: cannot listen on ", config.listen));
  trainer.Start();
  // Agents: client certificates requested (and verified) when a client CA is
  // given, never required (an EKS agent proves its node with a token).
  std::unique_ptr<grpc::Server> agent_server;
  int agent_port = 0;
  if (!config.agent_listen.empty()) {
    grpc::ServerBuilder agent_builder;
    agent_builder.AddListeningPort(
        config.agent_listen,
        Credentials(config, !config.tls_cert.empty(), config.tls_client_ca, false), &agent_port);
    agent_builder.RegisterService(&agent_service);
    agent_builder.RegisterService(&agent_trainer);
    ConfigureKeepalive(agent_builder);
    // One relay per node: 2,048 relays at 16,384 ranks.
    agent_trainer.AddQueues(agent_builder, 4);
    agent_server = agent_builder.BuildAndStart();
    if (agent_server == nullptr) {
      Die(absl::StrCat("--agent_listen: cannot listen on ", config.agent_listen));
    }
    agent_trainer.Start();
  }
  grpc::ServerBuilder admin_builder;
  admin_builder.AddListeningPort(
      config.admin_listen,
      Credentials(config, config.admin_tls, config.admin_client_ca, false), &admin_port);
  admin_builder.RegisterService(&admin);
  admin_builder.RegisterService(&node_admin);
  ConfigureKeepalive(admin_builder);
  std::unique_ptr<grpc::Server> admin_server = admin_builder.BuildAndStart();
  if (admin_server == nullptr) {
    Die(absl::StrCat("--admin_listen: cannot listen on ", config.admin_listen));
  }
  Log(absl::StrCat("sdcd ", kVersion, " serving trainers on ", config.listen, " (port ",
                   trainer_port, "), agents on ",
                   config.agent_listen.empty() ? std::string("none (no --agent_listen)")
                                               : absl::StrCat(config.agent_listen, " (port ",
                                                              agent_port, ")"),
                   ", admin on ", config.admin_listen,
                   absl::StartsWith(config.admin_listen, "unix:") ? ""
                                                                   : absl::StrCat(" (port ", admin_port, ")"),
                   ", metrics on port ", (*exposer)->port(), ", database ", config.db,
                   ", actuator ", actuator->name(), ", approval ", config.approval));

  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  signal(SIGPIPE, SIG_IGN);

  // Deadlines and expiry, once a second; health follows the store.
  std::thread ticker([&] {
    pthread_setname_np(pthread_self(), "sdc-ticker");
    while (!g_stop) {
      delivery.Deliver(coordinator.Tick());
      agent_hub.Tick();
      const bool healthy = db->health().ok();
      trainer_server->GetHealthCheckService()->SetServingStatus(healthy);
      if (agent_server != nullptr) {
        agent_server->GetHealthCheckService()->SetServingStatus(healthy);
      }
      admin_server->GetHealthCheckService()->SetServingStatus(healthy);
      absl::SleepFor(absl::Seconds(1));
    }
  });
  // Approved requests run through the actuator, outside every lock.
  std::thread actuator_loop([&] {
    pthread_setname_np(pthread_self(), "sdc-actuator");
    while (!g_stop) {
      {
        absl::MutexLock lock(&wake_mu);
        wake_mu.AwaitWithTimeout(absl::Condition(&wake), absl::Seconds(1));
        wake = false;
      }
      auto [started, effects] = coordinator.StartApproved(actuator->name());
      delivery.Deliver(std::move(effects));
      if (started.empty()) continue;
      const std::vector<ActuatorResult> results = actuator->Execute(started);
      for (size_t i = 0; i < started.size(); ++i) {
        Log(absl::StrCat("actuator ", actuator->name(), " on request ", started[i].id, ": ",
                         results[i].detail));
        service_metrics.ActuatorRun(actuator->name(), results[i].ok ? "ok" : "failed");
        auto done = coordinator.FinishExecution(started[i].id, results[i].ok, results[i].detail);
        if (done.ok()) delivery.Deliver(std::move(done->second));
      }
    }
  });

  while (!g_stop) absl::SleepFor(absl::Milliseconds(200));
  Log("shutting down");
  agent_hub.Shutdown();  // An actuator waiting for an agent stops waiting.
  // Trainers reconnect (to this sdcd restarted, or another) and resend what
  // was not acknowledged; their open streams would hold the shutdown.
  // Relays first: a relayed rank told to reconnect would otherwise come
  // back at once on its relay's still open stream.
  agent_trainer.EndRelays(grpc::Status(grpc::StatusCode::UNAVAILABLE, "sdcd is shutting down"));
  trainer.EndRelays(grpc::Status(grpc::StatusCode::UNAVAILABLE, "sdcd is shutting down"));
  streams.EndAll(grpc::Status(grpc::StatusCode::UNAVAILABLE, "sdcd is shutting down"));
  if (agent_server != nullptr) {
    agent_server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    agent_trainer.Stop();
  }
  trainer_server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  trainer.Stop();
  admin_server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  ticker.join();
  actuator_loop.join();
  // Callbacks still due reach the streams and metrics, which are destroyed
  // before the store.
  db->Drain();
  // A scrape's hooks read objects declared after the exposer (the trainer
  // service's relay count), destroyed before it: stop serving first.
  (*exposer)->Stop();
  return 0;
}

}  // namespace
}  // namespace sdc::daemon

int main(int argc, char** argv) { return sdc::daemon::Main(argc, argv); }
