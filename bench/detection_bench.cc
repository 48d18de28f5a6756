// ./sdc bench detection: the detection matrix. Every fault scenario of the
// demo (demo/scenarios.h) is run several times on a real local cluster (sdcd
// plus nodes x GPUs trainer processes, started by demo::RunCluster), varying
// the faulty rank and the fault step; each run is judged by demo::Analyze
// from the coordinator's incidents and the trainers' per-step records. Then
// a clean soak (bn-mlp, every step audited and weight-checked, plus a short
// transformer run) counts the checks performed and any alarm at all.
//
// Per scenario: detected (fraction of runs where a check fired on an injected
// fault), attributed_correctly (fraction of runs where the faulty rank, on its
// node, and only it, was blamed; null where the design cannot name anyone),
// mean_latency_steps (first detection step minus first injection step, over
// detected runs), false_alarms (confirmed blames of healthy ranks),
// skipped_steps and bad_checkpoints_written (totals over the runs): corrupted
// checkpoints left on disk at the end of a run, final or still provisional.
// bad_checkpoints_revoked counts the corrupted ones that were written
// provisional and revoked (deleted) by a later incident: they never became
// final, but a job that crashed in between could have resumed from one.
//
// Goals, from the issue: every fault the design can see is detected; with
// >= 3 nodes every attributable fault is blamed on the right rank and node;
// no healthy GPU is ever blamed; no corrupted checkpoint is ever written; the
// clean soak raises no alarm. A scenario that misses one is marked MISSED in
// the table and carries "goals_met": false in the JSON.
//
// Prints a table, then one JSON object on the last line of stdout. Progress
// goes to stderr as runs complete.
//
// Flags: --quick (one run per scenario, a 500-step soak), --runs=N (per
// scenario, default 3), --scenarios=A,B (only these fault scenarios; default
// all), --soak_steps=N (default 2000), --transformer_steps=N (the clean
// transformer run, default 60), --soak_run_steps=N (steps per soak run,
// default 500), --out_dir=DIR (default a temporary folder; one run folder per
// run under it), --keep (keep the run folders; they are deleted at the end
// otherwise). The smoke run in the test suite (bench/BUILD) is one scenario
// and a few dozen soak steps.
//
// --layouts=fsdp,hsdp,zero,tp (the default; none: no such rows) adds one row
// per sharded layout and fault: the selected scenarios the demo runs on
// that layout (demo::ScenarioOnLayout), --layout_runs runs each (default 1;
// the fault position shifts from layout to layout), trained by
// examples/ddp_train.py --layout. A row also counts the checkpoints vetoed,
// and a fault the design names a suspect (FSDP's at-rest check) counts as
// attributed when the faulty rank is the one suspect and nobody is blamed;
// on tp an activation fault's suspects are its tp group (a replay cannot
// tell the group's ranks apart): counted when every suspect is in the
// faulty rank's tp group and nobody is blamed, and the row says "tp group".
// JSON: "layouts":{L:{scenario:{...the scenario keys, checkpoints_vetoed,
// suspected}}}.
//
// Exits 1 when a goal is missed (after printing the table and the JSON), so
// a rule change that breaks detection or attribution fails the smoke run.
//
// --soak_only (./sdc bench soak): only a long clean soak, every step audited
// and weight-checked, in runs of 500 steps alternating the BatchNorm MLP and
// the running-mean model (center-mlp, whose forward reads the buffer it
// updates), until at least --min_audits (default 15,320) audits and
// --min_weight_checks (default 3,080) weight checks ran: AWS's published
// sample. Prints one JSON line: audits, weight_checks, false_alarms, wall_s,
// and the 95% upper bound on the false-alarm rate per audit (rule of three);
// exits 1 when the sample was not reached or anything alarmed.

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/detection_flags.h"
#include "bench/detection_rows.h"
#include "bench/json_text.h"
#include "bench/resume_tally.h"
#include "demo/launcher.h"
#include "demo/process.h"
#include "demo/report.h"
#include "demo/scenarios.h"

