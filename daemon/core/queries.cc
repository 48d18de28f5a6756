// Read-only queries: jobs, ranks, incidents, suspects, requests and the
// history of a GPU or node. None changes state.

#include "daemon/core/coordinator.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/coordinator_internal.h"

namespace sdc::core {

using internal::EchoJobId;

std::vector<JobSummary> Coordinator::ListJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobSummary> out;
  for (const auto& [id, job] : jobs_) {
    JobSummary s;
    s.job_id = id;
    s.world_size = job.record.world_size;
    s.created = job.record.created;
    s.attempt = job.record.attempt;
    std::set<std::string> nodes;
    bool all = true;
    Step last = UINT64_MAX;
    if (job.ranks.size() < job.record.world_size) all = false;
    for (const auto& [r, slot] : job.ranks) {
      nodes.insert(slot.record.placement.node);
      s.attached += slot.attached ? 1 : 0;
      if (!slot.record.has_last_step) all = false;
      last = std::min(last, slot.record.last_step);
    }
    s.last_step = all ? last : 0;
    s.nodes = static_cast<uint32_t>(nodes.size());
    for (const auto& [iid, inc] : incidents_) {
      s.open_incidents += inc.job_id == id ? 1 : 0;
    }
    out.push_back(s);
  }
  return out;
}

absl::StatusOr<std::vector<RankSummary>> Coordinator::ListRanks(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", EchoJobId(job_id)));
  std::vector<RankSummary> out;
  for (const auto& [r, slot] : it->second.ranks) {
    out.push_back({job_id, slot.record.placement, slot.attached, slot.record.last_step,
                   slot.record.incarnation, slot.record.identity, slot.record.proof,
                   slot.record.unproven});
  }
  return out;
}

std::vector<Incident> Coordinator::ListIncidents(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<Incident> out;
  for (const auto& [id, inc] : incidents_) {
    if (job_id.empty() || inc.job_id == job_id) out.push_back(inc);
  }
  return out;
}

std::vector<Suspect> Coordinator::ListSuspects() const {
  absl::MutexLock lock(&mu_);
  std::vector<Suspect> out;
  for (const auto& [gpu, s] : suspects_) out.push_back(s);
  return out;
}

std::vector<ReplacementRequest> Coordinator::ListRequests() const {
  absl::MutexLock lock(&mu_);
  return escalation_.List();
}

absl::StatusOr<ReplacementRequest> Coordinator::GetRequest(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  const ReplacementRequest* r = escalation_.Find(id);
  if (r == nullptr) return absl::NotFoundError(absl::StrCat("no replacement request ", id));
  return *r;
}

absl::StatusOr<Incident> Coordinator::GetIncident(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = incidents_.find(id);
  if (it == incidents_.end()) return absl::NotFoundError(absl::StrCat("no incident ", id));
  return it->second;
}

std::pair<std::vector<Incident>, std::vector<ReplacementRequest>> Coordinator::History(
    const std::string& gpu, const std::string& node) const {
  absl::MutexLock lock(&mu_);
  std::pair<std::vector<Incident>, std::vector<ReplacementRequest>> out;
  for (const auto& [id, inc] : incidents_) {
    const bool match =
        (!gpu.empty() && std::find(inc.gpus.begin(), inc.gpus.end(), gpu) != inc.gpus.end()) ||
        (!node.empty() && std::find(inc.nodes.begin(), inc.nodes.end(), node) != inc.nodes.end());
    if (match) out.first.push_back(inc);
  }
  for (const ReplacementRequest& r : escalation_.List()) {
    const bool match =
        (!gpu.empty() && std::find(r.gpus.begin(), r.gpus.end(), gpu) != r.gpus.end()) ||
        (!node.empty() && r.node == node);
    if (match) out.second.push_back(r);
  }
  return out;
}

uint32_t Coordinator::AttachedRanks() const {
  absl::MutexLock lock(&mu_);
  uint32_t n = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [r, slot] : job.ranks) n += slot.attached ? 1 : 0;
  }
  return n;
}

}  // namespace sdc::core
