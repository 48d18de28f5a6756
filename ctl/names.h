#ifndef SDC_CTL_NAMES_H_
#define SDC_CTL_NAMES_H_

// The words sdcctl shows for the admin API's enums, and the parsers of the
// flags that name them. Pure functions; all thread-safe.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "admin.pb.h"
#include "common.pb.h"

namespace sdc::sdcctl {

// -o / --output.
enum class OutputFormat { kTable, kWide, kJson, kYaml, kName };

// "table" (also ""), "wide", "json", "yaml" or "name"; InvalidArgument
// otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

// True for kTable and kWide, the formats with a header line.
bool IsTable(OutputFormat format);

// "Pending", "Approved", ..., "Expired"; "Unknown" for anything else.
std::string StateName(v1::RequestState state);

// --state: "pending", "approved", ... "expired", any case; InvalidArgument
// otherwise (REQUEST_STATE_UNSPECIFIED is not accepted).
absl::StatusOr<v1::RequestState> ParseRequestState(absl::string_view text);

// "nonfinite", "reduced_gradients", "replay", "weights" (the names sdcd's
// metrics use); "unknown" for anything else.
std::string CheckName(v1::CheckKind check);

// "Ready", "Stale", "Disconnected"; "Unknown" for anything else.
std::string NodeStatusName(v1::NodeStatus status);

// "Running", "Passed", "Failed", "Error"; "Unknown" for anything else.
std::string DiagnosticStateName(v1::DiagnosticState state);

// "viewer", "operator", "admin"; "unknown" otherwise.
std::string RoleName(v1::OperatorRole role);

// --role: viewer, operator or admin, any case; InvalidArgument otherwise.
absl::StatusOr<v1::OperatorRole> ParseRole(absl::string_view text);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_NAMES_H_