namespace sdc::bench {
namespace {

using demo::ClusterConfig;
using demo::ClusterResult;
using demo::RunFacts;
using demo::Scenario;

// The job every scenario runs in (the two-node scenario overrides nodes).
constexpr int kNodes = 3;
constexpr int kGpusPerNode = 2;
constexpr int kSteps = 35;
constexpr int kIntermittentSteps = 60;
constexpr int kAuditEvery = 5;
constexpr int kWeightCheckEvery = 5;
constexpr int kCheckpointEvery = 10;
// kill -9 sdcd once every rank passed this step; faults come after it.
constexpr int kRestartCoordinatorAt = 8;
// Faulty ranks in order of use: 1 is node-a, 3 node-b, 4 node-c (GPU 0);
// ranks beyond the world are skipped.
constexpr int kFaultRanks[] = {1, 3, 4, 2, 5, 0};
// Audit-aligned fault steps, in order of use.
constexpr int kFaultSteps[] = {15, 20, 25};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// One clean run.
struct CleanRun {
  std::string model;
  int steps = 0;
  int audit_every = 0;
  int weight_check_every = 0;
  std::string error;
  int audits = 0;
  int audits_failed = 0;
  int weight_checks = 0;
  int incidents = 0;
  int suspects = 0;
  int requests = 0;
  int skipped = 0;
  int checkpoints_allowed = 0;
  int checkpoints_vetoed = 0;
  bool weights_identical = false;
  absl::Duration wall;
};

class Bench {
 public:
  explicit Bench(Flags flags) : flags_(std::move(flags)) {}

  int Main() {
    const absl::Time start = absl::Now();
    if (!PrepareOutDir()) return 1;
    if (flags_.soak_only) return LongSoak(start);
    PlanRuns();
    for (const Scenario& s : demo::Scenarios()) {
      if (!Selected(s) || flags_.layouts_only) continue;
      ScenarioResult r;
      r.scenario = s;
      r.nodes = s.nodes > 0 ? s.nodes : kNodes;
      for (int i = 0; i < flags_.runs; ++i) r.runs.push_back(RunFault(s, r.nodes, i, "ddp"));
      Aggregate(r);
      scenarios_.push_back(std::move(r));
    }
    for (size_t l = 0; l < flags_.layouts.size(); ++l) {
      for (const Scenario& s : LayoutScenarios(flags_.layouts[l])) {
        ScenarioResult r;
        r.scenario = s;
        r.layout = flags_.layouts[l];
        for (int i = 0; i < flags_.layout_runs; ++i) {
          r.runs.push_back(RunFault(s, r.nodes, i + static_cast<int>(l), r.layout));
        }
        Aggregate(r);
        layout_rows_.push_back(std::move(r));
      }
    }
    if (!flags_.layouts_only) RunSoak();
    const absl::Duration wall = absl::Now() - start;
    PrintTable(wall);
    PrintJson(wall);
    Cleanup();
    std::vector<std::string> missed;
    for (const ScenarioResult& r : scenarios_) {
      if (!r.missed.empty()) {
        missed.push_back(absl::StrCat(r.scenario.name, ": ", absl::StrJoin(r.missed, "; ")));
      }
    }
    for (const ScenarioResult& r : layout_rows_) {
      if (!r.missed.empty()) {
        missed.push_back(absl::StrCat(r.layout, " ", r.scenario.name, ": ",
                                      absl::StrJoin(r.missed, "; ")));
      }
    }
    for (const std::string& m : SoakMissed(Totals(""))) missed.push_back("clean soak: " + m);
    if (!missed.empty()) {
      std::fprintf(stderr, "detection_bench: goals missed: %s\n",
                   absl::StrJoin(missed, " | ").c_str());
      return 1;
    }
    return 0;
  }

 private:
  bool PrepareOutDir() {
    std::error_code ec;
    if (flags_.out_dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string templ = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                       "/sdc-detection-bench.XXXXXX");
      if (mkdtemp(templ.data()) == nullptr) {
        std::fprintf(stderr, "detection_bench: cannot create a folder like %s\n", templ.c_str());
        return false;
      }
      flags_.out_dir = templ;
      temporary_out_dir_ = true;
    } else {
      std::filesystem::create_directories(flags_.out_dir, ec);
      if (ec || access(flags_.out_dir.c_str(), W_OK) != 0) {
        std::fprintf(stderr, "detection_bench: --out_dir %s is not a writable folder\n",
                     flags_.out_dir.c_str());
        return false;
      }
    }
    std::fprintf(stderr, "detection_bench: run folders under %s%s\n", flags_.out_dir.c_str(),
                 flags_.keep ? " (kept)" : " (deleted at the end; --keep keeps them)");
    return true;
  }

  // A fault scenario that --scenarios names (all of them by default); the
  // clean one is the soak.
  bool Selected(const Scenario& s) const {
    if (s.fault.empty()) return false;
    return flags_.scenarios.empty() || std::find(flags_.scenarios.begin(), flags_.scenarios.end(),
                                                 s.name) != flags_.scenarios.end();
  }

  // The selected fault scenarios `layout` runs, as the demo allows them there.
  std::vector<Scenario> LayoutScenarios(const std::string& layout) const {
    std::vector<Scenario> out;
    for (const Scenario& s : demo::Scenarios()) {
      if (Selected(s) && demo::ScenarioOnLayout(layout, s).ok()) out.push_back(s);
    }
    return out;
  }

