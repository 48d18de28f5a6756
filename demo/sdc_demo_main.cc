// sdc-demo: the main job. Starts sdcd and a local training cluster (CPU
// ranks over Gloo, 3 nodes x 2 GPUs by default) in a run folder, injects a
// scenario's fault, shows live progress, then prints a summary and writes a
// self-contained HTML report. Run through `./sdc demo`.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "demo/launcher.h"
#include "demo/report.h"
#include "demo/scenarios.h"

ABSL_FLAG(std::string, scenario, sdc::demo::kDefaultScenario,
          "The fault to inject; --scenario=list names every scenario.");
ABSL_FLAG(int, steps, 150, "Training steps.");
ABSL_FLAG(int, nodes, 3, "Nodes in the local cluster (a scenario may set its own).");
ABSL_FLAG(int, gpus_per_node, 2, "Ranks (\"GPUs\") per node.");
ABSL_FLAG(int, audit_every, 5, "A replay audit every N steps (0: none).");
ABSL_FLAG(int, weight_check_every, 5, "A weight check every N steps (0: none).");
ABSL_FLAG(int, checkpoint_every, 25, "Ask for a checkpoint every N steps (0: never).");
ABSL_FLAG(int, fault_rank, -1,
          "The rank the fault is injected on (-1: rank gpus_per_node + 1, node-b's second "
          "GPU, or the last rank of a smaller cluster).");
ABSL_FLAG(int, fault_step, -1,
          "The step the fault is injected at (-1: an audit step about 40% into the run, 60% "
          "in the coordinator-restart scenario).");
ABSL_FLAG(int, restart_at, -1,
          "coordinator-restart scenario: kill -9 sdcd once every rank passed this step (-1: "
          "a third of --steps).");
ABSL_FLAG(std::string, run_dir, "", "The run folder, new or empty (default: runs/<time>/).");
ABSL_FLAG(std::string, sdcctl, "./sdc ctl", "How the summary spells the sdcctl command.");
ABSL_FLAG(bool, keep_coordinator, true,
          "Leave sdcd running after the run, for sdcctl (--nokeep_coordinator: stop it).");
ABSL_FLAG(bool, quiet, false, "No live progress: only the summary.");
ABSL_FLAG(std::string, model, "transformer",
          "The model: transformer, bn-mlp, center-mlp, put-mlp or frozen-mlp (a scenario may "
          "set its own).");
ABSL_FLAG(std::string, trainer, "cpp",
          "cpp: the C++ trainer (sdc::Guard); python: PyTorch DDP ranks with the sdc_guard "
          "package (./sdc builds it); hf, lightning, accelerate: the same ranks trained by "
          "transformers.Trainer, Lightning or Accelerate through sdc_guard.integrations.");
ABSL_FLAG(bool, every_step, false,
          "Every-step checksums of each matrix product in the ranks' forward and backward "
          "(SDC_EVERY_STEP=1 in every trainer: Guard(every_step=True) in Python, "
          "GuardOptions::every_step in the C++ trainer).");
ABSL_FLAG(std::string, layout, "ddp",
          "How the model is laid over the ranks: ddp (full replicas), fsdp (FSDP2 on a 1-D "
          "mesh: a shard per rank), hsdp (FSDP2 on a nodes x GPUs replicate x shard mesh), "
          "zero (DDP and a ZeroRedundancyOptimizer) or tp (tensor parallel over each node's "
          "GPUs, replicated over the nodes: dp nodes x tp GPUs). fsdp, hsdp, zero and tp train "
          "the Python trainer (examples/layouts.py).");
ABSL_FLAG(std::string, facts, "",
          "Also write what the run showed as one JSON object to this file (tests, scripts).");

