#ifndef SDC_CTL_SDCCTL_FORMAT_H_
#define SDC_CTL_SDCCTL_FORMAT_H_

// What sdcctl prints, as pure functions of the admin API's messages and an
// injected "now": no I/O, no flags, no clock, so every byte of the CLI's
// output is unit-tested (sdcctl_format_test.cc). sdcctl_main.cc does the
// flags, the channel and the exit. All functions are thread-safe (stateless).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "admin.pb.h"
#include "agent.pb.h"
#include "common.pb.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/status.h"

namespace sdc::sdcctl {

// Exit codes: scripts branch on these, so they are part of the CLI contract.
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;         // Anything not listed below.
inline constexpr int kExitUsage = 2;         // Bad command line; nothing was sent.
inline constexpr int kExitNotFound = 3;      // NOT_FOUND.
inline constexpr int kExitPrecondition = 4;  // FAILED_PRECONDITION (e.g. already decided).
inline constexpr int kExitUnreachable = 5;   // UNAVAILABLE or DEADLINE_EXCEEDED.
inline constexpr int kExitPermission = 6;    // UNAUTHENTICATED or PERMISSION_DENIED.
// `diagnose`: the diagnostic ran and a device computed wrong values.
inline constexpr int kExitDiagnosticFailed = 7;
// `diagnose`: no verdict (the agent could not run it, its stream ended, or
// it was still running at the deadline).
inline constexpr int kExitDiagnosticNoVerdict = 8;

// The exit code for an RPC that ended with `code` (kExitOk for OK).
int ExitCodeFor(grpc::StatusCode code);

// The text after "sdcctl: error: " for a failed RPC to `server`, on one line
// (newlines in the server's message become spaces). UNAVAILABLE and
// DEADLINE_EXCEEDED read "cannot reach sdcd at SERVER: ...". The server's own
// message is kept whole, so a FAILED_PRECONDITION that suggests --force still
// does. REQUIRES: !status.ok().
std::string RpcErrorMessage(const grpc::Status& status, absl::string_view server);

// -o / --output.
enum class OutputFormat { kTable, kWide, kJson, kYaml, kName };

// "table" (also ""), "wide", "json", "yaml" or "name"; InvalidArgument
// otherwise.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

// --state: "pending", "approved", ... "expired", any case; InvalidArgument
// otherwise (REQUEST_STATE_UNSPECIFIED is not accepted).
absl::StatusOr<v1::RequestState> ParseRequestState(absl::string_view text);

// "Pending", "Approved", ..., "Expired"; "Unknown" for anything else.
std::string StateName(v1::RequestState state);

// "nonfinite", "reduced_gradients", "replay", "weights" (the names sdcd's
// metrics use); "unknown" for anything else.
std::string CheckName(v1::CheckKind check);

// kubectl-style age of something `seconds` old, truncated to its largest
// unit: "45s", "12m", "5h", "3d". Negative ages (clock skew) read "0s".
std::string FormatAge(int64_t seconds);

// The age at `now` of a timestamp in Unix milliseconds; "<unknown>" for 0.
std::string FormatAgeSince(int64_t unix_ms, absl::Time now);

// Lists. Table and wide formats print a header in capitals and columns that
// are aligned and separated by at least three spaces, NAME first and AGE
// last; name prints "kind/NAME" per line; json and yaml print the whole
// response message. An empty list gives "" for table, wide and name (the
// caller says "No resources found." on stderr) and the empty document for
// json and yaml. Every non-empty result ends with a newline.
// Requests: wide adds REASON, LAST-ACTOR and APPROVALS (the current round's
// count of the required, "1/2").
std::string FormatRequests(const v1::ListRequestsResponse& response, OutputFormat format,
                           absl::Time now);
std::string FormatIncidents(const v1::ListIncidentsResponse& response, OutputFormat format,
                            absl::Time now);
std::string FormatSuspects(const v1::ListSuspectsResponse& response, OutputFormat format,
                           absl::Time now);
std::string FormatJobs(const v1::ListJobsResponse& response, OutputFormat format, absl::Time now);

// A GPU's or node's history: in table and wide formats the incidents table
// then the requests table (each only if non-empty, a blank line between),
// NAME written "incident/ID" and "request/ID" because two kinds share the
// output. Empty response: as for lists.
std::string FormatHistory(const v1::HistoryResponse& response, OutputFormat format, absl::Time now);

// True when the response holds nothing to show.
bool IsEmpty(const v1::HistoryResponse& response);

// `describe request`: the request's fields, every transition and every
// evidence incident, in kubectl describe's "Label:  value" layout. Times are
// UTC (RFC 3339) with their age at `now`.
std::string DescribeRequest(const v1::ReplacementRequest& request, absl::Time now);

// The notice `approve` prints on stderr before it sends anything: what the
// approval will make the actuator do to the node, and what that costs on
// SageMaker HyperPod. Ends with a newline.
std::string ApprovalNotice(const v1::ReplacementRequest& request);

// Node agents. `get nodes`: NAME, INSTANCE, GPUS (how many), STATUS (Ready,
// Stale, Disconnected) and AGE, the time since the last heartbeat; wide adds
// HOSTNAME, GPU-MODEL and AGENT (its version). Name: "node/NAME".
std::string FormatNodes(const v1::ListNodesResponse& response, OutputFormat format,
                        absl::Time now);

// "Ready", "Stale", "Disconnected"; "Unknown" for anything else.
std::string NodeStatusName(v1::NodeStatus status);

// `describe node`: identity, GPUs and recent diagnostics, kubectl describe's
// layout.
std::string DescribeNode(const v1::Node& node, absl::Time now);

// "Running", "Passed", "Failed", "Error"; "Unknown" for anything else.
std::string DiagnosticStateName(v1::DiagnosticState state);

// `diagnose node`: in table and wide formats the verdict line, then one row
// per device (DEVICE, GPU, RESULT, MISMATCHES, MAX-ABS-ERROR, GFLOP/S,
// SECONDS; wide adds DETAIL); "diagnostic/ID" for name; the message for json
// and yaml. Ends with a newline.
std::string FormatDiagnostic(const v1::Diagnostic& diagnostic, OutputFormat format);

// kExitOk when every device passed, kExitDiagnosticFailed when one computed
// wrong values, kExitDiagnosticNoVerdict otherwise.
int DiagnosticExitCode(const v1::Diagnostic& diagnostic);

// The result of approve/deny: "request N approved" (or "denied"), with
// " (dry run: nothing changed)" when `dry_run`; "request/N" for name; the
// returned request for json and yaml. Ends with a newline.
std::string FormatDecision(const v1::ReplacementRequest& request, bool approved, bool dry_run,
                           OutputFormat format);

// The message as one JSON document: proto field names, fields with default
// values included, indented, ending with a newline. 64-bit integers are JSON
// strings, as the proto3 JSON mapping says.
std::string ToJson(const google::protobuf::Message& message);

// The same data as YAML, written by yaml-cpp's emitter: block style with
// two-space indentation (a list's "- " indented under its key), empty lists
// and messages as [] and {}, strings quoted only when needed. Field order and
// presence are ToJson's. Unlike ToJson, 64-bit integers are plain numbers.
// Ends with a newline.
std::string ToYaml(const google::protobuf::Message& message);

// A string as a YAML scalar that any YAML 1.1 or 1.2 reader (PyYAML,
// yaml-cpp, kubectl's) reads back as the same string: plain when possible,
// otherwise double-quoted with escapes. yaml-cpp quotes what YAML's syntax
// requires (empty strings, leading or trailing spaces, a leading indicator,
// ": " or " #", line breaks); this adds anything that would read as a bool,
// null or number, and control characters.
std::string YamlString(absl::string_view text);

// `describe incident`: every field of one incident, kubectl describe's
// layout, with the request it opened and who resolved it.
std::string DescribeIncident(const v1::Incident& incident, absl::Time now);

// `describe job`: the job's summary, its ranks (RANK, NODE, GPU, ATTACHED,
// CHECKED-THROUGH) and its incidents.
std::string DescribeJob(const v1::Job& job, const v1::ListRanksResponse& ranks,
                        const v1::ListIncidentsResponse& incidents, absl::Time now);

// "viewer", "operator", "admin"; "unknown" otherwise.
std::string RoleName(v1::OperatorRole role);
// --role: viewer, operator or admin, any case; InvalidArgument otherwise.
absl::StatusOr<v1::OperatorRole> ParseRole(absl::string_view text);

// `operator list`: NAME, ROLE, CREATED-BY, AGE; "operator/NAME" for name.
std::string FormatOperators(const v1::ListOperatorsResponse& response, OutputFormat format,
                            absl::Time now);

// -l key=value[,key=value]: every term must match (an item with several
// values for a key, such as an incident's nodes, matches if any does).
using Selector = std::vector<std::pair<std::string, std::string>>;
// InvalidArgument for an empty key or value, or a term without "=".
absl::StatusOr<Selector> ParseSelector(absl::string_view text);
// Keeps the items that match. The labels of each resource:
//   requests:  node, gpu, state (pending, approved, ...)
//   incidents: job, node, gpu, check, outcome, state (open, resolved)
//   suspects:  job, node, gpu
//   jobs:      job
//   nodes:     node, gpu, status (ready, stale, disconnected)
// InvalidArgument (naming the resource's labels) for any other key.
absl::Status Filter(v1::ListRequestsResponse* response, const Selector& selector);
absl::Status Filter(v1::ListIncidentsResponse* response, const Selector& selector);
absl::Status Filter(v1::ListSuspectsResponse* response, const Selector& selector);
absl::Status Filter(v1::ListJobsResponse* response, const Selector& selector);
absl::Status Filter(v1::ListNodesResponse* response, const Selector& selector);

// --no-headers: a table without its first line.
std::string WithoutHeaders(absl::string_view table);

// `completion bash` and `completion zsh`: scripts that complete commands,
// resources and flags (the zsh one loads the bash function through
// bashcompinit). The bash function is _sdcctl.
std::string BashCompletion();
std::string ZshCompletion();

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_SDCCTL_FORMAT_H_