  void PlanRuns() {
    for (const Scenario& s : demo::Scenarios()) {
      if (Selected(s) && !flags_.layouts_only) total_runs_ += flags_.runs;
    }
    for (const std::string& layout : flags_.layouts) {
      total_runs_ += static_cast<int>(LayoutScenarios(layout).size()) * flags_.layout_runs;
    }
    if (flags_.layouts_only) return;
    soak_runs_ = (flags_.soak_steps + flags_.soak_run_steps - 1) / flags_.soak_run_steps;
    total_runs_ += soak_runs_ + 1;  // And the clean transformer run.
  }

  std::string NewRunDir(const std::string& name) {
    const std::string dir = absl::StrFormat("%s/%02d-%s", flags_.out_dir, ++run_index_, name);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    std::filesystem::create_directories(dir, ec);
    run_dirs_.push_back(dir);
    return dir;
  }

  std::string Progress() const { return absl::StrFormat("[%d/%d]", run_index_, total_runs_); }

  // The i-th run of a scenario: which rank is faulty, at which step.
  static std::pair<int, int> FaultPosition(int world, int i) {
    std::vector<int> ranks;
    for (int r : kFaultRanks) {
      if (r < world) ranks.push_back(r);
    }
    const int n_ranks = static_cast<int>(ranks.size());
    constexpr int kNumSteps = sizeof(kFaultSteps) / sizeof(kFaultSteps[0]);
    // Ranks cycle; steps cycle too, shifted each full round of ranks so
    // that more runs also meet new (rank, step) pairs.
    return {ranks[i % n_ranks], kFaultSteps[(i + i / n_ranks) % kNumSteps]};
  }

