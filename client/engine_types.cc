#include "client/engine_types.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sdc::client {

std::string GuardSummary::ToString() const {
  return absl::StrFormat(
      "steps=%d skipped=%d audits=%d (unverified %d, mismatches %d) weight_checks=%d "
      "repairs=%d checkpoints allowed=%d vetoed=%d reports sent=%d acked=%d dropped=%d "
      "coordinator=%s%s",
      steps, skipped, audits, audits_unverified, audit_mismatches, weight_checks, repairs,
      checkpoints_allowed, checkpoints_vetoed, reports_sent, reports_acked, reports_dropped,
      coordinator_connected ? "connected" : "not connected",
      audits_off.empty() ? "" : absl::StrCat(" audits=off (", audits_off, ")"));
}

}  // namespace sdc::client
