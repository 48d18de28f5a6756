#ifndef SDC_DAEMON_SQLITE_STORE_H_
#define SDC_DAEMON_SQLITE_STORE_H_

// The coordinator's durable store: one SQLite file in WAL mode with
// synchronous=FULL, written by one thread that commits every queued mutation
// in one transaction (group commit), so thousands of reports per second cost
// a handful of fsyncs. A report is acknowledged only after the commit that
// holds it (NotifyDurable). Durability callbacks run on a notifier thread,
// in commit order, while the writer goes on with the next commit.
//
// Schema: see kMigrations in sqlite_schema.cc; `schema_version` holds the
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
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/store.h"
#include "daemon/operators.h"

struct sqlite3;

namespace sdc::daemon {
namespace internal {
class SqliteStatement;
}  // namespace internal

struct SqliteStoreOptions {
  // A log row that holds removed reports among pending ones moves those to
  // a new row once this old; the writer looks for such rows at most this
  // often. Tests shorten it.
  absl::Duration compact_after = absl::Seconds(1);
};

class SqliteStore : public core::Store, public OperatorStore {
 public:
  // Opens (creating if needed) the database at `path` and migrates it.
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path,
                                                           SqliteStoreOptions options = {});
  ~SqliteStore() override;

  absl::StatusOr<core::Snapshot> Load() override;
  absl::StatusOr<uint64_t> Apply(core::Mutation m) override;
  absl::Status WaitDurable(uint64_t ticket) override;
  // Waits until everything applied so far is committed (or the store
  // failed) and every durability callback has run. For shutdown: after it,
  // with nothing applying, no callback can run on what its owner destroys.
  void Drain();
  void NotifyDurable(uint64_t ticket, std::function<void(absl::Status)> done) override;

  // OperatorStore: the `operators` table, written at once (not queued with
  // the coordinator's mutations; each change is its own transaction).
  absl::StatusOr<std::vector<OperatorRecord>> LoadOperators() override;
  absl::Status InsertOperator(const OperatorRecord& record) override;
  absl::Status ApproveOperator(const std::string& name, const std::string& approved_by) override;
  absl::Status DeleteOperator(const std::string& name) override;

  // OK until a commit fails.
  absl::Status health() const;
  // Mutations queued but not yet committed.
  size_t queue_depth() const;
  // Size of the database and its WAL, in bytes.
  uint64_t file_bytes() const;
  // Commits made so far (each may hold many mutations).
  uint64_t commits() const;
  // Reports no longer pending but still stored: removed with their log
  // row when it has none pending left (see Settle).
  size_t settling_reports() const { return settling_reports_.load(std::memory_order_relaxed); }

  static constexpr int kSchemaVersion = 8;

