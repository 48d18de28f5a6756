// ./sdc bench overhead: what sdc-guard costs a training step. Six CPU
// processes (3 nodes x 2 GPUs, Gloo) train the demo's transformer in three
// loops per round: unguarded (a plain flat all-reduce, no clipping, as a
// DDP loop without sdc-guard), unguarded plus the guard's agreement exchange
// alone (12 int64, MAX, run the guard's way: what that one collective per
// step costs on this machine), and guarded (weight check every 10 steps,
// audit every 100, sdcd attached). The loops run at the same time, each in
// its own processes, and take turns of --turn_steps steps on the machine (a
// turn starts and ends with a barrier, outside the timed steps). Step time
// is the slowest rank's, after a warm-up. The guard's own parts come from
// its per-step timings, and its plain steps (no audit, no weight check) are
// set against the loop with one more collective.
// --trainer=python runs every loop as examples/ddp_train.py: plain PyTorch
// DDP against DDP guarded by the sdc_guard package (./sdc builds it).
// --variants=...,guarded-no-sdcd adds the guard with no coordinator
// configured, which splits the guard's cost between its own work and the
// share of the CPUs that sdcd and the report streams take. First, a short
// run of each (unguarded and guarded) counts the collectives every step
// issues: a guarded step without an audit must issue what an unguarded one
// does, or the bench fails. Last line: JSON (with "layout":"ddp").
// --layout=fsdp,hsdp,zero (any of them): each sharded layout's guarded job
// against the same layout unguarded, and the buddy check's bytes and time
// per check (bench/layout_overhead.h).

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/layout_overhead.h"
#include "demo/launcher.h"
#include "demo/process.h"
#include "demo/progress_line.h"

ABSL_FLAG(int, steps, 300, "Steps per loop and round, warm-up included.");
ABSL_FLAG(int, rounds, 2, "Rounds; each starts with a different loop.");
ABSL_FLAG(int, warmup, 20, "Steps left out of the timings at the start of each loop.");
ABSL_FLAG(int, turn_steps, 10, "Steps per turn on the machine.");
ABSL_FLAG(int, audit_every, 100, "Guarded loops: a replay audit every N steps.");
ABSL_FLAG(int, weight_check_every, 10, "Guarded loops: a weight check every N steps.");
ABSL_FLAG(std::string, variants, "unguarded,extra-collective,guarded",
          "The loops, in turn order: unguarded, extra-collective, guarded, guarded-no-sdcd "
          "(unguarded and guarded are required).");
ABSL_FLAG(std::string, out_dir, "",
          "Where the loops' run folders go, kept afterwards (default: a temporary folder, "
          "deleted).");
ABSL_FLAG(std::string, trainer, "cpp",
          "cpp: the demo's C++ trainer; python: examples/ddp_train.py (PyTorch DDP).");
ABSL_FLAG(std::string, layout, "ddp",
          "ddp (the loops above), or sharded layouts, comma-separated (fsdp, hsdp, zero, tp): "
          "each trained unguarded and guarded by examples/ddp_train.py --layout "
          "(bench/layout_overhead.h; defaults there: --steps=30 --warmup=5 --turn_steps=5 "
          "--audit_every=15 --weight_check_every=5).");

