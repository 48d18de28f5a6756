#ifndef SDC_DAEMON_CORE_STORE_H_
#define SDC_DAEMON_CORE_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/records.h"

namespace sdc::core {

// Where the coordinator's state becomes durable. Every state change of the
// core is one Mutation; a store applies each atomically and in order.
// Apply may return before the change is durable (a store batches commits);
// WaitDurable blocks until it is. The service acknowledges a report only
// after WaitDurable on the ticket of the change that holds it.
//
// Implementations are thread-safe.
class Store {
 public:
  virtual ~Store() = default;

  // Everything stored, for a restarting coordinator.
  virtual absl::StatusOr<Snapshot> Load() = 0;

  // Queues `m`. Returns a ticket; tickets grow with each call.
  virtual absl::StatusOr<uint64_t> Apply(Mutation m) = 0;

  // Returns once the change with `ticket` (and all before it) is durable, or
  // the error that made it fail.
  virtual absl::Status WaitDurable(uint64_t ticket) = 0;

  // Calls `done` once `ticket` is durable (or failed), possibly at once on
  // the calling thread, possibly later on a store thread. For callers that
  // must not block (gRPC reactors). Default: WaitDurable, then `done`.
  virtual void NotifyDurable(uint64_t ticket, std::function<void(absl::Status)> done) {
    done(WaitDurable(ticket));
  }
};

// A Store in memory: durable at once, gone with the process. For tests and
// for the core benchmark; it keeps every record so a second Coordinator can
// Restore() from it as after a restart.
class MemoryStore : public Store {
 public:
  absl::StatusOr<Snapshot> Load() override;
  absl::StatusOr<uint64_t> Apply(Mutation m) override;
  absl::Status WaitDurable(uint64_t ticket) override;

  // Number of reports not yet finalized.
  size_t pending_count() const;

 private:
  using RankKey = std::tuple<std::string, Rank>;
  using PendingKeyTuple = std::tuple<std::string, Rank, uint64_t, uint64_t>;

  mutable absl::Mutex mu_;
  uint64_t tickets_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, uint64_t>, AttemptRecord> attempts_ ABSL_GUARDED_BY(mu_);
  std::map<RankKey, RankRecord> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, uint32_t>, GroupRecord> groups_ ABSL_GUARDED_BY(mu_);
  std::map<PendingKeyTuple, std::pair<uint64_t, Report>> pending_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Incident> incidents_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, ReplacementRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Suspect> suspects_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, uint64_t>, PlanRecord> plans_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, uint32_t, Step, int>, StepVerdict> step_verdicts_
      ABSL_GUARDED_BY(mu_);
  std::vector<CheckpointDecision> checkpoint_decisions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::core

#endif  // SDC_DAEMON_CORE_STORE_H_
