#ifndef SDC_CTL_COMMAND_OUTPUT_H_
#define SDC_CTL_COMMAND_OUTPUT_H_

// What the commands other than get and describe print (those print through
// the table of resources, ctl/resources.h): history, approve and deny,
// diagnose, whoami, operator add. Pure functions of the admin API's
// messages and an injected "now"; all thread-safe.

#include <string>

#include "absl/time/time.h"
#include "admin.pb.h"
#include "ctl/names.h"

namespace sdc::sdcctl {

// A GPU's or node's history: in table and wide formats the incidents table
// then the requests table (each only if non-empty, a blank line between),
// NAME written "incident/ID" and "request/ID" because two kinds share the
// output; the kind/NAME lines for name; the whole response for json and
// yaml. An empty response gives "" except in json and yaml.
std::string FormatHistory(const v1::HistoryResponse& response, OutputFormat format, absl::Time now);

// True when the response holds nothing to show.
bool IsEmpty(const v1::HistoryResponse& response);

// The notice `approve` prints on stderr before it sends anything: what the
// approval will make the actuator do to the node, and what that costs on
// SageMaker HyperPod. Ends with a newline.
std::string ApprovalNotice(const v1::ReplacementRequest& request);

// The result of approve/deny: "request N approved" (or "denied"), with
// " (dry run: nothing changed)" when `dry_run`; "request/N" for name; the
// returned request for json and yaml. Ends with a newline.
std::string FormatDecision(const v1::ReplacementRequest& request, bool approved, bool dry_run,
                           OutputFormat format);

// `diagnose node`: in table and wide formats the verdict line, then one row
// per device (DEVICE, GPU, RESULT, MISMATCHES, MAX-ABS-ERROR, GFLOP/S,
// SECONDS; wide adds DETAIL); "diagnostic/ID" for name; the message for json
// and yaml. Ends with a newline.
std::string FormatDiagnostic(const v1::Diagnostic& diagnostic, OutputFormat format);

// kExitOk when every device passed, kExitDiagnosticFailed when one computed
// wrong values, kExitDiagnosticNoVerdict otherwise.
int DiagnosticExitCode(const v1::Diagnostic& diagnostic);

// `whoami`: Name, Role, Approvals Required and Server Version in table and
// wide formats; "operator/NAME" for name; the response for json and yaml.
std::string FormatWhoAmI(const v1::WhoAmIResponse& response, OutputFormat format);

// `operator add`, on stderr: who was added, and that the token on stdout is
// shown this once. Ends with a newline.
std::string OperatorAddedNotice(const v1::Operator& added);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_COMMAND_OUTPUT_H_
