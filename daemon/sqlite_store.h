#ifndef SDC_DAEMON_SQLITE_STORE_H_
#define SDC_DAEMON_SQLITE_STORE_H_

// The coordinator's durable store: one SQLite file in WAL mode with
// synchronous=FULL, written by one thread that commits every queued mutation
// in one transaction (group commit), so thousands of reports per second cost
// a handful of fsyncs. A report is acknowledged only after the commit that
// holds it (NotifyDurable). Durability callbacks run on a notifier thread,
// in commit order, while the writer goes on with the next commit.
//
// Schema: see kMigrations in sqlite_store.cc; `schema_version` holds the
// version, and Open() applies newer migrations in order. A database written
// by a newer sdcd is refused.
//
// Thread-safe. After a failed commit the store refuses everything (the
// coordinator must not acknowledge what it cannot keep); the daemon reports
// itself unhealthy.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/store.h"

struct sqlite3;

namespace sdc::daemon {
namespace internal {
class SqliteStatement;
}  // namespace internal

class SqliteStore : public core::Store {
 public:
  // Opens (creating if needed) the database at `path` and migrates it.
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path);
  ~SqliteStore() override;

  absl::StatusOr<core::Snapshot> Load() override;
  absl::StatusOr<uint64_t> Apply(core::Mutation m) override;
  absl::Status WaitDurable(uint64_t ticket) override;
  // Waits until everything applied so far is committed (or the store
  // failed) and every durability callback has run. For shutdown: after it,
  // with nothing applying, no callback can run on what its owner destroys.
  void Drain();
  void NotifyDurable(uint64_t ticket, std::function<void(absl::Status)> done) override;

  // OK until a commit fails.
  absl::Status health() const;
  // Mutations queued but not yet committed.
  size_t queue_depth() const;
  // Size of the database and its WAL, in bytes.
  uint64_t file_bytes() const;
  // Commits made so far (each may hold many mutations).
  uint64_t commits() const;
  // Reports of decided checks not yet removed (see Settle).
  size_t settling_reports() const { return settling_reports_.load(std::memory_order_relaxed); }

  static constexpr int kSchemaVersion = 4;

 private:
  SqliteStore(sqlite3* db, std::string path);
  void WriterMain();
  void NotifierMain();
  absl::Status Write(const core::Mutation& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // One transaction: `m` (if any), then up to `settle` decided checks'
  // reports removed, then, with `all_progress`, every rank's progress.
  absl::Status Commit(const core::Mutation* m, size_t settle, bool all_progress = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Removes up to `limit` reports of decided checks, oldest check first,
  // and the mark of each check whose reports are all gone.
  absl::Status Settle(size_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Removes a pending report, after writing its rank's progress.
  absl::Status RemovePending(const core::PendingKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status WriteRank(const core::RankRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Writes the rank's progress if it is waiting (dirty_), or nothing.
  absl::Status WriteProgress(absl::string_view job_id, core::Rank rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status WriteAllProgress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status ClearMark(const core::DecidedCheck& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  static core::Mutation Coalesce(std::deque<std::pair<uint64_t, core::Mutation>>& batch);
  // A cached prepared statement for a literal `sql`.
  internal::SqliteStatement& Prepared(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  sqlite3* const db_;
  const std::string path_;
  absl::Mutex write_mu_;  // Serializes use of db_ (writer thread and Load).
  std::map<const char*, std::unique_ptr<internal::SqliteStatement>> statements_
      ABSL_GUARDED_BY(write_mu_);
  // The next pending report's `arrival` (restore order): one past the
  // largest in the database when it opened.
  int64_t next_arrival_ ABSL_GUARDED_BY(write_mu_) = 1;
  // Rank records whose only change is progress (core::Mutation::progress),
  // not written yet, by job and rank: each is written before the first of
  // its rank's pending reports leaves the database (RemovePending), and
  // all when the store stops. Until then those reports carry it, and a
  // restore derives it from them. At 16,384 ranks this keeps 16,384 row
  // updates a step out of the commits that acknowledgements wait for.
  absl::flat_hash_map<std::string, absl::flat_hash_map<core::Rank, core::RankRecord>> dirty_
      ABSL_GUARDED_BY(write_mu_);

  // Decided checks whose reports are still in the database (marked in
  // decided_checks), oldest first, and how many reports they hold: removed
  // a chunk at a time when no write came for kSettleIdle, out of the
  // verdicts' commits (an audit of 16,384 ranks is 32,768 reports, about
  // 60 ms of deletions). Writer thread only.
  struct Settling {
    core::DecidedCheck check;
    size_t next = 0;  // Reports before it are removed.
  };
  std::deque<Settling> settling_;
  // The reports they hold; changed by the writer only, read for metrics.
  std::atomic<size_t> settling_reports_{0};
  static constexpr absl::Duration kSettleIdle = absl::Milliseconds(2);
  static constexpr size_t kSettleChunk = 1024;
  // Beyond this many, commits of new writes also remove a chunk.
  static constexpr size_t kSettleBacklog = 1 << 18;

  mutable absl::Mutex mu_;
  std::deque<std::pair<uint64_t, core::Mutation>> queue_ ABSL_GUARDED_BY(mu_);
  // Waiting for their ticket to be durable, by ticket.
  std::multimap<uint64_t, std::function<void(absl::Status)>> callbacks_ ABSL_GUARDED_BY(mu_);
  // Due, in commit order, for the notifier thread: callbacks send gRPC
  // messages, and running them on the writer would hold up the next commit.
  std::deque<std::pair<absl::Status, std::function<void(absl::Status)>>> due_
      ABSL_GUARDED_BY(mu_);
  bool notifying_ ABSL_GUARDED_BY(mu_) = false;  // Running a batch taken from due_.
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t commits_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
  std::thread notifier_;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_SQLITE_STORE_H_