  FaultRun RunFault(const Scenario& s, int nodes, int i, const std::string& layout) {
    FaultRun run;
    const int gpus = s.gpus_per_node > 0 ? s.gpus_per_node : kGpusPerNode;
    const int world = nodes * gpus;
    std::tie(run.rank, run.step) = FaultPosition(world, i);
    // {next}: a second faulty rank, the one after (two-faulty-of-three).
    run.fault = absl::StrReplaceAll(
        s.fault, {{"{rank}", absl::StrCat(run.rank)}, {"{step}", absl::StrCat(run.step)},
                  {"{next}", absl::StrCat((run.rank + 1) % world)}});
    const bool stepless = s.fault.find("{step}") == std::string::npos;
    if (stepless) run.step = -1;
    const std::string prefix = layout == "ddp" ? "" : layout + "-";
    run.run_dir = NewRunDir(absl::StrCat(prefix, s.name, "-r", run.rank,
                                         stepless ? "" : absl::StrCat("-s", run.step)));

    ClusterConfig c;
    c.run_dir = run.run_dir;
    c.nodes = nodes;
    c.gpus_per_node = gpus;
    c.steps = s.name == "intermittent" ? kIntermittentSteps : kSteps;
    c.audit_every = kAuditEvery;
    c.weight_check_every = kWeightCheckEvery;
    c.checkpoint_every = kCheckpointEvery;
    c.fault = run.fault;
    if (!s.model.empty()) c.model = s.model;
    if (s.micro_batches > 0) c.micro_batches = s.micro_batches;
    c.restart_coordinator_at = s.restart_coordinator ? kRestartCoordinatorAt : -1;
    c.job_id = absl::StrCat("bench-", prefix, s.name, "-", i);
    c.layout = layout;
    if (layout != "ddp") c.trainer = "python";  // Sharding is torch's (examples/layouts.py).
    c.timeout = absl::Minutes(10);
    if (s.replace_and_resume) ConfigureResume(c);
    // The first tick after the restart still shows the step of the kill; the
    // next one is read after sdcd is back.
    bool down = false;
    int ticks_up = 0;
    c.on_tick = [&](const demo::LiveStatus& l) {
      if (!l.coordinator_up) {
        down = true;
      } else if (down && run.restart_step < 0 && ++ticks_up == 2) {
        run.restart_step = l.step;
      }
    };

    const absl::Time start = absl::Now();
    absl::StatusOr<ClusterResult> result = demo::RunCluster(c);
    run.wall = absl::Now() - start;
    std::string where = absl::StrCat(prefix, s.name, " rank ", run.rank,
                                     run.step >= 0 ? absl::StrCat(" step ", run.step) : "");
    if (!result.ok()) {
      run.error = std::string(result.status().message());
      const size_t nl = run.error.find('\n');
      std::fprintf(stderr, "%s %s: ERROR %s (run folder %s)\n", Progress().c_str(), where.c_str(),
                   run.error.substr(0, nl).c_str(), run.run_dir.c_str());
      return run;
    }
    run.facts = demo::Analyze(*result, s, c, run.rank);
    run.fired = !run.facts.injections.empty();
    const std::string faulty_node = demo::NodeName(run.rank / kGpusPerNode);
    bool node_ok = true;
    for (const v1::Incident& inc : result->incidents) {
      if (!inc.confirmed()) continue;
      for (int k = 0; k < inc.ranks_size(); ++k) {
        const int r = static_cast<int>(inc.ranks(k));
        run.blamed.insert(r);
        if (r == run.rank && k < inc.node_names_size() && inc.node_names(k) != faulty_node) {
          node_ok = false;
        }
      }
    }
    run.attributed = run.facts.attributed_correctly && node_ok;
    if (!run.attributed && run.blamed.empty() && result->suspects.size() == 1 &&
        static_cast<int>(result->suspects[0].rank()) == run.rank) {
      run.suspected = true;
    }
    std::vector<int> suspects;
    for (const v1::Suspect& x : result->suspects) suspects.push_back(static_cast<int>(x.rank()));
    run.group_suspected = layout == "tp" && !run.attributed && !run.suspected &&
                          run.blamed.empty() && InTpGroup(suspects, run.rank, gpus);

    std::string line = absl::StrCat(Progress(), " ", where, ": ");
    if (!run.fired) {
      absl::StrAppend(&line, "the fault never fired; ");
    } else {
      absl::StrAppend(&line, run.facts.injections.size(), " injection(s) from step ",
                      run.facts.first_injection_step, "; ");
    }
    if (run.facts.detected) {
      absl::StrAppend(&line, "detected at step ", run.facts.first_detection_step);
      if (run.facts.latency_steps >= 0) absl::StrAppend(&line, " (+", run.facts.latency_steps, ")");
    } else {
      absl::StrAppend(&line, "NOT detected");
    }
    absl::StrAppend(&line, ", blamed ",
                    run.blamed.empty() ? "nobody" : absl::StrCat("rank ", absl::StrJoin(run.blamed, ",")));
    if (run.suspected) absl::StrAppend(&line, " (rank ", run.rank, " the one suspect)");
    if (run.group_suspected) {
      absl::StrAppend(&line, " (suspects: tp group of rank ", run.rank, ": rank ",
                      absl::StrJoin(suspects, ","), ")");
    }
    if (!run.facts.checkpoints_vetoed.empty()) {
      absl::StrAppend(&line, ", checkpoints vetoed at ",
                      absl::StrJoin(run.facts.checkpoints_vetoed, ","));
    }
    if (!node_ok) absl::StrAppend(&line, " (WRONG NODE)");
    absl::StrAppend(&line, ", skipped ", run.facts.skipped_steps.size());
    if (!run.facts.bad_checkpoints.empty()) {
      absl::StrAppend(&line, ", BAD CHECKPOINTS at ", absl::StrJoin(run.facts.bad_checkpoints, ","));
    }
    if (!run.facts.bad_checkpoints_revoked.empty()) {
      absl::StrAppend(&line, ", corrupted checkpoints revoked in time at ",
                      absl::StrJoin(run.facts.bad_checkpoints_revoked, ","));
    }
    if (run.facts.false_alarms > 0) absl::StrAppend(&line, ", ", run.facts.false_alarms, " FALSE ALARM(S)");
    if (s.restart_coordinator) {
      absl::StrAppend(&line, ", sdcd restarted ",
                      result->coordinator_restarts == 0
                          ? "NEVER"
                          : absl::StrCat("by step ", run.restart_step));
      if (run.restart_step >= 0 && run.step >= 0 && run.step <= run.restart_step) {
        absl::StrAppend(&line, " (the fault came BEFORE the restart)");
      }
    }
    absl::StrAppendFormat(&line, ", %.0f s", Seconds(run.wall));
    std::fprintf(stderr, "%s\n", line.c_str());
    return run;
  }