namespace sdc::bench {
namespace {

struct Args {
  int steps = 300;
  int rounds = 2;
  int warmup = 20;  // Two turns: the other loops start up during the first.
  int turn_steps = 10;
  int audit_every = 100;
  int weight_every = 10;
  std::string out_dir;  // Given: kept afterwards (logs, progress). Default: a temporary one.
  // Which loops run, taking turns in this order in the first round (each
  // later round starts one loop further on). The JSON's contract needs the first three;
  // guarded-no-sdcd (the guard with no coordinator configured: in-band
  // checks only, no report streams, no sdcd) splits the guard's cost between
  // its own work and the coordinator's share of the CPUs.
  std::vector<std::string> variants = {"unguarded", "extra-collective", "guarded"};
  // cpp: the demo's C++ trainer (sdc::Guard); python: examples/ddp_train.py
  // (PyTorch DDP, plain or with sdc_guard). Every loop runs the same one.
  std::string trainer = "cpp";
};

constexpr const char* kVariants[] = {"unguarded", "extra-collective", "guarded", "guarded-no-sdcd"};

int Fail(const std::string& what) {
  std::fprintf(stderr, "overhead_bench: %s\n", what.c_str());
  return 1;
}

// What makes a loop's timings worth printing: every rank ran every step and
// applied it, the replicas ended identical, and a guarded loop audited at
// its cadence with every audit passed (a clean run; a guard that stopped
// auditing would look cheap). Returns what went wrong, or "".
std::string CheckLoop(const demo::ClusterResult& r, const Args& a, bool guarded) {
  if (std::string applied = EveryStepApplied(r, a.steps); !applied.empty()) return applied;
  if (r.ranks.empty() || r.weight_digests.size() != r.ranks.size()) return "no final weights";
  for (const std::string& d : r.weight_digests) {
    if (d.empty() || d != r.weight_digests[0]) return "the replicas ended with different weights";
  }
  if (!guarded) return "";
  int audits = 0;
  for (const demo::StepRecord& s : r.ranks[0]) {
    if (!s.audited) continue;
    ++audits;
    if (s.outcome != "pass") return absl::StrCat("the audit of step ", s.step, " ended ", s.outcome);
  }
  if (audits != a.steps / a.audit_every) {
    return absl::StrCat(audits, " audits ran; the cadence schedules ", a.steps / a.audit_every);
  }
  return "";
}

// The collectives a step issues, guarded and unguarded: one short run of
// each with the trainers counting (--count_collectives; counting is kept out
// of the timed loops). Rank 0's count per step, from step 1.
struct CollectiveCounts {
  std::map<int, int> unguarded, guarded;  // By step.
  std::map<int, bool> audited;            // The guarded loop's audit steps.
};

absl::StatusOr<CollectiveCounts> CountCollectives(const Args& a, int steps) {
  CollectiveCounts out;
  std::map<std::string, absl::StatusOr<demo::ClusterResult>> results;
  for (const char* name : {"unguarded", "guarded"}) {
    demo::ClusterConfig c;
    c.run_dir = absl::StrCat(a.out_dir, "/count-", name);
    c.steps = steps;
    c.audit_every = a.audit_every;
    c.weight_check_every = a.weight_every;
    c.checkpoint_every = 0;
    c.trainer = a.trainer;
    c.unguarded = std::string(name) == "unguarded";
    c.count_collectives = true;
    c.job_id = absl::StrCat("overhead-count-", name);
    c.timeout = absl::Minutes(20);
    results.emplace(name, demo::RunCluster(c));
  }
  for (const auto& [name, r] : results) {
    if (!r.ok()) return absl::InternalError(absl::StrCat("counting, ", name, ": ", r.status().message()));
    if (r->ranks.empty() || static_cast<int>(r->ranks[0].size()) != steps) {
      return absl::InternalError(absl::StrCat("counting, ", name, ": rank 0 recorded ",
                                              r->ranks.empty() ? 0 : r->ranks[0].size(), " of ",
                                              steps, " steps"));
    }
    for (const demo::StepRecord& s : r->ranks[0]) {
      if (s.collectives < 0) {
        return absl::InternalError(absl::StrCat("counting, ", name, ": step ", s.step,
                                                " has no collective count"));
      }
      (name == "guarded" ? out.guarded : out.unguarded)[s.step] = s.collectives;
      if (name == "guarded") out.audited[s.step] = s.audited;
    }
  }
  return out;
}

// --layout=A,B: the sharded layouts' runs (bench/layout_overhead.h), with
// their own defaults for the flags left unset (a Python rank's step is
// several times the C++ trainer's).
template <typename Usage>
int ShardedMain(const std::string& layouts, Usage usage) {
  LayoutOverheadArgs a;
  a.layouts = absl::StrSplit(layouts, ',', absl::SkipEmpty());
  if (a.layouts.empty()) usage("--layout: name one or more of fsdp, hsdp, zero, tp");
  for (const std::string& l : a.layouts) {
    if (l != "fsdp" && l != "hsdp" && l != "zero" && l != "tp") {
      usage(absl::StrCat("--layout: '", l, "' is not a sharded layout (fsdp, hsdp, zero, tp; ddp "
                         "alone runs the DDP loops)"));
    }
    if (std::count(a.layouts.begin(), a.layouts.end(), l) > 1) {
      usage(absl::StrCat("--layout: '", l, "' named twice"));
    }
  }
  if (absl::GetFlag(FLAGS_trainer) != "cpp" && absl::GetFlag(FLAGS_trainer) != "python") {
    usage("--trainer: cpp or python");
  }
  if (absl::GetFlag(FLAGS_variants) != "unguarded,extra-collective,guarded") {
    usage("--variants is for the DDP loops; a sharded layout runs unguarded and guarded");
  }
  const auto flag = [](const auto& f, int fallback) {
    const int v = absl::GetFlag(f);
    return absl::GetFlagReflectionHandle(f).CurrentValue() ==
                   absl::GetFlagReflectionHandle(f).DefaultValue()
               ? fallback
               : v;
  };
  a.steps = flag(FLAGS_steps, a.steps);
  a.rounds = flag(FLAGS_rounds, a.rounds);
  a.warmup = flag(FLAGS_warmup, a.warmup);
  a.turn_steps = flag(FLAGS_turn_steps, a.turn_steps);
  a.audit_every = flag(FLAGS_audit_every, a.audit_every);
  a.weight_every = flag(FLAGS_weight_check_every, a.weight_every);
  for (const auto& [name, value, min] : {std::tuple<const char*, int, int>{"steps", a.steps, 1},
                                         {"rounds", a.rounds, 1},
                                         {"warmup", a.warmup, 0},
                                         {"turn_steps", a.turn_steps, 1},
                                         {"audit_every", a.audit_every, 1},
                                         {"weight_check_every", a.weight_every, 1}}) {
    if (value < min) usage(absl::StrCat("--", name, " must be at least ", min, ", got ", value));
  }
  if (a.steps <= a.warmup) usage("need --steps > --warmup");
  if (a.steps < a.audit_every || a.steps < a.weight_every) {
    usage("need --steps at least --audit_every and --weight_check_every (one of each)");
  }
  a.out_dir = absl::GetFlag(FLAGS_out_dir);
  const bool keep = !a.out_dir.empty();
  if (!keep) {
    const char* tmp = std::getenv("TMPDIR");
    a.out_dir = absl::StrCat(tmp ? tmp : "/tmp", "/sdc-overhead-", getpid());
  }
  demo::Run({"mkdir", "-p", a.out_dir});
  const int code = RunLayoutOverhead(a);
  if (keep) {
    std::fprintf(stderr, "runs kept in %s\n", a.out_dir.c_str());
  } else {
    demo::Run({"rm", "-rf", a.out_dir});
  }
  return code;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "what sdc-guard costs a training step: unguarded, extra-collective and guarded loops "
      "on a local cluster, taking turns.\n"
      "  overhead_bench [--steps=N] [--rounds=N] [--warmup=N] [--turn_steps=N] "
      "[--audit_every=N]\n"
      "                 [--weight_check_every=N] [--variants=A,B,...] [--out_dir=DIR] "
      "[--trainer=cpp|python]\n"
      "  overhead_bench --layout=fsdp,hsdp,zero [--steps=N] [--rounds=N] ...");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  auto usage = [](const std::string& error) {
    std::fprintf(stderr, "overhead_bench: %s\n", error.c_str());
    std::exit(2);
  };
  if (rest.size() > 1) usage(absl::StrCat("unexpected argument '", rest[1], "' (see --help)"));
  if (const std::string layout = absl::GetFlag(FLAGS_layout); layout != "ddp") {
    return ShardedMain(layout, usage);
  }
  Args a;
  a.steps = absl::GetFlag(FLAGS_steps);
  a.rounds = absl::GetFlag(FLAGS_rounds);
  a.warmup = absl::GetFlag(FLAGS_warmup);
  a.turn_steps = absl::GetFlag(FLAGS_turn_steps);
  a.audit_every = absl::GetFlag(FLAGS_audit_every);
  a.weight_every = absl::GetFlag(FLAGS_weight_check_every);
  a.out_dir = absl::GetFlag(FLAGS_out_dir);
  a.trainer = absl::GetFlag(FLAGS_trainer);
  a.variants = absl::StrSplit(absl::GetFlag(FLAGS_variants), ',', absl::SkipEmpty());
  for (const auto& [flag, value, min] : {std::tuple<const char*, int, int>{"steps", a.steps, 1},
                                         {"rounds", a.rounds, 1},
                                         {"warmup", a.warmup, 0},
                                         {"turn_steps", a.turn_steps, 1},
                                         {"audit_every", a.audit_every, 1},
                                         {"weight_check_every", a.weight_every, 1}}) {
    if (value < min) usage(absl::StrCat("--", flag, " must be at least ", min, ", got ", value));
  }
  if (a.trainer != "cpp" && a.trainer != "python") usage("--trainer: cpp or python");
  for (const std::string& v : a.variants) {
    if (std::find(std::begin(kVariants), std::end(kVariants), v) == std::end(kVariants)) {
      usage(absl::StrCat("--variants: unknown loop '", v, "' (known: ", absl::StrJoin(kVariants, ","),
                         ")"));
    }
  }
  if (a.steps <= a.warmup || a.rounds < 1) return Fail("need --steps > --warmup and --rounds >= 1");
  const auto runs = [&](const char* v) {
    return std::find(a.variants.begin(), a.variants.end(), v) != a.variants.end();
  };
  if (!runs("unguarded") || !runs("guarded")) {
    return Fail("--variants must include unguarded and guarded (the overhead is between them)");
  }
  const bool keep = !a.out_dir.empty();
  if (a.out_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    a.out_dir = absl::StrCat(tmp ? tmp : "/tmp", "/sdc-overhead-", getpid());
  }
  demo::Run({"mkdir", "-p", a.out_dir});
  // What each step issues, guarded and unguarded; a non-audit step of the
  // guard must issue exactly what the unguarded step does (issue 43).
  const int count_steps = a.weight_every + 2;  // One weight-check step among them.
  std::fprintf(stderr, "counting collectives: %d steps unguarded and guarded...\n", count_steps);
  absl::StatusOr<CollectiveCounts> counts = CountCollectives(a, count_steps);
  if (!counts.ok()) return Fail(std::string(counts.status().message()));
  double collectives_unguarded = 0, collectives_guarded = 0;
  int ordinary = 0;
  for (const auto& [step, n] : counts->guarded) {
    if (counts->audited.at(step)) continue;
    if (n != counts->unguarded.at(step)) {
      return Fail(absl::StrCat("step ", step, " (no audit) issued ", n,
                               " collectives guarded against ", counts->unguarded.at(step),
                               " unguarded"));
    }
    collectives_unguarded += counts->unguarded.at(step);
    collectives_guarded += n;
    ++ordinary;
  }
  if (ordinary == 0) return Fail("counting: no step without an audit");
  collectives_unguarded /= ordinary;
  collectives_guarded /= ordinary;

