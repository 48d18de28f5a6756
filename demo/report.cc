#include "demo/report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "demo/timeline.h"

namespace sdc::demo {
namespace {

std::string List(const std::vector<int>& steps) {
  return steps.empty() ? "none" : absl::StrJoin(steps, ", ");
}

std::string CheckName(v1::CheckKind k) {
  switch (k) {
    case v1::CHECK_NONFINITE:
      return "non-finite gradients (check 1)";
    case v1::CHECK_REDUCED_GRADIENTS:
      return "reduced-gradient agreement (check 1)";
    case v1::CHECK_REPLAY:
      return "ring replay audit (check 2)";
    case v1::CHECK_WEIGHTS:
      return "weight fingerprint vote (check 3)";
    default:
      return "unknown";
  }
}

// What caught incident `i`: its check, except a checksum alarm's, which sdcd
// files as check 2's (a replay audit judges the suspect) though the
// every-step product checksum caught it.
std::string CaughtBy(const v1::Incident& i) {
  if (i.check() == v1::CHECK_REPLAY && absl::StrContains(i.explanation(), "checksum alarm at step")) {
    return "every-step product checksum (a replay audit judges)";
  }
  return CheckName(i.check());
}

std::string StateName(v1::RequestState s) {
  std::string n = v1::RequestState_Name(s);
  std::transform(n.begin() + 1, n.end(), n.begin() + 1, ::tolower);
  return n;
}

// Mean loss per step over ranks.
std::map<int, double> MeanLoss(const ClusterResult& r) {
  std::map<int, std::pair<double, int>> acc;
  for (const auto& rank : r.ranks) {
    for (const StepRecord& s : rank) {
      acc[s.step].first += s.loss;
      ++acc[s.step].second;
    }
  }
  std::map<int, double> out;
  for (const auto& [step, v] : acc) out[step] = v.first / v.second;
  return out;
}

// Faults that change no value training uses: another stack's rounding
// (correct on its own terms), a bit flipped in the copy of a micro-batch
// sent to a replayer, reports delivered late.
bool ChangesNoTrainingValue(const Injection& inj) {
  for (const char* what : {"INJECTED software-stack", "into the micro-batch sent", "late delivery"}) {
    if (inj.what.find(what) != std::string::npos) return true;
  }
  return false;
}

bool IntoWeights(const Injection& inj) {
  for (const char* what : {"into weight", "into frozen weight", "into optimizer state"}) {
    if (inj.what.find(what) != std::string::npos) return true;
  }
  return false;
}

// How a skipped step was caught, from its reason (at most 80 characters):
// a checksum alarm's step, rank and op, or the reason without the failing
// rank's preamble.
std::string HowCaught(const std::string& reason) {
  static const std::regex kAlarm(R"re(checksum alarm at step \d+ on rank \d+(: [\w:]+)?)re");
  static const std::regex kFailed(R"re(^(\w+: )?step \d+ failed on rank \d+ and was skipped on every rank: )re");
  std::smatch m;
  if (std::regex_search(reason, m, kAlarm)) return m[0].str();
  return std::regex_replace(reason, kFailed, "").substr(0, 80);
}

// Each injection's fate, from the ranks' per-step decisions and sdcd's
// incidents: nothing here takes an injection's word that it was harmless.
// `sharded`: an FSDP2/HSDP layout, where a weight the vote or the buddy
// check finds stays as it is unless a step says it was repaired.
void ClassifyInjections(const std::map<int, StepRecord>& steps, bool sharded, RunFacts* f) {
  for (Injection& inj : f->injections) {
    if (inj.while_replaying) {
      inj.fate = Fate::kReplay;
      continue;
    }
    if (ChangesNoTrainingValue(inj)) {
      inj.fate = Fate::kNoTrainingValue;
      continue;
    }
    if (inj.what.find("shard-update fault") != std::string::npos) {
      // An update applied to a shard no other rank holds: the buddy check
      // finds it at a later step (a weights incident), nothing repairs it,
      // the checkpoints after it are vetoed.
      bool found = false;
      for (const v1::Incident& i : f->incidents) {
        found |= i.check() == v1::CHECK_WEIGHTS && static_cast<int>(i.step()) >= inj.step;
      }
      inj.fate = found ? Fate::kDetectedApplied : Fate::kUndetected;
    } else if (IntoWeights(inj)) {
      bool repaired = false, found = false;
      for (const auto& [step, s] : steps) repaired |= step >= inj.step && s.repaired;
      for (const v1::Incident& i : f->incidents) {
        found |= i.check() == v1::CHECK_WEIGHTS && static_cast<int>(i.step()) >= inj.step;
      }
      if (repaired || (found && !sharded)) {
        inj.fate = Fate::kCaughtRepaired;
        inj.how = "the weight vote";
      } else {
        inj.fate = found ? Fate::kDetectedApplied : Fate::kUndetected;
      }
    } else {
      auto it = steps.find(inj.step);
      bool named = false;
      for (const v1::Incident& i : f->incidents) {
        named |= i.outcome() != "audits_off" && static_cast<int>(i.step()) == inj.step;
      }
      if (it != steps.end() && !it->second.apply) {
        inj.fate = Fate::kCaughtSkipped;
        inj.how = HowCaught(it->second.reason);
      } else {
        inj.fate = named ? Fate::kDetectedApplied : Fate::kUndetected;
      }
    }
    switch (inj.fate) {
      case Fate::kCaughtSkipped:
      case Fate::kCaughtRepaired:
        ++f->caught;
        break;
      case Fate::kDetectedApplied:
        ++f->detected_applied;
        break;
      case Fate::kUndetected:
        f->undetected_steps.push_back(inj.step);
        break;
      case Fate::kReplay:
      case Fate::kNoTrainingValue:
        break;
    }
  }
}

}  // namespace

std::string FateName(Fate fate) {
  switch (fate) {
    case Fate::kCaughtSkipped:
      return "caught, step skipped";
    case Fate::kCaughtRepaired:
      return "caught by the weight vote";
    case Fate::kDetectedApplied:
      return "detected after it was applied";
    case Fate::kReplay:
      return "in a replay (never trained on)";
    case Fate::kNoTrainingValue:
      return "changes no value training uses";
    case Fate::kUndetected:
      return "TRAINED ON UNDETECTED";
  }
  return "unknown";
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

RunFacts Analyze(const ClusterResult& result, const Scenario& scenario,
                 const ClusterConfig& config, int fault_rank) {
  RunFacts f;
  f.scenario = scenario;
  f.fault_spec = config.fault;
  f.fault_rank = config.fault.empty() ? -1 : fault_rank;
  static const std::regex kStep(R"re((?:at|after) step (\d+))re");
  for (const std::string& line : result.injections) {
    Injection inj;
    inj.what = line;
    inj.rank = std::atoi(line.c_str() + 5);
    std::smatch m;
    if (std::regex_search(line, m, kStep)) inj.step = std::stoi(m[1].str());
    inj.while_replaying = line.find("while replaying") != std::string::npos;
    f.injections.push_back(inj);
    if (inj.step >= 0 && (f.first_injection_step < 0 || inj.step < f.first_injection_step)) {
      f.first_injection_step = inj.step;
    }
  }
  f.incidents = result.incidents;
  std::set<int> blamed;
  bool expected_seen = scenario.expect_incident.empty();
  int notices = 0;  // audits_off: the job's audits stopped; nothing was detected.
  for (const v1::Incident& i : f.incidents) {
    if (i.outcome() == "audits_off") {
      ++notices;
      continue;
    }
    if (f.first_detection_step < 0 || static_cast<int>(i.step()) < f.first_detection_step) {
      f.first_detection_step = static_cast<int>(i.step());
    }
    if (i.confirmed()) {
      for (uint32_t r : i.ranks()) blamed.insert(static_cast<int>(r));
    }
    expected_seen = expected_seen || i.outcome() == scenario.expect_incident;
  }
  const int findings = static_cast<int>(f.incidents.size()) - notices;
  if (f.fault_rank < 0) {
    f.false_alarms = findings;
  } else {
    // Where the design explains the fault without hardware, any GPU named is
    // a false alarm, the fault's rank's included.
    for (int r : blamed) {
      f.false_alarms += r != f.fault_rank || !scenario.expect_incident.empty() ? 1 : 0;
    }
    f.detected = findings > 0 && !f.injections.empty() && expected_seen;
    f.attributed_correctly = blamed.count(f.fault_rank) > 0 && blamed.size() == 1;
    if (f.detected && f.first_injection_step >= 0) {
      f.latency_steps = f.first_detection_step - f.first_injection_step;
    }
  }
  // Per-step decisions (every rank takes the same; read rank 0's).
  std::map<int, StepRecord> steps;
  if (!result.ranks.empty()) {
    for (const StepRecord& s : result.ranks[0]) steps[s.step] = s;
  }
  for (const auto& [step, s] : steps) {
    if (!s.apply) f.skipped_steps.push_back(step);
    if (s.checkpoint == "allowed") f.checkpoints_allowed.push_back(step);
    if (s.checkpoint == "vetoed") f.checkpoints_vetoed.push_back(step);
    f.audits += s.audited ? 1 : 0;
    f.audits_unverified += s.audited && s.unverified ? 1 : 0;
    f.weight_checks += config.weight_check_every > 0 && step % config.weight_check_every == 0;
  }
  if (!steps.empty()) {
    f.first_loss = steps.begin()->second.loss;
    f.last_loss = steps.rbegin()->second.loss;
  }
  // Corrupted intervals of the weights.
  std::vector<std::pair<int, int>> corrupted;  // [from, to)
  for (const Injection& inj : f.injections) {
    if (inj.step < 0 || inj.while_replaying) continue;
    if (ChangesNoTrainingValue(inj)) continue;
    if (inj.what.find("into weight") != std::string::npos) {
      int repaired = INT32_MAX;
      for (const auto& [step, s] : steps) {
        if (step > inj.step && s.repaired) {
          repaired = step;
          break;
        }
      }
      corrupted.push_back({inj.step, repaired});
    } else {
      auto it = steps.find(inj.step);
      if (it != steps.end() && it->second.apply) corrupted.push_back({inj.step, INT32_MAX});
    }
  }
  ClassifyInjections(steps, config.layout == "fsdp" || config.layout == "hsdp" ||
                               config.layout == "tp", &f);
  f.checkpoints_final = result.checkpoints_final;
  f.checkpoints_provisional = result.checkpoints_provisional;
  auto has = [](const std::vector<int>& v, int c) {
    return std::find(v.begin(), v.end(), c) != v.end();
  };
  // A restarted job: attempt 0's checkpoint is on disk if it was final at
  // the restart, or is there at the end and attempt 1 did not write it again
  // (attempt 1's rank 0 deletes the provisional ones sdcd revoked).
  const ClusterResult::Resume& rs = result.resume;
  std::vector<int> rewritten;
  if (rs.attempt > 0 && !rs.ranks.empty()) {
    for (const StepRecord& s : rs.ranks[0]) {
      if (s.checkpoint == "allowed") rewritten.push_back(s.step);
    }
  }
  auto on_disk = [&](int c) {
    if (rs.attempt > 0 && has(rs.final_at_restart, c)) return true;
    return (has(f.checkpoints_final, c) || has(f.checkpoints_provisional, c)) &&
           !has(rewritten, c);
  };
  for (int c : f.checkpoints_allowed) {
    if (!on_disk(c)) f.checkpoints_revoked.push_back(c);
    for (const auto& [from, to] : corrupted) {
      if (c >= from && c < to) {
        (on_disk(c) ? f.bad_checkpoints : f.bad_checkpoints_revoked).push_back(c);
        break;
      }
    }
  }
  f.weights_identical = !result.weight_digests.empty() &&
                        std::all_of(result.weight_digests.begin(), result.weight_digests.end(),
                                    [&](const std::string& d) {
                                      return !d.empty() && d == result.weight_digests[0];
                                    });
  if (rs.attempt > 0) {
    RunFacts::Resumed& a = f.resumed;
    a.approved = rs.done_unix_ms > 0;
    a.resumed = rs.resumed;
    a.resume_step = rs.resume_step;
    if (!rs.ranks.empty()) {
      for (const StepRecord& s : rs.ranks[0]) {
        ++a.steps;
        if (!s.apply) a.skipped_steps.push_back(s.step);
        if (s.checkpoint == "allowed") a.checkpoints_allowed.push_back(s.step);
        if (s.checkpoint == "vetoed") a.checkpoints_vetoed.push_back(s.step);
      }
    }
    a.incidents_after = static_cast<int>(result.incidents.size()) - rs.incidents_at_restart;
    if (!f.checkpoints_final.empty()) a.final_checkpoint = f.checkpoints_final.back();
    for (const auto& [from, to] : corrupted) {
      a.from_corrupted = a.from_corrupted || (rs.resume_step >= from && rs.resume_step < to);
    }
  }
  return f;
}

namespace {

// "12 audits" or "12 audits (3 unverified: ...)".
std::string AuditCount(const RunFacts& f) {
  if (f.audits_unverified == 0) return absl::StrCat(f.audits, " audits");
  return absl::StrCat(f.audits, " audits (", f.audits_unverified,
                      " unverified: checked in-band only, no verdict from sdcd in time)");
}

// "20 into training: 3 caught, 17 trained on undetected (steps 3, 6, ...); 4 into replays
// of a peer".
std::string InjectionTally(const RunFacts& f) {
  int replays = 0, elsewhere = 0;
  for (const Injection& i : f.injections) {
    replays += i.fate == Fate::kReplay ? 1 : 0;
    elsewhere += i.fate == Fate::kNoTrainingValue ? 1 : 0;
  }
  const int training = static_cast<int>(f.injections.size()) - replays - elsewhere;
  std::string out = absl::StrCat(training, " into training: ", f.caught, " caught");
  if (f.detected_applied > 0) {
    absl::StrAppend(&out, ", ", f.detected_applied, " detected after they were applied");
  }
  absl::StrAppend(&out, ", ", f.undetected_steps.size(), " trained on undetected");
  if (!f.undetected_steps.empty()) {
    absl::StrAppend(&out, " (steps ", absl::StrJoin(f.undetected_steps, ", "), ")");
  }
  if (replays > 0) absl::StrAppend(&out, "; ", replays, " into replays of a peer");
  if (elsewhere > 0) absl::StrAppend(&out, "; ", elsewhere, " that change no value training uses");
  return out;
}

// Every rank's reports to sdcd, from the guard summaries of their final lines.
struct ReportTotals {
  int64_t sent = 0;
  int64_t acked = 0;
  int64_t dropped = 0;
};

ReportTotals TotalsOf(const ClusterResult& r) {
  ReportTotals t;
  for (const auto& g : r.guard_summaries) {
    auto get = [&](const char* key) {
      auto it = g.find(key);
      return it == g.end() ? int64_t{0} : it->second;
    };
    t.sent += get("reports_sent");
    t.acked += get("reports_acked");
    t.dropped += get("reports_dropped");
  }
  return t;
}

}  // namespace

std::string SummaryText(const RunFacts& f, const ClusterResult& r, const ClusterConfig& c,
                        const std::string& sdcctl) {
  std::string out;
  absl::StrAppend(&out, "\n== sdc-guard demo: ", f.scenario.name, " ==\n", f.scenario.description,
                  "\n", c.nodes, " nodes x ", c.gpus_per_node, " GPUs (CPU ranks, Gloo",
                  c.layout == "ddp" ? "" : absl::StrCat("; ", c.layout), "), ", c.steps,
                  " steps, audit every ", c.audit_every, ", weight check every ",
                  c.weight_check_every, ", checkpoint every ", c.checkpoint_every, "\n");
  absl::StrAppendFormat(&out, "loss %.3f -> %.3f; %s, %d weight checks; wall %s\n",
                        f.first_loss, f.last_loss, AuditCount(f), f.weight_checks,
                        absl::FormatDuration(absl::Trunc(r.wall, absl::Seconds(1))));
  if (r.coordinator_restarts > 0) {
    absl::StrAppend(&out, "sdcd was killed (kill -9) and restarted ", r.coordinator_restarts,
                    " time(s)", c.restart_coordinator_at >= 0
                                    ? absl::StrCat(", after step ", c.restart_coordinator_at)
                                    : "",
                    "; what it had acknowledged came back from its database\n");
  }
  if (c.start_coordinator_after >= 0) {
    absl::StrAppend(&out, "sdcd started once every rank passed step ", c.start_coordinator_after,
                    ": the ranks held their reports until then\n");
  }
  const ReportTotals t = TotalsOf(r);
  if (t.sent > 0) {
    absl::StrAppend(&out, "reports to sdcd: ", t.sent, " sent, ", t.acked, " acknowledged, ",
                    t.dropped, " dropped\n");
  }
  absl::StrAppend(&out, "\nInjected:\n");
  if (f.injections.empty()) {
    absl::StrAppend(&out, f.fault_spec.empty() ? "  nothing\n"
                                               : "  nothing fired (the fault's steps never came)\n");
  }
  const size_t shown = std::min<size_t>(f.injections.size(), 10);
  for (size_t i = 0; i < shown; ++i) {
    const Injection& inj = f.injections[i];
    absl::StrAppend(&out, "  ", inj.what, "  -> ", FateName(inj.fate),
                    inj.how.empty() ? "" : absl::StrCat(" (", inj.how, ")"), "\n");
  }
  if (f.injections.size() > shown) {
    absl::StrAppend(&out, "  ... and ", f.injections.size() - shown, " more\n");
  }
  if (!f.injections.empty()) absl::StrAppend(&out, "  ", InjectionTally(f), "\n");
  absl::StrAppend(&out, "\nDetected:\n");
  if (f.incidents.empty()) absl::StrAppend(&out, "  nothing\n");
  for (const v1::Incident& i : f.incidents) {
    absl::StrAppend(&out, "  step ", i.step(), ": ", CaughtBy(i), ", ", i.outcome());
    if (f.first_injection_step >= 0) {
      absl::StrAppend(&out, " (", static_cast<int>(i.step()) - f.first_injection_step,
                      " steps after the first injection)");
    }
    absl::StrAppend(&out, "\n    ", i.explanation(), "\n");
    if (i.confirmed()) {
      for (int k = 0; k < i.ranks_size(); ++k) {
        absl::StrAppend(&out, "    blamed: rank ", i.ranks(k), " on node ", i.node_names(k),
                        ", GPU ", i.gpu_uuids(k), "\n");
      }
    }
    if (i.differing_tensors_size() > 0) {
      absl::StrAppend(&out, "    differing: ", absl::StrJoin(i.differing_tensors(), ", "), "\n");
    }
  }
  absl::StrAppend(&out, "\nSteps skipped on every rank: ",
                  f.skipped_steps.empty() ? "none" : absl::StrJoin(f.skipped_steps, ", "), "\n");
  absl::StrAppend(&out, "Checkpoints written: ", List(f.checkpoints_allowed),
                  "; vetoed: ", List(f.checkpoints_vetoed), "\n");
  absl::StrAppend(&out, "  at the end: final ", List(f.checkpoints_final), "; provisional ",
                  List(f.checkpoints_provisional), "; revoked and deleted ",
                  List(f.checkpoints_revoked), "\n");
  absl::StrAppend(&out, "Checkpoints on disk holding corrupted weights: ", List(f.bad_checkpoints));
  if (!f.bad_checkpoints_revoked.empty()) {
    absl::StrAppend(&out, " (corrupted ones revoked in time: ", List(f.bad_checkpoints_revoked),
                    ")");
  }
  absl::StrAppend(&out, "\n");
  absl::StrAppend(&out, "Replicas at the end: ",
                  f.weights_identical ? "identical weights on every rank"
                                      : "WEIGHTS DIFFER between ranks",
                  f.undetected_steps.empty()
                      ? ""
                      : absl::StrCat(", but ", f.undetected_steps.size(),
                                     " corruption(s) went into them undetected"),
                  "\n");
  const std::vector<TimelineEvent> timeline = Timeline(f, r);
  if (!timeline.empty()) {
    absl::StrAppend(&out, "\nThe whole loop (times UTC):\n");
    for (const TimelineEvent& e : timeline) {
      absl::StrAppendFormat(&out, "  %-16s %-8s %s\n", e.what, e.at, e.detail);
    }
  }
  for (const v1::ReplacementRequest& q : r.requests) {
    absl::StrAppend(&out, "\nReplacement request ", q.id(), " for ", q.node_name(), " is ",
                    StateName(q.state()), ": ", q.reason().substr(0, 160), "\n");
    if (q.state() == v1::PENDING && !sdcctl.empty()) {
      absl::StrAppend(&out, "  see the evidence:  ", sdcctl, " describe request ", q.id(), "\n",
                      "  approve it:        ", sdcctl, " approve ", q.id(),
                      " --reason \"confirmed by the sdc-guard demo\"\n");
    }
  }
  return out;
}

std::string HtmlReport(const RunFacts& f, const ClusterResult& r, const ClusterConfig& c) {
  const std::map<int, double> loss = MeanLoss(r);
  const int w = 900, h = 300, left = 60, right = 20, top = 20, bottom = 40;
  double lo = 1e9, hi = -1e9;
  for (const auto& [step, v] : loss) {
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (lo > hi) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  const int last_step = loss.empty() ? 1 : std::max(1, loss.rbegin()->first);
  auto x = [&](double step) { return left + (w - left - right) * (step - 1) / std::max(1, last_step - 1); };
  auto y = [&](double v) { return top + (h - top - bottom) * (hi - v) / (hi - lo); };
  std::string svg = absl::StrFormat(
      "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" "
      "aria-label=\"mean training loss per step\">",
      w, h, w, h);
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" "
                        "stroke=\"#ccc\"/>",
                        left, top, w - left - right, h - top - bottom);
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4;
    absl::StrAppendFormat(&svg,
                          "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.2f</text>",
                          left - 6, y(v) + 4, v);
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"%d\" font-size=\"11\">step 1</text><text x=\"%d\" "
                        "y=\"%d\" font-size=\"11\" text-anchor=\"end\">step %d</text>",
                        left, h - 10, w - right, h - 10, last_step);
  for (const Injection& inj : f.injections) {
    if (inj.step < 0) continue;
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#f0a\" "
                          "stroke-dasharray=\"2,3\"><title>injected: %s</title></line>",
                          x(inj.step), top, x(inj.step), h - bottom, HtmlEscape(inj.what));
  }
  for (const v1::Incident& i : f.incidents) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#d00\" "
                          "stroke-width=\"2\"><title>incident %d at step %d: %s</title></line>",
                          x(i.step()), top, x(i.step()), h - bottom, i.id(), i.step(),
                          HtmlEscape(i.explanation()));
  }
  std::string path;
  for (const auto& [step, v] : loss) {
    if (!std::isfinite(v)) continue;
    absl::StrAppendFormat(&path, "%s%.1f,%.1f ", path.empty() ? "M" : "L", x(step), y(v));
  }
  absl::StrAppend(&svg, "<path d=\"", path, "\" fill=\"none\" stroke=\"#1565c0\" stroke-width=\"1.5\"/>");
  for (int s : f.skipped_steps) {
    auto it = loss.find(s);
    const double v = it != loss.end() && std::isfinite(it->second) ? it->second : hi;
    absl::StrAppendFormat(&svg,
                          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#f57c00\"><title>step %d "
                          "skipped</title></circle>",
                          x(s), y(v), s);
  }
  for (int s : f.checkpoints_vetoed) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.1f\" y=\"%d\" font-size=\"14\" text-anchor=\"middle\" "
                          "fill=\"#555\">&#x2715;<title>checkpoint of step %d vetoed</title></text>",
                          x(s), h - bottom - 4, s);
  }
  for (int s : f.checkpoints_allowed) {
    const bool revoked =
        std::count(f.checkpoints_revoked.begin(), f.checkpoints_revoked.end(), s) > 0;
    const bool provisional =
        std::count(f.checkpoints_provisional.begin(), f.checkpoints_provisional.end(), s) > 0;
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\" "
                          "fill=\"%s\">%s<title>checkpoint of step %d written, %s</title></text>",
                          x(s), h - bottom - 4, revoked ? "#d00" : "#2e7d32",
                          revoked ? "&#x21ba;" : "&#x2713;", s,
                          revoked ? "then revoked and deleted" : provisional ? "still provisional" : "final");
  }
  absl::StrAppend(&svg, "</svg>");

  std::string html = absl::StrCat(
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>sdc-guard demo: ",
      HtmlEscape(f.scenario.name),
      "</title><style>body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:960px;"
      "color:#222}h1{font-size:22px}h2{font-size:17px;margin-top:1.6em}table{border-collapse:"
      "collapse;width:100%}td,th{border:1px solid #ddd;padding:4px 6px;text-align:left;"
      "vertical-align:top}th{background:#f3f3f3}.ok{color:#2e7d32}.bad{color:#c62828}"
      ".legend span{margin-right:1.2em}code{background:#f3f3f3;padding:1px 4px}</style></head><body>");
  absl::StrAppend(&html, "<h1>sdc-guard demo: ", HtmlEscape(f.scenario.name), "</h1><p>",
                  HtmlEscape(f.scenario.description), "</p>");
  absl::StrAppendFormat(&html,
                        "<p>%d nodes &times; %d GPUs (CPU ranks, Gloo), %d steps; audit every %d "
                        "steps, weight check every %d, checkpoint every %d. Loss %.3f &rarr; %.3f. "
                        "%s. Wall time %s.</p>",
                        c.nodes, c.gpus_per_node, c.steps, c.audit_every, c.weight_check_every,
                        c.checkpoint_every, f.first_loss, f.last_loss, HtmlEscape(AuditCount(f)),
                        absl::FormatDuration(absl::Trunc(r.wall, absl::Seconds(1))));
  if (r.coordinator_restarts > 0) {
    absl::StrAppend(&html, "<p>sdcd was killed (kill -9) and restarted ", r.coordinator_restarts,
                    " time(s) during the run.</p>");
  }
  absl::StrAppend(&html, "<h2>Training loss</h2>", svg,
                  "<p class=\"legend\"><span style=\"color:#1565c0\">&#9644; mean loss</span>"
                  "<span style=\"color:#f0a\">&#9482; fault injected</span><span style=\"color:#d00\">"
                  "&#9475; incident</span><span style=\"color:#f57c00\">&#9679; skipped step</span>"
                  "<span style=\"color:#2e7d32\">&#x2713; checkpoint written</span><span style=\"color:#d00\">"
                  "&#x21ba; checkpoint revoked</span><span>&#x2715; checkpoint vetoed</span></p>");
  absl::StrAppend(&html, "<h2>Outcome</h2><table>");
  auto row = [&](const std::string& k, const std::string& v, bool good) {
    absl::StrAppend(&html, "<tr><th>", k, "</th><td class=\"", good ? "ok" : "bad", "\">", v, "</td></tr>");
  };
  const bool all_seen = f.undetected_steps.empty();
  row("Injected", f.injections.empty() ? "nothing" : HtmlEscape(absl::StrCat(f.injections.size(), " injection(s), first at step ", f.first_injection_step)), true);
  if (!f.injections.empty()) {
    row("Corruptions trained on undetected",
        all_seen ? "none" : HtmlEscape(InjectionTally(f)),
        all_seen);
  }
  row("Detected", f.incidents.empty() ? "nothing" : absl::StrCat("first at step ", f.first_detection_step, f.latency_steps >= 0 ? absl::StrCat(", ", f.latency_steps, " steps after the first injection") : ""), f.fault_rank < 0 ? f.incidents.empty() : f.detected && all_seen);
  row("Blamed correctly", f.fault_rank < 0 ? "n/a" : (f.attributed_correctly ? "yes" : "no"), f.fault_rank < 0 || f.attributed_correctly || !f.scenario.attributable);
  row("False alarms", absl::StrCat(f.false_alarms), f.false_alarms == 0);
  row("Skipped steps", List(f.skipped_steps), true);
  row("Checkpoints written", List(f.checkpoints_allowed), true);
  row("Checkpoints vetoed", List(f.checkpoints_vetoed), true);
  row("Checkpoints final at the end", List(f.checkpoints_final), true);
  row("Checkpoints still provisional", List(f.checkpoints_provisional), true);
  row("Checkpoints revoked and deleted", List(f.checkpoints_revoked), true);
  row("Checkpoints on disk with corrupted weights", List(f.bad_checkpoints), f.bad_checkpoints.empty());
  row("Replicas at the end",
      absl::StrCat(f.weights_identical ? "identical" : "differ",
                   all_seen ? "" : absl::StrCat(", with ", f.undetected_steps.size(), " undetected corruption(s) in all of them")),
      f.weights_identical && all_seen);
  absl::StrAppend(&html, "</table>");
  absl::StrAppend(&html, "<h2>Incident timeline</h2>");
  if (f.incidents.empty()) absl::StrAppend(&html, "<p>No incident.</p>");
  else {
    absl::StrAppend(&html, "<table><tr><th>#</th><th>step</th><th>check</th><th>outcome</th><th>ranks</th><th>nodes / GPUs</th><th>evidence</th></tr>");
    for (const v1::Incident& i : f.incidents) {
      std::vector<std::string> where;
      for (int k = 0; k < i.ranks_size(); ++k) where.push_back(absl::StrCat(i.node_names(k), " / ", i.gpu_uuids(k)));
      absl::StrAppend(&html, "<tr><td>", i.id(), "</td><td>", i.step(), "</td><td>", HtmlEscape(CaughtBy(i)),
                      "</td><td>", HtmlEscape(i.outcome()), i.confirmed() ? " (attributed)" : "", "</td><td>",
                      absl::StrJoin(i.ranks(), ", "), "</td><td>", HtmlEscape(absl::StrJoin(where, "; ")), "</td><td>",
                      HtmlEscape(i.explanation()),
                      i.differing_tensors_size() > 0 ? absl::StrCat("<br>differing: <code>", HtmlEscape(absl::StrJoin(i.differing_tensors(), ", ")), "</code>") : "",
                      "</td></tr>");
    }
    absl::StrAppend(&html, "</table>");
  }
  absl::StrAppend(&html, "<h2>Injections</h2>");
  if (f.injections.empty()) absl::StrAppend(&html, "<p>None.</p>");
  else {
    absl::StrAppend(&html, "<ul>");
    for (const Injection& i : f.injections) {
      absl::StrAppend(&html, "<li>", HtmlEscape(i.what), " &rarr; <span class=\"",
                      i.fate == Fate::kUndetected ? "bad" : "ok", "\">", HtmlEscape(FateName(i.fate)),
                      i.how.empty() ? "" : HtmlEscape(absl::StrCat(" (", i.how, ")")), "</span></li>");
    }
    absl::StrAppend(&html, "</ul>");
  }
  const std::vector<TimelineEvent> timeline = Timeline(f, r);
  if (!timeline.empty()) {
    absl::StrAppend(&html, "<h2>The whole loop</h2><table><tr><th>event</th><th>time (UTC)</th>"
                           "<th>what happened</th></tr>");
    for (const TimelineEvent& e : timeline) {
      absl::StrAppend(&html, "<tr><td>", HtmlEscape(e.what), "</td><td>", HtmlEscape(e.at),
                      "</td><td>", HtmlEscape(e.detail), "</td></tr>");
    }
    absl::StrAppend(&html, "</table>");
  }
  absl::StrAppend(&html, "<h2>Replacement requests</h2>");
  if (r.requests.empty()) absl::StrAppend(&html, "<p>None.</p>");
  for (const v1::ReplacementRequest& q : r.requests) {
    absl::StrAppend(&html, "<p><b>Request ", q.id(), "</b> for <code>", HtmlEscape(q.node_name()), "</code> (",
                    HtmlEscape(q.action()), "), ", StateName(q.state()), ": ", HtmlEscape(q.reason()), "</p><table><tr><th>time</th><th>transition</th><th>who</th><th>why</th></tr>");
    for (const v1::Transition& t : q.transitions()) {
      absl::StrAppend(&html, "<tr><td>", absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(t.at_unix_ms()), absl::UTCTimeZone()),
                      " UTC</td><td>", StateName(t.from()), " &rarr; ", StateName(t.to()), "</td><td>", HtmlEscape(t.actor()),
                      "</td><td>", HtmlEscape(t.reason()), "</td></tr>");
    }
    absl::StrAppend(&html, "</table>");
  }
  absl::StrAppend(&html, "<p style=\"color:#777;margin-top:2em\">Generated by <code>./sdc demo</code>. The facts above come from sdcd's records (incidents, requests) and the trainers' per-step decisions.</p></body></html>\n");
  return html;
}

