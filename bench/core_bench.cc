// ./sdc bench core: the coordinator core at cluster scale, in one process:
// 16,384 ranks (2,048 nodes x 8 GPUs), 1,000 weight
// tensors. Every report goes through Coordinator::Ingest with the in-memory
// store, exactly as the service calls it.
//
//   healthy_vote_ms     the vote itself: the Ingest call of the last weight
//                       report of a step, when all 16,384 ranks agree
//   minority_vote_ms    the same when 3 ranks differ in a few tensors (the
//                       minority is compared tensor by tensor)
//   attribution_ms      attributing one faulty rank in a ring replay audit of
//                       16,384 ranks, tie-break included: the Ingest call
//                       that completes the ring (Attribute, which asks for
//                       tie-breaks) plus the calls that take the tie-break
//                       results, the last of which names the rank
//   attribution_ring_ms the first of those alone (Attribute over the ring)
//   tiebreak_ms         the rest: the tie-break results' Ingest calls
//   tiebreak_settle_ms  the last of them (settles the verdict, records the
//                       incident)
//   tiebreaks           tie-breaks the coordinator asked for (2: a ring gives
//                       the faulty rank two partners, which are not proof;
//                       see docs/ARCHITECTURE.md, "Two partners are not
//                       proof")
// and, for the whole step, the time to ingest every report
// (weight_step_ingest_ms, audit_step_ingest_ms: the tie-break results too).
// The bench plays the ranks as the client does: the ranks the coordinator
// names replay the disputed micro-batches and send their tie-break results.
// Every figure is printed only after the decision it times was checked.
// Last line: JSON.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  std::vector<WeightVerdictMessage> verdicts;  // Sent by any call of the step.
};

