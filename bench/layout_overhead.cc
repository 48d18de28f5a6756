#include "bench/layout_overhead.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "demo/launcher.h"

namespace sdc::bench {

bool WriteTurn(const std::string& path, const std::string& name) {
  const std::string tmp = path + ".bench";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << name << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

namespace {

constexpr int kNodes = 3;
constexpr int kGpusPerNode = 2;

bool HasBuddy(const std::string& layout) { return layout == "fsdp" || layout == "zero"; }
bool ShardedReplay(const std::string& layout) {
  return layout == "fsdp" || layout == "hsdp" || layout == "tp";
}

// One layout's figures over its rounds.
struct LayoutFigures {
  std::vector<double> unguarded, guarded, plain, audit_steps;
  std::vector<std::string> by_round;  // overhead_pct of each round alone.
  int audits = 0;                     // Rank 0's audited steps, all rounds.
  double sharded_audit_ms = 0;        // Per audit and rank (summary counters).
  int64_t buddy_checks = 0;           // Per rank, all rounds.
  double buddy_bytes_per_check = 0;   // Per rank and check.
  double buddy_ms_per_check = 0;
  int incidents = 0;
};

int64_t Counter(const std::map<std::string, int64_t>& g, const std::string& name) {
  const auto it = g.find(name);
  return it == g.end() ? -1 : it->second;
}

// What makes a run's timings worth printing (see the header). Returns what
// went wrong, or "".
std::string CheckRun(const demo::ClusterResult& r, const LayoutOverheadArgs& a,
                     const std::string& layout, bool guarded) {
  if (static_cast<int>(r.ranks.size()) != kNodes * kGpusPerNode) {
    return absl::StrCat(r.ranks.size(), " ranks recorded");
  }
  if (std::string applied = EveryStepApplied(r, a.steps); !applied.empty()) return applied;
  if (r.weight_digests.size() != r.ranks.size()) return "no final weights";
  for (const std::string& d : r.weight_digests) {
    if (d.empty() || d != r.weight_digests[0]) return "the ranks' full weights differ at the end";
  }
  if (!guarded) return "";
  if (!r.incidents.empty() || !r.suspects.empty()) {
    return absl::StrCat("the clean run raised ", r.incidents.size(), " incident(s) and ",
                        r.suspects.size(), " suspect(s)");
  }
  for (const demo::StepRecord& s : r.ranks[0]) {
    const bool due = s.step % a.audit_every == 0;
    if (s.audited != due) {
      return absl::StrCat("step ", s.step, due ? " was due an audit and had none"
                                               : " was audited off the cadence");
    }
    if (s.audited && s.outcome != "pass") {
      return absl::StrCat("the audit of step ", s.step, " ended ", s.outcome);
    }
  }
  const int64_t audits = a.steps / a.audit_every, checks = a.steps / a.weight_every;
  for (size_t rank = 0; rank < r.guard_summaries.size(); ++rank) {
    const auto& g = r.guard_summaries[rank];
    const auto expect = [&](const char* name, int64_t want) -> std::string {
      const int64_t got = Counter(g, name);
      if (got == want) return "";
      return absl::StrCat("rank ", rank, ": ", name, " ", got, ", expected ", want);
    };
    for (const std::string& wrong :
         {expect("buddy_checks", HasBuddy(layout) ? checks : 0),
          expect("buddy_findings", 0),
          expect("sharded_audits", ShardedReplay(layout) ? audits : 0),
          expect("sharded_audit_mismatches", 0),
          expect("skipped", 0)}) {
      if (!wrong.empty()) return wrong;
    }
  }
  return "";
}

demo::ClusterConfig Config(const LayoutOverheadArgs& a, const std::string& layout,
                           const std::string& name, int round) {
  demo::ClusterConfig c;
  c.run_dir = absl::StrCat(a.out_dir, "/", layout, "-", name, "-", round);
  c.nodes = kNodes;
  c.gpus_per_node = kGpusPerNode;
  c.steps = a.steps;
  c.audit_every = a.audit_every;
  c.weight_check_every = a.weight_every;
  c.checkpoint_every = 0;
  c.trainer = "python";
  c.layout = layout;
  c.unguarded = name == "unguarded";
  c.job_id = absl::StrCat("overhead-", layout, "-", round);
  c.turn_steps = a.turn_steps;
  c.timeout = absl::Minutes(30);
  return c;
}

// Runs `layout`'s rounds; fills `f` or returns what went wrong.
std::string RunLayout(const LayoutOverheadArgs& a, const std::string& layout, LayoutFigures& f) {
  double audit_ms_sum = 0, buddy_bytes = 0, buddy_ms = 0;
  int64_t audit_count = 0;
  for (int round = 0; round < a.rounds; ++round) {
    const std::vector<std::string> order = round % 2 == 0
                                               ? std::vector<std::string>{"unguarded", "guarded"}
                                               : std::vector<std::string>{"guarded", "unguarded"};
    const std::string turn_file = absl::StrCat(a.out_dir, "/turn-", layout, "-", round);
    if (!WriteTurn(turn_file, order.front())) return "cannot write " + turn_file;
    std::fprintf(stderr, "%s round %d/%d: %s, %d steps each, taking turns of %d steps...\n",
                 layout.c_str(), round + 1, a.rounds, absl::StrJoin(order, ", ").c_str(), a.steps,
                 a.turn_steps);
    std::map<std::string, absl::StatusOr<demo::ClusterResult>> results;
    for (const std::string& name : order) results.emplace(name, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < order.size(); ++i) {
      demo::ClusterConfig c = Config(a, layout, order[i], round);
      c.turn_file = turn_file;
      c.turn_name = order[i];
      c.turn_next = order[(i + 1) % order.size()];
      threads.emplace_back([c, name = order[i], &results, &turn_file] {
        absl::StatusOr<demo::ClusterResult> r = demo::RunCluster(c);
        if (!r.ok()) WriteTurn(turn_file, "*");  // The other loop runs freely to its end.
        results.at(name) = std::move(r);
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::string& name : order) {
      const absl::StatusOr<demo::ClusterResult>& r = results.at(name);
      if (!r.ok()) return absl::StrCat(name, ": ", r.status().message());
      if (std::string wrong = CheckRun(*r, a, layout, name == "guarded"); !wrong.empty()) {
        return absl::StrCat(name, ": ", wrong);
      }
    }
    const demo::ClusterResult& u = *results.at("unguarded");
    const demo::ClusterResult& g = *results.at("guarded");
    if (g.weight_digests[0] != u.weight_digests[0]) {
      return absl::StrCat("round ", round + 1, ": the guarded job's weights (", g.weight_digests[0],
                          ") are not the unguarded job's (", u.weight_digests[0], ")");
    }
    std::map<std::string, std::vector<double>> round_ms;
    for (const std::string& name : order) {
      const demo::ClusterResult& r = *results.at(name);
      std::map<int, double> slowest;
      for (const auto& rank : r.ranks) {
        for (const demo::StepRecord& s : rank) slowest[s.step] = std::max(slowest[s.step], s.ms);
      }
      const bool guarded = name == "guarded";
      for (const demo::StepRecord& s : r.ranks[0]) {
        if (s.step <= a.warmup) continue;
        const double ms = slowest[s.step];
        round_ms[name].push_back(ms);
        (guarded ? f.guarded : f.unguarded).push_back(ms);
        if (!guarded) continue;
        const bool weight = s.step % a.weight_every == 0;
        if (s.audited) {
          f.audit_steps.push_back(ms);
        } else if (!weight) {
          f.plain.push_back(ms);
        }
      }
      if (!guarded) continue;
      for (const demo::StepRecord& s : r.ranks[0]) f.audits += s.audited ? 1 : 0;
      for (const auto& summary : r.guard_summaries) {
        if (ShardedReplay(layout)) {
          audit_ms_sum += Counter(summary, "sharded_audit_us") / 1000.0;
          audit_count += Counter(summary, "sharded_audits");
        }
        if (HasBuddy(layout)) {
          buddy_bytes += Counter(summary, "buddy_bytes_sent");
          buddy_ms += Counter(summary, "buddy_us") / 1000.0;
          f.buddy_checks += Counter(summary, "buddy_checks");
        }
      }
    }
    const double mu = Mean(round_ms["unguarded"]), mg = Mean(round_ms["guarded"]);
    f.by_round.push_back(absl::StrFormat("%.3f", (mg - mu) / mu * 100));
    std::fprintf(stderr, "  %s round %d: unguarded %.2f ms, guarded %.2f ms a step (%+.2f%%)\n",
                 layout.c_str(), round + 1, mu, mg, (mg - mu) / mu * 100);
  }
  f.sharded_audit_ms = audit_count > 0 ? audit_ms_sum / audit_count : 0;
  // buddy_checks summed over ranks: per rank and check.
  f.buddy_bytes_per_check = f.buddy_checks > 0 ? buddy_bytes / f.buddy_checks : 0;
  f.buddy_ms_per_check = f.buddy_checks > 0 ? buddy_ms / f.buddy_checks : 0;
  f.buddy_checks /= kNodes * kGpusPerNode;  // Reported per rank.
  return "";
}

}  // namespace

std::string EveryStepApplied(const demo::ClusterResult& r, int steps) {
  for (size_t rank = 0; rank < r.ranks.size(); ++rank) {
    if (static_cast<int>(r.ranks[rank].size()) != steps) {
      return absl::StrCat("rank ", rank, " recorded ", r.ranks[rank].size(), " of ", steps,
                          " steps");
    }
    for (const demo::StepRecord& s : r.ranks[rank]) {
      if (!s.apply) {
        return absl::StrCat("rank ", rank, " skipped step ", s.step, " (", s.reason, ")");
      }
    }
  }
  return "";
}

int RunLayoutOverhead(const LayoutOverheadArgs& a) {
  std::map<std::string, LayoutFigures> figures;
  for (const std::string& layout : a.layouts) {
    LayoutFigures f;
    if (const std::string wrong = RunLayout(a, layout, f); !wrong.empty()) {
      std::fprintf(stderr, "overhead_bench: --layout=%s: %s\n", layout.c_str(), wrong.c_str());
      return 1;
    }
    figures.emplace(layout, std::move(f));
  }
  std::printf("6 ranks (3 nodes x 2 GPUs, CPU, Gloo), examples/ddp_train.py per layout, "
              "unguarded against guarded, %d steps x %d rounds, turns of %d steps; audit every "
              "%d, weight check every %d\n",
              a.steps, a.rounds, a.turn_steps, a.audit_every, a.weight_every);
  std::string json = absl::StrFormat(
      "{\"ranks\":6,\"steps\":%d,\"rounds\":%d,\"turn_steps\":%d,\"trainer\":\"python\","
      "\"layout\":\"%s\",\"audit_every\":%d,\"weight_check_every\":%d,\"layouts\":{",
      a.steps, a.rounds, a.turn_steps, absl::StrJoin(a.layouts, ","), a.audit_every,
      a.weight_every);
  bool first = true;
  for (const std::string& layout : a.layouts) {
    const LayoutFigures& f = figures.at(layout);
    const double u = Mean(f.unguarded), g = Mean(f.guarded), pct = (g - u) / u * 100;
    const bool buddy = HasBuddy(layout), sharded = ShardedReplay(layout);
    std::printf("%s:\n", layout.c_str());
    std::printf("  %-38s %10.2f ms\n", "step, unguarded", u);
    std::printf("  %-38s %10.2f ms  (%+.2f%%; rounds %s)\n", "step, guarded (end to end)", g, pct,
                absl::StrJoin(f.by_round, ", ").c_str());
    std::printf("  %-38s %10.2f ms  (%+.2f%%)\n", "step, guarded, no audit or weight check",
                Mean(f.plain), (Mean(f.plain) - u) / u * 100);
    std::printf("  %-38s %10.2f ms  (%zu samples; %s)\n", "audit step", Mean(f.audit_steps),
                f.audit_steps.size(),
                sharded ? absl::StrFormat("the sharded replay, %.1f ms an audit per rank",
                                          f.sharded_audit_ms).c_str()
                        : "the engine's replay audit");
    if (buddy) {
      std::printf("  %-38s %10.0f B   %.1f ms a check per rank (%lld checks per rank)\n",
                  "buddy check, sent per rank", f.buddy_bytes_per_check, f.buddy_ms_per_check,
                  static_cast<long long>(f.buddy_checks));
    } else {
      std::printf("  %-38s %10s     (%s replicas vote per shard instead)\n", "buddy check",
                  "none", layout == "tp" ? "tp's (dp x tp)" : "HSDP's");
    }
    std::printf("  %-38s %10s     (0 incidents, 0 suspects, every audit passed)\n",
                "guarded weights = unguarded", "bit for bit");
    absl::StrAppendFormat(
        &json,
        "%s\"%s\":{\"step_ms_unguarded\":%.3f,\"step_ms_guarded\":%.3f,\"overhead_pct\":%.3f,"
        "\"overhead_pct_by_round\":[%s],\"step_ms_guarded_plain\":%.3f,\"audit_step_ms\":%.3f,"
        "\"audits\":%d,\"sharded_audit_ms\":%s,\"buddy_checks\":%s,"
        "\"buddy_bytes_per_check\":%s,\"buddy_ms_per_check\":%s,\"bit_identical\":true,"
        "\"incidents\":%d}",
        first ? "" : ",", layout, u, g, pct, absl::StrJoin(f.by_round, ","), Mean(f.plain),
        Mean(f.audit_steps), f.audits,
        sharded ? absl::StrFormat("%.3f", f.sharded_audit_ms) : "null",
        buddy ? absl::StrCat(f.buddy_checks) : "null",
        buddy ? absl::StrFormat("%.0f", f.buddy_bytes_per_check) : "null",
        buddy ? absl::StrFormat("%.3f", f.buddy_ms_per_check) : "null", f.incidents);
    first = false;
  }
  std::printf("%s}}\n", json.c_str());
  return 0;
}

}  // namespace sdc::bench