std::string FactsJson(const RunFacts& f, const ClusterResult& result) {
  nlohmann::json j;
  j["scenario"] = f.scenario.name;
  j["fault_spec"] = f.fault_spec;
  j["fault_rank"] = f.fault_rank;
  j["first_injection_step"] = f.first_injection_step;
  j["first_detection_step"] = f.first_detection_step;
  j["latency_steps"] = f.latency_steps;
  j["detected"] = f.detected;
  j["attributed_correctly"] = f.attributed_correctly;
  j["false_alarms"] = f.false_alarms;
  j["skipped_steps"] = f.skipped_steps;
  j["checkpoints_allowed"] = f.checkpoints_allowed;
  j["checkpoints_vetoed"] = f.checkpoints_vetoed;
  j["checkpoints_final"] = f.checkpoints_final;
  j["checkpoints_provisional"] = f.checkpoints_provisional;
  j["checkpoints_revoked"] = f.checkpoints_revoked;
  j["bad_checkpoints"] = f.bad_checkpoints;
  j["bad_checkpoints_revoked"] = f.bad_checkpoints_revoked;
  j["weights_identical"] = f.weights_identical;
  j["injections_caught"] = f.caught;
  j["injections_detected_applied"] = f.detected_applied;
  j["undetected_steps"] = f.undetected_steps;
  j["audits"] = f.audits;
  j["audits_unverified"] = f.audits_unverified;
  j["weight_checks"] = f.weight_checks;
  j["first_loss"] = f.first_loss;
  j["last_loss"] = f.last_loss;
  j["injections"] = nlohmann::json::array();
  for (const Injection& i : f.injections) {
    j["injections"].push_back({{"rank", i.rank}, {"step", i.step}, {"what", i.what},
                               {"while_replaying", i.while_replaying},
                               {"fate", FateName(i.fate)}, {"how", i.how}});
  }
  std::vector<uint32_t> blamed;
  j["incidents"] = nlohmann::json::array();
  for (const v1::Incident& i : f.incidents) {
    std::vector<uint32_t> ranks(i.ranks().begin(), i.ranks().end());
    j["incidents"].push_back({{"step", i.step()}, {"outcome", i.outcome()},
                              {"confirmed", i.confirmed()}, {"ranks", ranks},
                              {"explanation", i.explanation()}});
    if (i.confirmed()) blamed.insert(blamed.end(), ranks.begin(), ranks.end());
  }
  std::sort(blamed.begin(), blamed.end());
  blamed.erase(std::unique(blamed.begin(), blamed.end()), blamed.end());
  j["blamed"] = blamed;
  std::vector<std::string> request_nodes;
  for (const v1::ReplacementRequest& r : result.requests) request_nodes.push_back(r.node_name());
  j["requests"] = request_nodes;
  j["coordinator_restarts"] = result.coordinator_restarts;
  const ClusterResult::Resume& rs = result.resume;
  if (rs.attempt > 0) {
    const RunFacts::Resumed& a = f.resumed;
    std::string approved_by;
    for (const v1::ReplacementRequest& q : result.requests) {
      if (q.id() != rs.request_id) continue;
      j["resume_request_state"] = StateName(q.state());
      for (const v1::Approval& ap : q.approvals()) approved_by = ap.operator_();
    }
    j["resume"] = {{"resumed", a.resumed},
                   {"attempt", rs.attempt},
                   {"request_id", rs.request_id},
                   {"approved_by", approved_by},
                   {"replaced_node", rs.replaced_node},
                   {"replacement_node", rs.replacement_node},
                   {"replaced_gpus", rs.replaced_gpus},
                   {"replacement_gpus", rs.replacement_gpus},
                   {"actuator_record", rs.actuator_record},
                   {"stopped_after_step", rs.stopped_after_step},
                   {"resume_step", a.resume_step},
                   {"from_corrupted", a.from_corrupted},
                   {"steps", a.steps},
                   {"skipped_steps", a.skipped_steps},
                   {"checkpoints_allowed", a.checkpoints_allowed},
                   {"checkpoints_vetoed", a.checkpoints_vetoed},
                   {"incidents_after", a.incidents_after},
                   {"final_checkpoint", a.final_checkpoint}};
  }
  const ReportTotals t = TotalsOf(result);
  j["reports_sent"] = t.sent;
  j["reports_acked"] = t.acked;
  j["reports_dropped"] = t.dropped;
  return j.dump();
}

}  // namespace sdc::demo
