#ifndef SDC_DEMO_SCENARIOS_H_
#define SDC_DEMO_SCENARIOS_H_

// The demo's fault scenarios (./sdc demo --scenario NAME).

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sdc::demo {

struct Scenario {
  std::string name;
  std::string description;  // One line for `--scenario list` and the summary.
  // The injected fault as an SDC_INJECT_FAULT spec; "{rank}", "{step}" are
  // filled in by the launcher. Empty: nothing injected.
  std::string fault;
  int nodes = 0;               // Override of --nodes (0: keep).
  bool restart_coordinator = false;  // kill -9 sdcd mid-run and restart it.
  // What the design can do about it.
  bool detectable = true;      // A check should fire.
  bool attributable = true;    // With >= 3 nodes, the faulty rank can be named.
  bool persistent = false;     // The GPU stays faulty (tie-breaks, targeted audits).
  std::string model;           // Override of the model (empty: keep).
  int micro_batches = 0;       // Override of the micro-batches per step (0: keep).
  // sdcd starts only after the trainers' first steps (a tenth of the run):
  // they hold their reports until it is there, then deliver them all.
  bool coordinator_late = false;
  int gpus_per_node = 0;       // Override of the ranks per node (0: keep).
  // Where set, the fault counts as detected only by an incident of this
  // outcome, and naming any GPU (a confirmed incident) is a false alarm:
  // the design explains it without blaming hardware.
  std::string expect_incident;
  // The whole loop: approve the request, replace the node, restart every
  // rank as a new attempt resumed from the newest final checkpoint
  // (ClusterConfig::replace_and_resume).
  bool replace_and_resume = false;
};

const std::vector<Scenario>& Scenarios();
std::optional<Scenario> FindScenario(const std::string& name);
inline constexpr char kDefaultScenario[] = "intermittent";

// Whether `layout` (ddp, fsdp, hsdp, zero, tp: examples/layouts.py) runs
// scenario `s`: `s` itself, or kInvalidArgument saying why not and, for a
// sharded layout, which scenarios it runs. The demo and the detection
// bench's layout rows both ask here.
absl::StatusOr<Scenario> ScenarioOnLayout(const std::string& layout, Scenario s);

}  // namespace sdc::demo

#endif  // SDC_DEMO_SCENARIOS_H_
