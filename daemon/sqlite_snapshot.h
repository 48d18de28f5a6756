#ifndef SDC_DAEMON_SQLITE_SNAPSHOT_H_
#define SDC_DAEMON_SQLITE_SNAPSHOT_H_

// Reading sdcd's store back at start: every table into the coordinator's
// Snapshot, pending reports in arrival order. DataLoss for a row this sdcd
// cannot read.

#include <sqlite3.h>

#include "absl/status/statusor.h"
#include "daemon/core/store.h"

namespace sdc::daemon {

absl::StatusOr<core::Snapshot> ReadSnapshot(sqlite3* db);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_SQLITE_SNAPSHOT_H_
