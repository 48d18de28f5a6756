// ./sdc bench overhead: what sdc-guard costs a training step. Six CPU
// processes (3 nodes x 2 GPUs, Gloo) train the demo's transformer three times
// per round, alternating: unguarded (a plain flat all-reduce and norm
// clipping, as a DDP loop without sdc-guard), unguarded plus the guard's
// agreement exchange alone (12 int64, MAX, run the guard's way: what that
// one collective per step costs on this machine), and guarded (weight check every 10
// steps, audit every 100, sdcd attached). Step time is the slowest rank's, after a
// warm-up. The guard's own parts come from its per-step timings, and its
// plain steps (no audit, no weight check) are set against the loop with one
// more collective. Last line: JSON.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unistd.h>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "demo/flags.h"
#include "demo/launcher.h"
#include "demo/process.h"

namespace sdc::bench {
namespace {

struct Args {
  int steps = 300;
  int rounds = 2;
  int warmup = 5;
  int audit_every = 100;
  int weight_every = 10;
  std::string out_dir;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "overhead_bench: %s\n", what.c_str());
  return 1;
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

int Main(int argc, char** argv) {
  Args a;
  auto usage = [](const std::string& error) {
    std::fprintf(stderr, "overhead_bench: %s\n", error.c_str());
    std::exit(2);
  };
  for (demo::FlagReader flag(argc, argv, usage); flag.Next();) {
    const std::string& arg = flag.name();
    if (arg == "--steps") {
      a.steps = flag.Number(1);
    } else if (arg == "--rounds") {
      a.rounds = flag.Number(1);
    } else if (arg == "--warmup") {
      a.warmup = flag.Number(0);
    } else if (arg == "--audit_every") {
      a.audit_every = flag.Number(1);
    } else if (arg == "--weight_check_every") {
      a.weight_every = flag.Number(1);
    } else if (arg == "--out_dir") {
      a.out_dir = flag.Value();
    } else {
      flag.Unknown("known: --steps --rounds --warmup --audit_every --weight_check_every --out_dir");
    }
  }
  if (a.steps <= a.warmup || a.rounds < 1) return Fail("need --steps > --warmup and --rounds >= 1");
  if (a.out_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    a.out_dir = absl::StrCat(tmp ? tmp : "/tmp", "/sdc-overhead-", getpid());
  }
  demo::Run({"mkdir", "-p", a.out_dir});
  std::vector<double> unguarded, collective, guarded, audit_steps, plain_steps, weight_ms, check1_ms, audit_ms,
      agreement_ms;
  for (int round = 0; round < a.rounds; ++round) {
    for (const char* variant : {"unguarded", "extra-collective", "guarded"}) {
      const bool guard = std::strcmp(variant, "guarded") == 0;
      const bool extra = std::strcmp(variant, "extra-collective") == 0;
      demo::ClusterConfig c;
      c.run_dir = absl::StrCat(a.out_dir, "/", variant, "-", round);
      c.steps = a.steps;
      c.audit_every = a.audit_every;
      c.weight_check_every = a.weight_every;
      c.checkpoint_every = 0;
      c.unguarded = !guard;
      c.extra_collective = extra;
      c.job_id = absl::StrCat("overhead-", round);
      std::fprintf(stderr, "round %d/%d: %s, %d steps...\n", round + 1, a.rounds,
                   variant, a.steps);
      absl::StatusOr<demo::ClusterResult> r = demo::RunCluster(c);
      if (!r.ok()) return Fail(std::string(r.status().message()));
      if (guard && !r->incidents.empty()) return Fail("the guarded clean run raised an incident");
      // Slowest rank per step, and rank 0's record of what ran.
      std::map<int, double> slowest;
      for (const auto& rank : r->ranks) {
        for (const demo::StepRecord& s : rank) slowest[s.step] = std::max(slowest[s.step], s.ms);
      }
      for (const demo::StepRecord& s : r->ranks[0]) {
        if (s.step <= a.warmup) continue;
        const double ms = slowest[s.step];
        (guard ? guarded : extra ? collective : unguarded).push_back(ms);
        if (!guard) continue;
        const bool weight = a.weight_every > 0 && s.step % a.weight_every == 0;
        if (s.audited) {
          audit_steps.push_back(ms);
          audit_ms.push_back(s.audit_ms);
        } else if (!weight) {
          plain_steps.push_back(ms);
        }
        if (weight) weight_ms.push_back(s.weight_ms);
        check1_ms.push_back(s.check1_ms);
        agreement_ms.push_back(s.agreement_ms);
      }
    }
  }
  const double u = Mean(unguarded), g = Mean(guarded), x = Mean(collective);
  const double overhead = (g - u) / u * 100;
  const double audit_ratio = audit_steps.empty() ? -1 : Mean(audit_steps) / Mean(plain_steps);
  // Amortized at the cadence: one weight check every `weight_every` steps.
  const double weight_pct = Mean(weight_ms) / std::max(1, a.weight_every) / g * 100;
  const double check1_pct = Mean(check1_ms) / g * 100;
  std::printf("6 ranks (3 nodes x 2 GPUs, CPU, Gloo), %d steps x %d rounds per variant\n", a.steps,
              a.rounds);
  std::printf("%-40s %10.2f ms\n", "step, unguarded", u);
  std::printf("%-40s %10.2f ms  (%+.2f ms: one more collective)\n",
              "step, unguarded + agreement exchange", x, x - u);
  std::printf("%-40s %10.2f ms  (%+.2f%%)\n", "step, guarded (end to end)", g, overhead);
  std::printf("%-40s %10.2f ms  (%+.2f ms over the loop with one more collective)\n",
              "step, guarded, no audit or weight check", Mean(plain_steps),
              Mean(plain_steps) - x);
  std::printf("%-40s %10.2f ms  (%.2fx a plain guarded step, %zu samples)\n", "audit step",
              Mean(audit_steps), audit_ratio, audit_steps.size());
  std::printf("%-40s %10.3f ms  (%.3f%% of a step, amortized over %d steps)\n",
              "weight check", Mean(weight_ms), weight_pct, a.weight_every);
  std::printf("%-40s %10.3f ms  (%.3f%% of a step)\n", "check 1 (scans and digest)",
              Mean(check1_ms), check1_pct);
  std::printf("%-40s %10.3f ms  (waiting for the slowest rank included)\n",
              "agreement exchange", Mean(agreement_ms));
  std::printf(
      "{\"ranks\":6,\"steps\":%d,\"rounds\":%d,\"step_ms_unguarded\":%.3f,\"step_ms_guarded\":%.3f,"
      "\"overhead_pct\":%.3f,\"audit_step_ratio\":%.3f,\"audit_step_ms\":%.3f,"
      "\"weight_check_ms\":%.3f,\"weight_check_pct_of_step\":%.4f,"
      "\"nonfinite_check_ms\":%.3f,\"nonfinite_check_pct_of_step\":%.4f,"
      "\"agreement_ms\":%.3f,\"step_ms_unguarded_extra_collective\":%.3f,"
      "\"extra_collective_ms\":%.3f,\"step_ms_guarded_plain\":%.3f}\n",
      a.steps, a.rounds, u, g, overhead, audit_ratio, Mean(audit_steps), Mean(weight_ms),
      weight_pct, Mean(check1_ms), check1_pct, Mean(agreement_ms), x, x - u, Mean(plain_steps));
  demo::Run({"rm", "-rf", a.out_dir});
  return 0;
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) { return sdc::bench::Main(argc, argv); }