 private:
  SqliteStore(sqlite3* db, std::string path, SqliteStoreOptions options);
  // Starts the writer and notifier threads (after IndexReports).
  void Start();
  void WriterMain();
  void NotifierMain();
  // Takes the progress records out of `m`.
  absl::Status Write(core::Mutation& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // One transaction: `m` (if any), then up to `settle` decided checks'
  // reports removed, then, with `all_progress`, every rank's progress.
  absl::Status Commit(core::Mutation* m, size_t settle, bool all_progress = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Deletes log rows whose reports are all removed and removes the
  // schema-4 rows of decided checks, about `limit` rows of work (a rank
  // row written counts as one), then clears the mark of each decided check
  // whose reports are all gone.
  absl::Status Settle(size_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Appends the reports to the log as one row.
  absl::Status AppendReports(const std::vector<core::Report>& reports)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // A pending report removed on its own (not by a decided check's mark):
  // after writing its rank's progress, a tombstone if its log row stays,
  // the row itself if it is a schema-4 one.
  absl::Status RemovePending(const core::PendingKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Forgets where a report is stored: one fewer live report in its row,
  // which is spent (deleted when idle) once none is left. Returns the row
  // (kLegacyRow: a schema-4 row, still to delete), or nullopt if the report
  // is not stored.
  std::optional<int64_t> Forget(const core::PendingKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // How long a pause in the writes must last before Settle has something
  // to do (rows to delete, schema-4 rows to remove, marks to clear, rows
  // to compact); infinite if nothing will come due.
  absl::Duration SettleDelay() const;
  // Deletes a schema-4 row of a report no longer pending.
  absl::Status DeleteLegacy(const core::PendingKey& k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Inserts a report_log row.
  absl::Status InsertRow(int64_t id, const std::string& blob)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Reads where each stored report is (at Open).
  absl::Status IndexReports() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Deletes a row with no pending report, after its ranks' progress.
  absl::Status DeleteRow(int64_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Moves the pending reports of rows written before `before` that also
  // hold removed ones into one new row, up to about `limit` reports.
  absl::Status Compact(absl::Time before, size_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status WriteRank(const core::RankRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Writes the rank's progress if it is waiting (dirty_), or nothing.
  absl::Status WriteProgress(absl::string_view job_id, core::Rank rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status WriteAllProgress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status ClearMark(const core::DecidedCheck& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // A cached prepared statement for a literal `sql`.
  internal::SqliteStatement& Prepared(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  sqlite3* const db_;
  const std::string path_;
  absl::Mutex write_mu_;  // Serializes use of db_ (writer thread and Load).
  std::map<const char*, std::unique_ptr<internal::SqliteStatement>> statements_
      ABSL_GUARDED_BY(write_mu_);
  // Rank records whose only change is progress (core::Mutation::progress),
  // not written yet, by job and rank: each is written before the first of
  // its rank's pending reports leaves the database (its log row deleted, a
  // tombstone written, a schema-4 row removed), and all when the store
  // stops. Until then those reports carry it, and a
  // restore derives it from them. At 16,384 ranks this keeps 16,384 row
  // updates a step out of the commits that acknowledgements wait for.
  absl::flat_hash_map<std::string, absl::flat_hash_map<core::Rank, core::RankRecord>> dirty_
      ABSL_GUARDED_BY(write_mu_);

  // Pending reports (schema 5): one row of `report_log` per commit holds
  // every report that commit added, so a report costs a share of one insert
  // and one delete instead of a B-tree insert and delete of its own. A row
  // is deleted when none of its reports is pending any more: they were
  // consumed by decided checks (whose marks stay until then) or removed one
  // by one (each a tombstone in `dropped_reports` until then). A row that a
  // few reports keep (a replica group waiting for a late rank, up to the
  // report deadline) is compacted: those reports move to a new row with
  // their arrival numbers, and the old row goes. Rows of `pending_reports`
  // that an older sdcd wrote (kLegacyRow) are read too and deleted one by
  // one. Writer thread only (and Open, before it runs).
  static constexpr int64_t kLegacyRow = 0;
  using ReportKey = std::tuple<std::string, core::Rank, uint64_t, uint64_t>;
  // Of a core::Report or a core::PendingKey.
  template <typename T>
  static ReportKey KeyOf(const T& r) {
    return ReportKey(r.job_id, r.rank, r.incarnation, r.sequence);
  }
  struct Location {
    int64_t row = kLegacyRow;
    uint32_t index = 0;  // In the row.
  };
  absl::flat_hash_map<ReportKey, Location> located_;
  struct LogRow {
    std::vector<core::PendingKey> reports;  // In the row's order, removed ones too.
    size_t live = 0;                        // Still pending.
    bool tombstones = false;                // Some in dropped_reports.
    absl::Time written;
    std::vector<uint64_t> checks;  // Settling checks that wait for it.
  };
  std::map<int64_t, LogRow> rows_;
  int64_t next_row_ = 1;
  // The next report's arrival number (restore order), kept across rows.
  int64_t next_arrival_ = 1;
  // Rows with no pending report, oldest first: deleted when the writer is
  // idle, after the progress of every rank they hold is written.
  std::deque<int64_t> spent_;
  const SqliteStoreOptions options_;
  // Decided checks whose reports may still be stored (marked in
  // decided_checks), by a number of their own, with how many rows (log rows
  // that held their reports, and schema-4 rows) are still there: the mark
  // goes once none is. Removal waits for a pause in the writes, out of the
  // verdicts' commits (an audit of 16,384 ranks consumes 32,768 reports).
  struct Settling {
    core::DecidedCheck check;  // Without its reports.
    size_t rows_left = 0;
  };
  absl::flat_hash_map<uint64_t, Settling> settling_;
  uint64_t next_settling_ = 1;
  // Schema-4 rows of decided checks, oldest first, with their check.
  std::deque<std::pair<uint64_t, core::PendingKey>> legacy_;
  // Checks whose rows are all gone: their marks are cleared next.
  std::vector<uint64_t> clearable_;
  // When Settle looks for rows to compact next.
  absl::Time next_compaction_ = absl::InfinitePast();
  // Removed reports still stored (in rows not deleted yet, or schema-4
  // rows); changed by the writer only, read for metrics.
  std::atomic<size_t> settling_reports_{0};
  // A pause this long is idle time. A step's burst of reports has gaps of
  // a few ms; at 2 ms, rows were deleted (and rank progress written) in
  // those gaps, holding up the commits of the burst's last reports: in
  // four interleaved pairs at 16,384 ranks, 20 ms gave ack p99 172 - 221
  // ms against 191 - 231.
  static constexpr absl::Duration kSettleIdle = absl::Milliseconds(20);
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
