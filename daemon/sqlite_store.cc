#include "daemon/sqlite_store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
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
  // Runs a statement that returns no rows.
  absl::Status Run(const char* what) {
    const int rc = sqlite3_step(stmt_);
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    return rc == SQLITE_DONE ? absl::OkStatus() : SqlError(db_, what);
  }
  bool Next() { return sqlite3_step(stmt_) == SQLITE_ROW; }
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

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path) {
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
  return std::unique_ptr<SqliteStore>(new SqliteStore(db, path));
}

SqliteStore::SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {
  {
    absl::MutexLock lock(&write_mu_);
    Stmt s(db_, "SELECT COALESCE(MAX(arrival), 0) FROM pending_reports");
    if (s.Next()) next_arrival_ = s.Int(0) + 1;
  }
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
  writer_.join();
  notifier_.join();
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
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      // Decided checks' reports still to remove: a pause in the writes is
      // the time to remove some.
      if (settling_.empty() || !failed_.ok()) {
        mu_.Await(absl::Condition(&ready));
      } else {
        mu_.AwaitWithTimeout(absl::Condition(&ready), kSettleIdle);
      }
      stopping = queue_.empty() && stop_;
      batch.swap(queue_);
    }
    if (batch.empty()) {
      // Idle, or stopping (then everything left: a clean database).
      absl::Status status;
      if (stopping) {
        // Progress too, so that the rank rows are current.
        absl::MutexLock lock(&write_mu_);
        status = Commit(nullptr, settling_reports(), /*all_progress=*/true);
      } else if (!settling_.empty()) {
        absl::MutexLock lock(&write_mu_);
        status = Commit(nullptr, kSettleChunk);
      }
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        // What is left stays marked; a restore removes it.
        failed_ = WritesStopped(status);
        settling_.clear();
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
      if (status.ok()) {
        for (core::DecidedCheck& d : m.decided) {
          if (d.reports.empty()) continue;
          settling_reports_.fetch_add(d.reports.size(), std::memory_order_relaxed);
          settling_.push_back({std::move(d), 0});
        }
      }
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

absl::Status SqliteStore::Commit(const core::Mutation* m, size_t settle, bool all_progress) {
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

absl::Status SqliteStore::Write(const core::Mutation& m) {
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
  for (const auto& r : m.progress) dirty_[r.job_id][r.placement.rank] = r;
  for (const auto& g : m.groups) {
    Stmt& s = Prepared( "INSERT OR REPLACE INTO replica_groups VALUES (?1, ?2, ?3, ?4, ?5)");
    s.Bind(1, g.job_id).Bind(2, g.group).Blob(3, LayoutBlob(g.weight_tensors));
    s.Bind(4, g.parameter_count).Bind(5, static_cast<int64_t>(g.layout_digest));
    if (absl::Status st = s.Run("writing a replica group"); !st.ok()) return st;
  }
  if (!m.pending_added.empty()) {
    Stmt& s = Prepared(
           "INSERT OR REPLACE INTO pending_reports "
           "(job_id, rank, incarnation, sequence, arrival, report) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    for (const auto& r : m.pending_added) {
      s.Bind(1, r.job_id).Bind(2, r.rank).Bind(3, static_cast<int64_t>(r.incarnation));
      s.Bind(4, static_cast<int64_t>(r.sequence)).Bind(5, next_arrival_++);
      s.Blob(6, ToProto(r).SerializeAsString());
      if (absl::Status st = s.Run("writing a report"); !st.ok()) return st;
    }
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
      "INSERT INTO ranks VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) "
      "ON CONFLICT (job_id, rank) DO UPDATE SET node = excluded.node, "
      "local_rank = excluded.local_rank, gpu_uuid = excluded.gpu_uuid, "
      "replica_group = excluded.replica_group, incarnation = excluded.incarnation, "
      "acked_sequence = excluded.acked_sequence, has_last_step = excluded.has_last_step, "
      "last_step = excluded.last_step, deterministic = excluded.deterministic, "
      "resumed = excluded.resumed");
  s.Bind(1, r.job_id).Bind(2, r.placement.rank).Bind(3, r.placement.node);
  s.Bind(4, r.placement.local_rank).Bind(5, r.placement.gpu_uuid);
  s.Bind(6, r.placement.replica_group).Bind(7, static_cast<int64_t>(r.incarnation));
  s.Bind(8, static_cast<int64_t>(r.acked_sequence)).Bind(9, r.has_last_step ? 1 : 0);
  s.Bind(10, static_cast<int64_t>(r.last_step)).Bind(11, r.deterministic ? 1 : 0);
  s.Bind(12, r.resumed ? 1 : 0);
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

absl::Status SqliteStore::RemovePending(const core::PendingKey& k) {
  // The rank's progress may rest on this report (Mutation::progress).
  if (absl::Status st = WriteProgress(k.job_id, k.rank); !st.ok()) return st;
  Stmt& s = Prepared(
      "DELETE FROM pending_reports WHERE job_id = ?1 AND rank = ?2 AND incarnation = ?3 "
      "AND sequence = ?4");
  s.Bind(1, k.job_id).Bind(2, k.rank).Bind(3, static_cast<int64_t>(k.incarnation));
  s.Bind(4, static_cast<int64_t>(k.sequence));
  return s.Run("removing a report");
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
  while (limit > 0 && !settling_.empty()) {
    Settling& front = settling_.front();
    const std::vector<core::PendingKey>& reports = front.check.reports;
    for (; front.next < reports.size() && limit > 0; ++front.next, --limit) {
      if (absl::Status st = RemovePending(reports[front.next]); !st.ok()) return st;
    }
    if (front.next < reports.size()) break;
    if (absl::Status st = ClearMark(front.check); !st.ok()) return st;
    settling_reports_.fetch_sub(reports.size(), std::memory_order_relaxed);
    settling_.pop_front();
  }
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
    Stmt s(db_, "SELECT report FROM pending_reports ORDER BY arrival");
    while (s.Next()) {
      v1::Report r;
      if (!r.ParseFromString(s.Bytes(0))) return absl::DataLossError("bad pending report row");
      absl::StatusOr<core::Report> c = FromProto(r);
      if (!c.ok()) return absl::DataLossError(c.status().message());
      snap.pending.push_back(*std::move(c));
    }
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
