#ifndef SDC_DEMO_REPORT_H_
#define SDC_DEMO_REPORT_H_

// What a demo run showed, computed from the launcher's result and the
// coordinator's records (not from prose), and rendered as a terminal
// summary and a self-contained HTML report.

#include <string>
#include <vector>

#include "demo/launcher.h"
#include "demo/scenarios.h"

namespace sdc::demo {

// What became of one injected corruption.
enum class Fate {
  kCaughtSkipped,    // Its step was skipped on every rank: never trained on.
  kCaughtRepaired,   // A corrupted weight or optimizer state, found by the weight
                     // vote (or repaired) before the run ended.
  kDetectedApplied,  // An incident names its step, but the step was applied: trained
                     // on, and checkpoints from then on are revoked or vetoed.
  kReplay,           // Injected into a replay of a peer's micro-batch: it can only
                     // make the replayer look faulty, never reach the weights.
  kNoTrainingValue,  // Another software stack's rounding, a flipped bit in the copy
                     // sent to a replayer, late reports: nothing trains on it.
  kUndetected,       // Trained on undetected: averaged into every replica, unseen.
};

std::string FateName(Fate fate);

struct Injection {
  int rank = -1;
  int step = -1;
  std::string what;
  bool while_replaying = false;
  Fate fate = Fate::kUndetected;
  // How a caught one was caught: its skipped step's reason, short ("checksum
  // alarm at step 6 on rank 3: mm", "replay audit mismatch"), or "the
  // weight vote"; empty otherwise.
  std::string how;
};

struct RunFacts {
  Scenario scenario;
  std::string fault_spec;
  int fault_rank = -1;
  std::vector<Injection> injections;
  int first_injection_step = -1;
  // Incidents, as the coordinator recorded them.
  std::vector<v1::Incident> incidents;
  int first_detection_step = -1;
  int latency_steps = -1;         // First detection minus first injection.
  // Some check fired on an injected fault (with an incident of
  // scenario.expect_incident's outcome, where that is set).
  bool detected = false;
  bool attributed_correctly = false;  // A confirmed incident names the faulty rank, and only it.
  // Confirmed blames of other ranks (any incident when clean; any blame at
  // all where scenario.expect_incident is set).
  int false_alarms = 0;
  std::vector<int> skipped_steps;
  std::vector<int> checkpoints_allowed;  // Written (provisional at first).
  std::vector<int> checkpoints_vetoed;
  std::vector<int> checkpoints_final;        // On disk at the end, confirmed.
  std::vector<int> checkpoints_provisional;  // On disk at the end, not yet confirmed.
  std::vector<int> checkpoints_revoked;      // Written, then revoked and deleted.
  // Checkpoints on disk at the end (final or provisional) that hold
  // corrupted values: written after an applied step that carried an injected
  // gradient fault, or between a weight corruption and its repair.
  std::vector<int> bad_checkpoints;
  // Corrupted checkpoints that were written provisional and then revoked.
  std::vector<int> bad_checkpoints_revoked;
  bool weights_identical = false;  // All replicas ended with the same digest.
  // Injections into training (not into replays) by fate; the steps of those
  // trained on undetected.
  int caught = 0;
  int detected_applied = 0;
  std::vector<int> undetected_steps;
  int audits = 0;
  int audits_unverified = 0;  // Audited steps with no verdict from sdcd in time.
  int weight_checks = 0;
  double first_loss = 0;
  double last_loss = 0;
  // The whole loop (replace-and-resume): the facts above are attempt 0's
  // (the weights digests and the files on disk at the end are attempt 1's);
  // these are attempt 1's, from its ranks' records and sdcd's incidents.
  struct Resumed {
    bool approved = false;  // The request was approved and its actuator ran (Done).
    bool resumed = false;
    int resume_step = 0;
    int steps = 0;                  // Steps attempt 1 trained (rank 0's records).
    std::vector<int> skipped_steps;
    std::vector<int> checkpoints_allowed;
    std::vector<int> checkpoints_vetoed;
    int incidents_after = 0;        // Incidents sdcd recorded after attempt 1 started.
    int final_checkpoint = -1;      // The newest final checkpoint on disk at the end.
    // The checkpoint resumed from held corrupted weights (an injected fault
    // applied at or before its step).
    bool from_corrupted = false;
  } resumed;
};

RunFacts Analyze(const ClusterResult& result, const Scenario& scenario,
                 const ClusterConfig& config, int fault_rank);

// The terminal summary: what was injected, what was detected, who was
// blamed, checkpoints, the request and the exact sdcctl command.
std::string SummaryText(const RunFacts& facts, const ClusterResult& result,
                        const ClusterConfig& config, const std::string& sdcctl);

// A self-contained HTML page (inline SVG and CSS, no scripts).
std::string HtmlReport(const RunFacts& facts, const ClusterResult& result,
                       const ClusterConfig& config);

std::string HtmlEscape(const std::string& s);

// The facts as one JSON object (for tests and scripts): the RunFacts fields
// by name, plus "blamed" (ranks of confirmed incidents), "requests" (their
// nodes) and "coordinator_restarts".
std::string FactsJson(const RunFacts& facts, const ClusterResult& result);

}  // namespace sdc::demo

#endif  // SDC_DEMO_REPORT_H_