namespace sdc::demo {
namespace {

// How the header names the --trainer's ranks.
std::string TrainerName(const std::string& trainer) {
  if (trainer == "python") return "Python";
  if (trainer == "hf") return "transformers.Trainer";
  if (trainer == "lightning") return "Lightning";
  if (trainer == "accelerate") return "Accelerate";
  return "C++";
}

// The flags, read once (flags stay near main).
struct Config {
  std::string scenario;
  int steps = 0;
  int nodes = 0;
  int gpus_per_node = 0;
  int audit_every = 0;
  int weight_check_every = 0;
  int checkpoint_every = 0;
  int fault_rank = -1;  // -1: chosen from the cluster's shape.
  int fault_step = -1;  // -1: chosen from --steps and --audit_every.
  int restart_at = -1;  // -1: a third of --steps.
  std::string run_dir;
  std::string sdcctl;
  bool keep_coordinator = true;
  bool quiet = false;
  std::string model;
  std::string trainer;
  std::string facts;  // Where to write the run's facts as JSON (tests).
  bool every_step = false;
  std::string layout;
};

Config ConfigFromFlags() {
  Config c;
  c.scenario = absl::GetFlag(FLAGS_scenario);
  c.steps = absl::GetFlag(FLAGS_steps);
  c.nodes = absl::GetFlag(FLAGS_nodes);
  c.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  c.audit_every = absl::GetFlag(FLAGS_audit_every);
  c.weight_check_every = absl::GetFlag(FLAGS_weight_check_every);
  c.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  c.fault_rank = absl::GetFlag(FLAGS_fault_rank);
  c.fault_step = absl::GetFlag(FLAGS_fault_step);
  c.restart_at = absl::GetFlag(FLAGS_restart_at);
  c.run_dir = absl::GetFlag(FLAGS_run_dir);
  c.sdcctl = absl::GetFlag(FLAGS_sdcctl);
  c.keep_coordinator = absl::GetFlag(FLAGS_keep_coordinator);
  c.quiet = absl::GetFlag(FLAGS_quiet);
  c.model = absl::GetFlag(FLAGS_model);
  c.trainer = absl::GetFlag(FLAGS_trainer);
  c.facts = absl::GetFlag(FLAGS_facts);
  c.every_step = absl::GetFlag(FLAGS_every_step);
  c.layout = absl::GetFlag(FLAGS_layout);
  return c;
}

// The flags' own limits; what depends on the scenario is checked in Main.
absl::Status Validate(const Config& c) {
  const struct {
    const char* flag;
    int value;
    int min;
  } kMinimums[] = {
      {"steps", c.steps, 1},
      {"nodes", c.nodes, 1},
      {"gpus_per_node", c.gpus_per_node, 1},
      {"audit_every", c.audit_every, 0},
      {"weight_check_every", c.weight_check_every, 0},
      {"checkpoint_every", c.checkpoint_every, 0},
  };
  for (const auto& m : kMinimums) {
    if (m.value < m.min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", m.flag, " must be at least ", m.min, ", got ", m.value));
    }
  }
  const struct {
    const char* flag;
    int value;
    int min;
  } kChosenByDefault[] = {
      {"fault_rank", c.fault_rank, 0},
      {"fault_step", c.fault_step, 1},
      {"restart_at", c.restart_at, 1},
  };
  for (const auto& m : kChosenByDefault) {
    if (m.value != -1 && m.value < m.min) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", m.flag, " must be at least ", m.min, " (or -1: chosen for you), got ", m.value));
    }
  }
  if (c.trainer != "cpp" && c.trainer != "python" && c.trainer != "hf" &&
      c.trainer != "lightning" && c.trainer != "accelerate") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--trainer must be cpp, python, hf, lightning or accelerate, got '", c.trainer, "'"));
  }
  if (!KnownLayout(c.layout)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layout must be ddp, fsdp, hsdp, zero or tp, got '", c.layout, "'"));
  }
  if (c.layout != "ddp" && c.trainer != "cpp" && c.trainer != "python") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layout=", c.layout, ": the Python trainer's (--trainer=python), not ", c.trainer));
  }
  return absl::OkStatus();
}

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr, "sdc demo: %s\n", error.c_str());
  std::exit(2);
}

