#include "daemon/sqlite_store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/batch_scope.h"
#include "daemon/convert.h"
#include "google/protobuf/io/coded_stream.h"

namespace sdc::daemon {
namespace {

// Migration i (1-based) brings the schema from version i-1 to i. Append new
// migrations; never edit a released one.
const char* const kMigrations[] = {
    // 1: the initial schema.
    R"sql(
CREATE TABLE jobs (
  job_id TEXT PRIMARY KEY,
  world_size INTEGER NOT NULL,
  audit_every INTEGER NOT NULL,
  weight_check_every INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  next_plan_id INTEGER NOT NULL
);
CREATE TABLE ranks (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  node TEXT NOT NULL,
  local_rank INTEGER NOT NULL,
  gpu_uuid TEXT NOT NULL,
  replica_group INTEGER NOT NULL,
  incarnation INTEGER NOT NULL,
  acked_sequence INTEGER NOT NULL,
  has_last_step INTEGER NOT NULL,
  last_step INTEGER NOT NULL,
  deterministic INTEGER NOT NULL,
  resumed INTEGER NOT NULL,
  PRIMARY KEY (job_id, rank)
);
CREATE TABLE replica_groups (
  job_id TEXT NOT NULL,
  grp INTEGER NOT NULL,
  layout BLOB NOT NULL,
  parameter_count INTEGER NOT NULL,
  layout_digest INTEGER NOT NULL,
  PRIMARY KEY (job_id, grp)
);
CREATE TABLE pending_reports (
  arrival INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  incarnation INTEGER NOT NULL,
  sequence INTEGER NOT NULL,
  report BLOB NOT NULL,
  UNIQUE (job_id, rank, incarnation, sequence)
);
CREATE TABLE incidents (
  id INTEGER PRIMARY KEY,
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  check_kind TEXT NOT NULL,
  outcome TEXT NOT NULL,
  confirmed INTEGER NOT NULL,
  request_id INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  body BLOB NOT NULL
);
CREATE TABLE incident_gpus (
  incident_id INTEGER NOT NULL,
  gpu_uuid TEXT NOT NULL,
  node TEXT NOT NULL,
  rank INTEGER NOT NULL,
  PRIMARY KEY (incident_id, gpu_uuid)
);
CREATE INDEX incident_gpus_by_gpu ON incident_gpus (gpu_uuid);
CREATE INDEX incident_gpus_by_node ON incident_gpus (node);
CREATE TABLE requests (
  id INTEGER PRIMARY KEY,
  node TEXT NOT NULL,
  state TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  body BLOB NOT NULL
);
CREATE TABLE request_transitions (
  request_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  from_state TEXT NOT NULL,
  to_state TEXT NOT NULL,
  at_ms INTEGER NOT NULL,
  actor TEXT NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY (request_id, seq)
);
CREATE TABLE suspects (
  gpu_uuid TEXT PRIMARY KEY,
  body BLOB NOT NULL
);
CREATE TABLE plans (
  job_id TEXT NOT NULL,
  plan_id INTEGER NOT NULL,
  grp INTEGER NOT NULL,
  suspect INTEGER NOT NULL,
  done INTEGER NOT NULL,
  plan BLOB NOT NULL,
  PRIMARY KEY (job_id, plan_id)
);
CREATE TABLE checkpoint_decisions (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  allowed INTEGER NOT NULL,
  reason TEXT NOT NULL,
  at_ms INTEGER NOT NULL
);
CREATE TABLE step_verdicts (
  job_id TEXT NOT NULL,
  grp INTEGER NOT NULL,
  step INTEGER NOT NULL,
  check_kind TEXT NOT NULL,
  failed INTEGER NOT NULL,
  complete INTEGER NOT NULL,
  applied INTEGER NOT NULL,
  summary TEXT NOT NULL,
  incident_id INTEGER NOT NULL,
  PRIMARY KEY (job_id, grp, step, check_kind)
);
)sql",
    // 2: provisional checkpoints; a decision row may revoke an allowed one.
    R"sql(
ALTER TABLE checkpoint_decisions ADD COLUMN revocation INTEGER NOT NULL DEFAULT 0;
)sql",
    // 3: pending reports in one B-tree ordered by their key, instead of a
    // rowid table plus a unique index on the key: each insert and delete
    // (tens of thousands a step at 16,384 ranks) touches one tree, not
    // two. `arrival` keeps the restore order; the store numbers it.
    R"sql(
CREATE TABLE pending_reports_by_key (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  incarnation INTEGER NOT NULL,
  sequence INTEGER NOT NULL,
  arrival INTEGER NOT NULL,
  report BLOB NOT NULL,
  PRIMARY KEY (job_id, rank, incarnation, sequence)
) WITHOUT ROWID;
INSERT INTO pending_reports_by_key
  SELECT job_id, rank, incarnation, sequence, arrival, report FROM pending_reports;
DROP TABLE pending_reports;
ALTER TABLE pending_reports_by_key RENAME TO pending_reports;
)sql",
    // 4: a mark per decided check whose pending reports are not removed
    // yet: they go after the decision's commit, when the writer is idle
    // (core::DecidedCheck). A restore skips and removes a marked check's.
    R"sql(
CREATE TABLE decided_checks (
  job_id TEXT NOT NULL,
  grp INTEGER NOT NULL,
  step INTEGER NOT NULL,
  check_kind TEXT NOT NULL,
  plan_id INTEGER NOT NULL,
  PRIMARY KEY (job_id, grp, step, check_kind, plan_id)
) WITHOUT ROWID;
)sql",
    // 5: pending reports as a log: one row per commit holds the reports it
    // added (each with its arrival number), instead of a row per report: at
    // 16,384 ranks a row insert and delete per report were most of the
    // writer's work in a step. A report removed while its row stays has a
    // tombstone. pending_reports keeps what an older sdcd wrote; nothing new
    // goes there.
    R"sql(
