#include "daemon/sqlite_schema.h"

#include "absl/strings/str_cat.h"

namespace sdc::daemon::sqlite {
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
    // 8: attempts (issue 42): a job restarted by its launcher is a new
    // attempt of the same job; each is kept, and abandoned provisional
    // checkpoints are marked.
    R"sql(
ALTER TABLE jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN resume_step INTEGER NOT NULL DEFAULT 0;
CREATE TABLE attempts (
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  world_size INTEGER NOT NULL,
  resume_step INTEGER NOT NULL,
  started_ms INTEGER NOT NULL,
  closed_checks INTEGER NOT NULL,
  note TEXT NOT NULL,
  PRIMARY KEY (job_id, attempt)
);
ALTER TABLE checkpoint_decisions ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0;
)sql",
};

constexpr int kMigrationCount = sizeof(kMigrations) / sizeof(kMigrations[0]);
static_assert(kMigrationCount == kSchemaVersion);

using Stmt = internal::SqliteStatement;

}  // namespace

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
  if (*version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database schema version ", *version, " is newer than this sdcd understands (",
        kSchemaVersion, "); upgrade sdcd"));
  }
  for (int v = *version + 1; v <= kSchemaVersion; ++v) {
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

}  // namespace sdc::daemon::sqlite