// A replay audit's attribution: the ring, then its tie-breaks.
struct AuditTiming {
  double ring_ms = 0;      // The Ingest call that completed the ring (Attribute).
  double tiebreak_ms = 0;  // Every tie-break result's Ingest call.
  double settle_ms = 0;    // The last of them: the verdict naming the rank.
  size_t tiebreaks = 0;
  double total_ms = 0;     // Every report of the step, tie-break results included.
  double attribution_ms() const { return ring_ms + tiebreak_ms; }
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
      absl::StatusOr<AttachResult> a = coordinator_.Attach(h, Caller{h.placement.node, "certificate", {}});
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
      if (r + 1 == ranks_) t.last_ms = Ms(std::chrono::steady_clock::now() - call);
      if (!e.ok()) return e.status();
      for (const OutMessage& m : e->messages) {
        if (const auto* v = std::get_if<WeightVerdictMessage>(&m.body)) t.verdicts.push_back(*v);
      }
    }
    t.total_ms = Ms(std::chrono::steady_clock::now() - start);
    return t;
  }

  // A scheduled audit of `step` where `faulty` is wrong in every role: every
  // rank's original and replay, then the tie-breaks the coordinator asks
  // for, each replayed by the rank it names (wrong only if that is
  // `faulty`), as the client does in-band. Fails unless the ring alone
  // leaves the verdict to tie-breaks and they name exactly `faulty`.
  absl::StatusOr<AuditTiming> AuditStep(Step step, Rank faulty) {
    std::vector<PlanMember> members;
    for (Rank r = 0; r < ranks_; ++r) members.push_back({r, absl::StrCat("node-", r / kGpusPerNode)});
    const Topology topology(std::move(members));
    const ReplayPlan plan = PlanFullAudit(topology, step / 100);
    Report report;
    report.job_id = "bench";
    report.step = step;
    report.incarnation = 1;
    AuditTiming t;
    const size_t incidents_before = coordinator_.ListIncidents("bench").size();
    std::vector<TieBreakMessage> asked;
    std::vector<AuditVerdictMessage> verdicts;
    double call_ms = 0;
    // Every result of rank r's replay of `subject`'s micro-batch is the same
    // on healthy ranks; the faulty rank's is off by one.
    auto send = [&](Rank r, AuditRole role, Rank subject) -> absl::Status {
      AuditResult a;
      a.role = role;
      a.subject = subject;
      a.loss_bits = 0x3ff0000000000000ull + subject + (r == faulty ? 1 : 0);
      a.gradient_digest = a.loss_bits * 31;
      report.rank = r;
      report.sequence = ++sequence_[r];
      report.body = std::move(a);
      const auto call = std::chrono::steady_clock::now();
      absl::StatusOr<Effects> e = coordinator_.Ingest(report);
      call_ms = Ms(std::chrono::steady_clock::now() - call);
      if (!e.ok()) return e.status();
      for (const OutMessage& m : e->messages) {
        if (const auto* tb = std::get_if<TieBreakMessage>(&m.body)) asked.push_back(*tb);
        if (const auto* v = std::get_if<AuditVerdictMessage>(&m.body)) verdicts.push_back(*v);
      }
      return absl::OkStatus();
    };
    const auto start = std::chrono::steady_clock::now();
    for (Rank r = 0; r < ranks_; ++r) {
      if (absl::Status s = send(r, AuditRole::kOriginal, r); !s.ok()) return s;
    }
    for (const Assignment& a : plan.assignments) {
      if (absl::Status s = send(a.replayer, AuditRole::kReplay, a.subject); !s.ok()) return s;
    }
    t.ring_ms = call_ms;
    t.total_ms = Ms(std::chrono::steady_clock::now() - start);
    // Two partners are not proof: the ring alone names nobody and asks for
    // a tie-break of each of the faulty rank's two comparisons.
    if (asked.size() != 2 || verdicts.size() != 1 ||
        verdicts[0].outcome != AuditOutcome::kTieBreakPending || !verdicts[0].faulty.empty()) {
      return absl::InternalError(absl::StrCat(
          "the ring audit should leave its verdict to 2 tie-breaks; the coordinator asked for ",
          asked.size(), " and sent ", verdicts.size(), " verdict(s)",
          verdicts.empty() ? "" : absl::StrCat(", the first ", AuditOutcomeName(verdicts[0].outcome))));
    }
    if (coordinator_.ListIncidents("bench").size() != incidents_before) {
      return absl::InternalError("the ring audit recorded an incident before its tie-breaks");
    }
    t.tiebreaks = asked.size();
    verdicts.clear();
    const std::vector<TieBreakMessage> tiebreaks = std::move(asked);
    asked.clear();
    const auto tiebreaks_start = std::chrono::steady_clock::now();
    for (const TieBreakMessage& m : tiebreaks) {
      if (m.step != step || m.replayer == faulty) {
        return absl::InternalError(absl::StrCat("tie-break of rank ", m.subject, " at step ",
                                                m.step, " assigned to rank ", m.replayer));
      }
      if (absl::Status s = send(m.replayer, AuditRole::kTieBreak, m.subject); !s.ok()) return s;
      t.tiebreak_ms += call_ms;
    }
    t.settle_ms = call_ms;
    t.total_ms += Ms(std::chrono::steady_clock::now() - tiebreaks_start);
    if (!asked.empty() || verdicts.size() != 1 || verdicts[0].step != step ||
        verdicts[0].outcome != AuditOutcome::kFaulty ||
        verdicts[0].faulty != std::vector<Rank>{faulty} || !verdicts[0].suspects.empty()) {
      return absl::InternalError(absl::StrCat(
          "the tie-breaks should name exactly rank ", faulty, "; the coordinator sent ",
          verdicts.size(), " verdict(s)",
          verdicts.empty() ? "" : absl::StrCat(", the first ", AuditOutcomeName(verdicts[0].outcome),
                                               " naming ", absl::StrJoin(verdicts[0].faulty, ","))));
    }
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
  if (healthy->verdicts.size() != 1 || !healthy->verdicts[0].pass ||
      !healthy->verdicts[0].minority.empty()) {
    return Fail("the healthy weight step did not end in one passing vote");
  }
  if (!bench.coordinator().ListIncidents("bench").empty()) return Fail("healthy vote raised an incident");

  const std::vector<Rank> minority = {17, ranks / 2, ranks - 5};
  // At the default 1,000 tensors: tensors 3, 500 and 999.
  const WeightReport bad = bench.MakeWeights(1, {3, tensors / 2, tensors - 1});
  absl::StatusOr<Timing> minority_vote = bench.WeightStep(30, minority, bad);
  if (!minority_vote.ok()) return Fail(minority_vote.status().ToString());
  std::vector<Incident> incidents = bench.coordinator().ListIncidents("bench");
  if (minority_vote->verdicts.size() != 1 || minority_vote->verdicts[0].pass ||
      minority_vote->verdicts[0].minority != minority || incidents.size() != 1 ||
      incidents[0].ranks != minority || incidents[0].differing_tensors.size() != 3) {
    return Fail("minority vote did not name exactly the 3 minority ranks and 3 tensors");
  }

  const Rank faulty = ranks / 3;
  absl::StatusOr<AuditTiming> audit = bench.AuditStep(100, faulty);
  if (!audit.ok()) return Fail(audit.status().ToString());
  incidents = bench.coordinator().ListIncidents("bench");
  if (incidents.size() != 2 || incidents[1].ranks != std::vector<Rank>{faulty} ||
      !incidents[1].confirmed || incidents[1].outcome != "faulty") {
    return Fail("the audit did not record one confirmed incident naming exactly the faulty rank");
  }

  const double rss = PeakRssMib();
  std::printf("ranks %u, tensors %u\n", ranks, tensors);
  std::printf("%-40s %10s %12s\n", "", "decide ms", "ingest ms");
  std::printf("%-40s %10.2f %12.1f\n", "weight vote, all agree", healthy->last_ms,
              healthy->total_ms);
  std::printf("%-40s %10.2f %12.1f\n", "weight vote, 3 ranks differ", minority_vote->last_ms,
              minority_vote->total_ms);
  std::printf("%-40s %10.2f %12.1f\n", "replay audit, 1 faulty rank, tie-breaks",
              audit->attribution_ms(), audit->total_ms);
  std::printf("%-40s %10.2f\n", "  the ring (Attribute, asks tie-breaks)", audit->ring_ms);
  std::printf("%-40s %10.2f\n",
              absl::StrCat("  ", audit->tiebreaks, " tie-break results (last settles)").c_str(),
              audit->tiebreak_ms);
  std::printf("peak RSS %.0f MiB\n", rss);
  std::printf(
      "{\"ranks\":%u,\"tensors\":%u,\"healthy_vote_ms\":%.3f,\"minority_vote_ms\":%.3f,"
      "\"attribution_ms\":%.3f,\"weight_step_ingest_ms\":%.1f,"
      "\"minority_step_ingest_ms\":%.1f,\"audit_step_ingest_ms\":%.1f,\"peak_rss_mib\":%.0f,"
      "\"attribution_ring_ms\":%.3f,\"tiebreak_ms\":%.3f,\"tiebreak_settle_ms\":%.3f,"
      "\"tiebreaks\":%zu}\n",
      ranks, tensors, healthy->last_ms, minority_vote->last_ms, audit->attribution_ms(),
      healthy->total_ms, minority_vote->total_ms, audit->total_ms, rss, audit->ring_ms,
      audit->tiebreak_ms, audit->settle_ms, audit->tiebreaks);
  return 0;
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) { return sdc::bench::Main(argc, argv); }