CREATE TABLE report_log (
  id INTEGER PRIMARY KEY,
  reports BLOB NOT NULL
);
CREATE TABLE dropped_reports (
  log_id INTEGER NOT NULL,
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  incarnation INTEGER NOT NULL,
  sequence INTEGER NOT NULL,
  PRIMARY KEY (log_id, job_id, rank, incarnation, sequence)
) WITHOUT ROWID;
)sql",
    // 6: per-operator admin credentials (daemon/operators.h): the SHA-256
    // of each operator's token, never the token.
    R"sql(
CREATE TABLE operators (
  name TEXT PRIMARY KEY,
  role TEXT NOT NULL,
  token_sha256 BLOB NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  created_by TEXT NOT NULL
);
)sql",
    // 7: node identities (issue 38): who proved each rank's placement, and
    // which admin consented to an operator's enrollment (two-person).
    R"sql(
ALTER TABLE ranks ADD COLUMN identity TEXT NOT NULL DEFAULT '';
ALTER TABLE ranks ADD COLUMN proof TEXT NOT NULL DEFAULT '';
ALTER TABLE ranks ADD COLUMN unproven TEXT NOT NULL DEFAULT '';
ALTER TABLE operators ADD COLUMN approved_by TEXT NOT NULL DEFAULT '';
)sql",
};

constexpr int kMigrationCount = sizeof(kMigrations) / sizeof(kMigrations[0]);
static_assert(kMigrationCount == SqliteStore::kSchemaVersion);

absl::Status SqlError(sqlite3* db, const std::string& what) {
  return absl::InternalError(absl::StrCat("sqlite: ", what, ": ", sqlite3_errmsg(db)));
}

absl::Status Exec(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite: ", err ? err : "error"));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

// A prepared statement, reset after each use.
class SqliteStatement {
 public:
  SqliteStatement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) stmt_ = nullptr;
  }
  ~SqliteStatement() { sqlite3_finalize(stmt_); }
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;

  bool ok() const { return stmt_ != nullptr; }
  SqliteStatement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  SqliteStatement& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  SqliteStatement& Blob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // `v` must outlive the statement's next Run or Reset.
  SqliteStatement& StaticBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  // Runs a statement that returns no rows.
  absl::Status Run(const char* what) {
    const int rc = sqlite3_step(stmt_);
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    return rc == SQLITE_DONE ? absl::OkStatus() : SqlError(db_, what);
  }
  bool Next() { return sqlite3_step(stmt_) == SQLITE_ROW; }
  sqlite3_stmt* raw() { return stmt_; }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    return p == nullptr ? "" : std::string(p, sqlite3_column_bytes(stmt_, col));
  }
  std::string Bytes(int col) {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
    return p == nullptr ? "" : std::string(p, sqlite3_column_bytes(stmt_, col));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

}  // namespace internal

namespace {

using Stmt = internal::SqliteStatement;

absl::StatusOr<int> SchemaVersion(sqlite3* db) {
  Stmt exists(db, "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'");
  if (!exists.ok()) return SqlError(db, "reading the schema");
  if (!exists.Next()) return 0;
  Stmt version(db, "SELECT version FROM schema_version");
  if (!version.ok() || !version.Next()) return SqlError(db, "reading schema_version");
  return static_cast<int>(version.Int(0));
}

absl::Status Migrate(sqlite3* db) {
  absl::StatusOr<int> version = SchemaVersion(db);
  if (!version.ok()) return version.status();
  if (*version > SqliteStore::kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database schema version ", *version, " is newer than this sdcd understands (",
        SqliteStore::kSchemaVersion, "); upgrade sdcd"));
  }
  for (int v = *version + 1; v <= SqliteStore::kSchemaVersion; ++v) {
    std::string sql = absl::StrCat("BEGIN IMMEDIATE;", kMigrations[v - 1]);
    if (v == 1) {
      absl::StrAppend(&sql, "CREATE TABLE schema_version (version INTEGER NOT NULL);",
                      "INSERT INTO schema_version VALUES (1);");
    } else {
      absl::StrAppend(&sql, "UPDATE schema_version SET version = ", v, ";");
    }
    absl::StrAppend(&sql, "COMMIT;");
    if (absl::Status s = Exec(db, sql); !s.ok()) {
      Exec(db, "ROLLBACK;").IgnoreError();
      return absl::InternalError(absl::StrCat("migration to schema version ", v,
                                              " failed: ", s.message()));
    }
  }
  return absl::OkStatus();
}

// What the store answers once a commit failed: it keeps nothing more.
absl::Status WritesStopped(const absl::Status& why) {
  return absl::UnavailableError(
      absl::StrCat("the database stopped accepting writes: ", why.message()));
}

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

std::string LayoutBlob(const std::vector<std::string>& tensors) {
  v1::Hello h;
  for (const auto& t : tensors) h.add_weight_tensors(t);
  return h.SerializeAsString();
}

core::PendingKey PendingKeyOf(const core::Report& r) {
  return {r.job_id, r.rank, r.incarnation, r.sequence};
}

// A report_log row's blob: per report, its arrival number (varint), the
// length of its v1::Report (varint) and the report.
void AppendVarint(std::string* out, uint64_t v) {
  uint8_t buf[10];  // The longest varint of 64 bits.
  uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(v, buf);
  out->append(reinterpret_cast<const char*>(buf), end - buf);
}

void AppendLogEntry(std::string* blob, int64_t arrival, absl::string_view report) {
  AppendVarint(blob, static_cast<uint64_t>(arrival));
  AppendVarint(blob, report.size());
  blob->append(report.data(), report.size());
}

void AppendLogEntry(std::string* blob, int64_t arrival, const v1::Report& report) {
  AppendVarint(blob, static_cast<uint64_t>(arrival));
  const size_t size = report.ByteSizeLong();
  AppendVarint(blob, size);
  const size_t at = blob->size();
  blob->resize(at + size);
  report.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&(*blob)[at]));
}

// Calls `f(arrival, report bytes)` for each entry of a row's blob, in order.
template <typename F>
absl::Status ForEachLogEntry(const std::string& blob, F f) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(blob.data()),
                                            static_cast<int>(blob.size()));
  in.SetTotalBytesLimit(std::numeric_limits<int>::max());
  while (in.CurrentPosition() < static_cast<int>(blob.size())) {
    uint64_t arrival = 0;
    uint32_t size = 0;
    if (!in.ReadVarint64(&arrival) || !in.ReadVarint32(&size) ||
        blob.size() - in.CurrentPosition() < size) {
      return absl::DataLossError("bad report_log row");
    }
    const absl::string_view report(blob.data() + in.CurrentPosition(), size);
    if (absl::Status s = f(static_cast<int64_t>(arrival), report); !s.ok()) return s;
    in.Skip(static_cast<int>(size));
  }
  return absl::OkStatus();
}

