#ifndef SDC_BENCH_LAYOUT_OVERHEAD_H_
#define SDC_BENCH_LAYOUT_OVERHEAD_H_

// ./sdc bench overhead --layout=fsdp|hsdp|zero|tp (a comma list runs several):
// what the guard costs a sharded job (issue 44). Per layout, one cluster of
// 6 ranks (3 nodes x 2 GPUs, CPU, Gloo) trains the demo's transformer with
// examples/ddp_train.py --layout=L unguarded and another guarded, at the
// same time, taking turns of --turn_steps steps (as the DDP loops do);
// each round another loop goes first. Step time is the slowest rank's,
// after the warm-up.
//
// Before a figure is printed, each layout's runs must show: every rank ran
// and applied every step; the guarded job's final weights bit-identical to
// the unguarded job's (the full parameters' digest, every rank alike); no
// incident and no suspect at sdcd; an audit (the sharded replay under fsdp
// hsdp and tp, the engine's own under zero) at exactly the steps the cadence
// schedules, each passed; and where the layout has a buddy check (fsdp,
// zero), a check at every weight-check step on every rank with no finding.
// The DDP bench's collective count is not asserted here: a sharded layout's
// guard keeps its agreement exchange on every step (ARCHITECTURE.md).
//
// Prints a table, then one JSON line: {"ranks","steps","rounds","turn_steps",
// "trainer","layout","audit_every","weight_check_every","layouts":{L:{...}}}
// with per layout step_ms_unguarded, step_ms_guarded, overhead_pct,
// overhead_pct_by_round, step_ms_guarded_plain, audit_step_ms, audits,
// sharded_audit_ms (per audit and rank; null under zero), buddy_checks, buddy_bytes_per_check and buddy_ms_per_check (per rank and
// check; null under hsdp, which has no buddy check), bit_identical and
// incidents.

#include <string>
#include <vector>

#include "demo/launcher.h"

namespace sdc::bench {

struct LayoutOverheadArgs {
  std::vector<std::string> layouts;  // fsdp, hsdp, zero, tp.
  int steps = 30;
  int rounds = 2;
  int warmup = 5;
  int turn_steps = 5;
  int audit_every = 15;
  int weight_every = 5;
  std::string out_dir;  // Exists; the runs' folders go under it.
};

// Runs every layout of `a`; returns the process's exit code (1 when a
// layout's runs fail a check, after saying which on stderr).
int RunLayoutOverhead(const LayoutOverheadArgs& a);

// Hands the turn to `name` in `path` (a rename: readers never see a
// partial file). Shared with the DDP loops of overhead_bench.cc.
bool WriteTurn(const std::string& path, const std::string& name);

double Mean(const std::vector<double>& v);

// "" when every rank of `r` recorded `steps` steps and applied each; else
// what went wrong. Shared with the DDP loops' checks.
std::string EveryStepApplied(const demo::ClusterResult& r, int steps);

}  // namespace sdc::bench

#endif  // SDC_BENCH_LAYOUT_OVERHEAD_H_