  static void Aggregate(ScenarioResult& r) {
    for (const FaultRun& run : r.runs) {
      if (!run.error.empty()) {
        ++r.errors;
        continue;
      }
      ++r.completed;
      r.fired += run.fired ? 1 : 0;
      r.detected += run.facts.detected ? 1 : 0;
      r.attributed += run.attributed ? 1 : 0;
      if (run.facts.detected && run.facts.latency_steps >= 0) {
        r.latency_sum += run.facts.latency_steps;
        ++r.latency_runs;
      }
      r.false_alarms += run.facts.false_alarms;
      r.skipped += static_cast<int>(run.facts.skipped_steps.size());
      r.bad_checkpoints += static_cast<int>(run.facts.bad_checkpoints.size());
      r.bad_checkpoints_revoked += static_cast<int>(run.facts.bad_checkpoints_revoked.size());
      r.checkpoints_vetoed += static_cast<int>(run.facts.checkpoints_vetoed.size());
      r.suspected += run.suspected ? 1 : 0;
      r.group_suspected += run.group_suspected ? 1 : 0;
      r.resume.Add(run.facts);
    }
    if (r.scenario.replace_and_resume) r.resume.Missed(r.completed, &r.missed);
    if (r.errors > 0) r.missed.push_back(absl::StrCat(r.errors, " run(s) failed"));
    if (r.completed > 0 && r.scenario.detectable && r.detected < r.completed) {
      r.missed.push_back(absl::StrCat("detected ", r.detected, "/", r.completed));
    }
    // A sharded layout's row: a suspect with the stated reason counts (issue 44),
    // on tp the faulty rank's tp group as the suspects (the table says so).
    const int named =
        r.attributed + (r.layout == "ddp" ? 0 : r.suspected + r.group_suspected);
    if (r.completed > 0 && r.attribution_applies() && named < r.completed) {
      r.missed.push_back(absl::StrCat("attributed ", named, "/", r.completed));
    }
    if (r.false_alarms > 0) r.missed.push_back(absl::StrCat(r.false_alarms, " healthy rank(s) blamed"));
    if (r.bad_checkpoints > 0) {
      r.missed.push_back(absl::StrCat(r.bad_checkpoints, " corrupted checkpoint(s) written"));
    }
  }

  CleanRun RunClean(const std::string& model, int steps, int audit_every, int weight_check_every,
                    int checkpoint_every, int index) {
    CleanRun run;
    run.model = model;
    run.steps = steps;
    run.audit_every = audit_every;
    run.weight_check_every = weight_check_every;
    ClusterConfig c;
    c.run_dir = NewRunDir(absl::StrCat("clean-", model, "-", index));
    c.nodes = kNodes;
    c.gpus_per_node = kGpusPerNode;
    c.steps = steps;
    c.model = model;
    c.audit_every = audit_every;
    c.weight_check_every = weight_check_every;
    c.checkpoint_every = checkpoint_every;
    c.job_id = absl::StrCat("bench-clean-", model, "-", index);
    c.timeout = absl::Minutes(30);
    const absl::Time start = absl::Now();
    absl::StatusOr<ClusterResult> result = demo::RunCluster(c);
    run.wall = absl::Now() - start;
    const std::string where = absl::StrCat("clean ", model, " run ", index + 1, " (", steps, " steps)");
    if (!result.ok()) {
      run.error = std::string(result.status().message());
      std::fprintf(stderr, "%s %s: ERROR %s (run folder %s)\n", Progress().c_str(), where.c_str(),
                   run.error.substr(0, run.error.find('\n')).c_str(), c.run_dir.c_str());
      return run;
    }
    Scenario clean = *demo::FindScenario("clean");
    const RunFacts f = demo::Analyze(*result, clean, c, -1);
    run.incidents = static_cast<int>(result->incidents.size());
    run.suspects = static_cast<int>(result->suspects.size());
    run.requests = static_cast<int>(result->requests.size());
    run.skipped = static_cast<int>(f.skipped_steps.size());
    run.checkpoints_allowed = static_cast<int>(f.checkpoints_allowed.size());
    run.checkpoints_vetoed = static_cast<int>(f.checkpoints_vetoed.size());
    run.weights_identical = f.weights_identical;
    // Checks actually performed, from rank 0's per-step records (every rank
    // takes the same decisions): an audited step, and a step whose weights
    // were fingerprinted (scheduled, or forced by a checkpoint request).
    if (!result->ranks.empty()) {
      for (const demo::StepRecord& s : result->ranks[0]) {
        if (s.audited) {
          ++run.audits;
          run.audits_failed += s.outcome != "pass" ? 1 : 0;
        }
        const bool scheduled = weight_check_every > 0 && s.step % weight_check_every == 0;
        const bool for_checkpoint = s.checkpoint == "allowed" || s.checkpoint == "vetoed";
        run.weight_checks += scheduled || for_checkpoint || s.weight_ms > 0 ? 1 : 0;
      }
    }
    std::fprintf(stderr,
                 "%s %s: %d audits (%d not passed), %d weight checks, %d incident(s), %d skipped, "
                 "checkpoints %d written / %d vetoed, replicas %s, %.0f s\n",
                 Progress().c_str(), where.c_str(), run.audits, run.audits_failed,
                 run.weight_checks, run.incidents, run.skipped, run.checkpoints_allowed,
                 run.checkpoints_vetoed, run.weights_identical ? "identical" : "DIFFER",
                 Seconds(run.wall));
    return run;
  }

  void RunSoak() {
    int left = flags_.soak_steps;
    for (int i = 0; i < soak_runs_; ++i) {
      const int steps = left / (soak_runs_ - i);
      left -= steps;
      soak_.push_back(RunClean("bn-mlp", steps, 1, 1, 50, i));
    }
    soak_.push_back(RunClean("transformer", flags_.transformer_steps, kAuditEvery,
                             kWeightCheckEvery, kCheckpointEvery, 0));
  }