// Calls `f(row, arrival, report, dropped)` for every stored pending report:
// rows of pending_reports (an older sdcd's; row 0) first, then those of
// report_log (rows from 1), `dropped` if a tombstone says it was removed.
template <typename F>
absl::Status ForEachStoredReport(sqlite3* db, F f) {
  {
    Stmt s(db, "SELECT arrival, report FROM pending_reports ORDER BY arrival");
    while (s.Next()) {
      v1::Report r;
      if (!r.ParseFromString(s.Bytes(1))) return absl::DataLossError("bad pending report row");
      if (absl::Status st = f(0, s.Int(0), r, false); !st.ok()) return st;
    }
  }
  using Key = std::tuple<int64_t, std::string, uint32_t, uint64_t, uint64_t>;
  absl::flat_hash_set<Key> dropped;
  {
    Stmt s(db, "SELECT log_id, job_id, rank, incarnation, sequence FROM dropped_reports");
    while (s.Next()) {
      dropped.insert(Key(s.Int(0), s.Text(1), static_cast<uint32_t>(s.Int(2)),
                         static_cast<uint64_t>(s.Int(3)), static_cast<uint64_t>(s.Int(4))));
    }
  }
  Stmt s(db, "SELECT id, reports FROM report_log ORDER BY id");
  while (s.Next()) {
    const int64_t row = s.Int(0);
    absl::Status st = ForEachLogEntry(s.Bytes(1), [&](int64_t arrival, absl::string_view bytes) {
      v1::Report r;
      if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return absl::DataLossError(absl::StrCat("bad report in report_log row ", row));
      }
      const bool gone =
          !dropped.empty() &&
          dropped.contains(Key(row, r.job_id(), r.rank(), r.incarnation(), r.sequence()));
      return f(row, arrival, r, gone);
    });
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                               SqliteStoreOptions options) {
  sqlite3* db = nullptr;
  // SQLite's memory statistics take a process-wide mutex on every
  // allocation it makes, and sdcd reads none of them. Only possible before
  // SQLite initializes: the first store of the process decides.
  static std::once_flag memstatus_off;
  std::call_once(memstatus_off, [] { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); });
  // No SQLite mutex: write_mu_ serializes every use of the connection, and
  // SQLite's own lock around each of the dozen calls a statement makes was a
  // measurable share of the writer thread at 16,384 ranks.
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                             SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(absl::StrCat(
        "cannot open database ", path, ": ", db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  // A 64 MiB page cache and a WAL checkpoint every 4,096 pages (16 MiB).
  // With SQLite's defaults (2 MiB, 1,000 pages) the commits of a step's
  // rank progress at 16,384 ranks read back pages just evicted (about 550
  // reads a step) and checkpointed every few commits, each checkpoint
  // another fsync with the writer waiting (59 fsyncs in 4 s of steps,
  // against 33 with these). In a SQLite-only replay of one step's writes,
  // 275 ms of CPU with the defaults and 140 ms with these.
  for (const char* pragma : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;",
                             "PRAGMA busy_timeout=5000;", "PRAGMA foreign_keys=OFF;",
                             "PRAGMA cache_size=-65536;", "PRAGMA wal_autocheckpoint=4096;"}) {
    if (absl::Status s = Exec(db, pragma); !s.ok()) {
      sqlite3_close(db);
      return absl::UnavailableError(absl::StrCat("database ", path, ": ", s.message()));
    }
  }
  if (absl::Status s = Migrate(db); !s.ok()) {
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db, path, options));
  {
    absl::MutexLock lock(&store->write_mu_);
    if (absl::Status s = store->IndexReports(); !s.ok()) {
      return absl::DataLossError(absl::StrCat("database ", path, ": ", s.message()));
    }
  }
  store->Start();
  return store;
}

SqliteStore::SqliteStore(sqlite3* db, std::string path, SqliteStoreOptions options)
    : db_(db), path_(std::move(path)), options_(options) {}

void SqliteStore::Start() {
  // Named for top -H and perf.
  writer_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sdc-store");
    WriterMain();
  });
  notifier_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sdc-store-done");
    NotifierMain();
  });
}

SqliteStore::~SqliteStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (writer_.joinable()) writer_.join();
  if (notifier_.joinable()) notifier_.join();
  sqlite3_close(db_);
}

absl::StatusOr<uint64_t> SqliteStore::Apply(core::Mutation m) {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  const uint64_t ticket = ++next_ticket_;
  queue_.emplace_back(ticket, std::move(m));
  return ticket;
}

absl::Status SqliteStore::WaitDurable(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto done = [this, ticket]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return durable_ >= ticket || !failed_.ok();
  };
  mu_.Await(absl::Condition(&done));
  return durable_ >= ticket ? absl::OkStatus() : failed_;
}

void SqliteStore::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (durable_ == next_ticket_ || !failed_.ok()) && callbacks_.empty() && due_.empty() &&
           !notifying_;
  };
  mu_.Await(absl::Condition(&idle));
}

void SqliteStore::NotifyDurable(uint64_t ticket, std::function<void(absl::Status)> done) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (durable_ < ticket && failed_.ok()) {
      callbacks_.emplace(ticket, std::move(done));
      return;
    }
    status = durable_ >= ticket ? absl::OkStatus() : failed_;
    // Behind callbacks already due, so that messages keep commit order.
    if (!due_.empty() || notifying_) {
      due_.emplace_back(status, std::move(done));
      return;
    }
  }
  done(status);
}

absl::Status SqliteStore::health() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

size_t SqliteStore::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

uint64_t SqliteStore::commits() const {
  absl::MutexLock lock(&mu_);
  return commits_;
}

