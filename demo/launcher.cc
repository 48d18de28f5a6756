#include "demo/launcher.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <variant>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "admin.grpc.pb.h"
#include "demo/pki.h"
#include "demo/process.h"
#include "demo/progress_line.h"
#include "demo/tcp_proxy.h"
#include "grpcpp/grpcpp.h"
#include <nlohmann/json.hpp>

namespace sdc::demo {
namespace {

// Reads whole new lines of a progress file.
class Tail {
 public:
  explicit Tail(std::string path) : path_(std::move(path)) {}

  // The lines completed since the last call, parsed. A line that does not
  // parse is an error naming the file and the line (the trainers write
  // these files; a bad line is a bug to see, not data to skip).
  absl::StatusOr<std::vector<ProgressLine>> NewLines() {
    std::vector<ProgressLine> lines;
    std::ifstream in(path_);
    if (!in) return lines;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // A partial line: read it next time.
      offset_ += line.size() + 1;
      ++line_number_;
      absl::StatusOr<ProgressLine> parsed = ParseProgressLine(line);
      if (!parsed.ok()) {
        return absl::InternalError(absl::StrCat(path_, " line ", line_number_, ": ",
                                                parsed.status().message(), ": ",
                                                line.substr(0, 200)));
      }
      lines.push_back(*std::move(parsed));
    }
    return lines;
  }

 private:
  std::string path_;
  size_t offset_ = 0;
  int line_number_ = 0;
};

class Admin {
 public:
  Admin(const std::string& address, const std::string& token_file)
      : stub_(v1::AdminService::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        token_file_(token_file) {}

  template <typename Req, typename Resp, typename Call>
  bool Query(Call call, const Req& req, Resp* resp) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (token_.empty()) token_ = std::string(absl::StripAsciiWhitespace(ReadFile(token_file_)));
    c.AddMetadata("authorization", "Bearer " + token_);
    return (stub_.get()->*call)(&c, req, resp).ok();
  }
  v1::AdminService::Stub* stub() { return stub_.get(); }

 private:
  std::unique_ptr<v1::AdminService::Stub> stub_;
  std::string token_file_;
  std::string token_;
};

int PortAfter(const std::string& line, const std::string& marker) {
  const size_t at = line.find(marker);
  if (at == std::string::npos) return 0;
  int n = 0;
  const std::string rest = line.substr(at + marker.size());
  (void)absl::SimpleAtoi(rest.substr(0, rest.find_first_not_of("0123456789")), &n);
  return n;
}

// The trainer's checkpoint files, as rank 0 left them: step-N.pt (the
// Python and C++ trainers), checkpoint-N/ (transformers.Trainer),
// step-N.ckpt (Lightning), step-N.state/ (Accelerate); each with
// .provisional until the guard calls it final.
void ListCheckpoints(const std::string& dir, ClusterResult* result) {
  static const std::regex kName(
      R"re((?:step-|checkpoint-)(\d+)(?:\.pt|\.ckpt|\.state|\.dcp)?(\.provisional)?)re");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    std::cmatch m;
    if (!std::regex_match(e->d_name, m, kName)) continue;
    const int step = std::stoi(m[1].str());
    (m[2].matched ? result->checkpoints_provisional : result->checkpoints_final).push_back(step);
  }
  closedir(d);
  std::sort(result->checkpoints_final.begin(), result->checkpoints_final.end());
  std::sort(result->checkpoints_provisional.begin(), result->checkpoints_provisional.end());
}

// A loopback port nothing listens on now (for a coordinator that starts
// later on it); 0 when none can be found.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace

bool KnownLayout(const std::string& layout) {
  return layout == "ddp" || layout == "fsdp" || layout == "hsdp" || layout == "zero" ||
         layout == "tp";
}

std::string NodeName(int node) {
  std::string name = "node-";
  if (node >= 26) name += static_cast<char>('a' + node / 26 - 1);
  name += static_cast<char>('a' + node % 26);
  return name;
}

