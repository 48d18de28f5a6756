#ifndef SDC_BENCH_DETECTION_ROWS_H_
#define SDC_BENCH_DETECTION_ROWS_H_

// The detection matrix's rows (bench/detection_bench.cc): one fault run,
// a scenario's runs and aggregates, and their JSON.

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/resume_tally.h"
#include "demo/report.h"
#include "demo/scenarios.h"

namespace sdc::bench {

// One fault run.
struct FaultRun {
  int rank = -1;
  int step = -1;
  std::string fault;
  std::string run_dir;
  std::string error;  // RunCluster failed; nothing else is meaningful.
  demo::RunFacts facts;
  bool fired = false;          // The trainer logged at least one injection.
  bool attributed = false;     // Right rank, right node, nobody else.
  bool suspected = false;      // Not attributed: the faulty rank the one suspect, nobody blamed.
  // tp: neither, nobody blamed, and every suspect in the faulty rank's tp
  // group (an activation fault: the tp collectives mix the group's
  // activations, so a replay names the group, not its rank).
  bool group_suspected = false;
  std::set<int> blamed;        // Ranks named by confirmed incidents.
  int restart_step = -1;       // Steps every rank had finished once sdcd was back.
  absl::Duration wall;
};

// One row of the matrix: a scenario's runs, on DDP or a sharded layout.
struct ScenarioResult {
  demo::Scenario scenario;
  std::string layout = "ddp";  // A sharded layout's row: examples/layouts.py's.
  int nodes = 3;  // The detection bench's kNodes, or a scenario's own.
  std::vector<FaultRun> runs;
  // Aggregates over the completed runs.
  int completed = 0;
  int errors = 0;
  int detected = 0;
  int attributed = 0;
  int fired = 0;
  double latency_sum = 0;
  int latency_runs = 0;
  int false_alarms = 0;
  int skipped = 0;
  int bad_checkpoints = 0;
  int bad_checkpoints_revoked = 0;
  int checkpoints_vetoed = 0;
  int suspected = 0;  // Runs whose faulty rank was the one suspect, nobody blamed.
  int group_suspected = 0;  // tp: runs whose suspects were the faulty rank's tp group.
  ResumeTally resume;  // The replace-and-resume scenario's loop.
  std::vector<std::string> missed;  // Goals not met, in words.

  bool attribution_applies() const { return scenario.attributable && nodes >= 3; }
  std::optional<double> detected_fraction() const {
    if (completed == 0) return std::nullopt;
    return static_cast<double>(detected) / completed;
  }
  std::optional<double> attributed_fraction() const {
    if (!attribution_applies() || completed == 0) return std::nullopt;
    return static_cast<double>(attributed) / completed;
  }
  std::optional<double> mean_latency() const {
    if (latency_runs == 0) return std::nullopt;
    return latency_sum / latency_runs;
  }
};

// The row's JSON object: runs, detected, attributed_correctly,
// mean_latency_steps, false_alarms, skipped_steps, bad_checkpoints_written,
// bad_checkpoints_revoked, errors, fired, nodes, (replace-and-resume's loop),
// (a sharded layout's row: checkpoints_vetoed, suspected; tp's also
// tp_group_suspected), goals_met, missed, faults.
std::string RowJson(const ScenarioResult& r);

// Whether the suspects (ranks) are all in the tp group of `faulty` when
// every tp group is `tp` consecutive ranks (the demo's layout: a dp
// replica's tp group on one node); none is false.
bool InTpGroup(const std::vector<int>& suspects, int faulty, int tp);

// The suspect cell of a layout row: "1", or "1 tp group" when that many
// runs' suspects were the faulty rank's tp group.
std::string SuspectCell(const ScenarioResult& r);

// "0.67", or "n/a" for none.
std::string Fraction(std::optional<double> v);

}  // namespace sdc::bench

#endif  // SDC_BENCH_DETECTION_ROWS_H_