  // ./sdc bench soak: clean runs until the sample is as large as AWS's.
  int LongSoak(absl::Time start) {
    const int goal = std::max(flags_.min_audits, flags_.min_weight_checks);
    total_runs_ = (goal + flags_.soak_run_steps - 1) / flags_.soak_run_steps;
    for (int i = 0;; ++i) {
      const SoakTotals t = Totals("");
      if (t.audits >= flags_.min_audits && t.weight_checks >= flags_.min_weight_checks) break;
      if (t.errors > 2) {
        std::fprintf(stderr, "detection_bench: %d soak runs failed; stopping\n", t.errors);
        break;
      }
      total_runs_ = std::max(total_runs_, i + 1);
      soak_.push_back(
          RunClean(i % 2 == 0 ? "bn-mlp" : "center-mlp", flags_.soak_run_steps, 1, 1, 50, i));
    }
    const absl::Duration wall = absl::Now() - start;
    const SoakTotals t = Totals("");
    std::vector<std::string> missed = SoakMissed(t);
    if (t.audits < flags_.min_audits) missed.push_back(absl::StrCat("only ", t.audits, " audits"));
    if (t.weight_checks < flags_.min_weight_checks) {
      missed.push_back(absl::StrCat("only ", t.weight_checks, " weight checks"));
    }
    // Rule of three: 0 events in n trials bounds the rate by 3/n at 95%.
    const double upper95 = t.audits > 0 ? 3.0 / t.audits : 1.0;
    absl::PrintF("clean soak: %d runs, %d steps (bn-mlp %d, center-mlp %d): %d audits, %d weight "
                 "checks, %d false alarms, %d audits not passed, %d skipped, checkpoints %d "
                 "written / %d vetoed, %.0f s  %s\n",
                 t.runs, t.steps, Totals("bn-mlp").steps, Totals("center-mlp").steps, t.audits,
                 t.weight_checks, t.false_alarms, t.audits_failed, t.skipped,
                 t.checkpoints_allowed, t.checkpoints_vetoed, Seconds(wall),
                 missed.empty() ? "ok" : absl::StrCat("MISSED: ", absl::StrJoin(missed, "; ")).c_str());
    if (t.false_alarms == 0 && t.audits > 0) {
      absl::PrintF("  0 alarms in %d audits: at 95%% confidence at most 1 false alarm per %d "
                   "audits (AWS: 1 per 5,100)\n",
                   t.audits, t.audits / 3);
    }
    absl::PrintF(
        "{\"audits\":%d,\"weight_checks\":%d,\"false_alarms\":%d,\"wall_s\":%.1f,"
        "\"steps\":%d,\"runs\":%d,\"errors\":%d,\"audits_not_passed\":%d,\"suspects\":%d,"
        "\"requests\":%d,\"skipped_steps\":%d,\"checkpoints_allowed\":%d,"
        "\"checkpoints_vetoed\":%d,\"false_alarm_rate_upper95\":%.3g,\"goals_met\":%s}\n",
        t.audits, t.weight_checks, t.false_alarms, Seconds(wall), t.steps, t.runs, t.errors,
        t.audits_failed, t.suspects, t.requests, t.skipped, t.checkpoints_allowed,
        t.checkpoints_vetoed, upper95, missed.empty() ? "true" : "false");
    std::fflush(stdout);
    Cleanup();
    return missed.empty() ? 0 : 1;
  }

  struct SoakTotals {
    int runs = 0;
    int errors = 0;
    int steps = 0;
    int audits = 0;
    int audits_failed = 0;
    int weight_checks = 0;
    int false_alarms = 0;
    int suspects = 0;
    int requests = 0;
    int skipped = 0;
    int checkpoints_allowed = 0;
    int checkpoints_vetoed = 0;
    int replicas_differ = 0;
    // What the runs' cadences schedule: fewer performed means a check
    // stopped running, which no alarm count would show.
    int audits_scheduled = 0;
    int weight_checks_scheduled = 0;
  };

  SoakTotals Totals(const std::string& model_filter) const {
    SoakTotals t;
    for (const CleanRun& r : soak_) {
      if (!model_filter.empty() && r.model != model_filter) continue;
      if (!r.error.empty()) {
        ++t.errors;
        continue;
      }
      ++t.runs;
      t.steps += r.steps;
      t.audits += r.audits;
      t.audits_failed += r.audits_failed;
      t.weight_checks += r.weight_checks;
      t.false_alarms += r.incidents;
      t.suspects += r.suspects;
      t.requests += r.requests;
      t.skipped += r.skipped;
      t.checkpoints_allowed += r.checkpoints_allowed;
      t.checkpoints_vetoed += r.checkpoints_vetoed;
      t.replicas_differ += r.weights_identical ? 0 : 1;
      t.audits_scheduled += r.steps / r.audit_every;
      t.weight_checks_scheduled += r.steps / r.weight_check_every;
    }
    return t;
  }