  std::vector<double> unguarded, collective, guarded, audit_steps, plain_steps, weight_ms, check1_ms, audit_ms,
      agreement_ms, alone, alone_plain;
  // CPU seconds of every process a loop ran (trainers and sdcd, start-up
  // included), per step: a second view, less sensitive to waiting.
  std::map<std::string, std::vector<double>> cpu_ms;
  std::vector<double> sdcd_cpu_ms;  // sdcd's share of the guarded loop's.
  std::vector<std::string> round_overheads;  // overhead_pct of each round alone.
  for (int round = 0; round < a.rounds; ++round) {
    // The loops run at the same time and take turns of --turn_steps steps,
    // so the machine's drift over minutes (other tenants) falls on all of
    // them alike; run one after another, loops of identical code differed
    // by up to 20% here. Each round, a different loop goes first.
    std::vector<std::string> order;
    for (size_t i = 0; i < a.variants.size(); ++i) {
      order.push_back(a.variants[(i + round) % a.variants.size()]);
    }
    const std::string turn_file = absl::StrCat(a.out_dir, "/turn-", round);
    if (!WriteTurn(turn_file, order.front())) return Fail("cannot write " + turn_file);
    std::fprintf(stderr, "round %d/%d: %s, %d steps each, taking turns of %d steps...\n", round + 1,
                 a.rounds, absl::StrJoin(order, ", ").c_str(), a.steps, a.turn_steps);
    std::map<std::string, absl::StatusOr<demo::ClusterResult>> results;
    for (const std::string& name : order) results.emplace(name, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < order.size(); ++i) {
      const std::string& name = order[i];
      demo::ClusterConfig c;
      c.run_dir = absl::StrCat(a.out_dir, "/", name, "-", round);
      c.steps = a.steps;
      c.audit_every = a.audit_every;
      c.weight_check_every = a.weight_every;
      c.checkpoint_every = 0;
      c.trainer = a.trainer;
      c.unguarded = name == "unguarded" || name == "extra-collective";
      c.extra_collective = name == "extra-collective";
      c.no_coordinator = name == "guarded-no-sdcd";
      c.job_id = absl::StrCat("overhead-", round);
      c.turn_file = turn_file;
      c.turn_name = name;
      c.turn_next = order[(i + 1) % order.size()];
      c.turn_steps = a.turn_steps;
      c.timeout = absl::Minutes(90);
      threads.emplace_back([c, name, &results, &turn_file] {
        absl::StatusOr<demo::ClusterResult> r = demo::RunCluster(c);
        // A loop that failed holds no turn: the others run freely to the end.
        if (!r.ok()) WriteTurn(turn_file, "*");
        results.at(name) = std::move(r);
      });
    }
    for (std::thread& t : threads) t.join();
    const size_t unguarded_before = unguarded.size(), guarded_before = guarded.size();
    for (const std::string& name : order) {
      const absl::StatusOr<demo::ClusterResult>& r = results.at(name);
      if (!r.ok()) return Fail(absl::StrCat(name, ": ", r.status().message()));
      const bool guard = name == "guarded";
      const bool extra = name == "extra-collective";
      const bool no_sdcd = name == "guarded-no-sdcd";
      cpu_ms[name].push_back(r->cpu_seconds * 1000 / a.steps);
      if (guard) sdcd_cpu_ms.push_back(r->sdcd_cpu_seconds * 1000 / a.steps);
      if (guard && !r->incidents.empty()) return Fail("the guarded clean run raised an incident");
      if (const std::string wrong = CheckLoop(*r, a, guard || no_sdcd); !wrong.empty()) {
        return Fail(absl::StrCat(name, ": ", wrong));
      }
      // Slowest rank per step, and rank 0's record of what ran.
      std::map<int, double> slowest;
      for (const auto& rank : r->ranks) {
        for (const demo::StepRecord& s : rank) slowest[s.step] = std::max(slowest[s.step], s.ms);
      }
      std::vector<double> this_run;
      for (const auto& [step, ms] : slowest) {
        if (step > a.warmup) this_run.push_back(ms);
      }
      std::fprintf(stderr, "  %s: %.2f ms a step, %.1f CPU ms a step (all processes)\n",
                   name.c_str(), Mean(this_run), cpu_ms[name].back());
      for (const demo::StepRecord& s : r->ranks[0]) {
        if (s.step <= a.warmup) continue;
        const double ms = slowest[s.step];
        const bool weight = a.weight_every > 0 && s.step % a.weight_every == 0;
        if (no_sdcd) {
          alone.push_back(ms);
          if (!s.audited && !weight) alone_plain.push_back(ms);
          continue;
        }
        (guard ? guarded : extra ? collective : unguarded).push_back(ms);
        if (!guard) continue;
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
    const std::vector<double> u_round(unguarded.begin() + unguarded_before, unguarded.end());
    const std::vector<double> g_round(guarded.begin() + guarded_before, guarded.end());
    const double round_pct = (Mean(g_round) - Mean(u_round)) / Mean(u_round) * 100;
    round_overheads.push_back(absl::StrFormat("%.3f", round_pct));
    std::fprintf(stderr, "  round %d: guarded %+.2f%% over unguarded\n", round + 1, round_pct);
  }
  const double u = Mean(unguarded), g = Mean(guarded), x = Mean(collective);
  const std::string by_round = absl::StrJoin(round_overheads, ",");
  const double overhead = (g - u) / u * 100;
  const double audit_ratio = audit_steps.empty() ? -1 : Mean(audit_steps) / Mean(plain_steps);
  // Amortized at the cadence: one weight check every `weight_every` steps.
  const double weight_pct = Mean(weight_ms) / std::max(1, a.weight_every) / g * 100;
  const double check1_pct = Mean(check1_ms) / g * 100;
  std::printf("6 ranks (3 nodes x 2 GPUs, CPU, Gloo), %s trainers, %d steps x %d rounds per "
              "variant, in turns of %d steps\n",
              a.trainer == "python" ? "Python DDP" : "C++", a.steps, a.rounds, a.turn_steps);
  std::printf("%-40s %10.2f     unguarded, %.2f guarded (%d steps without an audit, weight "
              "checks included)\n",
              "collectives a step", collectives_unguarded, collectives_guarded, ordinary);
  std::printf("%-40s %10.2f ms\n", "step, unguarded", u);
  if (!collective.empty()) {
    std::printf("%-40s %10.2f ms  (%+.2f ms: one more collective)\n",
                "step, unguarded + agreement exchange", x, x - u);
  }
  std::printf("%-40s %10.2f ms  (%+.2f%%)\n", "step, guarded (end to end)", g, overhead);
  if (!collective.empty()) {
    std::printf("%-40s %10.2f ms  (%+.2f ms over the loop with one more collective)\n",
                "step, guarded, no audit or weight check", Mean(plain_steps),
                Mean(plain_steps) - x);
  }
  if (!alone.empty()) {
    std::printf("%-40s %10.2f ms  (%+.2f%%; plain steps %.2f ms, %+.2f ms against sdcd attached)\n",
                "step, guarded, no coordinator", Mean(alone), (Mean(alone) - u) / u * 100,
                Mean(alone_plain), Mean(plain_steps) - Mean(alone_plain));
  }
  const double cpu_u = Mean(cpu_ms["unguarded"]), cpu_g = Mean(cpu_ms["guarded"]);
  const double cpu_overhead = (cpu_g - cpu_u) / cpu_u * 100;
  std::printf("%-40s %10.1f ms  unguarded, %.1f ms guarded (%+.2f%%)\n",
              "CPU a step, all processes", cpu_u, cpu_g, cpu_overhead);
  std::printf("%-40s %10.1f ms  (%.2f%% of the guarded loop's)\n", "CPU a step, sdcd alone",
              Mean(sdcd_cpu_ms), Mean(sdcd_cpu_ms) / cpu_g * 100);
  if (!alone.empty()) {
    std::printf("%-40s %10.1f ms  (the guard without sdcd and report streams)\n",
                "CPU a step, guarded, no coordinator", Mean(cpu_ms["guarded-no-sdcd"]));
  }
  std::printf("%-40s %10.2f ms  (%.2fx a plain guarded step, %zu samples)\n", "audit step",
              Mean(audit_steps), audit_ratio, audit_steps.size());
  std::printf("%-40s %10.3f ms  (%.3f%% of a step, amortized over %d steps)\n",
              "weight check", Mean(weight_ms), weight_pct, a.weight_every);
  std::printf("%-40s %10.3f ms  (%.3f%% of a step)\n", "check 1 (scans and digest)",
              Mean(check1_ms), check1_pct);
  std::printf("%-40s %10.3f ms  (waiting for the slowest rank included)\n",
              "agreement exchange", Mean(agreement_ms));
  // Figures of loops that did not run are null, never zero.
  auto number = [](bool ran, double v) { return ran ? absl::StrFormat("%.3f", v) : std::string("null"); };
  std::printf(
      "{\"ranks\":6,\"steps\":%d,\"rounds\":%d,\"step_ms_unguarded\":%.3f,\"step_ms_guarded\":%.3f,"
      "\"overhead_pct\":%.3f,\"audit_step_ratio\":%.3f,\"audit_step_ms\":%.3f,"
      "\"weight_check_ms\":%.3f,\"weight_check_pct_of_step\":%.4f,"
      "\"nonfinite_check_ms\":%.3f,\"nonfinite_check_pct_of_step\":%.4f,"
      "\"agreement_ms\":%.3f,\"step_ms_unguarded_extra_collective\":%s,"
      "\"extra_collective_ms\":%s,\"step_ms_guarded_plain\":%.3f,"
      "\"step_ms_guarded_no_sdcd\":%s,\"step_ms_guarded_no_sdcd_plain\":%s,"
      "\"cpu_ms_per_step_unguarded\":%.2f,\"cpu_ms_per_step_guarded\":%.2f,"
      "\"cpu_overhead_pct\":%.3f,\"cpu_ms_per_step_guarded_no_sdcd\":%s,\"cpu_ms_per_step_sdcd\":%.2f,"
      "\"turn_steps\":%d,\"overhead_pct_by_round\":[%s],\"trainer\":\"%s\",\"layout\":\"ddp\","
      "\"collectives_per_step_unguarded\":%.2f,\"collectives_per_step_guarded\":%.2f}\n",
      a.steps, a.rounds, u, g, overhead, audit_ratio, Mean(audit_steps), Mean(weight_ms),
      weight_pct, Mean(check1_ms), check1_pct, Mean(agreement_ms),
      number(!collective.empty(), x).c_str(), number(!collective.empty(), x - u).c_str(),
      Mean(plain_steps), number(!alone.empty(), Mean(alone)).c_str(),
      number(!alone.empty(), Mean(alone_plain)).c_str(), cpu_u, cpu_g, cpu_overhead,
      number(!alone.empty(), Mean(cpu_ms["guarded-no-sdcd"])).c_str(), Mean(sdcd_cpu_ms),
      a.turn_steps, by_round.c_str(), a.trainer.c_str(), collectives_unguarded,
      collectives_guarded);
  if (keep) {
    std::fprintf(stderr, "runs kept in %s\n", a.out_dir.c_str());
  } else {
    demo::Run({"rm", "-rf", a.out_dir});
  }
  return 0;
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) { return sdc::bench::Main(argc, argv); }
