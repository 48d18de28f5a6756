// ./sdc bench watch: what the watch of a GPU named faulty costs while its
// replacement request waits (issue 42 item 4). One run of the demo's
// cluster (3 nodes x 2 ranks, Gloo, a real sdcd that requires approval):
// rank 3 corrupts one step, the scheduled audit at --fault_step; it is named
// and its request stays pending, so from a few steps later every step runs
// the watch (a rank of another node replays rank 3's micro-batch). Set
// against each other, in the same run: the plain steps before the naming
// (no audit, no weight check) and the watch steps after it (no scheduled
// audit, no weight check), as the slowest rank's step time; and the watch
// replayer's audit time (its replay, the micro-batch transfer and the
// in-band verdict) on the watch steps. The bench checks the run first: rank
// 3 named, one request, the watch on every step from its first, no other
// step skipped. Last line: JSON.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/json_text.h"
#include "demo/launcher.h"
#include "demo/process.h"
#include "demo/progress_line.h"
#include "protocol/replay_plan.h"

ABSL_FLAG(int, steps, 120, "Steps of the run.");
ABSL_FLAG(int, fault_step, 40,
          "The step rank 3 corrupts (made a scheduled audit: --audit_every is set to it).");
ABSL_FLAG(int, weight_check_every, 10, "A weight check every N steps (left out of both sides).");
ABSL_FLAG(std::string, out_dir, "", "Where the run folder goes, kept (default: a temporary one).");

namespace sdc::bench {
namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "watch bench: %s\n", why.c_str());
  return 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "./sdc bench watch [--steps=N] [--fault_step=N] [--weight_check_every=N] [--out_dir=DIR]");
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int fault_step = absl::GetFlag(FLAGS_fault_step);
  const int weight_every = absl::GetFlag(FLAGS_weight_check_every);
  if (fault_step < 5 || steps < fault_step + 10) {
    return Fail("needs --fault_step >= 5 and --steps >= --fault_step + 10");
  }
  if (weight_every < 1) return Fail("--weight_check_every must be >= 1");
  std::string dir = absl::GetFlag(FLAGS_out_dir);
  const bool keep = !dir.empty();
  if (!keep) {
    const char* tmp = std::getenv("TMPDIR");
    dir = absl::StrCat(tmp ? tmp : "/tmp", "/sdc-watch-", getpid());
  }
  demo::Run({"rm", "-rf", dir});
  demo::Run({"mkdir", "-p", dir});
  demo::ClusterConfig c;
  c.run_dir = dir;
  c.steps = steps;
  c.audit_every = fault_step;
  c.weight_check_every = weight_every;
  c.checkpoint_every = 0;  // None: checkpoints are not what is measured.
  c.fault = absl::StrCat("activation-scale:3:step=", fault_step, ":10000");
  c.job_id = "watch-bench";
  const absl::Time start = absl::Now();
  absl::StatusOr<demo::ClusterResult> r = demo::RunCluster(c);
  if (!r.ok()) return Fail(r.status().ToString());
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - start);

  // The run is what the figures claim it is.
  if (r->requests.size() != 1 || r->requests[0].node_name() != "node-b") {
    return Fail(absl::StrCat(r->requests.size(), " replacement requests; expected one, node-b's"));
  }
  bool named = false;
  for (const v1::Incident& i : r->incidents) {
    named |= i.confirmed() && i.ranks_size() == 1 && i.ranks(0) == 3 &&
             static_cast<int>(i.step()) == fault_step;
  }
  if (!named) return Fail(absl::StrCat("rank 3 was not named at step ", fault_step));
  const uint32_t world = static_cast<uint32_t>(r->ranks.size());
  auto scheduled = [&](int s) { return s % fault_step == 0; };
  auto weight = [&](int s) { return s % weight_every == 0; };
  int watch_from = -1;
  for (const demo::StepRecord& s : r->ranks[0]) {
    if (s.step > fault_step && s.audited && !scheduled(s.step)) {
      watch_from = s.step;
      break;
    }
  }
  if (watch_from < 0) return Fail("the watch never ran");
  // Who replays rank 3 under the watch: sdcd's plan (PlanWatch, salt 0),
  // derived here the same way from the cluster's placement.
  std::vector<protocol::PlanMember> members;
  for (uint32_t k = 0; k < world; ++k) {
    members.push_back({k, demo::NodeName(static_cast<int>(k) / c.gpus_per_node)});
  }
  const std::vector<protocol::Assignment> watch =
      protocol::PlanWatch(protocol::Topology(members), {3}, 0).assignments;
  if (watch.size() != 1) return Fail("no replayer for rank 3 in the watch plan");
  const size_t replayer = watch[0].replayer;
  std::vector<double> plain_ms, watch_ms;
  std::vector<std::vector<double>> audit_ms(world);
  for (size_t i = 0; i < r->ranks[0].size(); ++i) {
    const int s = r->ranks[0][i].step;
    double slowest = 0;
    for (size_t k = 0; k < world; ++k) {
      const demo::StepRecord& rec = r->ranks[k][i];
      if (rec.step != s) return Fail("the ranks' step records are not aligned");
      slowest = std::max(slowest, rec.ms);
      if (s >= watch_from && !scheduled(s) && !weight(s)) {
        if (!rec.audited) return Fail(absl::StrCat("step ", s, " ran no watch on rank ", k));
        if (!rec.apply) return Fail(absl::StrCat("step ", s, " was skipped on rank ", k));
        audit_ms[k].push_back(rec.audit_ms);
      }
    }
    if (s > 5 && s < fault_step && !weight(s)) plain_ms.push_back(slowest);
    if (s >= watch_from && !scheduled(s) && !weight(s)) watch_ms.push_back(slowest);
  }
  if (plain_ms.size() < 5 || watch_ms.size() < 5) {
    return Fail(absl::StrCat(plain_ms.size(), " plain and ", watch_ms.size(),
                             " watch steps: too few to compare (more --steps)"));
  }
  const double plain = Median(plain_ms);
  const double watched = Median(watch_ms);
  const double replay = Median(audit_ms[replayer]);
  std::printf("watch of rank 3 (named at step %d): in force from step %d, %zu watch steps\n",
              fault_step, watch_from, watch_ms.size());
  std::printf("  plain step (slowest rank, median):        %8.2f ms (%zu steps)\n", plain,
              plain_ms.size());
  std::printf("  watch step (slowest rank, median):        %8.2f ms  = %.2f x the plain step\n",
              watched, watched / plain);
  std::printf("  watch audit on rank %zu, the replayer:      %8.2f ms  = %.2f of a plain step\n",
              replayer, replay, replay / plain);
  std::printf("  wall %.1f s; run folder %s\n", wall_s, keep ? dir.c_str() : "(deleted)");
  if (!keep) demo::Run({"rm", "-rf", dir});
  std::printf(
      "{\"plain_step_ms\": %s, \"watch_step_ms\": %s, \"watch_step_ratio\": %s, "
      "\"replayer_audit_ms\": %s, \"replayer_audit_ratio\": %s, \"watch_steps\": %zu, "
      "\"wall_s\": %s}\n",
      JsonNumberOrNull(plain).c_str(), JsonNumberOrNull(watched).c_str(),
      JsonNumberOrNull(watched / plain).c_str(), JsonNumberOrNull(replay).c_str(),
      JsonNumberOrNull(replay / plain).c_str(), watch_ms.size(), JsonNumberOrNull(wall_s).c_str());
  return 0;
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) { return sdc::bench::Main(argc, argv); }
