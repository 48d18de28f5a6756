#include "ctl/command_output.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ctl/errors.h"
#include "ctl/resources.h"
#include "ctl/serialize.h"
#include "ctl/text.h"

namespace sdc::sdcctl {
namespace {

// The kinds a history holds, in the order it prints them.
std::vector<const Resource*> HistoryKinds() {
  return {FindResource("incidents"), FindResource("requests")};
}

std::string DeviceResultName(const v1::DiagnosticResult& r) {
  if (!r.error().empty()) return "error";
  return r.pass() && r.mismatches() == 0 ? "pass" : "FAIL";
}

std::string Verdict(const v1::Diagnostic& d) {
  const std::string head = absl::StrCat("diagnostic ", d.id(), " on node ", Cell(d.node_name()));
  const std::string shape = absl::StrCat(d.size(), "x", d.size(), " fp32, ", d.repetitions(),
                                         d.repetitions() == 1 ? " repetition" : " repetitions");
  switch (d.state()) {
    case v1::DIAGNOSTIC_PASSED:
      return absl::StrCat(head, ": PASSED (", shape,
                          "; every element matched the reference bit for bit)");
    case v1::DIAGNOSTIC_FAILED: {
      int wrong = 0;
      uint64_t mismatches = 0;
      for (const v1::DiagnosticResult& r : d.results()) {
        if (DeviceResultName(r) == "FAIL") {
          ++wrong;
          mismatches += r.mismatches();
        }
      }
      return absl::StrCat(head, ": FAILED (", shape, "; ", wrong,
                          wrong == 1 ? " device" : " devices", " computed wrong values, ",
                          mismatches, mismatches == 1 ? " element differs)" : " elements differ)");
    }
    case v1::DIAGNOSTIC_RUNNING:
      return absl::StrCat(head, ": still running (", shape, "); see sdcctl describe node ",
                          Cell(d.node_name()));
    default: {
      std::string why = d.error();
      for (const v1::DiagnosticResult& r : d.results()) {
        if (why.empty() && !r.error().empty()) why = absl::StrCat(r.device(), ": ", r.error());
      }
      return absl::StrCat(head, ": NO VERDICT (", Cell(why), ")");
    }
  }
}

std::vector<Row> DeviceRows(const v1::Diagnostic& d, bool wide) {
  std::vector<Row> rows;
  Row header = {"DEVICE", "GPU", "RESULT", "MISMATCHES", "MAX-ABS-ERROR", "GFLOP/S", "SECONDS"};
  if (wide) header.push_back("DETAIL");
  rows.push_back(std::move(header));
  for (const v1::DiagnosticResult& r : d.results()) {
    Row row = {Cell(r.device()),
               Cell(r.gpu()),
               DeviceResultName(r),
               absl::StrCat(r.mismatches()),
               ShortestDouble(r.max_abs_error()),
               absl::StrFormat("%.1f", r.gflops()),
               absl::StrFormat("%.3f", r.seconds())};
    if (wide) row.push_back(Cell(r.error().empty() ? r.detail() : r.error()));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

bool IsEmpty(const v1::HistoryResponse& response) {
  return response.incidents().empty() && response.requests().empty();
}

std::string FormatHistory(const v1::HistoryResponse& response, OutputFormat format,
                          absl::Time now) {
  switch (format) {
    case OutputFormat::kJson:
      return ToJson(response);
    case OutputFormat::kYaml:
      return ToYaml(response);
    case OutputFormat::kName: {
      std::string out;
      for (const Resource* kind : HistoryKinds()) absl::StrAppend(&out, kind->NameLines(response));
      return out;
    }
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  std::string out;
  for (const Resource* kind : HistoryKinds()) {
    if (kind->Count(response) == 0) continue;
    if (!out.empty()) out.push_back('\n');
    absl::StrAppend(&out, RenderTable(kind->Rows(response, format == OutputFormat::kWide,
                                                 absl::StrCat(kind->kind(), "/"), now)));
  }
  return out;
}

std::string ApprovalNotice(const v1::ReplacementRequest& r) {
  const std::string node = r.node_name().empty() ? "<unknown>" : Cell(r.node_name());
  if (r.action() == "reboot") {
    return absl::StrCat("Approving request ", r.id(), ": node ", node,
                        " will be marked for reboot by the configured actuator. On SageMaker "
                        "HyperPod, rebooting a node restarts the instance; jobs on it must "
                        "restart from their last checkpoint.\n");
  }
  const std::string action =
      r.action().empty() || r.action() == "replace" ? "replacement" : Cell(r.action());
  return absl::StrCat("Approving request ", r.id(), ": node ", node, " will be marked for ", action,
                      " by the configured actuator. On SageMaker HyperPod, replacing a node "
                      "terminates the instance and wipes its local volumes (instance store, "
                      "/tmp, local NVMe); jobs on it must restart from their last checkpoint.\n");
}

std::string FormatDecision(const v1::ReplacementRequest& r, bool approved, bool dry_run,
                           OutputFormat format) {
  switch (format) {
    case OutputFormat::kJson:
      return ToJson(r);
    case OutputFormat::kYaml:
      return ToYaml(r);
    case OutputFormat::kName:
      return absl::StrCat("request/", r.id(), "\n");
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  return absl::StrCat("request ", r.id(), approved ? " approved" : " denied",
                      dry_run ? " (dry run: nothing changed)" : "", "\n");
}

std::string FormatDiagnostic(const v1::Diagnostic& d, OutputFormat format) {
  switch (format) {
    case OutputFormat::kJson:
      return ToJson(d);
    case OutputFormat::kYaml:
      return ToYaml(d);
    case OutputFormat::kName:
      return absl::StrCat("diagnostic/", d.id(), "\n");
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  std::string out = absl::StrCat(Verdict(d), "\n");
  if (!d.results().empty()) {
    absl::StrAppend(&out, RenderTable(DeviceRows(d, format == OutputFormat::kWide)));
  }
  return out;
}

int DiagnosticExitCode(const v1::Diagnostic& d) {
  switch (d.state()) {
    case v1::DIAGNOSTIC_PASSED:
      return kExitOk;
    case v1::DIAGNOSTIC_FAILED:
      return kExitDiagnosticFailed;
    default:
      return kExitDiagnosticNoVerdict;
  }
}

std::string FormatWhoAmI(const v1::WhoAmIResponse& r, OutputFormat format) {
  switch (format) {
    case OutputFormat::kJson:
      return ToJson(r);
    case OutputFormat::kYaml:
      return ToYaml(r);
    case OutputFormat::kName:
      return absl::StrCat("operator/", r.name(), "\n");
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  return LabelBlock({{"Name", r.name()},
                     {"Role", RoleName(r.role())},
                     {"Approvals Required", absl::StrCat(r.approvals_required())},
                     {"Server Version", r.server_version()}});
}

std::string OperatorAddedNotice(const v1::Operator& o) {
  return absl::StrCat("operator/", o.name(), " added (role ", RoleName(o.role()),
                      "). Its token follows, shown this once: give it to ", o.name(),
                      " to keep in a file only they can read (token_file in sdcctl.yaml).\n");
}

}  // namespace sdc::sdcctl