// Abseil's --help lists the flags of the program's main file, found by the
// binary's name; sdc-demo's are in sdc_demo_main.cc.
void SetUpFlags() {
  absl::SetProgramUsageMessage(absl::StrFormat(
      "the sdc-guard demo: sdcd and a local training cluster (CPU ranks over Gloo) with an "
      "injected fault, live progress, a summary and an HTML report.\n"
      "  ./sdc demo [--scenario=NAME|list] [--trainer=cpp|python|hf|lightning|accelerate]\n"
      "             [--layout=ddp|fsdp|hsdp|zero|tp]"
      "             [--steps=N] [--nodes=N]"
      "             [--gpus_per_node=N] [--audit_every=N] [--weight_check_every=N]\n"
      "             [--checkpoint_every=N] [--fault_rank=R] [--fault_step=S] [--run_dir=DIR]\n"
      "             [--quiet] [--nokeep_coordinator] [--facts=FILE]\n"
      "Default scenario: %s; run folder runs/<time>/.",
      kDefaultScenario));
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "demo/sdc_demo_main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
}

void ListScenarios() {
  std::printf("scenarios (./sdc demo --scenario=NAME):\n");
  for (const Scenario& s : Scenarios()) {
    std::printf("  %-20s %s%s\n", s.name.c_str(), s.description.c_str(),
                s.name == kDefaultScenario ? " [default]" : "");
  }
}

// One screen of live progress, redrawn in place on a terminal.
class Display {
 public:
  Display(bool tty, bool quiet, const Scenario& s) : tty_(tty), quiet_(quiet), scenario_(s) {}
  void Show(const LiveStatus& l) {
    if (quiet_) return;
    const std::string lines[] = {
        absl::StrFormat("scenario %-18s step %4d/%-4d  loss %7.4f  %5.2f steps/s  %s elapsed",
                        scenario_.name, l.step, l.total_steps, l.loss, l.steps_per_s,
                        absl::FormatDuration(absl::Trunc(l.elapsed, absl::Seconds(1)))),
        absl::StrFormat("checks: %d audits (%d failed), %d weight checks | skipped steps %d | "
                        "checkpoints %d written, %d vetoed",
                        l.audits, l.audits_failed, l.weight_checks, l.skipped,
                        l.checkpoints_allowed, l.checkpoints_vetoed),
        absl::StrFormat("sdcd %s | incidents %d | suspects %d | replacement requests %d",
                        l.coordinator_up ? "up" : "DOWN", l.incidents, l.suspects, l.requests),
        absl::StrCat("last event: ", l.last_event.empty() ? "-" : l.last_event.substr(0, 110)),
    };
    if (tty_) {
      if (drawn_) std::printf("\x1b[4F");
      for (const std::string& line : lines) std::printf("\x1b[2K%s\n", line.c_str());
      drawn_ = true;
    } else if (l.step >= next_line_ || l.step == l.total_steps) {
      std::printf("%s | %s\n", lines[0].c_str(), lines[1].c_str());
      next_line_ = l.step + 25;
    }
    std::fflush(stdout);
  }

 private:
  bool tty_;
  bool quiet_;
  Scenario scenario_;
  bool drawn_ = false;
  int next_line_ = 0;
};

