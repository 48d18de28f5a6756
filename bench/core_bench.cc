// ./sdc bench core: the coordinator core at cluster scale, in one process:
// 16,384 ranks (2,048 nodes x 8 GPUs), 1,000 weight
// tensors. Every report goes through Coordinator::Ingest with the in-memory
// store, exactly as the service calls it.
//
//   healthy_vote_ms   the vote itself: the Ingest call of the last weight
//                     report of a step, when all 16,384 ranks agree
//   minority_vote_ms  the same when 3 ranks differ in a few tensors (the
//                     minority is compared tensor by tensor)
//   attribution_ms    the Ingest call that completes a replay audit of 16,384
//                     ranks with one faulty rank and attributes it
// and, for the whole step, the time to ingest every report
// (weight_step_ingest_ms, audit_step_ingest_ms). Last line: JSON.

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/coordinator.h"
#include "kernels/model_digest.h"

ABSL_FLAG(uint32_t, ranks, 16384, "Ranks attached to the coordinator (at least 24).");
ABSL_FLAG(uint32_t, tensors, 1000, "Tensors per rank's model (at least 8).");

namespace sdc::bench {
namespace {

using namespace sdc::core;  // NOLINT: a benchmark of the core.

constexpr uint32_t kGpusPerNode = 8;

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double PeakRssMib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "core_bench: %s\n", what.c_str());
  return 1;
}

struct Timing {
  double last_ms = 0;   // The Ingest call that completed the check.
  double total_ms = 0;  // Every report of the step.
};

class Bench {
 public:
  Bench(uint32_t ranks, uint32_t tensors)
      : ranks_(ranks), coordinator_(CoordinatorOptions{}, &clock_, &store_) {
    for (uint32_t t = 0; t < tensors; ++t) names_.push_back(absl::StrCat("layers.", t, ".weight"));
    healthy_ = MakeWeights(0, {});
  }

  absl::Status AttachAll() {
    for (Rank r = 0; r < ranks_; ++r) {
      Hello h;
      h.job_id = "bench";
      h.placement = {r, absl::StrCat("node-", r / kGpusPerNode), r % kGpusPerNode,
                     absl::StrCat("GPU-", r), 0};
      h.world_size = ranks_;
      h.incarnation = 1;
      h.weight_tensors = names_;
      h.parameter_count = static_cast<uint32_t>(names_.size());
      h.layout_digest = 1;
      h.deterministic = true;
      h.audit_every = 100;
      h.weight_check_every = 10;
      absl::StatusOr<AttachResult> a = coordinator_.Attach(h);
      if (!a.ok()) return a.status();
    }
    return absl::OkStatus();
  }

  WeightReport MakeWeights(uint64_t salt, const std::vector<uint32_t>& corrupt) const {
    WeightReport w;
    kernels::ModelDigestBuilder digest;
    for (uint32_t t = 0; t < names_.size(); ++t) {
      Fingerprint fp{4096, 0x1000 + t, 0x2000 + t};
      for (uint32_t c : corrupt) fp.s1 += (c == t) ? salt : 0;
      w.tensors.push_back(fp);
      digest.Add(names_[t], fp);
    }
    w.digest = digest.Finish();
    return w;
  }

  // Every rank's weight report of `step`; `minority` ranks send `bad`.
  absl::StatusOr<Timing> WeightStep(Step step, const std::vector<Rank>& minority,
                                    const WeightReport& bad) {
    Report report;
    report.job_id = "bench";
    report.step = step;
    report.incarnation = 1;
    Report odd = report;
    report.body = healthy_;
    odd.body = bad;
    Timing t;
    const auto start = std::chrono::steady_clock::now();
    for (Rank r = 0; r < ranks_; ++r) {
      const bool is_bad = std::find(minority.begin(), minority.end(), r) != minority.end();
      Report& rep = is_bad ? odd : report;
      rep.rank = r;
      rep.sequence = ++sequence_[r];
      const auto call = std::chrono::steady_clock::now();
      absl::StatusOr<Effects> e = coordinator_.Ingest(rep);
      if (!e.ok()) return e.status();
      if (r + 1 == ranks_) t.last_ms = Ms(std::chrono::steady_clock::now() - call);
    }
    t.total_ms = Ms(std::chrono::steady_clock::now() - start);
    return t;
  }

