#include "ctl/names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace sdc::sdcctl {
namespace {

// The word sdcctl shows for an enum value: its name in the .proto less
// `prefix`, in lower case, capitalized when `capitalize`; "unknown" for the
// UNSPECIFIED value and for a value newer than this sdcctl.
std::string EnumWord(const std::string& proto_name, absl::string_view prefix, bool capitalize) {
  std::string word = proto_name.empty() || absl::EndsWith(proto_name, "_UNSPECIFIED")
                         ? "unknown"
                         : absl::AsciiStrToLower(absl::StripPrefix(proto_name, prefix));
  if (capitalize) word[0] = absl::ascii_toupper(word[0]);
  return word;
}

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text.empty() || text == "table") return OutputFormat::kTable;
  if (text == "wide") return OutputFormat::kWide;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  if (text == "name") return OutputFormat::kName;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown output format \"", text, "\" (want table, wide, json, yaml or name)"));
}

bool IsTable(OutputFormat format) {
  return format == OutputFormat::kTable || format == OutputFormat::kWide;
}

std::string StateName(v1::RequestState state) {
  return EnumWord(v1::RequestState_Name(state), "", /*capitalize=*/true);
}

absl::StatusOr<v1::RequestState> ParseRequestState(absl::string_view text) {
  for (v1::RequestState s :
       {v1::PENDING, v1::APPROVED, v1::EXECUTING, v1::DONE, v1::FAILED, v1::DENIED, v1::EXPIRED}) {
    if (absl::EqualsIgnoreCase(text, StateName(s))) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown request state \"", text,
                   "\" (want pending, approved, executing, done, failed, denied or expired)"));
}

std::string CheckName(v1::CheckKind check) {
  return EnumWord(v1::CheckKind_Name(check), "CHECK_", /*capitalize=*/false);
}

std::string NodeStatusName(v1::NodeStatus status) {
  return EnumWord(v1::NodeStatus_Name(status), "NODE_", /*capitalize=*/true);
}

std::string DiagnosticStateName(v1::DiagnosticState state) {
  return EnumWord(v1::DiagnosticState_Name(state), "DIAGNOSTIC_", /*capitalize=*/true);
}

std::string RoleName(v1::OperatorRole role) {
  switch (role) {
    case v1::ROLE_VIEWER:
      return "viewer";
    case v1::ROLE_OPERATOR:
      return "operator";
    case v1::ROLE_ADMIN:
      return "admin";
    default:
      return "unknown";
  }
}

absl::StatusOr<v1::OperatorRole> ParseRole(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "viewer") return v1::ROLE_VIEWER;
  if (lower == "operator") return v1::ROLE_OPERATOR;
  if (lower == "admin") return v1::ROLE_ADMIN;
  return absl::InvalidArgumentError(
      absl::StrCat("bad --role \"", text, "\" (want viewer, operator or admin)"));
}

}  // namespace sdc::sdcctl