absl::StatusOr<ClusterResult> RunCluster(const ClusterConfig& c) {
  const int world = c.nodes * c.gpus_per_node;
  if (c.nodes < 1 || c.gpus_per_node < 1) return absl::InvalidArgumentError("nodes and GPUs per node must be at least 1");
  if (world < 2) return absl::InvalidArgumentError("a data-parallel job needs at least 2 ranks");
  if (c.steps < 1) return absl::InvalidArgumentError("steps must be at least 1");
  mkdir(c.run_dir.c_str(), 0755);
  if (access(c.run_dir.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("run folder ", c.run_dir, " is not writable"));
  }
  const std::string sdcd_bin = c.sdcd_binary.empty() ? BinaryPath("daemon/sdcd") : c.sdcd_binary;
  // The command that starts one rank, before its flags.
  std::vector<std::string> trainer_command;
  std::string python_path;
  if (c.trainer == "cpp") {
    trainer_command = {c.trainer_binary.empty() ? BinaryPath("demo/sdc-trainer") : c.trainer_binary};
  } else if (c.trainer == "python" || c.trainer == "hf" || c.trainer == "lightning" ||
             c.trainer == "accelerate") {
    const char* python = std::getenv("SDC_PYTHON");
    if (python == nullptr || *python == '\0') {
      return absl::FailedPreconditionError(
          "the Python trainer needs SDC_PYTHON, the Python of the project's virtual environment "
          "(./sdc sets it, and SDC_PYTHONPATH to the built sdc_guard package)");
    }
    const char* path = std::getenv("SDC_PYTHONPATH");
    if (path != nullptr) python_path = path;
    if (c.trainer == "python") {
      trainer_command = {python, BinaryPath("examples/ddp_train.py")};
    } else {  // The same ranks, trained by a framework through sdc_guard.integrations.
      trainer_command = {python, BinaryPath("examples/framework_train.py"),
                         "--framework=" + c.trainer};
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer '", c.trainer, "': expected cpp, python, hf, lightning or accelerate"));
  }
  if (!KnownLayout(c.layout)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout '", c.layout, "': expected ddp, fsdp, hsdp, zero or tp"));
  }
  if (c.layout == "tp" && (c.nodes < 2 || 4 % c.gpus_per_node != 0 || c.model != "transformer")) {
    // examples/layouts.py: the transformer's 4 heads split over tp = GPUs
    // per node, replicated over the nodes.
    return absl::InvalidArgumentError(absl::StrCat(
        "layout tp: the transformer over 2+ nodes of 1, 2 or 4 GPUs (tp = GPUs per node), got ",
        c.nodes, " node(s) of ", c.gpus_per_node, ", model ", c.model));
  }
  if (c.layout != "ddp" && c.trainer != "python") {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", c.layout, ": the Python trainer's only (examples/layouts.py)"));
  }
  ClusterResult result;
  result.db = c.run_dir + "/sdcd.db";
  result.token_file = c.run_dir + "/admin.token";
  const absl::Time start = absl::Now();

  const bool with_sdcd = !c.unguarded && !c.coordinator_unreachable && !c.no_coordinator;
  // Node identities, made at start: a throwaway CA and one certificate per
  // node, which its ranks present (SDC_TLS_CERT). sdcd takes a rank's node
  // from its certificate, so evidence about a node comes from that node.
  ClusterPki pki;
  if (with_sdcd) {
    const std::string pki_dir = c.run_dir + "/pki";
    mkdir(pki_dir.c_str(), 0700);
    std::vector<std::string> nodes;
    for (int n = 0; n < c.nodes; ++n) nodes.push_back(NodeName(n));
    // The fresh node that replaces a faulty one (replace_and_resume).
    if (c.replace_and_resume) nodes.push_back(NodeName(c.nodes));
    absl::StatusOr<ClusterPki> made = WriteClusterPki(pki_dir, nodes);
    if (!made.ok()) return made.status();
    pki = *std::move(made);
    result.pki_dir = pki_dir;
  }

  // replace_and_resume: sdcd's actuator is a local stand-in for HyperPod,
  // which records the node it was told to replace.
  std::vector<std::string> actuator_flags = {"--actuator=" + c.actuator};
  const std::string replacements = c.run_dir + "/replacements.txt";
  if (c.replace_and_resume) {
    if (c.run_dir.find_first_of(" \t'") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "run folder '", c.run_dir, "': replace_and_resume needs one without spaces or quotes "
          "(it holds the actuator's command)"));
    }
    const std::string standin = c.run_dir + "/hyperpod-standin";
    unlink(replacements.c_str());
    WriteRecordingStandIn(standin, replacements,
                          "node marked for replacement (a local stand-in for HyperPod)");
    actuator_flags = {"--actuator=command",
                      "--actuator_command=" + standin + " {action} {node} request={request}"};
  }

  // The coordinator, on free loopback ports it reports in its log.
  Process sdcd;
  int trainer_port = 0, admin_port = 0, metrics_port = 0;
  auto start_sdcd = [&]() -> absl::Status {
    std::vector<std::string> argv = {
        sdcd_bin, "--db=" + result.db, "--admin_token_file=" + result.token_file,
        absl::StrCat("--listen=127.0.0.1:", trainer_port),
        absl::StrCat("--admin_listen=127.0.0.1:", admin_port),
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port),
        "--tls_cert=" + pki.server_cert, "--tls_key=" + pki.server_key,
        "--tls_client_ca=" + pki.ca, "--report_deadline=30s"};
    argv.insert(argv.end(), actuator_flags.begin(), actuator_flags.end());
    absl::StatusOr<Process> p = Process::Start(argv, c.run_dir + "/sdcd.log", {},
                                               /*detached=*/c.keep_coordinator);
    if (!p.ok()) return p.status();
    sdcd = *std::move(p);
    absl::StatusOr<std::string> line = sdcd.WaitForLog("serving trainers on .*");
    if (!line.ok()) return line.status();
    trainer_port = PortAfter(*line, "(port ");
    admin_port = PortAfter(line->substr(line->find("admin on")), "(port ");
    metrics_port = PortAfter(*line, "metrics on port ");
    return absl::OkStatus();
  };
  std::unique_ptr<Admin> admin;
  bool sdcd_started = false;
  auto start_first = [&]() -> absl::Status {
    if (absl::Status s = start_sdcd(); !s.ok()) return s;
    sdcd_started = true;
    result.admin_address = absl::StrCat("127.0.0.1:", admin_port);
    admin = std::make_unique<Admin>(result.admin_address, result.token_file);
    return absl::OkStatus();
  };
  if (with_sdcd && c.start_coordinator_after < 0) {
    if (absl::Status s = start_first(); !s.ok()) return s;
  } else if (with_sdcd) {
    // The trainers dial this port from their start; sdcd comes later.
    trainer_port = FreePort();
    if (trainer_port == 0) return absl::InternalError("no free loopback port for sdcd");
  }
  // One proxy per node in front of sdcd, as the name its trainers dial.
  std::vector<std::unique_ptr<TcpProxy>> proxies;
  if (with_sdcd && c.proxies) {
    for (int n = 0; n < c.nodes; ++n) {
      absl::StatusOr<std::unique_ptr<TcpProxy>> p = TcpProxy::Start(trainer_port);
      if (!p.ok()) return p.status();
      proxies.push_back(*std::move(p));
    }
  }
  std::vector<ClusterConfig::CoordinatorEvent> events = c.coordinator_events;
  if (c.restart_coordinator_at >= 0) {
    ClusterConfig::CoordinatorEvent kill;
    kill.after_step = c.restart_coordinator_at;
    events.push_back(kill);
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.after_step < b.after_step; });
  for (const auto& e : events) {
    using What = ClusterConfig::CoordinatorEvent::What;
    if ((e.what == What::kMove || e.what == What::kCutNode || e.what == What::kRestoreNode) &&
        !c.proxies) {
      return absl::InvalidArgumentError("moving sdcd or cutting a node off needs proxies");
    }
    if (e.node < 0 || e.node >= c.nodes) {
      return absl::InvalidArgumentError(absl::StrCat("no node ", e.node, " to cut off"));
    }
  }

  // The trainers. Attempt 0 runs on nodes NodeName(0..nodes-1); a
  // restarted attempt (replace_and_resume) on the same nodes with the
  // replaced one's name changed to `node_names`'. Each attempt has its own
  // rendezvous, progress files and logs.
  std::vector<std::string> node_names;
  for (int n = 0; n < c.nodes; ++n) node_names.push_back(NodeName(n));
  std::vector<Process> trainers;
  std::vector<std::unique_ptr<Tail>> tails;
  auto start_trainers = [&](int attempt, int resume_step) -> absl::Status {
    const std::string suffix = attempt == 0 ? "" : absl::StrCat(".attempt", attempt);
    const std::string store = c.run_dir + "/rendezvous" + suffix;
    unlink(store.c_str());
    trainers.clear();
    tails.clear();
    const std::string incarnation = std::to_string(absl::ToUnixMillis(absl::Now()));
    const bool python_resume = attempt > 0 && c.trainer == "python";
    for (int r = 0; r < world; ++r) {
      const std::string progress = absl::StrCat(c.run_dir, "/progress-", r, suffix, ".jsonl");
      unlink(progress.c_str());
      const std::string node = node_names[r / c.gpus_per_node];
      std::map<std::string, std::string> env = {
          {"SDC_JOB_ID", c.job_id},
          {"SDC_NODE_NAME", node},
          {"LOCAL_RANK", std::to_string(r % c.gpus_per_node)},
          {"SDC_AUDIT_EVERY", std::to_string(c.audit_every)},
          {"SDC_WEIGHT_CHECK_EVERY", std::to_string(c.weight_check_every)},
          {"SDC_INCARNATION", incarnation},
          {"SDC_VERDICT_WAIT_MS", "3000"}};
      if (attempt > 0) {
        env["SDC_ATTEMPT"] = std::to_string(attempt);
        env["SDC_RESUME_STEP"] = std::to_string(resume_step);
      }
      if (with_sdcd) {
        env["SDC_COORDINATOR"] = absl::StrCat(
            "127.0.0.1:", proxies.empty() ? trainer_port : proxies[r / c.gpus_per_node]->port());
        env["SDC_TLS_CA"] = pki.ca;
        env["SDC_TLS_CERT"] = pki.NodeCert(node);
        env["SDC_TLS_KEY"] = pki.NodeKey(node);
      }
      for (const auto& [name, value] : c.trainer_env) env[name] = value;
      const int group = c.replica_groups > 1 ? r % c.replica_groups : 0;
      if (c.replica_groups > 1) env["SDC_REPLICA_GROUP"] = std::to_string(group);
      // Port 1 on loopback: nothing listens, every connection is refused.
      if (c.coordinator_unreachable) env["SDC_COORDINATOR"] = "127.0.0.1:1";
      // The fault belongs to the faulty GPU: a restarted attempt runs on a
      // fresh node and injects nothing.
      if (!c.fault.empty() && attempt == 0) {
        env["SDC_INJECT_FAULT"] = c.fault;
        env["SDC_ALLOW_FAULT_INJECTION"] = "yes-i-am-testing";
      }
      if (!python_path.empty()) env["PYTHONPATH"] = python_path;
      std::vector<std::string> argv = trainer_command;
      argv.insert(argv.end(), {absl::StrCat("--rank=", r),
                               absl::StrCat("--world_size=", world),
                               "--rendezvous=" + store,
                               absl::StrCat("--steps=", python_resume ? c.steps
                                                                      : c.steps - resume_step),
                               "--model=" + c.model,
                               absl::StrCat("--batch=", c.batch),
                               absl::StrCat("--micro_batches=", c.micro_batches),
                               absl::StrCat("--checkpoint_every=", c.checkpoint_every),
                               "--checkpoint_dir=" + c.run_dir,
                               "--progress=" + progress});
      if (python_resume) {
        // examples/ddp_train.py finds the newest final checkpoint itself
        // (sdc_guard's latest_final_step) and trains on to --steps.
        argv.push_back("--resume");
      } else if (resume_step > 0) {
        argv.push_back(absl::StrCat("--first_step=", resume_step + 1));
        argv.push_back(absl::StrCat("--resume_from=", c.run_dir, "/step-", resume_step, ".pt"));
      }
      if (c.replica_groups > 1) argv.push_back(absl::StrCat("--seed=", 1234 + group));
      if (c.layout != "ddp") {
        // HSDP's replicate dim over the nodes: rank r = node x GPUs + local
        // rank holds shard r % GPUs, one replica of it per node (tp: tp rank
        // r % GPUs of dp replica r / GPUs, a tp group per node).
        argv.push_back("--layout=" + c.layout);
        argv.push_back(absl::StrCat("--replicas=", c.nodes));
      }
      if (c.collective_timeout > absl::ZeroDuration()) {
        const int64_t s = absl::ToInt64Seconds(c.collective_timeout);
        argv.push_back(c.trainer == "cpp" ? absl::StrCat("--collective_timeout_s=", s)
                                          : absl::StrCat("--pg_timeout_s=", s));
      }
      if (c.unguarded) argv.push_back("--unguarded");
      if (c.every_step && !c.unguarded) {
        if (c.trainer == "cpp") {
          argv.push_back("--every_step");
        } else {
          env["SDC_EVERY_STEP"] = "1";
        }
      }
      if (c.unguarded && c.extra_collective) argv.push_back("--extra_collective");
      if (c.count_collectives) argv.push_back("--count_collectives");
      if (!c.turn_file.empty()) {
        argv.push_back("--turn_file=" + c.turn_file);
        argv.push_back("--turn_name=" + c.turn_name);
        argv.push_back("--turn_next=" + c.turn_next);
        argv.push_back(absl::StrCat("--turn_steps=", c.turn_steps));
      }
      absl::StatusOr<Process> p =
          Process::Start(argv, absl::StrCat(c.run_dir, "/trainer-", r, suffix, ".log"), env);
      if (!p.ok()) return p.status();
      trainers.push_back(*std::move(p));
      tails.push_back(std::make_unique<Tail>(progress));
    }
    return absl::OkStatus();
  };
  if (c.replace_and_resume &&
      (!with_sdcd || (c.trainer != "cpp" && c.trainer != "python") ||
       c.start_coordinator_after >= 0 || c.proxies)) {
    return absl::InvalidArgumentError(
        "replace_and_resume needs sdcd from the start, no proxies, and the cpp or python trainer");
  }
  // The operator's own credential (replace_and_resume), as `sdcctl operator
  // add` gives one: the approval is recorded under its name.
  auto sdcctl = [&](std::vector<std::string> args, const std::string& token_file) {
    std::vector<std::string> argv = {BinaryPath("ctl/sdcctl"), "--server=" + result.admin_address,
                                     "--token_file=" + token_file};
    argv.insert(argv.end(), args.begin(), args.end());
    return Run(argv, {}, absl::Seconds(30));
  };
  const std::string operator_token = c.run_dir + "/operator.token";
  if (c.replace_and_resume) {
    result.resume.operator_name = "demo-operator";
    const RunResult added =
        sdcctl({"operator", "add", result.resume.operator_name, "-o", "json"}, result.token_file);
    const nlohmann::json j = nlohmann::json::parse(added.output, nullptr, /*allow_exceptions=*/false);
    if (added.exit_code != 0 || !j.is_object() || !j.contains("token") || !j["token"].is_string()) {
      return absl::InternalError(absl::StrCat("sdcctl operator add failed (exit ",
                                              added.exit_code, "): ", added.output));
    }
    std::ofstream(operator_token) << j["token"].get<std::string>() << "\n";
    chmod(operator_token.c_str(), 0600);
  }
  if (absl::Status s = start_trainers(0, 0); !s.ok()) return s;
  enum class Phase { kOff, kAwaitRequest, kAwaitDone, kResumed };
  Phase phase = c.replace_and_resume ? Phase::kAwaitRequest : Phase::kOff;
  std::vector<std::vector<StepRecord>>* records = &result.ranks;
  result.resume.ranks.resize(world);
  result.ranks.resize(world);
  result.weight_digests.resize(world);
  result.guard_summaries.resize(world);
  std::vector<bool> finished(world, false);
  LiveStatus live;
  live.total_steps = c.steps;
  std::map<int, double> slowest;
  size_t next_event = 0;
  absl::Time last_admin = absl::InfinitePast();
  while (true) {
    bool all_done = true;
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<std::vector<ProgressLine>> lines = tails[r]->NewLines();
      if (!lines.ok()) return lines.status();
      for (ProgressLine& line : *lines) {
        if (const auto* final = std::get_if<FinalRecord>(&line)) {
          finished[r] = true;
          result.weight_digests[r] = final->weights_digest;
          result.guard_summaries[r] = final->guard;
          continue;
        }
        StepRecord rec = std::get<StepRecord>(std::move(line));
        slowest[rec.step] = std::max(slowest[rec.step], rec.ms);
        if (r == 0) {
          live.audits += rec.audited ? 1 : 0;
          live.audits_failed += rec.audited && rec.outcome != "pass" ? 1 : 0;
          live.weight_checks += c.weight_check_every > 0 && rec.step % c.weight_check_every == 0 ? 1 : 0;
          live.skipped += rec.apply ? 0 : 1;
          live.checkpoints_allowed += rec.checkpoint == "allowed" ? 1 : 0;
          live.checkpoints_vetoed += rec.checkpoint == "vetoed" ? 1 : 0;
          if (!rec.apply) live.last_event = absl::StrCat("step ", rec.step, " skipped: ", rec.reason);
        }
        (*records)[r].push_back(std::move(rec));
      }
      if (!finished[r]) {
        if (!trainers[r].running()) {
          return absl::InternalError(absl::StrCat("trainer rank ", r, " exited early; its log:\n",
                                                  trainers[r].Log().substr(0, 4000)));
        }
        all_done = false;
      }
    }
    int done_step = c.steps;
    for (int r = 0; r < world; ++r) {
      done_step = std::min(done_step, (*records)[r].empty() ? 0 : (*records)[r].back().step);
    }
    live.step = done_step;
    live.elapsed = absl::Now() - start;
    live.steps_per_s = done_step / std::max(1e-3, absl::ToDoubleSeconds(live.elapsed));
    double loss = 0;
    int n = 0;
    for (int r = 0; r < world; ++r) {
      for (auto it = (*records)[r].rbegin(); it != (*records)[r].rend(); ++it) {
        if (it->step == done_step) {
          loss += it->loss;
          ++n;
          break;
        }
      }
    }
    if (n > 0) live.loss = loss / n;
    // The coordinator-late scenario: sdcd starts once the job is under way.
    if (with_sdcd && !sdcd_started && (done_step >= c.start_coordinator_after || all_done)) {
      if (absl::Status s = start_first(); !s.ok()) return s;
      for (auto& p : proxies) p->Retarget(trainer_port);
      live.last_event = absl::StrCat("sdcd started after step ", done_step);
    }
    live.coordinator_up = sdcd_started;
    // Faults of the coordinator and the network (the coordinator-restart
    // scenario: a crash, then the same database).
    while (sdcd_started && next_event < events.size() &&
           done_step >= events[next_event].after_step) {
      using What = ClusterConfig::CoordinatorEvent::What;
      const ClusterConfig::CoordinatorEvent& e = events[next_event++];
      if (e.what == What::kCutNode || e.what == What::kRestoreNode) {
        const bool cut = e.what == What::kCutNode;
        if (cut) {
          proxies[e.node]->Cut();
        } else {
          proxies[e.node]->Restore();
        }
        live.last_event = absl::StrCat(NodeName(e.node),
                                       cut ? " cut off from sdcd" : " reaches sdcd again",
                                       " after step ", done_step);
        continue;
      }
      sdcd.Kill();
      result.sdcd_cpu_seconds += sdcd.cpu_seconds();
      live.coordinator_up = false;
      live.last_event = absl::StrCat("sdcd killed (kill -9) after step ", done_step);
      if (c.on_tick) c.on_tick(live);
      absl::SleepFor(e.pause);
      if (e.what == What::kMove) trainer_port = 0;  // A new port, the same database.
      if (absl::Status s = start_sdcd(); !s.ok()) return s;
      for (auto& p : proxies) p->Retarget(trainer_port);
      ++result.coordinator_restarts;
      live.coordinator_up = true;
      live.last_event = absl::StrCat("sdcd restarted on its database",
                                     e.what == What::kMove ? " on a new port" : "",
                                     " after step ", done_step);
    }
    // The live counts are for a display: without one (the overhead
    // benchmark) sdcd is not asked, so the harness adds no load to what it
    // measures. The final lists are fetched below either way.
    if (admin != nullptr && c.on_tick && absl::Now() - last_admin > absl::Seconds(1)) {
      last_admin = absl::Now();
      v1::ListIncidentsResponse inc;
      if (admin->Query(&v1::AdminService::Stub::ListIncidents, v1::ListIncidentsRequest(), &inc)) {
        if (inc.incidents_size() > live.incidents && inc.incidents_size() > 0) {
          const v1::Incident& last = inc.incidents(inc.incidents_size() - 1);
          live.last_event = absl::StrCat("incident ", last.id(), " at step ", last.step(), ": ",
                                         last.explanation().substr(0, 120));
        }
        live.incidents = inc.incidents_size();
      }
      v1::ListSuspectsResponse sus;
      if (admin->Query(&v1::AdminService::Stub::ListSuspects, v1::ListSuspectsRequest(), &sus)) {
        live.suspects = sus.suspects_size();
      }
      v1::ListRequestsResponse req;
      if (admin->Query(&v1::AdminService::Stub::ListRequests, v1::ListRequestsRequest(), &req)) {
        live.requests = req.requests_size();
      }
    }
    // The whole loop: approve, replace, restart, resume.
    ClusterResult::Resume& rs = result.resume;
    if (phase == Phase::kAwaitRequest) {
      v1::ListRequestsResponse req;
      if (admin->Query(&v1::AdminService::Stub::ListRequests, v1::ListRequestsRequest(), &req)) {
        for (const v1::ReplacementRequest& q : req.requests()) {
          if (q.state() != v1::PENDING) continue;
          const RunResult approved = sdcctl(
              {"approve", absl::StrCat(q.id()),
               absl::StrCat("--reason=sdc-guard demo: ", q.node_name(), " attributed faulty")},
              operator_token);
          if (approved.exit_code != 0) {
            return absl::InternalError(absl::StrCat("sdcctl approve ", q.id(), " failed (exit ",
                                                    approved.exit_code, "): ", approved.output));
          }
          rs.request_id = q.id();
          rs.replaced_node = q.node_name();
          rs.replaced_gpus.assign(q.gpu_uuids().begin(), q.gpu_uuids().end());
          rs.approved_unix_ms = absl::ToUnixMillis(absl::Now());
          live.last_event = absl::StrCat("request ", q.id(), " approved by ", rs.operator_name,
                                         " after step ", done_step);
          phase = Phase::kAwaitDone;
          break;
        }
      }
    } else if (phase == Phase::kAwaitDone) {
      v1::GetRequestRequest q;
      q.set_id(rs.request_id);
      v1::ReplacementRequest r;
      if (admin->Query(&v1::AdminService::Stub::GetRequest, q, &r) && r.state() != v1::APPROVED &&
          r.state() != v1::EXECUTING) {
        if (r.state() != v1::DONE) {
          return absl::InternalError(absl::StrCat("request ", rs.request_id, " ended ",
                                                  v1::RequestState_Name(r.state()),
                                                  " instead of DONE: ", r.actuator_result()));
        }
        rs.done_unix_ms = absl::ToUnixMillis(absl::Now());
        rs.actuator_record = std::string(absl::StripAsciiWhitespace(ReadFile(replacements)));
        if (rs.actuator_record.find(" " + rs.replaced_node + " ") == std::string::npos) {
          return absl::InternalError(absl::StrCat("the actuator did not record ", rs.replaced_node,
                                                  ": '", rs.actuator_record, "'"));
        }
        const auto old = std::find(node_names.begin(), node_names.end(), rs.replaced_node);
        if (old == node_names.end()) {
          return absl::InternalError(absl::StrCat("request ", rs.request_id, " names node ",
                                                  rs.replaced_node, ", not one of the job's"));
        }
        // The node is gone and its ranks with it; the launcher (torchrun,
        // HyperPod auto-resume) ends the rest of the job.
        const int old_node = static_cast<int>(old - node_names.begin());
        for (int r = 0; r < world; ++r) {
          if (r / c.gpus_per_node == old_node) trainers[r].Kill();
        }
        for (int r = 0; r < world; ++r) {
          if (r / c.gpus_per_node != old_node) trainers[r].Kill();
          result.cpu_seconds += trainers[r].cpu_seconds();
        }
        rs.stopped_after_step = done_step;
        ClusterResult snapshot;
        ListCheckpoints(c.run_dir, &snapshot);
        rs.final_at_restart = snapshot.checkpoints_final;
        rs.provisional_at_restart = snapshot.checkpoints_provisional;
        rs.resume_step = rs.final_at_restart.empty() ? 0 : rs.final_at_restart.back();
        v1::ListIncidentsResponse inc;
        admin->Query(&v1::AdminService::Stub::ListIncidents, v1::ListIncidentsRequest(), &inc);
        rs.incidents_at_restart = inc.incidents_size();
        node_names[old_node] = NodeName(c.nodes);
        rs.replacement_node = node_names[old_node];
        for (int g = 0; g < c.gpus_per_node; ++g) {
          // The guard's GPU id for a CPU rank (client/options.h).
          rs.replacement_gpus.push_back(absl::StrCat("cpu-", rs.replacement_node, "-", g));
        }
        rs.attempt = 1;
        rs.restart_unix_ms = absl::ToUnixMillis(absl::Now());
        records = &rs.ranks;
        std::fill(finished.begin(), finished.end(), false);
        if (absl::Status s = start_trainers(rs.attempt, rs.resume_step); !s.ok()) return s;
        all_done = false;
        phase = Phase::kResumed;
        live.last_event = absl::StrCat(rs.replaced_node, " replaced by ", rs.replacement_node,
                                       "; attempt 1 resumes from step ", rs.resume_step);
      }
    }
    if (all_done && (phase == Phase::kAwaitRequest || phase == Phase::kAwaitDone)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job ended before its replacement request was ",
          phase == Phase::kAwaitRequest ? "opened" : "done", " (more --steps?)"));
    }
    if (phase == Phase::kResumed && all_done) rs.resumed = true;
    if (c.on_tick) c.on_tick(live);
    if (all_done) break;
    if (absl::Now() - start > c.timeout) {
      return absl::DeadlineExceededError(absl::StrCat("the cluster did not finish within ",
                                                      absl::FormatDuration(c.timeout)));
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  for (Process& t : trainers) {
    t.Stop(absl::Seconds(30));
    result.cpu_seconds += t.cpu_seconds();
  }
  result.wall = absl::Now() - start;
  ListCheckpoints(c.run_dir, &result);
  for (const auto& [step, ms] : slowest) result.step_ms.push_back(ms);
  // What each faulty rank says it injected.
  static const std::regex kInjected(R"re(sdc-guard rank (\d+): (INJECTED .*))re");
  for (int r = 0; r < world; ++r) {
    std::istringstream log(ReadFile(absl::StrCat(c.run_dir, "/trainer-", r, ".log")));
    std::string line;
    while (std::getline(log, line)) {
      std::smatch m;
      if (std::regex_search(line, m, kInjected)) result.injections.push_back(absl::StrCat("rank ", m[1].str(), ": ", m[2].str()));
    }
  }
  if (admin != nullptr) {
    // Tie-break results and the last verdicts land after the trainers
    // finish: wait until the incident list holds still for a second.
    v1::ListIncidentsResponse inc;
    int stable = -1;
    for (int i = 0; i < 40; ++i) {
      admin->Query(&v1::AdminService::Stub::ListIncidents, v1::ListIncidentsRequest(), &inc);
      if (inc.incidents_size() == stable && i >= 4) break;
      stable = inc.incidents_size();
      absl::SleepFor(absl::Milliseconds(250));
    }
    result.incidents.assign(inc.incidents().begin(), inc.incidents().end());
    v1::ListRequestsResponse req;
    admin->Query(&v1::AdminService::Stub::ListRequests, v1::ListRequestsRequest(), &req);
    for (const auto& r : req.requests()) {
      v1::GetRequestRequest q;
      q.set_id(r.id());
      v1::ReplacementRequest full;
      result.requests.push_back(admin->Query(&v1::AdminService::Stub::GetRequest, q, &full) ? full : r);
    }
    v1::ListSuspectsResponse sus;
    admin->Query(&v1::AdminService::Stub::ListSuspects, v1::ListSuspectsRequest(), &sus);
    result.suspects.assign(sus.suspects().begin(), sus.suspects().end());
    if (c.keep_coordinator) {
      result.sdcd_pid = sdcd.pid();
      sdcd.Release();
    } else {
      sdcd.Stop();
      result.sdcd_cpu_seconds += sdcd.cpu_seconds();
    }
  }
  result.cpu_seconds += result.sdcd_cpu_seconds;
  return result;
}

}  // namespace sdc::demo
