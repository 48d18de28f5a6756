#ifndef SDC_BENCH_DETECTION_FLAGS_H_
#define SDC_BENCH_DETECTION_FLAGS_H_

// The flags of ./sdc bench detection (bench/detection_bench.cc), read once.

#include <string>
#include <vector>

namespace sdc::bench {

struct Flags {
  bool quick = false;
  int runs = 3;
  std::vector<std::string> scenarios;  // Empty: every fault scenario.
  // The sharded layouts whose rows run (examples/layouts.py): each runs the
  // selected scenarios the demo allows on it (demo::ScenarioOnLayout),
  // layout_runs runs each. Empty (--layouts=none): DDP's rows only.
  std::vector<std::string> layouts = {"fsdp", "hsdp", "zero", "tp"};
  int layout_runs = 1;
  bool layouts_only = false;  // Only the layout rows: no DDP rows, no clean soak.
  int soak_steps = 2000;
  int transformer_steps = 60;
  int soak_run_steps = 500;  // Soak runs are at most this long.
  std::string out_dir;
  bool keep = false;
  bool soak_only = false;
  int min_audits = 15320;
  int min_weight_checks = 3080;
};

// Parses the command line; a bad flag exits 2 with the reason on stderr.
Flags FlagsFromCommandLine(int argc, char** argv);

}  // namespace sdc::bench

#endif  // SDC_BENCH_DETECTION_FLAGS_H_