  static std::vector<std::string> SoakMissed(const SoakTotals& t) {
    std::vector<std::string> missed;
    if (t.errors > 0) missed.push_back(absl::StrCat(t.errors, " run(s) failed"));
    if (t.false_alarms > 0) missed.push_back(absl::StrCat(t.false_alarms, " false alarm(s)"));
    if (t.suspects > 0) missed.push_back(absl::StrCat(t.suspects, " suspect(s)"));
    if (t.requests > 0) missed.push_back(absl::StrCat(t.requests, " replacement request(s)"));
    if (t.skipped > 0) missed.push_back(absl::StrCat(t.skipped, " skipped step(s)"));
    if (t.checkpoints_vetoed > 0) missed.push_back(absl::StrCat(t.checkpoints_vetoed, " checkpoint(s) vetoed"));
    if (t.replicas_differ > 0) missed.push_back(absl::StrCat(t.replicas_differ, " run(s) ended with differing replicas"));
    if (t.audits < t.audits_scheduled) {
      missed.push_back(absl::StrCat(t.audits, " of ", t.audits_scheduled, " scheduled audits ran"));
    }
    if (t.weight_checks < t.weight_checks_scheduled) {
      missed.push_back(absl::StrCat(t.weight_checks, " of ", t.weight_checks_scheduled,
                                    " scheduled weight checks ran"));
    }
    return missed;
  }

  void PrintTable(absl::Duration wall) const {
    absl::PrintF("sdc-guard detection matrix: %d nodes x %d GPUs (CPU ranks, Gloo), %d steps per run "
                "(intermittent %d), audit every %d, weight check every %d, checkpoint every %d;\n"
                "faults at audit-aligned steps %s on ranks %s; coordinator restart after step %d\n\n",
                kNodes, kGpusPerNode, kSteps, kIntermittentSteps, kAuditEvery, kWeightCheckEvery,
                kCheckpointEvery, absl::StrJoin(kFaultSteps, "/"), absl::StrJoin(kFaultRanks, "/"),
                kRestartCoordinatorAt);
    absl::PrintF("%-20s %5s %9s %11s %8s %8s %8s %9s %8s  %s\n", "scenario", "runs", "detected",
                "attributed", "latency", "false", "skipped", "bad ckpt", "revoked", "goals");
    for (const ScenarioResult& r : scenarios_) {
      std::string goals = r.missed.empty() ? "ok" : absl::StrCat("MISSED: ", absl::StrJoin(r.missed, "; "));
      if (r.completed > 0 && r.fired < r.completed) {
        absl::StrAppend(&goals, " (fault fired in ", r.fired, "/", r.completed, " runs)");
      }
      absl::PrintF("%-20s %5d %9s %11s %8s %8d %8d %9d %8d  %s\n", r.scenario.name.c_str(), r.completed,
                  Fraction(r.detected_fraction()).c_str(),
                  r.attribution_applies() ? Fraction(r.attributed_fraction()).c_str() : "n/a",
                  r.mean_latency().has_value() ? absl::StrFormat("%.1f", *r.mean_latency()).c_str() : "n/a",
                  r.false_alarms, r.skipped, r.bad_checkpoints, r.bad_checkpoints_revoked,
                  goals.c_str());
    }
    PrintLayoutRows();
    if (flags_.layouts_only) {
      absl::PrintF("wall time %.0f s\n", Seconds(wall));
      return;
    }
    const SoakTotals t = Totals("");
    const std::vector<std::string> missed = SoakMissed(t);
    absl::PrintF("\nclean soak: %d runs, %d steps (bn-mlp %d, transformer %d): %d audits, %d weight "
                "checks, %d false alarms, %d skipped, checkpoints %d written / %d vetoed  %s\n",
                t.runs, t.steps, Totals("bn-mlp").steps, Totals("transformer").steps, t.audits,
                t.weight_checks, t.false_alarms, t.skipped, t.checkpoints_allowed,
                t.checkpoints_vetoed,
                missed.empty() ? "ok" : absl::StrCat("MISSED: ", absl::StrJoin(missed, "; ")).c_str());
    if (t.false_alarms == 0 && t.audits > 0) {
      // Rule of three: 0 events in n trials bounds the rate by 3/n at 95%.
      absl::PrintF("  0 alarms in %d audit steps: at 95%% confidence at most 1 false alarm per %d "
                  "audits (AWS: 1 per 5,100)\n",
                  t.audits, t.audits / 3);
    }
    absl::PrintF("wall time %.0f s\n", Seconds(wall));
  }

