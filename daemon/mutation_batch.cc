#include "daemon/mutation_batch.h"

#include <iterator>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace sdc::daemon {

core::Mutation CoalesceMutations(std::deque<std::pair<uint64_t, core::Mutation>>& batch) {
  // Keys view job ids the batch owns: nothing leaves the batch before the
  // last loop, and that one only moves what no key views (a voided report
  // stays where it is).
  using Key = std::tuple<absl::string_view, core::Rank, uint64_t, uint64_t>;
  auto key = [](const auto& k) { return Key(k.job_id, k.rank, k.incarnation, k.sequence); };
  absl::flat_hash_set<Key> removed;
  size_t removals = 0;
  for (auto& [ticket, m] : batch) removals += m.pending_removed.size();
  removed.reserve(removals);
  for (auto& [ticket, m] : batch) {
    for (const core::PendingKey& k : m.pending_removed) removed.insert(key(k));
  }
  // Reports added and finalized within the batch: neither write is made.
  absl::flat_hash_set<Key> voided;
  if (!removed.empty()) {
    for (auto& [ticket, m] : batch) {
      for (const core::Report& r : m.pending_added) {
        if (removed.contains(key(r))) voided.insert(key(r));
      }
    }
  }
  core::Mutation out;
  out.pending_added.reserve([&] {
    size_t added = 0;
    for (auto& [ticket, m] : batch) added += m.pending_added.size();
    return added;
  }());
  // A rank's latest record in the batch, and whether it must be written now
  // (a Hello's is; progress may wait, unless a report that carries it is
  // never written: added and removed within the batch).
  struct Latest {
    core::RankRecord record;
    bool now = false;
  };
  absl::flat_hash_map<std::string, absl::flat_hash_map<core::Rank, Latest>> latest;
  auto keep = [&](core::RankRecord& r, bool now) {
    auto& of_job = latest.try_emplace(r.job_id).first->second;  // Copies a job id once.
    Latest& slot = of_job[r.placement.rank];
    slot.record = std::move(r);
    slot.now = slot.now || now;
  };
  for (auto& [ticket, m] : batch) {
    auto move_all = [](auto& to, auto& from) {
      to.insert(to.end(), std::make_move_iterator(from.begin()),
                std::make_move_iterator(from.end()));
    };
    // A job dropped here drops what earlier mutations of the batch wrote
    // for it (Write() removes jobs first).
    for (const std::string& job : m.jobs_removed) {
      auto of_job = [&job](const auto& r) { return r.job_id == job; };
      out.jobs.erase(std::remove_if(out.jobs.begin(), out.jobs.end(), of_job), out.jobs.end());
      out.groups.erase(std::remove_if(out.groups.begin(), out.groups.end(), of_job),
                       out.groups.end());
      out.plans.erase(std::remove_if(out.plans.begin(), out.plans.end(), of_job),
                      out.plans.end());
      out.step_verdicts.erase(
          std::remove_if(out.step_verdicts.begin(), out.step_verdicts.end(), of_job),
          out.step_verdicts.end());
      out.checkpoint_decisions.erase(
          std::remove_if(out.checkpoint_decisions.begin(), out.checkpoint_decisions.end(), of_job),
          out.checkpoint_decisions.end());
      latest.erase(job);
    }
    move_all(out.jobs_removed, m.jobs_removed);
    // An attempt drops its job's ranks, groups and plans, those earlier in
    // this batch too (Write() applies attempts before them); its pending
    // reports leave through pending_removed.
    for (const core::AttemptRecord& a : m.attempts) {
      auto of_job = [&a](const auto& r) { return r.job_id == a.job_id; };
      out.groups.erase(std::remove_if(out.groups.begin(), out.groups.end(), of_job),
                       out.groups.end());
      out.plans.erase(std::remove_if(out.plans.begin(), out.plans.end(), of_job),
                      out.plans.end());
      latest.erase(a.job_id);
    }
    move_all(out.attempts, m.attempts);
    move_all(out.jobs, m.jobs);
    for (auto& r : m.ranks) keep(r, true);
    const bool carried_by_voided =
        !voided.empty() && std::any_of(m.pending_added.begin(), m.pending_added.end(),
                                       [&](const core::Report& r) {
                                         return voided.contains(key(r));
                                       });
    for (auto& r : m.progress) keep(r, carried_by_voided);
    for (auto& r : m.pending_added) {
      if (!voided.contains(key(r))) out.pending_added.push_back(std::move(r));
    }
    for (auto& k : m.pending_removed) {
      if (!voided.contains(key(k))) out.pending_removed.push_back(std::move(k));
    }
    move_all(out.groups, m.groups);
    move_all(out.incidents, m.incidents);
    move_all(out.requests, m.requests);
    move_all(out.suspects, m.suspects);
    move_all(out.suspects_removed, m.suspects_removed);
    move_all(out.plans, m.plans);
    move_all(out.checkpoint_decisions, m.checkpoint_decisions);
    // A rollback voids the verdicts of its job from its step on, including
    // those earlier in this batch; Write() applies rollbacks first.
    for (const auto& [job, from] : m.rollbacks) {
      out.step_verdicts.erase(
          std::remove_if(out.step_verdicts.begin(), out.step_verdicts.end(),
                         [&](const core::StepVerdict& v) {
                           return v.job_id == job && v.step >= from;
                         }),
          out.step_verdicts.end());
    }
    move_all(out.rollbacks, m.rollbacks);
    move_all(out.step_verdicts, m.step_verdicts);
    move_all(out.decided, m.decided);
    move_all(out.decided_cleared, m.decided_cleared);
  }
  for (auto& [job, of_job] : latest) {
    for (auto& [rank, slot] : of_job) {
      (slot.now ? out.ranks : out.progress).push_back(std::move(slot.record));
    }
  }
  return out;
}

}  // namespace sdc::daemon
