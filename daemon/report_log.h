#ifndef SDC_DAEMON_REPORT_LOG_H_
#define SDC_DAEMON_REPORT_LOG_H_

// How sdcd's store keeps pending reports: report_log rows whose blob holds,
// per report, its arrival number (varint), the length of its v1::Report
// (varint) and the report; dropped_reports tombstones the ones removed from
// a row still holding others; pending_reports is an older sdcd's table,
// read and never written.

#include <sqlite3.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/sqlite_schema.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/trainer.pb.h"

namespace sdc::daemon {

// Appends one entry (arrival, the serialized report) to a row's blob.
void AppendLogEntry(std::string* blob, int64_t arrival, absl::string_view report);
void AppendLogEntry(std::string* blob, int64_t arrival, const v1::Report& report);

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
    internal::SqliteStatement s(db, "SELECT arrival, report FROM pending_reports ORDER BY arrival");
    while (s.Next()) {
      v1::Report r;
      if (!r.ParseFromString(s.Bytes(1))) return absl::DataLossError("bad pending report row");
      if (absl::Status st = f(0, s.Int(0), r, false); !st.ok()) return st;
    }
  }
  using Key = std::tuple<int64_t, std::string, uint32_t, uint64_t, uint64_t>;
  absl::flat_hash_set<Key> dropped;
  {
    internal::SqliteStatement s(db, "SELECT log_id, job_id, rank, incarnation, sequence FROM dropped_reports");
    while (s.Next()) {
      dropped.insert(Key(s.Int(0), s.Text(1), static_cast<uint32_t>(s.Int(2)),
                         static_cast<uint64_t>(s.Int(3)), static_cast<uint64_t>(s.Int(4))));
    }
  }
  internal::SqliteStatement s(db, "SELECT id, reports FROM report_log ORDER BY id");
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

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_REPORT_LOG_H_
