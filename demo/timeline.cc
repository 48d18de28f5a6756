#include "demo/timeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace sdc::demo {

namespace {

std::string Clock(int64_t unix_ms) {
  return unix_ms <= 0 ? "--:--:--"
                      : absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(unix_ms),
                                         absl::UTCTimeZone());
}

std::string List(const std::vector<int>& steps) {
  return steps.empty() ? "none" : absl::StrJoin(steps, ", ");
}

std::string StateName(v1::RequestState s) {
  std::string n = v1::RequestState_Name(s);
  std::transform(n.begin() + 1, n.end(), n.begin() + 1, ::tolower);
  return n;
}

}  // namespace

std::vector<TimelineEvent> Timeline(const RunFacts& f, const ClusterResult& r) {
  const ClusterResult::Resume& rs = r.resume;
  std::vector<TimelineEvent> t;
  if (rs.attempt == 0) return t;
  t.push_back({"fault", "", f.first_injection_step < 0
                               ? "nothing injected"
                               : absl::StrCat("step ", f.first_injection_step, ", rank ",
                                              f.fault_rank, " (", f.injections.size(),
                                              " injection(s): ",
                                              f.injections.empty() ? "" : FateName(f.injections[0].fate),
                                              ")")});
  for (const v1::Incident& i : f.incidents) {
    if (!i.confirmed()) continue;
    std::string who;
    for (int k = 0; k < i.ranks_size(); ++k) {
      absl::StrAppend(&who, k > 0 ? ", " : "", "rank ", i.ranks(k), " on ", i.node_names(k),
                      " (GPU ", i.gpu_uuids(k), ")");
    }
    t.push_back({"detection", Clock(i.created_unix_ms()),
                 absl::StrCat("incident ", i.id(), " at step ", i.step(), ": ", i.outcome(),
                              ", names ", who)});
    break;
  }
  t.push_back({"veto/revocation", "",
               absl::StrCat("revoked ", List(f.checkpoints_revoked), "; vetoed ",
                            List(f.checkpoints_vetoed))});
  for (const v1::ReplacementRequest& q : r.requests) {
    if (q.id() != rs.request_id) continue;
    t.push_back({"request", Clock(q.created_unix_ms()),
                 absl::StrCat("request ", q.id(), ": ", q.action(), " ", q.node_name(), " (",
                              absl::StrJoin(q.gpu_uuids(), ", "), "), now ",
                              StateName(q.state()))});
    for (const v1::Transition& tr : q.transitions()) {
      if (tr.to() == v1::APPROVED) {
        t.push_back({"approval", Clock(tr.at_unix_ms()),
                     absl::StrCat("by ", tr.actor(), ": ", tr.reason())});
      }
    }
  }
  t.push_back({"replacement", Clock(rs.done_unix_ms),
               absl::StrCat(rs.replaced_node, " -> ", rs.replacement_node, " (GPUs ",
                            absl::StrJoin(rs.replacement_gpus, ", "), "); the actuator ran: ",
                            rs.actuator_record)});
  t.push_back({"restart", Clock(rs.restart_unix_ms),
               absl::StrCat("attempt ", rs.attempt, ": every rank a new process, the same job id; "
                            "attempt 0 stopped after step ", rs.stopped_after_step)});
  const RunFacts::Resumed& a = f.resumed;
  t.push_back({"resume", "",
               a.resume_step > 0
                   ? absl::StrCat("from step ", a.resume_step, "'s final checkpoint (",
                                  a.from_corrupted ? "CORRUPTED" : "clean", "); ", a.steps,
                                  " steps trained, skipped ", List(a.skipped_steps),
                                  ", incidents after the resume: ", a.incidents_after,
                                  ", checkpoints allowed ", List(a.checkpoints_allowed),
                                  ", vetoed ", List(a.checkpoints_vetoed))
                   : "from scratch: no final checkpoint on disk"});
  t.push_back({"final checkpoint", "",
               a.final_checkpoint < 0 ? "none" : absl::StrCat("step ", a.final_checkpoint)});
  return t;
}


}  // namespace sdc::demo