uint64_t SqliteStore::file_bytes() const {
  uint64_t total = 0;
  for (const std::string& p : {path_, path_ + "-wal"}) {
    struct stat st;
    if (stat(p.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  return total;
}

void SqliteStore::WriterMain() {
  while (true) {
    std::deque<std::pair<uint64_t, core::Mutation>> batch;
    bool stopping = false;
    // Rows to delete, marks to clear, rows to compact: a pause in the
    // writes is the time for them.
    const absl::Duration settle_after = SettleDelay();
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      if (settle_after == absl::InfiniteDuration() || !failed_.ok()) {
        mu_.Await(absl::Condition(&ready));
      } else {
        mu_.AwaitWithTimeout(absl::Condition(&ready), settle_after);
      }
      stopping = queue_.empty() && stop_;
      batch.swap(queue_);
    }
    if (batch.empty()) {
      // Idle, or stopping (then everything that can go: a clean database).
      absl::Status status;
      if (stopping) {
        // Progress too, so that the rank rows are current.
        absl::MutexLock lock(&write_mu_);
        status = Commit(nullptr, std::numeric_limits<size_t>::max(), /*all_progress=*/true);
      } else if (settle_after != absl::InfiniteDuration()) {
        absl::MutexLock lock(&write_mu_);
        status = Commit(nullptr, kSettleChunk);
      }
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        // What is left stays marked; a restore removes it.
        failed_ = WritesStopped(status);
        settling_reports_.store(0, std::memory_order_relaxed);
      }
      if (stopping) {
        writer_done_ = true;
        return;
      }
      continue;
    }
    absl::Status status;
    {
      absl::MutexLock lock(&write_mu_);
      core::Mutation m = Coalesce(batch);
      // Far behind on removals (no pause long enough): some go along.
      status = Commit(&m, settling_reports() > kSettleBacklog ? kSettleChunk : 0);
    }
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      durable_ = batch.back().first;
      ++commits_;
    } else {
      failed_ = WritesStopped(status);
    }
    // After a failure every waiter is due, with the failure.
    const auto end = failed_.ok() ? callbacks_.upper_bound(durable_) : callbacks_.end();
    for (auto it = callbacks_.begin(); it != end; ++it) {
      due_.emplace_back(failed_, std::move(it->second));
    }
    callbacks_.erase(callbacks_.begin(), end);
  }
}

absl::Status SqliteStore::Commit(core::Mutation* m, size_t settle, bool all_progress) {
  absl::Status status = Exec(db_, "BEGIN IMMEDIATE;");
  if (status.ok() && m != nullptr) status = Write(*m);
  if (status.ok() && settle > 0) status = Settle(settle);
  if (status.ok() && all_progress) status = WriteAllProgress();
  status = status.ok() ? Exec(db_, "COMMIT;") : status;
  if (!status.ok()) Exec(db_, "ROLLBACK;").IgnoreError();
  return status;
}

void SqliteStore::NotifierMain() {
  while (true) {
    std::deque<std::pair<absl::Status, std::function<void(absl::Status)>>> due;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return writer_done_ || !due_.empty();
      };
      notifying_ = false;
      mu_.Await(absl::Condition(&ready));
      if (due_.empty()) return;  // The writer is done and nothing is left.
      due.swap(due_);
      notifying_ = true;
    }
    // Messages for one stream from many callbacks leave together.
    BatchScope scope;
    for (auto& [status, cb] : due) cb(status);
  }
}

