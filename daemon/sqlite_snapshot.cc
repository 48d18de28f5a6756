#include "daemon/sqlite_snapshot.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/convert.h"
#include "daemon/report_log.h"
#include "daemon/sqlite_schema.h"

namespace sdc::daemon {
namespace {

using Stmt = internal::SqliteStatement;

absl::StatusOr<core::CheckKind> CheckKindOf(const std::string& name) {
  static const std::map<std::string, core::CheckKind> kKinds = {
      {"nonfinite", core::CheckKind::kNonFinite},
      {"reduced_gradients", core::CheckKind::kReducedGradients},
      {"replay", core::CheckKind::kReplay},
      {"weights", core::CheckKind::kWeights}};
  auto kind = kKinds.find(name);
  if (kind == kKinds.end()) return absl::DataLossError(absl::StrCat("bad check kind '", name, "'"));
  return kind->second;
}

}  // namespace

absl::StatusOr<core::Snapshot> ReadSnapshot(sqlite3* db) {
  core::Snapshot snap;
  {
    Stmt s(db,
           "SELECT job_id, world_size, audit_every, weight_check_every, created_ms, "
           "next_plan_id, attempt, resume_step FROM jobs");
    while (s.Next()) {
      snap.jobs.push_back({s.Text(0), static_cast<uint32_t>(s.Int(1)),
                           static_cast<uint32_t>(s.Int(2)), static_cast<uint32_t>(s.Int(3)),
                           FromUnixMillis(s.Int(4)), static_cast<uint64_t>(s.Int(5)),
                           static_cast<uint64_t>(s.Int(6)), static_cast<uint64_t>(s.Int(7))});
    }
  }
  {
    Stmt s(db,
           "SELECT job_id, attempt, world_size, resume_step, started_ms, closed_checks, note "
           "FROM attempts ORDER BY job_id, attempt");
    while (s.Next()) {
      snap.attempts.push_back({s.Text(0), static_cast<uint64_t>(s.Int(1)),
                               static_cast<uint32_t>(s.Int(2)), static_cast<uint64_t>(s.Int(3)),
                               FromUnixMillis(s.Int(4)), static_cast<uint32_t>(s.Int(5)),
                               s.Text(6)});
    }
  }
  {
    Stmt s(db, "SELECT * FROM ranks");
    while (s.Next()) {
      core::RankRecord r;
      r.job_id = s.Text(0);
      r.placement = {static_cast<uint32_t>(s.Int(1)), s.Text(2), static_cast<uint32_t>(s.Int(3)),
                     s.Text(4), static_cast<uint32_t>(s.Int(5))};
      r.incarnation = s.Int(6);
      r.acked_sequence = s.Int(7);
      r.has_last_step = s.Int(8) != 0;
      r.last_step = s.Int(9);
      r.deterministic = s.Int(10) != 0;
      r.resumed = s.Int(11) != 0;
      r.identity = s.Text(12);
      r.proof = s.Text(13);
      r.unproven = s.Text(14);
      snap.ranks.push_back(std::move(r));
    }
  }
  {
    Stmt s(db, "SELECT * FROM replica_groups");
    while (s.Next()) {
      v1::Hello layout;
      if (!layout.ParseFromString(s.Bytes(2))) return absl::DataLossError("bad layout row");
      snap.groups.push_back({s.Text(0), static_cast<uint32_t>(s.Int(1)),
                             {layout.weight_tensors().begin(), layout.weight_tensors().end()},
                             static_cast<uint32_t>(s.Int(3)), static_cast<uint64_t>(s.Int(4))});
    }
  }
  {
    // In arrival order: a compacted row holds reports older than its
    // neighbours'.
    std::vector<std::pair<int64_t, core::Report>> pending;
    absl::Status st = ForEachStoredReport(
        db, [&](int64_t, int64_t arrival, const v1::Report& r, bool dropped) -> absl::Status {
          if (dropped) return absl::OkStatus();
          absl::StatusOr<core::Report> c = FromProto(r);
          if (!c.ok()) return absl::DataLossError(c.status().message());
          pending.emplace_back(arrival, *std::move(c));
          return absl::OkStatus();
        });
    if (!st.ok()) return st;
    std::stable_sort(pending.begin(), pending.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    snap.pending.reserve(pending.size());
    for (auto& [arrival, r] : pending) snap.pending.push_back(std::move(r));
  }
  {
    Stmt s(db, "SELECT body FROM incidents ORDER BY id");
    while (s.Next()) {
      v1::Incident i;
      if (!i.ParseFromString(s.Bytes(0))) return absl::DataLossError("bad incident row");
      snap.incidents.push_back(FromProto(i));
    }
  }
  {
    Stmt s(db, "SELECT body FROM requests ORDER BY id");
    while (s.Next()) {
      v1::ReplacementRequest r;
      if (!r.ParseFromString(s.Bytes(0))) return absl::DataLossError("bad request row");
      snap.requests.push_back(FromProto(r));
    }
  }
  {
    Stmt s(db, "SELECT body FROM suspects");
    while (s.Next()) {
      v1::Suspect x;
      if (!x.ParseFromString(s.Bytes(0))) return absl::DataLossError("bad suspect row");
      snap.suspects.push_back(FromProto(x));
    }
  }
  {
    Stmt s(db, "SELECT job_id, plan_id, grp, suspect, done, plan FROM plans");
    while (s.Next()) {
      v1::AuditPlan p;
      if (!p.ParseFromString(s.Bytes(5))) return absl::DataLossError("bad plan row");
      core::PlanRecord r;
      r.job_id = s.Text(0);
      r.plan_id = s.Int(1);
      r.group = static_cast<uint32_t>(s.Int(2));
      r.suspect = static_cast<uint32_t>(s.Int(3));
      r.done = s.Int(4) != 0;
      r.reason = p.reason();
      r.watch = p.watch();
      for (const auto& a : p.assignments()) r.assignments.push_back({a.replayer(), a.subject()});
      snap.plans.push_back(std::move(r));
    }
  }
  {
    Stmt s(db, "SELECT * FROM step_verdicts");
    while (s.Next()) {
      core::StepVerdict v;
      v.job_id = s.Text(0);
      v.group = static_cast<uint32_t>(s.Int(1));
      v.step = s.Int(2);
      absl::StatusOr<core::CheckKind> kind = CheckKindOf(s.Text(3));
      if (!kind.ok()) return kind.status();
      v.check = *kind;
      v.failed = s.Int(4) != 0;
      v.complete = s.Int(5) != 0;
      v.applied = s.Int(6) != 0;
      v.summary = s.Text(7);
      v.incident_id = s.Int(8);
      snap.step_verdicts.push_back(std::move(v));
    }
  }
  {
    Stmt s(db,
           "SELECT job_id, step, allowed, reason, at_ms, revocation, abandoned FROM "
           "checkpoint_decisions ORDER BY id");
    while (s.Next()) {
      snap.checkpoint_decisions.push_back({s.Text(0), static_cast<uint64_t>(s.Int(1)),
                                           s.Int(2) != 0, s.Text(3), FromUnixMillis(s.Int(4)),
                                           s.Int(5) != 0, s.Int(6) != 0});
    }
  }
  {
    Stmt s(db, "SELECT job_id, grp, step, check_kind, plan_id FROM decided_checks");
    while (s.Next()) {
      absl::StatusOr<core::CheckKind> kind = CheckKindOf(s.Text(3));
      if (!kind.ok()) return kind.status();
      snap.decided.push_back({s.Text(0), static_cast<uint32_t>(s.Int(1)),
                              static_cast<uint64_t>(s.Int(2)), *kind,
                              static_cast<uint64_t>(s.Int(4)), {}});
    }
  }
  return snap;
}

}  // namespace sdc::daemon
