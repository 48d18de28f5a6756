#include "daemon/core/store.h"

#include <algorithm>

namespace sdc::core {
namespace {

// Erases the entries of `m` keyed (first) by job `job`.
template <typename Map>
void EraseJob(Map& m, const std::string& job) {
  for (auto it = m.begin(); it != m.end();) {
    it = std::get<0>(it->first) == job ? m.erase(it) : std::next(it);
  }
}

}  // namespace

absl::StatusOr<Snapshot> MemoryStore::Load() {
  absl::MutexLock lock(&mu_);
  Snapshot s;
  for (const auto& [k, v] : jobs_) s.jobs.push_back(v);
  for (const auto& [k, v] : attempts_) s.attempts.push_back(v);
  for (const auto& [k, v] : ranks_) s.ranks.push_back(v);
  for (const auto& [k, v] : groups_) s.groups.push_back(v);
  std::vector<std::pair<uint64_t, Report>> pending;
  for (const auto& [k, v] : pending_) pending.push_back(v);
  std::sort(pending.begin(), pending.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [arrival, report] : pending) s.pending.push_back(report);
  for (const auto& [k, v] : incidents_) s.incidents.push_back(v);
  for (const auto& [k, v] : requests_) s.requests.push_back(v);
  for (const auto& [k, v] : suspects_) s.suspects.push_back(v);
  for (const auto& [k, v] : plans_) s.plans.push_back(v);
  for (const auto& [k, v] : step_verdicts_) s.step_verdicts.push_back(v);
  s.checkpoint_decisions = checkpoint_decisions_;
  return s;
}

absl::StatusOr<uint64_t> MemoryStore::Apply(Mutation m) {
  absl::MutexLock lock(&mu_);
  for (const std::string& job : m.jobs_removed) {
    jobs_.erase(job);
    EraseJob(ranks_, job);
    EraseJob(groups_, job);
    EraseJob(pending_, job);
    EraseJob(plans_, job);
    EraseJob(step_verdicts_, job);
    EraseJob(attempts_, job);
    checkpoint_decisions_.erase(
        std::remove_if(checkpoint_decisions_.begin(), checkpoint_decisions_.end(),
                       [&job](const CheckpointDecision& d) { return d.job_id == job; }),
        checkpoint_decisions_.end());
  }
  for (auto& a : m.attempts) {
    EraseJob(ranks_, a.job_id);
    EraseJob(groups_, a.job_id);
    EraseJob(plans_, a.job_id);
    attempts_[{a.job_id, a.attempt}] = std::move(a);
  }
  for (auto& r : m.jobs) jobs_[r.job_id] = std::move(r);
  for (auto& r : m.ranks) ranks_[{r.job_id, r.placement.rank}] = std::move(r);
  for (auto& r : m.progress) ranks_[{r.job_id, r.placement.rank}] = std::move(r);
  for (auto& r : m.groups) groups_[{r.job_id, r.group}] = std::move(r);
  for (auto& r : m.pending_added) {
    PendingKeyTuple key{r.job_id, r.rank, r.incarnation, r.sequence};
    pending_[key] = {arrivals_++, std::move(r)};
  }
  for (const auto& k : m.pending_removed) {
    pending_.erase({k.job_id, k.rank, k.incarnation, k.sequence});
  }
  // Nothing here to wait for: a decided check's reports go with it.
  for (const auto& d : m.decided) {
    for (const auto& k : d.reports) pending_.erase({k.job_id, k.rank, k.incarnation, k.sequence});
  }
  for (auto& r : m.incidents) incidents_[r.id] = std::move(r);
  for (auto& r : m.requests) requests_[r.id] = std::move(r);
  for (auto& r : m.suspects) suspects_[r.gpu] = std::move(r);
  for (const auto& gpu : m.suspects_removed) suspects_.erase(gpu);
  for (auto& r : m.plans) plans_[{r.job_id, r.plan_id}] = std::move(r);
  for (auto& r : m.step_verdicts) {
    step_verdicts_[{r.job_id, r.group, r.step, static_cast<int>(r.check)}] = std::move(r);
  }
  for (const auto& [job, from] : m.rollbacks) {
    for (auto it = step_verdicts_.begin(); it != step_verdicts_.end();) {
      if (std::get<0>(it->first) == job && std::get<2>(it->first) >= from) {
        it = step_verdicts_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : m.checkpoint_decisions) checkpoint_decisions_.push_back(std::move(r));
  return ++tickets_;
}

absl::Status MemoryStore::WaitDurable(uint64_t) { return absl::OkStatus(); }

size_t MemoryStore::pending_count() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

}  // namespace sdc::core