  // The sharded layouts' rows: caught, blamed right (or the one suspect),
  // checkpoints vetoed, steps to detection.
  void PrintLayoutRows() const {
    if (layout_rows_.empty()) return;
    absl::PrintF("\nsharded layouts (examples/ddp_train.py --layout, Python ranks), %d run(s) each:\n",
                 flags_.layout_runs);
    absl::PrintF("%-24s %5s %9s %11s %12s %8s %8s %8s %9s  %s\n", "layout / scenario", "runs",
                 "caught", "blamed", "suspect", "latency", "vetoed", "skipped", "bad ckpt", "goals");
    for (const ScenarioResult& r : layout_rows_) {
      const std::string goals =
          r.missed.empty() ? "ok" : absl::StrCat("MISSED: ", absl::StrJoin(r.missed, "; "));
      absl::PrintF("%-24s %5d %9s %11s %12s %8s %8d %8d %9d  %s\n",
                   absl::StrCat(r.layout, " ", r.scenario.name), r.completed,
                   Fraction(r.detected_fraction()),
                   r.attribution_applies() ? Fraction(r.attributed_fraction()) : "n/a",
                   SuspectCell(r),
                   r.mean_latency().has_value() ? absl::StrFormat("%.1f", *r.mean_latency()) : "n/a",
                   r.checkpoints_vetoed, r.skipped, r.bad_checkpoints, goals);
    }
  }

  void PrintJson(absl::Duration wall) const {
    std::string json = "{\"scenarios\":{";
    bool first = true;
    for (const ScenarioResult& r : scenarios_) {
      absl::StrAppend(&json, first ? "" : ",", "\"", JsonEscape(r.scenario.name), "\":", RowJson(r));
      first = false;
    }
    absl::StrAppend(&json, "},\"layouts\":{");
    for (size_t l = 0; l < flags_.layouts.size(); ++l) {
      absl::StrAppend(&json, l > 0 ? "," : "", "\"", flags_.layouts[l], "\":{");
      first = true;
      for (const ScenarioResult& r : layout_rows_) {
        if (r.layout != flags_.layouts[l]) continue;
        absl::StrAppend(&json, first ? "" : ",", "\"", JsonEscape(r.scenario.name), "\":", RowJson(r));
        first = false;
      }
      absl::StrAppend(&json, "}");
    }
    const SoakTotals t = Totals("");
    auto part = [&](const std::string& model) {
      const SoakTotals p = Totals(model);
      return absl::StrCat("{\"runs\":", p.runs, ",\"steps\":", p.steps, ",\"audits\":", p.audits,
                          ",\"weight_checks\":", p.weight_checks, ",\"false_alarms\":",
                          p.false_alarms, ",\"checkpoints_allowed\":", p.checkpoints_allowed, "}");
    };
    absl::StrAppend(&json, "},\"clean_soak\":{\"audits\":", t.audits,
                    ",\"weight_checks\":", t.weight_checks, ",\"false_alarms\":", t.false_alarms,
                    ",\"steps\":", t.steps, ",\"runs\":", t.runs, ",\"errors\":", t.errors,
                    ",\"audits_not_passed\":", t.audits_failed, ",\"suspects\":", t.suspects,
                    ",\"requests\":", t.requests, ",\"skipped_steps\":", t.skipped,
                    ",\"checkpoints_allowed\":", t.checkpoints_allowed,
                    ",\"checkpoints_vetoed\":", t.checkpoints_vetoed,
                    ",\"goals_met\":", SoakMissed(t).empty() ? "true" : "false",
                    ",\"bn_mlp\":", part("bn-mlp"), ",\"transformer\":", part("transformer"),
                    "},\"wall_s\":", absl::StrFormat("%.1f", Seconds(wall)), "}");
    std::printf("%s\n", json.c_str());
    std::fflush(stdout);
  }

  void Cleanup() {
    if (flags_.keep) {
      std::fprintf(stderr, "detection_bench: run folders kept under %s\n", flags_.out_dir.c_str());
      return;
    }
    std::error_code ec;
    for (const std::string& dir : run_dirs_) std::filesystem::remove_all(dir, ec);
    if (temporary_out_dir_) std::filesystem::remove(flags_.out_dir, ec);
  }

  Flags flags_;
  bool temporary_out_dir_ = false;
  int run_index_ = 0;
  int total_runs_ = 0;
  int soak_runs_ = 0;
  std::vector<std::string> run_dirs_;
  std::vector<ScenarioResult> scenarios_;
  std::vector<ScenarioResult> layout_rows_;  // --layouts: one per layout and scenario.
  std::vector<CleanRun> soak_;
};

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) {
  return sdc::bench::Bench(sdc::bench::FlagsFromCommandLine(argc, argv)).Main();
}
