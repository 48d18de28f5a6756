#ifndef SDC_DAEMON_SQLITE_SCHEMA_H_
#define SDC_DAEMON_SQLITE_SCHEMA_H_

// The SQLite side of sdcd's store: the schema as numbered migrations, and
// the few tools every query of the store uses (a prepared statement,
// errors that name SQLite's message). Not thread-safe: the store's write
// mutex serializes every use of the connection.

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sdc::daemon {
namespace sqlite {

// The schema version this sdcd writes: the number of migrations.
inline constexpr int kSchemaVersion = 8;

// Internal: "sqlite: WHAT: SQLite's message for `db`".
absl::Status SqlError(sqlite3* db, const std::string& what);

// Runs statements that return no rows. Internal with SQLite's message.
absl::Status Exec(sqlite3* db, const std::string& sql);

// The database's schema version; 0 for a new file.
absl::StatusOr<int> SchemaVersion(sqlite3* db);

// Applies the migrations the database lacks, each in its own transaction.
// FailedPrecondition for a database written by a newer sdcd.
absl::Status Migrate(sqlite3* db);

}  // namespace sqlite

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
    return rc == SQLITE_DONE ? absl::OkStatus() : sqlite::SqlError(db_, what);
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
}  // namespace sdc::daemon

#endif  // SDC_DAEMON_SQLITE_SCHEMA_H_
