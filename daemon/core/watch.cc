// Ranks not trusted between their naming and their replacement (issue 42
// item 4). A GPU named faulty keeps training while its replacement request
// waits for an operator; an intermittent fault then corrupts the steps no
// audit covers, and the all-reduce carries each into every replica. While
// the request is open the group runs a standing watch plan: on every step
// that runs no other audit, a trusted rank of another node replays the
// watched rank's micro-batch, so each further corruption is a mismatch the
// ranks see in-band (the step is skipped on every rank) and a tie-break
// names the same GPU again. The watch ends with the request (denied,
// expired, failed or done): a new watch plan with no assignments.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/coordinator.h"

namespace sdc::core {

std::vector<Rank> Coordinator::WatchedRanks(JobState& job, const GroupState& group) {
  std::vector<Rank> watched;
  for (Rank r : group.members) {
    const Placement& p = RankOf(job, r).placement;
    auto f = faulty_gpus_.find(p.gpu_uuid);
    if (f == faulty_gpus_.end()) continue;
    const ReplacementRequest* open = escalation_.OpenFor(p.node);
    if (open == nullptr ||
        std::find(open->gpus.begin(), open->gpus.end(), p.gpu_uuid) == open->gpus.end()) {
      continue;
    }
    watched.push_back(r);
  }
  return watched;
}

std::vector<Assignment> Coordinator::CurrentWatch(const JobState& job, const GroupState& group) {
  for (auto it = job.plans.rbegin(); it != job.plans.rend(); ++it) {
    if (it->second.watch && it->second.group == group.record.group) return it->second.assignments;
  }
  return {};
}

void Coordinator::UpdateWatch(JobState& job, GroupState& group, Txn& txn) {
  if (!AllAttached(job)) return;
  const Topology& topology = TopologyOf(job, group);
  if (topology.capability() == AttributionCapability::kDetectOnly ||
      topology.capability() == AttributionCapability::kNone) {
    return;  // No replay could be attributed: a watch would only skip steps.
  }
  const std::vector<Rank> watched = WatchedRanks(job, group);
  const std::vector<Assignment> next = PlanWatch(topology, watched, 0).assignments;
  const std::vector<Assignment> current = CurrentWatch(job, group);
  auto same = [](const Assignment& a, const Assignment& b) {
    return a.replayer == b.replayer && a.subject == b.subject;
  };
  if (std::equal(next.begin(), next.end(), current.begin(), current.end(), same)) return;
  PlanRecord plan;
  plan.job_id = job.record.job_id;
  plan.group = group.record.group;
  plan.plan_id = job.record.next_plan_id++;
  plan.assignments = next;
  plan.watch = true;
  std::vector<std::string> who;
  for (Rank r : watched) who.push_back(Describe(job, r));
  plan.reason = watched.empty()
                    ? std::string("watch ended: no rank of the group awaits its replacement")
                    : absl::StrCat("watch until replaced: ", absl::StrJoin(who, ", "),
                                   " named faulty, replacement request open; its micro-batch "
                                   "is replayed on every step");
  job.plans[plan.plan_id] = plan;
  txn.mutation.plans.push_back(plan);
  txn.mutation.jobs.push_back(job.record);
  txn.effects.messages.push_back(
      {job.record.job_id, JobRanks(job),
       PlanMessage{plan.plan_id, plan.assignments, plan.reason, true, plan.group}});
}

std::vector<Rank> Coordinator::JobRanks(const JobState& job) {
  std::vector<Rank> out;
  out.reserve(job.ranks.size());
  for (const auto& [r, state] : job.ranks) out.push_back(r);
  return out;
}

void Coordinator::UpdateWatches(Txn& txn) {
  for (auto& [id, job] : jobs_) {
    if (!AllAttached(job)) continue;
    for (auto& [g, group] : job.groups) UpdateWatch(job, group, txn);
  }
}

}  // namespace sdc::core