  // A scheduled audit of `step` where `faulty` is wrong in both roles.
  absl::StatusOr<Timing> AuditStep(Step step, Rank faulty) {
    std::vector<PlanMember> members;
    for (Rank r = 0; r < ranks_; ++r) members.push_back({r, absl::StrCat("node-", r / kGpusPerNode)});
    const Topology topology(std::move(members));
    const ReplayPlan plan = PlanFullAudit(topology, step / 100);
    Report report;
    report.job_id = "bench";
    report.step = step;
    report.incarnation = 1;
    Timing t;
    const auto start = std::chrono::steady_clock::now();
    auto send = [&](Rank r, AuditRole role, Rank subject, bool wrong) -> absl::Status {
      AuditResult a;
      a.role = role;
      a.subject = subject;
      a.loss_bits = 0x3ff0000000000000ull + subject + (wrong ? 1 : 0);
      a.gradient_digest = a.loss_bits * 31;
      report.rank = r;
      report.sequence = ++sequence_[r];
      report.body = std::move(a);
      const auto call = std::chrono::steady_clock::now();
      absl::StatusOr<Effects> e = coordinator_.Ingest(report);
      t.last_ms = Ms(std::chrono::steady_clock::now() - call);
      return e.status();
    };
    for (Rank r = 0; r < ranks_; ++r) {
      if (absl::Status s = send(r, AuditRole::kOriginal, r, r == faulty); !s.ok()) return s;
    }
    for (const Assignment& a : plan.assignments) {
      if (absl::Status s = send(a.replayer, AuditRole::kReplay, a.subject, a.replayer == faulty);
          !s.ok()) {
        return s;
      }
    }
    t.total_ms = Ms(std::chrono::steady_clock::now() - start);
    return t;
  }

  Coordinator& coordinator() { return coordinator_; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  const uint32_t ranks_;
  std::vector<std::string> names_;
  WeightReport healthy_;
  FakeClock clock_;
  MemoryStore store_;
  Coordinator coordinator_;
  std::map<Rank, uint64_t> sequence_;
};

int Main(int argc, char** argv) {
  // Abseil here is built with mutex deadlock detection on: a graph walk on
  // every lock. Production code does not pay for a debugging aid.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "the coordinator core's vote and attribution at scale, in process.\n"
      "  core_bench [--ranks=N] [--tensors=N]");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument '", rest[1], "' (see --help)"));
  const uint32_t ranks = absl::GetFlag(FLAGS_ranks);
  const uint32_t tensors = absl::GetFlag(FLAGS_tensors);
  if (ranks < 3 * kGpusPerNode || tensors < 8) return Fail("need --ranks >= 24 and --tensors >= 8");
  Bench bench(ranks, tensors);
  std::fprintf(stderr, "attaching %u ranks (%u nodes x %u GPUs), %u tensors...\n", ranks,
               ranks / kGpusPerNode, kGpusPerNode, tensors);
  if (absl::Status s = bench.AttachAll(); !s.ok()) return Fail(s.ToString());

  // Warm-up step, then the measured healthy step.
  if (auto w = bench.WeightStep(10, {}, {}); !w.ok()) return Fail(w.status().ToString());
  absl::StatusOr<Timing> healthy = bench.WeightStep(20, {}, {});
  if (!healthy.ok()) return Fail(healthy.status().ToString());
  if (!bench.coordinator().ListIncidents("bench").empty()) return Fail("healthy vote raised an incident");

  const std::vector<Rank> minority = {17, ranks / 2, ranks - 5};
  const WeightReport bad = bench.MakeWeights(1, {3, 500 % tensors, tensors - 1});
  absl::StatusOr<Timing> minority_vote = bench.WeightStep(30, minority, bad);
  if (!minority_vote.ok()) return Fail(minority_vote.status().ToString());
  std::vector<Incident> incidents = bench.coordinator().ListIncidents("bench");
  if (incidents.size() != 1 || incidents[0].ranks != minority ||
      incidents[0].differing_tensors.size() != 3) {
    return Fail("minority vote did not name exactly the 3 minority ranks and 3 tensors");
  }

  const Rank faulty = ranks / 3;
  absl::StatusOr<Timing> audit = bench.AuditStep(100, faulty);
  if (!audit.ok()) return Fail(audit.status().ToString());
  incidents = bench.coordinator().ListIncidents("bench");
  if (incidents.size() != 2 || incidents[1].ranks != std::vector<Rank>{faulty}) {
    return Fail("the audit did not attribute exactly the faulty rank");
  }

  const double rss = PeakRssMib();
  std::printf("ranks %u, tensors %u\n", ranks, tensors);
  std::printf("%-34s %10s %12s\n", "", "decide ms", "ingest ms");
  std::printf("%-34s %10.2f %12.1f\n", "weight vote, all agree", healthy->last_ms,
              healthy->total_ms);
  std::printf("%-34s %10.2f %12.1f\n", "weight vote, 3 ranks differ", minority_vote->last_ms,
              minority_vote->total_ms);
  std::printf("%-34s %10.2f %12.1f\n", "replay audit, 1 faulty rank", audit->last_ms,
              audit->total_ms);
  std::printf("peak RSS %.0f MiB\n", rss);
  std::printf(
      "{\"ranks\":%u,\"tensors\":%u,\"healthy_vote_ms\":%.3f,\"minority_vote_ms\":%.3f,"
      "\"attribution_ms\":%.3f,\"weight_step_ingest_ms\":%.1f,"
      "\"minority_step_ingest_ms\":%.1f,\"audit_step_ingest_ms\":%.1f,\"peak_rss_mib\":%.0f}\n",
      ranks, tensors, healthy->last_ms, minority_vote->last_ms, audit->last_ms,
      healthy->total_ms, minority_vote->total_ms, audit->total_ms, rss);
  return 0;
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) { return sdc::bench::Main(argc, argv); }