// One commit's worth of mutations as one, without writes a later mutation
// of the same batch makes void: a rank record rewritten (the last wins), and
// a report added and removed again before the commit. Order is kept
// otherwise; the result is what applying them one by one would leave.
core::Mutation SqliteStore::Coalesce(std::deque<std::pair<uint64_t, core::Mutation>>& batch) {
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

internal::SqliteStatement& SqliteStore::Prepared(const char* sql) {
  std::unique_ptr<internal::SqliteStatement>& stmt = statements_[sql];
  if (stmt == nullptr) stmt = std::make_unique<internal::SqliteStatement>(db_, sql);
  return *stmt;
}

absl::Status SqliteStore::Write(core::Mutation& m) {
  for (const std::string& job : m.jobs_removed) {
    for (const char* sql : {"DELETE FROM jobs WHERE job_id = ?1",
                            "DELETE FROM ranks WHERE job_id = ?1",
                            "DELETE FROM replica_groups WHERE job_id = ?1",
                            "DELETE FROM plans WHERE job_id = ?1",
                            "DELETE FROM step_verdicts WHERE job_id = ?1",
                            "DELETE FROM checkpoint_decisions WHERE job_id = ?1",
                            "DELETE FROM decided_checks WHERE job_id = ?1"}) {
      Stmt& s = Prepared(sql);
      s.Bind(1, job);
      if (absl::Status st = s.Run("dropping an abandoned job"); !st.ok()) return st;
    }
    dirty_.erase(job);
  }
  for (const auto& j : m.jobs) {
    Stmt& s = Prepared( "INSERT OR REPLACE INTO jobs VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    s.Bind(1, j.job_id).Bind(2, j.world_size).Bind(3, j.audit_every);
    s.Bind(4, j.weight_check_every).Bind(5, UnixMillis(j.created)).Bind(6, j.next_plan_id);
    if (absl::Status st = s.Run("writing a job"); !st.ok()) return st;
  }
  for (const auto& r : m.ranks) {
    if (absl::Status st = WriteRank(r); !st.ok()) return st;
    auto of_job = dirty_.find(r.job_id);
    if (of_job != dirty_.end()) of_job->second.erase(r.placement.rank);
  }
  for (auto& r : m.progress) {
    auto& of_job = dirty_[r.job_id];
    of_job[r.placement.rank] = std::move(r);
  }
  for (const auto& g : m.groups) {
    Stmt& s = Prepared( "INSERT OR REPLACE INTO replica_groups VALUES (?1, ?2, ?3, ?4, ?5)");
    s.Bind(1, g.job_id).Bind(2, g.group).Blob(3, LayoutBlob(g.weight_tensors));
    s.Bind(4, g.parameter_count).Bind(5, static_cast<int64_t>(g.layout_digest));
    if (absl::Status st = s.Run("writing a replica group"); !st.ok()) return st;
  }
  if (!m.pending_added.empty()) {
    if (absl::Status st = AppendReports(m.pending_added); !st.ok()) return st;
  }
  for (const auto& k : m.pending_removed) {
    if (absl::Status st = RemovePending(k); !st.ok()) return st;
  }
  // A decided check's reports stay until the writer is idle (Settle); its
  // mark says they are spent.
  for (const auto& d : m.decided) {
    if (d.reports.empty()) continue;
    Stmt& s = Prepared("INSERT OR REPLACE INTO decided_checks VALUES (?1, ?2, ?3, ?4, ?5)");
    s.Bind(1, d.job_id).Bind(2, d.group).Bind(3, static_cast<int64_t>(d.step));
    s.Bind(4, core::CheckKindName(d.check)).Bind(5, static_cast<int64_t>(d.plan_id));
    if (absl::Status st = s.Run("marking a decided check"); !st.ok()) return st;
    const uint64_t id = next_settling_++;
    Settling& settling = settling_[id];
    settling.check = {d.job_id, d.group, d.step, d.check, d.plan_id, {}};
    for (const core::PendingKey& k : d.reports) {
      const std::optional<int64_t> row = Forget(k);
      if (!row.has_value()) continue;
      if (*row == kLegacyRow) {
        legacy_.emplace_back(id, k);
        ++settling.rows_left;
        continue;
      }
      std::vector<uint64_t>& checks = rows_.at(*row).checks;
      if (checks.empty() || checks.back() != id) {
        checks.push_back(id);
        ++settling.rows_left;
      }
    }
    if (settling.rows_left == 0) clearable_.push_back(id);
  }
  for (const auto& d : m.decided_cleared) {
    if (absl::Status st = ClearMark(d); !st.ok()) return st;
  }
  for (const auto& i : m.incidents) {
    Stmt& s = Prepared( "INSERT OR REPLACE INTO incidents VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    s.Bind(1, static_cast<int64_t>(i.id)).Bind(2, i.job_id).Bind(3, static_cast<int64_t>(i.step));
    s.Bind(4, core::CheckKindName(i.check)).Bind(5, i.outcome).Bind(6, i.confirmed ? 1 : 0);
    s.Bind(7, static_cast<int64_t>(i.request_id)).Bind(8, UnixMillis(i.created));
    s.Blob(9, ToProto(i).SerializeAsString());
    if (absl::Status st = s.Run("writing an incident"); !st.ok()) return st;
    Stmt& g = Prepared( "INSERT OR REPLACE INTO incident_gpus VALUES (?1, ?2, ?3, ?4)");
    for (size_t k = 0; k < i.ranks.size(); ++k) {
      g.Bind(1, static_cast<int64_t>(i.id)).Bind(2, i.gpus[k]).Bind(3, i.nodes[k]);
      g.Bind(4, i.ranks[k]);
      if (absl::Status st = g.Run("writing an incident's GPU"); !st.ok()) return st;
    }
  }
  for (const auto& r : m.requests) {
    Stmt& s = Prepared( "INSERT OR REPLACE INTO requests VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    s.Bind(1, static_cast<int64_t>(r.id)).Bind(2, r.node).Bind(3, core::RequestStateName(r.state));
    s.Bind(4, UnixMillis(r.created)).Bind(5, UnixMillis(r.updated));
    s.Blob(6, ToProto(r).SerializeAsString());
    if (absl::Status st = s.Run("writing a request"); !st.ok()) return st;
    Stmt& t = Prepared( "INSERT OR REPLACE INTO request_transitions VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    for (size_t k = 0; k < r.transitions.size(); ++k) {
      const core::Transition& x = r.transitions[k];
      t.Bind(1, static_cast<int64_t>(r.id)).Bind(2, static_cast<int64_t>(k));
      t.Bind(3, core::RequestStateName(x.from)).Bind(4, core::RequestStateName(x.to));
      t.Bind(5, UnixMillis(x.at)).Bind(6, x.actor).Bind(7, x.reason);
      if (absl::Status st = t.Run("writing a transition"); !st.ok()) return st;
    }
  }
  for (const auto& sus : m.suspects) {
    Stmt& s = Prepared( "INSERT OR REPLACE INTO suspects VALUES (?1, ?2)");
    s.Bind(1, sus.gpu).Blob(2, ToProto(sus).SerializeAsString());
    if (absl::Status st = s.Run("writing a suspect"); !st.ok()) return st;
  }
  for (const auto& gpu : m.suspects_removed) {
    Stmt& s = Prepared( "DELETE FROM suspects WHERE gpu_uuid = ?1");
    s.Bind(1, gpu);
    if (absl::Status st = s.Run("removing a suspect"); !st.ok()) return st;
  }
  for (const auto& p : m.plans) {
    Stmt& s = Prepared( "INSERT OR REPLACE INTO plans VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    s.Bind(1, p.job_id).Bind(2, static_cast<int64_t>(p.plan_id)).Bind(3, p.group);
    s.Bind(4, p.suspect).Bind(5, p.done ? 1 : 0);
    s.Blob(6, ToProto(core::PlanMessage{p.plan_id, p.assignments, p.reason}).SerializeAsString());
    if (absl::Status st = s.Run("writing a plan"); !st.ok()) return st;
  }
  for (const auto& d : m.checkpoint_decisions) {
    Stmt& s = Prepared(
           "INSERT INTO checkpoint_decisions (job_id, step, allowed, reason, at_ms, revocation) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    s.Bind(1, d.job_id).Bind(2, static_cast<int64_t>(d.step)).Bind(3, d.allowed ? 1 : 0);
    s.Bind(4, d.reason).Bind(5, UnixMillis(d.at)).Bind(6, d.revocation ? 1 : 0);
    if (absl::Status st = s.Run("writing a checkpoint decision"); !st.ok()) return st;
  }
  for (const auto& [job, from] : m.rollbacks) {
    Stmt& s = Prepared( "DELETE FROM step_verdicts WHERE job_id = ?1 AND step >= ?2");
    s.Bind(1, job).Bind(2, static_cast<int64_t>(from));
    if (absl::Status st = s.Run("rolling back step verdicts"); !st.ok()) return st;
  }
  if (!m.step_verdicts.empty()) {
    Stmt& s = Prepared(
           "INSERT OR REPLACE INTO step_verdicts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    for (const auto& v : m.step_verdicts) {
      s.Bind(1, v.job_id).Bind(2, v.group).Bind(3, static_cast<int64_t>(v.step));
      s.Bind(4, core::CheckKindName(v.check)).Bind(5, v.failed ? 1 : 0);
      s.Bind(6, v.complete ? 1 : 0).Bind(7, v.applied ? 1 : 0).Bind(8, v.summary);
      s.Bind(9, static_cast<int64_t>(v.incident_id));
      if (absl::Status st = s.Run("writing a step verdict"); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::WriteRank(const core::RankRecord& r) {
  // An upsert changes the row in place; REPLACE deleted and reinserted it,
  // in the table and in its primary key's index.
  Stmt& s = Prepared(
      "INSERT INTO ranks VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
      "?15) ON CONFLICT (job_id, rank) DO UPDATE SET node = excluded.node, "
      "local_rank = excluded.local_rank, gpu_uuid = excluded.gpu_uuid, "
      "replica_group = excluded.replica_group, incarnation = excluded.incarnation, "
      "acked_sequence = excluded.acked_sequence, has_last_step = excluded.has_last_step, "
      "last_step = excluded.last_step, deterministic = excluded.deterministic, "
      "resumed = excluded.resumed, identity = excluded.identity, proof = excluded.proof, "
      "unproven = excluded.unproven");
  s.Bind(1, r.job_id).Bind(2, r.placement.rank).Bind(3, r.placement.node);
  s.Bind(4, r.placement.local_rank).Bind(5, r.placement.gpu_uuid);
  s.Bind(6, r.placement.replica_group).Bind(7, static_cast<int64_t>(r.incarnation));
  s.Bind(8, static_cast<int64_t>(r.acked_sequence)).Bind(9, r.has_last_step ? 1 : 0);
  s.Bind(10, static_cast<int64_t>(r.last_step)).Bind(11, r.deterministic ? 1 : 0);
  s.Bind(12, r.resumed ? 1 : 0).Bind(13, r.identity).Bind(14, r.proof).Bind(15, r.unproven);
  return s.Run("writing a rank");
}

absl::Status SqliteStore::WriteProgress(absl::string_view job_id, core::Rank rank) {
  auto of_job = dirty_.find(job_id);
  if (of_job == dirty_.end()) return absl::OkStatus();
  auto it = of_job->second.find(rank);
  if (it == of_job->second.end()) return absl::OkStatus();
  if (absl::Status st = WriteRank(it->second); !st.ok()) return st;
  of_job->second.erase(it);
  return absl::OkStatus();
}

absl::Status SqliteStore::WriteAllProgress() {
  for (auto& [job, of_job] : dirty_) {
    for (const auto& [rank, r] : of_job) {
      if (absl::Status st = WriteRank(r); !st.ok()) return st;
    }
    of_job.clear();
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::AppendReports(const std::vector<core::Report>& reports) {
  const int64_t id = next_row_++;
  LogRow& row = rows_[id];
  row.written = absl::Now();
  row.reports.reserve(reports.size());
  // A report whose key is pending already replaces it, as a row per report
  // did (INSERT OR REPLACE); the coordinator adds none.
  std::vector<bool> replaced;  // By a later one of this commit.
  for (uint32_t i = 0; i < reports.size(); ++i) {
    const core::Report& r = reports[i];
    auto [it, fresh] = located_.try_emplace(KeyOf(r), Location{id, i});
    if (!fresh && it->second.row == id) {
      replaced.resize(reports.size());
      replaced[it->second.index] = true;
      it->second.index = i;
      continue;
    }
    if (!fresh) {
      // From an earlier commit: dropped (which forgets it), then held here.
      if (absl::Status st = RemovePending(PendingKeyOf(r)); !st.ok()) return st;
      located_.emplace(KeyOf(r), Location{id, i});
    }
    ++row.live;
  }
  std::string blob;
  for (uint32_t i = 0; i < reports.size(); ++i) {
    if (!replaced.empty() && replaced[i]) continue;
    const core::Report& r = reports[i];
    AppendLogEntry(&blob, next_arrival_++, ToProto(r));
    row.reports.push_back(PendingKeyOf(r));
  }
  return InsertRow(id, blob);
}

absl::Status SqliteStore::InsertRow(int64_t id, const std::string& blob) {
  Stmt& s = Prepared("INSERT INTO report_log (id, reports) VALUES (?1, ?2)");
  s.Bind(1, id).StaticBlob(2, blob);
  return s.Run("writing reports");
}

std::optional<int64_t> SqliteStore::Forget(const core::PendingKey& k) {
  auto it = located_.find(KeyOf(k));
  if (it == located_.end()) return std::nullopt;
  const int64_t row = it->second.row;
  located_.erase(it);
  settling_reports_.fetch_add(1, std::memory_order_relaxed);
  if (row != kLegacyRow && --rows_.at(row).live == 0) spent_.push_back(row);
  return row;
}

absl::Status SqliteStore::DeleteLegacy(const core::PendingKey& k) {
  Stmt& s = Prepared(
      "DELETE FROM pending_reports WHERE job_id = ?1 AND rank = ?2 AND incarnation = ?3 "
      "AND sequence = ?4");
  s.Bind(1, k.job_id).Bind(2, k.rank).Bind(3, static_cast<int64_t>(k.incarnation));
  s.Bind(4, static_cast<int64_t>(k.sequence));
  if (absl::Status st = s.Run("removing a report"); !st.ok()) return st;
  settling_reports_.fetch_sub(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status SqliteStore::RemovePending(const core::PendingKey& k) {
  // The rank's progress may rest on this report (Mutation::progress).
  if (absl::Status st = WriteProgress(k.job_id, k.rank); !st.ok()) return st;
  const std::optional<int64_t> row = Forget(k);
  if (!row.has_value()) return absl::OkStatus();
  if (*row == kLegacyRow) return DeleteLegacy(k);
  // Its row goes when none of its reports is pending; until then a restore
  // skips this one.
  Stmt& s = Prepared("INSERT OR REPLACE INTO dropped_reports VALUES (?1, ?2, ?3, ?4, ?5)");
  s.Bind(1, *row).Bind(2, k.job_id).Bind(3, k.rank).Bind(4, static_cast<int64_t>(k.incarnation));
  s.Bind(5, static_cast<int64_t>(k.sequence));
  rows_.at(*row).tombstones = true;
  return s.Run("dropping a report");
}

absl::Status SqliteStore::DeleteRow(int64_t id) {
  auto it = rows_.find(id);
  const LogRow& row = it->second;
  // The progress of a rank may rest on reports of this row.
  for (const core::PendingKey& k : row.reports) {
    if (absl::Status st = WriteProgress(k.job_id, k.rank); !st.ok()) return st;
  }
  Stmt& s = Prepared("DELETE FROM report_log WHERE id = ?1");
  s.Bind(1, id);
  if (absl::Status st = s.Run("removing reports"); !st.ok()) return st;
  if (row.tombstones) {
    Stmt& t = Prepared("DELETE FROM dropped_reports WHERE log_id = ?1");
    t.Bind(1, id);
    if (absl::Status st = t.Run("removing tombstones"); !st.ok()) return st;
  }
  settling_reports_.fetch_sub(row.reports.size() - row.live, std::memory_order_relaxed);
  for (uint64_t check : row.checks) {
    auto settling = settling_.find(check);
    if (settling != settling_.end() && --settling->second.rows_left == 0) {
      clearable_.push_back(check);
    }
  }
  rows_.erase(it);
  return absl::OkStatus();
}

absl::Status SqliteStore::Compact(absl::Time before, size_t limit) {
  std::vector<int64_t> old;
  size_t moving = 0;
  for (const auto& [id, row] : rows_) {
    if (row.written >= before || moving >= limit) break;
    if (row.live == 0 || row.live == row.reports.size()) continue;
    old.push_back(id);
    moving += row.live;
  }
  if (old.empty()) return absl::OkStatus();
  const int64_t id = next_row_++;
  LogRow fresh;
  fresh.written = absl::Now();
  fresh.reports.reserve(moving);
  std::string blob;
  Stmt& read = Prepared("SELECT reports FROM report_log WHERE id = ?1");
  for (int64_t from : old) {
    read.Bind(1, from);
    if (!read.Next()) {
      read.Reset();
      return absl::DataLossError(absl::StrCat("report_log row ", from, " is missing"));
    }
    const std::string stored = read.Bytes(0);
    read.Reset();
    const LogRow& row = rows_.at(from);
    size_t i = 0;
    absl::Status parsed =
        ForEachLogEntry(stored, [&](int64_t arrival, absl::string_view report) -> absl::Status {
          if (i >= row.reports.size()) return absl::DataLossError("report_log row too long");
          const core::PendingKey& k = row.reports[i++];
          auto it = located_.find(KeyOf(k));
          if (it == located_.end() || it->second.row != from) return absl::OkStatus();
          it->second = {id, static_cast<uint32_t>(fresh.reports.size())};
          AppendLogEntry(&blob, arrival, report);  // Its arrival stays.
          fresh.reports.push_back(k);
          ++fresh.live;
          return absl::OkStatus();
        });
    if (!parsed.ok()) return parsed;
  }
  if (absl::Status st = InsertRow(id, blob); !st.ok()) return st;
  rows_[id] = std::move(fresh);
  for (int64_t from : old) {
    if (absl::Status st = DeleteRow(from); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Duration SqliteStore::SettleDelay() const {
  if (!spent_.empty() || !legacy_.empty() || !clearable_.empty()) return kSettleIdle;
  if (rows_.empty()) return absl::InfiniteDuration();
  // The oldest row may hold removed reports among pending ones.
  const absl::Time due =
      std::max(next_compaction_, rows_.begin()->second.written + options_.compact_after);
  return std::max(kSettleIdle, due - absl::Now());
}

absl::Status SqliteStore::ClearMark(const core::DecidedCheck& d) {
  Stmt& s = Prepared(
      "DELETE FROM decided_checks WHERE job_id = ?1 AND grp = ?2 AND step = ?3 AND "
      "check_kind = ?4 AND plan_id = ?5");
  s.Bind(1, d.job_id).Bind(2, d.group).Bind(3, static_cast<int64_t>(d.step));
  s.Bind(4, core::CheckKindName(d.check)).Bind(5, static_cast<int64_t>(d.plan_id));
  return s.Run("clearing a decided check's mark");
}

absl::Status SqliteStore::Settle(size_t limit) {
  size_t work = 0;
  while (!spent_.empty() && work < limit) {
    const int64_t id = spent_.front();
    work += rows_.at(id).reports.size();
    if (absl::Status st = DeleteRow(id); !st.ok()) return st;
    spent_.pop_front();
  }
  while (!legacy_.empty() && work < limit) {
    const auto& [check, k] = legacy_.front();
    if (absl::Status st = WriteProgress(k.job_id, k.rank); !st.ok()) return st;
    if (absl::Status st = DeleteLegacy(k); !st.ok()) return st;
    if (--settling_.at(check).rows_left == 0) clearable_.push_back(check);
    legacy_.pop_front();
    ++work;
  }
  const absl::Time now = absl::Now();
  if (work < limit && now >= next_compaction_) {
    next_compaction_ = now + options_.compact_after;
    if (absl::Status st = Compact(now - options_.compact_after, limit - work); !st.ok()) return st;
  }
  for (uint64_t check : clearable_) {
    auto it = settling_.find(check);
    if (absl::Status st = ClearMark(it->second.check); !st.ok()) return st;
    settling_.erase(it);
  }
  clearable_.clear();
  return absl::OkStatus();
}

absl::Status SqliteStore::IndexReports() {
  absl::Status st = ForEachStoredReport(
      db_, [&](int64_t id, int64_t arrival, const v1::Report& r, bool dropped) -> absl::Status {
        next_arrival_ = std::max(next_arrival_, arrival + 1);
        ReportKey key(r.job_id(), r.rank(), r.incarnation(), r.sequence());
        if (id == kLegacyRow) {
          located_[std::move(key)] = {kLegacyRow, 0};
          return absl::OkStatus();
        }
        auto [it, fresh] = rows_.try_emplace(id);
        LogRow& row = it->second;
        if (fresh) {
          row.written = absl::Now();
          next_row_ = std::max(next_row_, id + 1);
        }
        if (dropped) {
          row.tombstones = true;
          settling_reports_.fetch_add(1, std::memory_order_relaxed);
        } else {
          located_[std::move(key)] = {id, static_cast<uint32_t>(row.reports.size())};
          ++row.live;
        }
        row.reports.push_back({r.job_id(), r.rank(), r.incarnation(), r.sequence()});
        return absl::OkStatus();
      });
  if (!st.ok()) return st;
  // Rows whose reports were all removed (stopped before deleting them).
  for (const auto& [id, row] : rows_) {
    if (row.live == 0) spent_.push_back(id);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OperatorRecord>> SqliteStore::LoadOperators() {
  absl::MutexLock lock(&write_mu_);
  Stmt s(db_,
         "SELECT name, role, token_sha256, created_unix_ms, created_by, approved_by FROM "
         "operators ORDER BY name");
  if (!s.ok()) return SqlError(db_, "reading operators");
  std::vector<OperatorRecord> out;
  while (s.Next()) {
    absl::StatusOr<Role> role = ParseRole(s.Text(1));
    if (!role.ok()) {
      return absl::DataLossError(absl::StrCat("operator ", s.Text(0), ": ", role.status().message()));
    }
    out.push_back({s.Text(0), *role, s.Bytes(2), FromUnixMillis(s.Int(3)), s.Text(4),
                   s.Text(5)});
  }
  return out;
}

absl::Status SqliteStore::InsertOperator(const OperatorRecord& r) {
  absl::MutexLock lock(&write_mu_);
  Stmt s(db_, "INSERT INTO operators VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  if (!s.ok()) return SqlError(db_, "adding an operator");
  s.Bind(1, r.name).Bind(2, std::string(RoleName(r.role))).Blob(3, r.token_sha256);
  s.Bind(4, UnixMillis(r.created)).Bind(5, r.created_by).Bind(6, r.approved_by);
  if (sqlite3_step(s.raw()) != SQLITE_DONE) {
    if (sqlite3_extended_errcode(db_) == SQLITE_CONSTRAINT_PRIMARYKEY) {
      return absl::AlreadyExistsError(absl::StrCat("operator ", r.name, " already exists"));
    }
    return SqlError(db_, "adding an operator");
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::ApproveOperator(const std::string& name,
                                          const std::string& approved_by) {
  absl::MutexLock lock(&write_mu_);
  Stmt s(db_, "UPDATE operators SET approved_by = ?2 WHERE name = ?1");
  if (!s.ok()) return SqlError(db_, "approving an operator");
  s.Bind(1, name).Bind(2, approved_by);
  if (absl::Status st = s.Run("approving an operator"); !st.ok()) return st;
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no operator ", name));
  return absl::OkStatus();
}

absl::Status SqliteStore::DeleteOperator(const std::string& name) {
  absl::MutexLock lock(&write_mu_);
  Stmt s(db_, "DELETE FROM operators WHERE name = ?1");
  if (!s.ok()) return SqlError(db_, "removing an operator");
  s.Bind(1, name);
  if (absl::Status st = s.Run("removing an operator"); !st.ok()) return st;
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no operator ", name));
  return absl::OkStatus();
}

absl::StatusOr<core::Snapshot> SqliteStore::Load() {
  absl::MutexLock lock(&write_mu_);
  core::Snapshot snap;
  {
    Stmt s(db_, "SELECT * FROM jobs");
    while (s.Next()) {
      snap.jobs.push_back({s.Text(0), static_cast<uint32_t>(s.Int(1)),
                           static_cast<uint32_t>(s.Int(2)), static_cast<uint32_t>(s.Int(3)),
                           FromUnixMillis(s.Int(4)), static_cast<uint64_t>(s.Int(5))});
    }
  }
  {
    Stmt s(db_, "SELECT * FROM ranks");
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
    Stmt s(db_, "SELECT * FROM replica_groups");
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
        db_, [&](int64_t, int64_t arrival, const v1::Report& r, bool dropped) -> absl::Status {
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
    Stmt s(db_, "SELECT body FROM incidents ORDER BY id");
    while (s.Next()) {
      v1::Incident i;
      if (!i.ParseFromString(s.Bytes(0))) return absl::DataLossError("bad incident row");
      snap.incidents.push_back(FromProto(i));
    }
  }
  {
    Stmt s(db_, "SELECT body FROM requests ORDER BY id");
    while (s.Next()) {
      v1::ReplacementRequest r;
      if (!r.ParseFromString(s.Bytes(0))) return absl::DataLossError("bad request row");
      snap.requests.push_back(FromProto(r));
    }
  }
  {
    Stmt s(db_, "SELECT body FROM suspects");
    while (s.Next()) {
      v1::Suspect x;
      if (!x.ParseFromString(s.Bytes(0))) return absl::DataLossError("bad suspect row");
      snap.suspects.push_back(FromProto(x));
    }
  }
  {
    Stmt s(db_, "SELECT job_id, plan_id, grp, suspect, done, plan FROM plans");
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
      for (const auto& a : p.assignments()) r.assignments.push_back({a.replayer(), a.subject()});
      snap.plans.push_back(std::move(r));
    }
  }
  {
    Stmt s(db_, "SELECT * FROM step_verdicts");
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
    Stmt s(db_,
           "SELECT job_id, step, allowed, reason, at_ms, revocation FROM checkpoint_decisions "
           "ORDER BY id");
    while (s.Next()) {
      snap.checkpoint_decisions.push_back({s.Text(0), static_cast<uint64_t>(s.Int(1)),
                                           s.Int(2) != 0, s.Text(3), FromUnixMillis(s.Int(4)),
                                           s.Int(5) != 0});
    }
  }
  {
    Stmt s(db_, "SELECT job_id, grp, step, check_kind, plan_id FROM decided_checks");
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
