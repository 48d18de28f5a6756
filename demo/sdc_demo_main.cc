// sdc-demo: the main job. Starts sdcd and a local training cluster (CPU
// ranks over Gloo, 3 nodes x 2 GPUs by default) in a run folder, injects a
// scenario's fault, shows live progress, then prints a summary and writes a
// self-contained HTML report. Run through `./sdc demo`.

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "demo/flags.h"
#include "demo/launcher.h"
#include "demo/report.h"
#include "demo/scenarios.h"

namespace sdc::demo {
namespace {

struct Flags {
  std::string scenario = kDefaultScenario;
  int steps = 150;
  int nodes = 3;
  int gpus_per_node = 2;
  int audit_every = 5;
  int weight_check_every = 5;
  int checkpoint_every = 25;
  int fault_rank = -1;
  int fault_step = -1;
  int restart_at = -1;
  std::string run_dir;
  std::string sdcctl = "./sdc ctl";
  bool keep_coordinator = true;
  bool quiet = false;
  std::string model = "transformer";
  std::string trainer = "cpp";
  std::string facts;  // Where to write the run's facts as JSON (tests).
};

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr, "sdc demo: %s\n", error.c_str());
  std::exit(2);
}

void PrintUsage() {
  std::printf(
      "usage: ./sdc demo [--scenario NAME|list] [--steps N] [--nodes N] [--gpus-per-node N]\n"
      "                  [--audit-every N] [--weight-check-every N] [--checkpoint-every N]\n"
      "                  [--fault-rank R] [--fault-step S] [--run-dir DIR] [--quiet]\n"
      "                  [--no-keep-coordinator] [--trainer cpp|python] [--facts FILE]\n"
      "Defaults: --scenario %s --steps 150 --nodes 3 --gpus-per-node 2 --audit-every 5\n"
      "          --weight-check-every 5 --checkpoint-every 25, run folder runs/<time>/,\n"
      "          --trainer cpp (python: PyTorch DDP ranks with the sdc_guard package)\n",
      kDefaultScenario);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (FlagReader flag(argc, argv, Usage); flag.Next();) {
    const std::string& arg = flag.name();
    if (arg == "--help" || arg == "-h") {
      PrintUsage();
      std::exit(0);
    } else if (arg == "--scenario") {
      f.scenario = flag.Value();
    } else if (arg == "--steps") {
      f.steps = flag.Number(1);
    } else if (arg == "--nodes") {
      f.nodes = flag.Number(1);
    } else if (arg == "--gpus-per-node") {
      f.gpus_per_node = flag.Number(1);
    } else if (arg == "--audit-every") {
      f.audit_every = flag.Number(0);
    } else if (arg == "--weight-check-every") {
      f.weight_check_every = flag.Number(0);
    } else if (arg == "--checkpoint-every") {
      f.checkpoint_every = flag.Number(0);
    } else if (arg == "--fault-rank") {
      f.fault_rank = flag.Number(0);
    } else if (arg == "--fault-step") {
      f.fault_step = flag.Number(1);
    } else if (arg == "--restart-at") {
      f.restart_at = flag.Number(1);
    } else if (arg == "--run-dir") {
      f.run_dir = flag.Value();
    } else if (arg == "--sdcctl") {
      f.sdcctl = flag.Value();
    } else if (arg == "--model") {
      f.model = flag.Value();
    } else if (arg == "--facts") {
      f.facts = flag.Value();
    } else if (arg == "--trainer") {
      f.trainer = flag.Value();
      if (f.trainer != "cpp" && f.trainer != "python") Usage("--trainer: cpp or python");
    } else if (arg == "--quiet") {
      f.quiet = true;
    } else if (arg == "--no-keep-coordinator") {
      f.keep_coordinator = false;
    } else {
      flag.Unknown("see ./sdc demo --help");
    }
  }
  return f;
}

void ListScenarios() {
  std::printf("scenarios (./sdc demo --scenario NAME):\n");
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
  Flags f = Parse(argc, argv);
  if (f.scenario == "list") {
    ListScenarios();
    return 0;
  }
  std::optional<Scenario> scenario = FindScenario(f.scenario);
  if (!scenario.has_value()) {
    Usage(absl::StrCat("unknown scenario '", f.scenario, "' (./sdc demo --scenario list)"));
  }
  if (scenario->nodes > 0) f.nodes = scenario->nodes;
  const int world = f.nodes * f.gpus_per_node;
  if (world < 2) Usage("--nodes x --gpus-per-node must be at least 2 ranks");
  if (f.fault_rank < 0) f.fault_rank = std::min(world - 1, f.gpus_per_node + 1);
  if (f.fault_rank >= world) Usage(absl::StrCat("--fault-rank ", f.fault_rank, " is not below ", world, " ranks"));
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
    Usage(absl::StrCat("--run-dir: cannot create ", f.run_dir, ": ", strerror(errno)));
  }
  if (access(f.run_dir.c_str(), W_OK) != 0) Usage(absl::StrCat("--run-dir: ", f.run_dir, " is not writable"));

  ClusterConfig c;
  c.run_dir = f.run_dir;
  c.nodes = f.nodes;
  c.gpus_per_node = f.gpus_per_node;
  c.steps = f.steps;
  c.audit_every = f.audit_every;
  c.weight_check_every = f.weight_check_every;
  c.checkpoint_every = f.checkpoint_every;
  c.model = scenario->model.empty() ? f.model : scenario->model;
  if (scenario->micro_batches > 0) c.micro_batches = scenario->micro_batches;
  c.trainer = f.trainer;
  c.fault = absl::StrReplaceAll(scenario->fault, {{"{rank}", absl::StrCat(f.fault_rank)},
                                                  {"{step}", absl::StrCat(f.fault_step)}});
  c.restart_coordinator_at = scenario->restart_coordinator ? f.restart_at : -1;
  c.job_id = absl::StrCat("demo-", scenario->name);
  c.keep_coordinator = f.keep_coordinator;
  std::printf("sdc-guard demo: %s\n  %s\n  %d nodes x %d GPUs (%s trainers), %d steps; run folder %s\n",
              scenario->name.c_str(), scenario->description.c_str(), f.nodes, f.gpus_per_node,
              f.trainer == "python" ? "Python DDP" : "C++", f.steps, f.run_dir.c_str());
  if (!c.fault.empty()) std::printf("  fault: %s\n", c.fault.c_str());
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