int Main(int argc, char** argv) {
  SetUpFlags();
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    Usage(absl::StrCat("unexpected argument '", rest[1], "' (flags are --name=VALUE; see --help)"));
  }
  Config f = ConfigFromFlags();
  if (absl::Status s = Validate(f); !s.ok()) Usage(std::string(s.message()));
  if (f.scenario == "list") {
    ListScenarios();
    return 0;
  }
  std::optional<Scenario> scenario = FindScenario(f.scenario);
  if (!scenario.has_value()) {
    Usage(absl::StrCat("unknown scenario '", f.scenario, "' (./sdc demo --scenario=list)"));
  }
  if (f.layout != "ddp" && f.trainer == "cpp") f.trainer = "python";  // Sharding: torch's.
  if (absl::StatusOr<Scenario> s = ScenarioOnLayout(f.layout, *scenario); s.ok()) {
    scenario = *std::move(s);
  } else {
    Usage(std::string(s.status().message()));
  }
  if (scenario->nodes > 0) f.nodes = scenario->nodes;
  if (scenario->gpus_per_node > 0) f.gpus_per_node = scenario->gpus_per_node;
  const int world = f.nodes * f.gpus_per_node;
  if (world < 2) Usage("--nodes x --gpus_per_node must be at least 2 ranks");
  if (f.fault_rank < 0) f.fault_rank = std::min(world - 1, f.gpus_per_node + 1);
  if (f.fault_rank >= world) Usage(absl::StrCat("--fault_rank ", f.fault_rank, " is not below ", world, " ranks"));
  const int audit = std::max(1, f.audit_every);
  if (f.fault_step < 0) {
    // An audit step about 40% into the run (60% after a coordinator restart).
    const double at = scenario->restart_coordinator ? 0.6 : 0.4;
    f.fault_step = std::max(audit, static_cast<int>(f.steps * at) / audit * audit);
    if (f.fault_step > f.steps) f.fault_step = f.steps;
  }
  if (scenario->restart_coordinator && f.restart_at < 0) f.restart_at = f.steps / 3;
  if (f.run_dir.empty()) {
    f.run_dir = absl::StrCat("runs/", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()));
    mkdir("runs", 0755);
  }
  if (mkdir(f.run_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    Usage(absl::StrCat("--run_dir: cannot create ", f.run_dir, ": ", strerror(errno)));
  }
  if (access(f.run_dir.c_str(), W_OK) != 0) Usage(absl::StrCat("--run_dir: ", f.run_dir, " is not writable"));
  // A run folder holds one run: the summary reads every log in it, so an
  // earlier run's injections and findings would be counted with this one's.
  if (std::error_code ec; !std::filesystem::is_empty(f.run_dir, ec) && !ec) {
    Usage(absl::StrCat("--run_dir: ", f.run_dir,
                       " is not empty (it holds an earlier run, whose logs the summary would "
                       "count as this run's): name a new folder, or remove it"));
  }

  ClusterConfig c;
  c.run_dir = f.run_dir;
  if (char cwd[4096]; f.run_dir[0] != '/' && getcwd(cwd, sizeof cwd) != nullptr) {
    // Absolute for the trainers: the Python ones' file:// rendezvous URL
    // would read a relative path's first folder as a host name.
    c.run_dir = absl::StrCat(cwd, "/", f.run_dir);
  }
  c.nodes = f.nodes;
  c.gpus_per_node = f.gpus_per_node;
  c.steps = f.steps;
  c.audit_every = f.audit_every;
  c.weight_check_every = f.weight_check_every;
  c.checkpoint_every = f.checkpoint_every;
  c.model = scenario->model.empty() ? f.model : scenario->model;
  if (scenario->micro_batches > 0) c.micro_batches = scenario->micro_batches;
  c.trainer = f.trainer;
  c.layout = f.layout;
  if (f.every_step) c.trainer_env["SDC_EVERY_STEP"] = "1";  // Both front ends read it.
  std::string fault = scenario->fault;
  // The every-step checksums check matrix products: under --every_step the
  // intermittent GPU's corruption is a wrong element of a product's output
  // (a marginal multiply-add lane), not a bit flip of an elementwise
  // activation, which no product checksum sees. Fault kind product-column:
  // an error of 2^-6 times the element's column's checksum scale T_j, so
  // above the column's threshold by construction (at least 2^18 / K times
  // it for an fp32 product of K terms; fault_injection.h), and every
  // injection is one the checksums must catch.
  if (f.every_step && absl::StartsWith(fault, "mantissa-bitflip:{rank}:p=")) {
    fault = absl::StrCat("product-column", fault.substr(std::string("mantissa-bitflip").size()));
  }
  c.fault = absl::StrReplaceAll(fault, {{"{rank}", absl::StrCat(f.fault_rank)},
                                        {"{step}", absl::StrCat(f.fault_step)},
                                        {"{next}", absl::StrCat((f.fault_rank + 1) % world)}});
  c.restart_coordinator_at = scenario->restart_coordinator ? f.restart_at : -1;
  if (scenario->coordinator_late) c.start_coordinator_after = std::max(1, f.steps / 10);
  c.job_id = absl::StrCat("demo-", scenario->name);
  if (scenario->replace_and_resume) {
    if (f.trainer != "cpp" && f.trainer != "python") {
      Usage("--scenario=replace-and-resume: the cpp and python trainers resume from a "
            "checkpoint; the frameworks' trainers do not yet");
    }
    if (f.checkpoint_every < 1 || f.checkpoint_every * 2 >= f.fault_step) {
      Usage(absl::StrCat("--scenario=replace-and-resume needs two checkpoints before the fault "
                         "(a final one to resume from): --checkpoint_every at most ",
                         (f.fault_step - 1) / 2, " for --fault_step ", f.fault_step));
    }
    c.replace_and_resume = true;
  }
  c.keep_coordinator = f.keep_coordinator;
  std::printf("sdc-guard demo: %s\n  %s\n  %d nodes x %d GPUs (%s trainers%s), %d steps; run folder %s\n",
              scenario->name.c_str(), scenario->description.c_str(), f.nodes, f.gpus_per_node,
              TrainerName(f.trainer).c_str(),
              f.layout == "ddp" ? "" : absl::StrCat(", layout ", f.layout).c_str(), f.steps,
              f.run_dir.c_str());
  if (!c.fault.empty()) std::printf("  fault: %s\n", c.fault.c_str());
  if (c.start_coordinator_after >= 0) {
    std::printf("  sdcd starts once every rank passed step %d\n", c.start_coordinator_after);
  }
  std::printf("\n");
  Display display(isatty(STDOUT_FILENO) != 0, f.quiet, *scenario);
  c.on_tick = [&](const LiveStatus& l) { display.Show(l); };
  absl::StatusOr<ClusterResult> result = RunCluster(c);
  if (!result.ok()) {
    std::fprintf(stderr, "sdc demo: %s\n(logs in %s)\n", std::string(result.status().message()).c_str(),
                 f.run_dir.c_str());
    return 1;
  }
  const RunFacts facts = Analyze(*result, *scenario, c, f.fault_rank);
  const std::string ctl = absl::StrCat(f.sdcctl, " --server=", result->admin_address,
                                       " --token_file=", result->token_file);
  std::printf("%s", SummaryText(facts, *result, c, f.keep_coordinator ? ctl : "").c_str());
  if (!f.facts.empty()) {
    std::ofstream out(f.facts);
    out << FactsJson(facts, *result) << "\n";
    if (!out) {
      std::fprintf(stderr, "sdc demo: --facts: cannot write %s\n", f.facts.c_str());
      return 1;
    }
  }
  const std::string report = f.run_dir + "/report.html";
  std::ofstream(report) << HtmlReport(facts, *result, c);
  std::printf("\nHTML report: %s\n", report.c_str());
  if (result->sdcd_pid > 0) {
    std::printf("sdcd keeps running for sdcctl (pid %d, database %s); stop it with: kill %d\n",
                result->sdcd_pid, result->db.c_str(), result->sdcd_pid);
  }
  return 0;
}

}  // namespace
}  // namespace sdc::demo

int main(int argc, char** argv) { return sdc::demo::Main(argc, argv); }
