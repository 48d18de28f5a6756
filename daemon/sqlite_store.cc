#include "daemon/sqlite_store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/batch_scope.h"
#include "daemon/convert.h"
#include "daemon/mutation_batch.h"
#include "daemon/report_log.h"
#include "daemon/sqlite_schema.h"
#include "daemon/sqlite_snapshot.h"

namespace sdc::daemon {
namespace {

using sqlite::Exec;
using sqlite::SqlError;
using Stmt = internal::SqliteStatement;

static_assert(SqliteStore::kSchemaVersion == sqlite::kSchemaVersion);

// What the store answers once a commit failed: it keeps nothing more.
absl::Status WritesStopped(const absl::Status& why) {
  return absl::UnavailableError(
      absl::StrCat("the database stopped accepting writes: ", why.message()));
}

std::string LayoutBlob(const std::vector<std::string>& tensors) {
  v1::Hello h;
  for (const auto& t : tensors) h.add_weight_tensors(t);
  return h.SerializeAsString();
}

core::PendingKey PendingKeyOf(const core::Report& r) {
  return {r.job_id, r.rank, r.incarnation, r.sequence};
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
  if (absl::Status s = sqlite::Migrate(db); !s.ok()) {
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
      core::Mutation m = CoalesceMutations(batch);
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
                            "DELETE FROM decided_checks WHERE job_id = ?1",
                            "DELETE FROM attempts WHERE job_id = ?1"}) {
      Stmt& s = Prepared(sql);
      s.Bind(1, job);
      if (absl::Status st = s.Run("dropping an abandoned job"); !st.ok()) return st;
    }
    dirty_.erase(job);
  }
  for (const auto& a : m.attempts) {
    // Progress of the old ranks is moot: their rows go (and their pending
    // reports with the mutation's pending_removed, which then writes none).
    for (const char* sql : {"DELETE FROM ranks WHERE job_id = ?1",
                            "DELETE FROM replica_groups WHERE job_id = ?1",
                            "DELETE FROM plans WHERE job_id = ?1"}) {
      Stmt& s = Prepared(sql);
      s.Bind(1, a.job_id);
      if (absl::Status st = s.Run("starting an attempt"); !st.ok()) return st;
    }
    dirty_.erase(a.job_id);
    Stmt& s = Prepared("INSERT OR REPLACE INTO attempts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    s.Bind(1, a.job_id).Bind(2, static_cast<int64_t>(a.attempt)).Bind(3, a.world_size);
    s.Bind(4, static_cast<int64_t>(a.resume_step)).Bind(5, UnixMillis(a.started));
    s.Bind(6, a.closed_checks).Bind(7, a.note);
    if (absl::Status st = s.Run("writing an attempt"); !st.ok()) return st;
  }
  for (const auto& j : m.jobs) {
    Stmt& s = Prepared(
        "INSERT OR REPLACE INTO jobs (job_id, world_size, audit_every, weight_check_every, "
        "created_ms, next_plan_id, attempt, resume_step) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
    s.Bind(1, j.job_id).Bind(2, j.world_size).Bind(3, j.audit_every);
    s.Bind(4, j.weight_check_every).Bind(5, UnixMillis(j.created)).Bind(6, j.next_plan_id);
    s.Bind(7, static_cast<int64_t>(j.attempt)).Bind(8, static_cast<int64_t>(j.resume_step));
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
    s.Blob(6, ToProto(core::PlanMessage{p.plan_id, p.assignments, p.reason, p.watch, p.group})
                  .SerializeAsString());
    if (absl::Status st = s.Run("writing a plan"); !st.ok()) return st;
  }
  for (const auto& d : m.checkpoint_decisions) {
    Stmt& s = Prepared(
           "INSERT INTO checkpoint_decisions (job_id, step, allowed, reason, at_ms, revocation, "
           "abandoned) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    s.Bind(1, d.job_id).Bind(2, static_cast<int64_t>(d.step)).Bind(3, d.allowed ? 1 : 0);
    s.Bind(4, d.reason).Bind(5, UnixMillis(d.at)).Bind(6, d.revocation ? 1 : 0);
    s.Bind(7, d.abandoned ? 1 : 0);
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
  return ReadSnapshot(db_);
}

}  // namespace sdc::daemon
