#include "bench/detection_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "demo/scenarios.h"

ABSL_FLAG(bool, quick, false, "One run per scenario and a 500-step soak.");
ABSL_FLAG(int, runs, 0, "Runs per scenario (0: 3, or 1 with --quick).");
ABSL_FLAG(std::string, scenarios, "",
          "Comma-separated fault scenarios to run (default: every one; see ./sdc demo --help).");
ABSL_FLAG(std::string, layouts, "fsdp,hsdp,zero,tp",
          "Sharded layouts whose rows run (fsdp, hsdp, zero, tp; none: DDP's rows only): each "
          "runs the selected scenarios ./sdc demo --layout allows on it.");
ABSL_FLAG(int, layout_runs, 1, "Runs per layout and scenario.");
ABSL_FLAG(bool, layouts_only, false, "Only the --layouts rows: no DDP rows, no clean soak.");
ABSL_FLAG(int, soak_steps, 0, "Clean bn-mlp soak steps in total (0: 2000, or 500 with --quick).");
ABSL_FLAG(int, transformer_steps, 0,
          "Steps of the clean transformer run (0: 60, or 30 with --quick).");
ABSL_FLAG(int, soak_run_steps, 500, "Steps per clean soak run (the matrix's and --soak_only's).");
ABSL_FLAG(std::string, out_dir, "", "Where the run folders go (default: a temporary folder).");
ABSL_FLAG(bool, keep, false, "Keep the run folders (deleted at the end otherwise).");
ABSL_FLAG(bool, soak_only, false,
          "Only a long clean soak, every step audited and weight-checked (./sdc bench soak).");
ABSL_FLAG(int, min_audits, 15320, "With --soak_only: the audits to reach.");
ABSL_FLAG(int, min_weight_checks, 3080, "With --soak_only: the weight checks to reach.");

namespace sdc::bench {
namespace {

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr, "detection_bench: %s\n", error.c_str());
  std::exit(2);
}

}  // namespace

Flags FlagsFromCommandLine(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the detection matrix of sdc-guard on a local cluster.\n"
      "  detection_bench [--quick] [--runs=N] [--scenarios=A,B] [--layouts=fsdp,hsdp,zero,tp|none]\n"
      "                  [--layout_runs=N] [--layouts_only] [--soak_steps=N]\n"
      "                  [--transformer_steps=N] [--soak_run_steps=N] [--out_dir=DIR] [--keep]\n"
      "  detection_bench --soak_only [--min_audits=N] [--min_weight_checks=N] "
      "[--soak_run_steps=N]");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) Usage(absl::StrCat("unexpected argument '", rest[1], "' (see --help)"));
  Flags f;
  f.quick = absl::GetFlag(FLAGS_quick);
  f.runs = absl::GetFlag(FLAGS_runs);
  f.scenarios = absl::StrSplit(absl::GetFlag(FLAGS_scenarios), ',', absl::SkipEmpty());
  const std::string layouts = absl::GetFlag(FLAGS_layouts);
  f.layouts.clear();
  if (layouts != "none") f.layouts = absl::StrSplit(layouts, ',', absl::SkipEmpty());
  for (const std::string& l : f.layouts) {
    if (l != "fsdp" && l != "hsdp" && l != "zero" && l != "tp") {
      Usage(absl::StrCat("--layouts: '", l,
                         "' is not fsdp, hsdp, zero or tp (none: no layout rows)"));
    }
    if (std::count(f.layouts.begin(), f.layouts.end(), l) > 1) {
      Usage(absl::StrCat("--layouts: '", l, "' named twice"));
    }
  }
  f.layout_runs = absl::GetFlag(FLAGS_layout_runs);
  f.layouts_only = absl::GetFlag(FLAGS_layouts_only);
  if (f.layouts_only && f.layouts.empty()) Usage("--layouts_only needs --layouts");
  f.soak_steps = absl::GetFlag(FLAGS_soak_steps);
  f.transformer_steps = absl::GetFlag(FLAGS_transformer_steps);
  f.soak_run_steps = absl::GetFlag(FLAGS_soak_run_steps);
  f.out_dir = absl::GetFlag(FLAGS_out_dir);
  f.keep = absl::GetFlag(FLAGS_keep);
  f.soak_only = absl::GetFlag(FLAGS_soak_only);
  f.min_audits = absl::GetFlag(FLAGS_min_audits);
  f.min_weight_checks = absl::GetFlag(FLAGS_min_weight_checks);
  if (f.runs == 0) f.runs = f.quick ? 1 : 3;
  if (f.soak_steps == 0) f.soak_steps = f.quick ? 500 : 2000;
  if (f.transformer_steps == 0) f.transformer_steps = f.quick ? 30 : 60;
  for (const std::string& name : f.scenarios) {
    const std::optional<demo::Scenario> s = demo::FindScenario(name);
    if (!s.has_value() || s->fault.empty()) {
      Usage(absl::StrCat("--scenarios: '", name, "' is not a fault scenario"));
    }
  }
  for (const auto& [flag, value] : {std::pair<const char*, int>{"runs", f.runs},
                                    {"layout_runs", f.layout_runs},
                                    {"soak_steps", f.soak_steps},
                                    {"transformer_steps", f.transformer_steps},
                                    {"soak_run_steps", f.soak_run_steps},
                                    {"min_audits", f.min_audits},
                                    {"min_weight_checks", f.min_weight_checks}}) {
    if (value < 1) Usage(absl::StrCat("--", flag, " must be at least 1, got ", value));
  }
  return f;
}

}  // namespace sdc::bench
