#include "ctl/sdcctl_format.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace sdc::sdcctl {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr char kNone[] = "<none>";

// ---------------------------------------------------------------------------
// Tables

using Row = std::vector<std::string>;

// One table cell: never empty (a blank cell would shift what the eye reads as
// the next column) and never more than one line. Control characters are
// replaced so that a job id sent by a trainer cannot drive the terminal.
std::string Cell(absl::string_view text) {
  if (text.empty()) return kNone;
  std::string out(text);
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n' || c == '\r' || c == '\t') {
      c = ' ';
    } else if (u < 0x20 || u == 0x7f) {
      c = '?';
    }
  }
  return out;
}

template <typename Container>
std::string JoinCell(const Container& values) {
  return Cell(absl::StrJoin(values, ","));
}

// Columns are measured in code points, so UTF-8 node names stay aligned.
size_t DisplayWidth(absl::string_view text) {
  size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// kubectl's layout: every column but the last padded to its widest cell plus
// three spaces; no trailing spaces.
std::string RenderTable(const std::vector<Row>& rows, absl::string_view indent = "") {
  std::vector<size_t> widths;
  for (const Row& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], DisplayWidth(row[i]));
    }
  }
  std::string out;
  for (const Row& row : rows) {
    absl::StrAppend(&out, indent);
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&out, row[i]);
      if (i + 1 < row.size()) {
        out.append(widths[i] - DisplayWidth(row[i]) + 3, ' ');
      }
    }
    out.push_back('\n');
  }
  return out;
}

std::string YesNo(bool b) { return b ? "yes" : "no"; }

// ---------------------------------------------------------------------------
// Rows of each kind. `prefix` is "" in a list of one kind and "kind/" where
// kinds are mixed (history).

std::vector<Row> RequestRows(const google::protobuf::RepeatedPtrField<v1::ReplacementRequest>& rs,
                             bool wide, absl::string_view prefix, absl::Time now) {
  std::vector<Row> rows;
  Row header = {"NAME", "NODE", "STATE", "ACTION", "GPUS", "INCIDENTS"};
  if (wide) header.insert(header.end(), {"REASON", "LAST-ACTOR", "APPROVALS"});
  header.push_back("AGE");
  rows.push_back(std::move(header));
  for (const v1::ReplacementRequest& r : rs) {
    Row row = {absl::StrCat(prefix, r.id()), Cell(r.node_name()),
               StateName(r.state()),         Cell(r.action()),
               JoinCell(r.gpu_uuids()),      JoinCell(r.incident_ids())};
    if (wide) {
      row.push_back(Cell(r.reason()));
      row.push_back(r.transitions().empty() ? kNone : Cell(r.transitions().rbegin()->actor()));
      // Of the current round: "1/2" while a second operator's is missing.
      row.push_back(absl::StrCat(r.approvals_size(), "/",
                                 std::max<uint32_t>(1, r.approvals_required())));
    }
    row.push_back(FormatAgeSince(r.created_unix_ms(), now));
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<Row> IncidentRows(const google::protobuf::RepeatedPtrField<v1::Incident>& is, bool wide,
                              absl::string_view prefix, absl::Time now) {
  std::vector<Row> rows;
  Row header = {"NAME", "JOB", "STEP", "CHECK", "OUTCOME", "RANKS", "NODES", "ATTRIBUTED"};
  if (wide) header.insert(header.end(), {"GPUS", "TENSORS", "EXPLANATION"});
  header.push_back("AGE");
  rows.push_back(std::move(header));
  for (const v1::Incident& i : is) {
    Row row = {absl::StrCat(prefix, i.id()), Cell(i.job_id()),    absl::StrCat(i.step()),
               CheckName(i.check()),
               Cell(i.resolved_by().empty() ? i.outcome()
                                            : absl::StrCat(i.outcome(), " (resolved)")),
               JoinCell(i.ranks()),
               JoinCell(i.node_names()),     YesNo(i.confirmed())};
    if (wide) {
      row.push_back(JoinCell(i.gpu_uuids()));
      row.push_back(JoinCell(i.differing_tensors()));
      row.push_back(Cell(i.explanation()));
    }
    row.push_back(FormatAgeSince(i.created_unix_ms(), now));
    rows.push_back(std::move(row));
  }
  return rows;
}

// For the list formats that are the same for every kind.
std::string NameLines(absl::string_view kind, const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) absl::StrAppend(&out, kind, "/", n, "\n");
  return out;
}

// ---------------------------------------------------------------------------
// YAML (written with yaml-cpp's emitter)

// Words that YAML 1.1 or 1.2 reads as a bool or null, or that PyYAML
// refuses as a plain value ("=", the merge key "<<"). yaml-cpp 0.7 writes
// most of them plain, so they are quoted here.
bool IsYamlKeyword(absl::string_view text) {
  static const char* const kWords[] = {"true", "false", "yes",  "no", "on", "off",
                                       "y",    "n",     "null", "~",  "=",  "<<"};
  for (const char* w : kWords) {
    if (absl::EqualsIgnoreCase(text, w)) return true;
  }
  return false;
}

// Anything that might read as a number, a timestamp, a YAML 1.1 sexagesimal
// ("12:30") or .inf/.nan. yaml-cpp writes these plain, so a string like
// "123" would read back as an int. Errs on the side of quoting ("3d-node" is
// quoted although it would read back fine).
bool MightReadAsNumber(absl::string_view text) {
  if (text.empty()) return false;
  if (absl::ascii_isdigit(text[0])) return true;
  if (text.size() > 1 && (text[0] == '+' || text[0] == '-' || text[0] == '.')) {
    return absl::ascii_isdigit(text[1]) || text[1] == '.' ||
           absl::StartsWithIgnoreCase(text.substr(1), "inf") ||
           absl::StartsWithIgnoreCase(text.substr(1), "nan");
  }
  return false;
}

// yaml-cpp 0.7 writes a carriage return (and DEL) raw in a plain scalar;
// double quotes make it escape them.
bool HasControlCharacter(absl::string_view text) {
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

// A string as a YAML scalar that reads back as that same string: yaml-cpp
// decides what its syntax requires (indicators, ": ", " #", leading or
// trailing spaces, line breaks); strings that would read as another type are
// double-quoted here.
void EmitString(YAML::Emitter& out, absl::string_view text) {
  // yaml-cpp escapes DEL only together with every non-ASCII character.
  if (absl::StrContains(text, '\x7f')) out << YAML::EscapeNonAscii;
  if (IsYamlKeyword(text) || MightReadAsNumber(text) || HasControlCharacter(text)) {
    out << YAML::DoubleQuoted;
  }
  out << std::string(text);
}

std::string ShortestDouble(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  std::string s;
  for (int precision = 6; precision <= 17; ++precision) {
    s = absl::StrFormat("%.*g", precision, d);
    if (std::strtod(s.c_str(), nullptr) == d) break;
  }
  return s;
}

// A number's text: yaml-cpp writes it plain, as it does for the numbers it
// formats itself (its own doubles carry 17 digits: "0.10000000000000001").
void EmitNumber(YAML::Emitter& out, const std::string& text) { out << text; }

// ShortestDouble as YAML 1.1 (PyYAML) reads it as a float too: 1.1 wants a
// dot before an exponent, so "1e+300" becomes "1.0e+300".
std::string YamlDouble(double d) {
  std::string text = ShortestDouble(d);
  const size_t e = text.find('e');
  if (e != std::string::npos && text.find('.') == std::string::npos) text.insert(e, ".0");
  return text;
}

// Element `index` of a repeated field, or the singular field when index < 0.
void EmitScalar(YAML::Emitter& out, const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return EmitNumber(out,
                        absl::StrCat(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f)));
    case FieldDescriptor::CPPTYPE_INT64:
      return EmitNumber(out,
                        absl::StrCat(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f)));
    case FieldDescriptor::CPPTYPE_UINT32:
      return EmitNumber(
          out, absl::StrCat(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f)));
    case FieldDescriptor::CPPTYPE_UINT64:
      return EmitNumber(
          out, absl::StrCat(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f)));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return EmitNumber(
          out, YamlDouble(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f)));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return EmitNumber(
          out, YamlDouble(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f)));
    case FieldDescriptor::CPPTYPE_BOOL:
      out << (rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
      return;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number = rep ? r->GetRepeatedEnumValue(m, f, index) : r->GetEnumValue(m, f);
      const google::protobuf::EnumValueDescriptor* v = f->enum_type()->FindValueByNumber(number);
      if (v == nullptr) return EmitNumber(out, absl::StrCat(number));
      return EmitString(out, v->name());
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& s = rep ? r->GetRepeatedStringReference(m, f, index, &scratch)
                                 : r->GetStringReference(m, f, &scratch);
      return EmitString(out, f->type() == FieldDescriptor::TYPE_BYTES ? absl::Base64Escape(s) : s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // Not a scalar; the caller handles messages.
  }
}

// Unset message fields and unset members of a oneof are left out; every
// other field is shown, defaults included, as ToJson does.
bool IsShown(const Message& m, const FieldDescriptor* f) {
  if (f->is_repeated()) return true;
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE || f->has_presence()) {
    return m.GetReflection()->HasField(m, f);
  }
  return true;
}

// The message as a block mapping in declaration order, or {} when it has no
// fields to show; empty lists are written []. (Map fields would show as lists
// of key/value entries; the admin API has none.)
void EmitMessage(YAML::Emitter& out, const Message& m) {
  const Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  std::vector<const FieldDescriptor*> fields;
  for (int i = 0; i < d->field_count(); ++i) {
    if (IsShown(m, d->field(i))) fields.push_back(d->field(i));
  }
  if (fields.empty()) {
    out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
    return;
  }
  out << YAML::BeginMap;
  for (const FieldDescriptor* f : fields) {
    out << YAML::Key;
    EmitString(out, f->name());
    out << YAML::Value;
    if (f->is_repeated()) {
      const int n = r->FieldSize(m, f);
      if (n == 0) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        continue;
      }
      out << YAML::BeginSeq;
      for (int j = 0; j < n; ++j) {
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          EmitMessage(out, r->GetRepeatedMessage(m, f, j));
        } else {
          EmitScalar(out, m, f, j);
        }
      }
      out << YAML::EndSeq;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      EmitMessage(out, r->GetMessage(m, f));
    } else {
      EmitScalar(out, m, f, -1);
    }
  }
  out << YAML::EndMap;
}

// ---------------------------------------------------------------------------
// describe

std::string FormatTimestamp(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "<unknown>";
  return absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone()),
      " (", FormatAgeSince(unix_ms, now), " ago)");
}

// "Label:" padded so the values of one block line up, kubectl describe's way.
std::string LabelBlock(const std::vector<std::pair<std::string, std::string>>& pairs,
                       absl::string_view indent) {
  size_t width = 0;
  for (const auto& [label, value] : pairs) width = std::max(width, label.size() + 1);
  std::string out;
  for (const auto& [label, value] : pairs) {
    absl::StrAppend(&out, indent, label, ":", std::string(width - label.size() - 1 + 2, ' '), value,
                    "\n");
  }
  return out;
}

using Fields = std::vector<std::pair<std::string, std::string>>;

// What an incident says, in the order both describe forms print it.
Fields IncidentFields(const v1::Incident& i, absl::Time now) {
  return {{"Job", Cell(i.job_id())},
          {"Step", absl::StrCat(i.step())},
          {"Check", CheckName(i.check())},
          {"Outcome", Cell(i.outcome())},
          {"Ranks", JoinCell(i.ranks())},
          {"Nodes", JoinCell(i.node_names())},
          {"GPUs", JoinCell(i.gpu_uuids())},
          {"Attributed", YesNo(i.confirmed())},
          {"Tensors", JoinCell(i.differing_tensors())},
          {"Explanation", Cell(i.explanation())},
          {"Created", FormatTimestamp(i.created_unix_ms(), now)}};
}

// One incident inside another object's description (a request's evidence,
// a job's incidents).
std::string IncidentBlock(const v1::Incident& i, absl::Time now) {
  return absl::StrCat("  Incident ", i.id(), ":\n", LabelBlock(IncidentFields(i, now), "    "));
}

}  // namespace

// ---------------------------------------------------------------------------
// Codes and names

int ExitCodeFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return kExitOk;
    case grpc::StatusCode::NOT_FOUND:
      return kExitNotFound;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return kExitPrecondition;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnreachable;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return kExitPermission;
    default:
      return kExitError;
  }
}

std::string RpcErrorMessage(const grpc::Status& status, absl::string_view server) {
  const grpc::StatusCode code = status.error_code();
  const std::string code_name =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(static_cast<int>(code)));
  std::string message = status.error_message().empty() ? code_name : status.error_message();
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StrCat("cannot reach sdcd at ", server, ": ", message);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StrCat("cannot reach sdcd at ", server, ": no answer before the deadline (",
                          message, "; see --timeout)");
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StrCat("permission denied: ", message);
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return message;
    default:
      return absl::StrCat(code_name, ": ", message);
  }
}

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text.empty() || text == "table") return OutputFormat::kTable;
  if (text == "wide") return OutputFormat::kWide;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  if (text == "name") return OutputFormat::kName;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown output format \"", text, "\" (want table, wide, json, yaml or name)"));
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

std::string StateName(v1::RequestState state) {
  return EnumWord(v1::RequestState_Name(state), "", /*capitalize=*/true);
}

std::string CheckName(v1::CheckKind check) {
  return EnumWord(v1::CheckKind_Name(check), "CHECK_", /*capitalize=*/false);
}

std::string FormatAge(int64_t seconds) {
  if (seconds < 60) return absl::StrCat(std::max<int64_t>(seconds, 0), "s");
  if (seconds < 3600) return absl::StrCat(seconds / 60, "m");
  if (seconds < 86400) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds / 86400, "d");
}

std::string FormatAgeSince(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "<unknown>";
  return FormatAge(absl::ToInt64Seconds(now - absl::FromUnixMillis(unix_ms)));
}

// ---------------------------------------------------------------------------
// Lists

namespace {

// What every list prints the same way: JSON, YAML, or kind/name lines; an
// empty list prints nothing. nullopt: print the table (or wide table).
template <typename Response, typename Items, typename NameOf>
std::optional<std::string> Serialized(const Response& response, OutputFormat format,
                                      absl::string_view kind, const Items& items,
                                      NameOf name_of) {
  switch (format) {
    case OutputFormat::kJson:
      return ToJson(response);
    case OutputFormat::kYaml:
      return ToYaml(response);
    case OutputFormat::kName: {
      std::vector<std::string> names;
      for (const auto& item : items) names.push_back(name_of(item));
      return NameLines(kind, names);
    }
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  if (items.empty()) return std::string();
  return std::nullopt;
}

}  // namespace

std::string FormatRequests(const v1::ListRequestsResponse& response, OutputFormat format,
                           absl::Time now) {
  if (auto text = Serialized(response, format, "request", response.requests(),
                              [](const auto& r) { return absl::StrCat(r.id()); })) {
    return *text;
  }
  return RenderTable(
      RequestRows(response.requests(), format == OutputFormat::kWide, /*prefix=*/"", now));
}

std::string FormatIncidents(const v1::ListIncidentsResponse& response, OutputFormat format,
                            absl::Time now) {
  if (auto text = Serialized(response, format, "incident", response.incidents(),
                              [](const auto& i) { return absl::StrCat(i.id()); })) {
    return *text;
  }
  return RenderTable(
      IncidentRows(response.incidents(), format == OutputFormat::kWide, /*prefix=*/"", now));
}

std::string FormatSuspects(const v1::ListSuspectsResponse& response, OutputFormat format,
                           absl::Time now) {
  if (auto text = Serialized(response, format, "suspect", response.suspects(),
                              [](const auto& s) { return Cell(s.gpu_uuid()); })) {
    return *text;
  }
  const bool wide = format == OutputFormat::kWide;
  std::vector<Row> rows;
  Row header = {"NAME", "NODE", "JOB", "RANK", "INCIDENTS", "TARGETED-LEFT"};
  if (wide) header.push_back("REASON");
  header.push_back("AGE");
  rows.push_back(std::move(header));
  for (const v1::Suspect& s : response.suspects()) {
    Row row = {Cell(s.gpu_uuid()),
               Cell(s.node_name()),
               Cell(s.job_id()),
               absl::StrCat(s.rank()),
               absl::StrCat(s.incidents()),
               absl::StrCat(s.targeted_audits_left())};
    if (wide) row.push_back(Cell(s.reason()));
    row.push_back(FormatAgeSince(s.since_unix_ms(), now));
    rows.push_back(std::move(row));
  }
  return RenderTable(rows);
}

std::string FormatJobs(const v1::ListJobsResponse& response, OutputFormat format, absl::Time now) {
  if (auto text = Serialized(response, format, "job", response.jobs(),
                              [](const auto& j) { return Cell(j.job_id()); })) {
    return *text;
  }
  // Wide has nothing to add: a job has no free-text fields.
  std::vector<Row> rows = {{"NAME", "WORLD", "NODES", "ATTACHED", "LAST-STEP", "INCIDENTS", "AGE"}};
  for (const v1::Job& j : response.jobs()) {
    rows.push_back({Cell(j.job_id()), absl::StrCat(j.world_size()), absl::StrCat(j.nodes()),
                    absl::StrCat(j.attached_ranks()), absl::StrCat(j.last_step()),
                    absl::StrCat(j.open_incidents()), FormatAgeSince(j.created_unix_ms(), now)});
  }
  return RenderTable(rows);
}

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
      for (const auto& i : response.incidents()) absl::StrAppend(&out, "incident/", i.id(), "\n");
      for (const auto& r : response.requests()) absl::StrAppend(&out, "request/", r.id(), "\n");
      return out;
    }
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  const bool wide = format == OutputFormat::kWide;
  std::string out;
  if (!response.incidents().empty()) {
    out = RenderTable(IncidentRows(response.incidents(), wide, "incident/", now));
  }
  if (!response.requests().empty()) {
    if (!out.empty()) out.push_back('\n');
    absl::StrAppend(&out, RenderTable(RequestRows(response.requests(), wide, "request/", now)));
  }
  return out;
}

// ---------------------------------------------------------------------------
// describe, approve, deny

std::string DescribeRequest(const v1::ReplacementRequest& r, absl::Time now) {
  std::string out = LabelBlock({{"Request", absl::StrCat(r.id())},
                                {"Node", Cell(r.node_name())},
                                {"State", StateName(r.state())},
                                {"Action", Cell(r.action())},
                                {"GPUs", JoinCell(r.gpu_uuids())},
                                {"Incidents", JoinCell(r.incident_ids())},
                                {"Reason", Cell(r.reason())},
                                {"Created", FormatTimestamp(r.created_unix_ms(), now)},
                                {"Updated", FormatTimestamp(r.updated_unix_ms(), now)},
                                {"Actuator", Cell(r.actuator())},
                                {"Actuator Result", Cell(r.actuator_result())}},
                               "");
  // Shown when approval takes more than one operator, or someone approved.
  if (r.approvals_required() > 1 || !r.approvals().empty()) {
    std::vector<std::string> names;
    for (const v1::Approval& a : r.approvals()) names.push_back(Cell(a.operator_()));
    absl::StrAppend(&out, "Approvals:  ", names.empty() ? kNone : absl::StrJoin(names, ", "),
                    " (", r.approvals().size(), " of ", std::max<uint32_t>(1, r.approvals_required()),
                    " required)\n");
  }
  if (r.transitions().empty()) {
    absl::StrAppend(&out, "Transitions:  ", kNone, "\n");
  } else {
    absl::StrAppend(&out, "Transitions:\n");
    std::vector<Row> rows = {{"TIME", "TRANSITION", "ACTOR", "REASON"}};
    for (const v1::Transition& t : r.transitions()) {
      rows.push_back({t.at_unix_ms() == 0 ? std::string("<unknown>")
                                          : absl::FormatTime("%Y-%m-%dT%H:%M:%SZ",
                                                             absl::FromUnixMillis(t.at_unix_ms()),
                                                             absl::UTCTimeZone()),
                      absl::StrCat(StateName(t.from()), " -> ", StateName(t.to())), Cell(t.actor()),
                      Cell(t.reason())});
    }
    absl::StrAppend(&out, RenderTable(rows, "  "));
  }
  if (r.incident_ids().empty() && r.evidence().empty()) {
    absl::StrAppend(&out, "Evidence:  ", kNone, "\n");
    return out;
  }
  absl::StrAppend(&out, "Evidence:\n");
  for (const v1::Incident& i : r.evidence()) absl::StrAppend(&out, IncidentBlock(i, now));
  // sdcd leaves out incidents it no longer has; say so rather than hide it.
  for (uint64_t id : r.incident_ids()) {
    bool shown = false;
    for (const v1::Incident& i : r.evidence()) shown = shown || i.id() == id;
    if (!shown) absl::StrAppend(&out, "  Incident ", id, ":  <not returned by sdcd>\n");
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

// ---------------------------------------------------------------------------
// Nodes and diagnostics

std::string NodeStatusName(v1::NodeStatus status) {
  return EnumWord(v1::NodeStatus_Name(status), "NODE_", /*capitalize=*/true);
}

std::string DiagnosticStateName(v1::DiagnosticState state) {
  return EnumWord(v1::DiagnosticState_Name(state), "DIAGNOSTIC_", /*capitalize=*/true);
}

namespace {

// The distinct GPU models of a node, "NVIDIA H100 80GB HBM3" or "A,B".
std::string GpuModels(const v1::Node& n) {
  std::vector<std::string> models;
  for (const v1::GpuIdentity& g : n.gpus()) {
    if (std::find(models.begin(), models.end(), g.model()) == models.end()) {
      models.push_back(g.model());
    }
  }
  return JoinCell(models);
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
      return absl::StrCat(head, ": PASSED (", shape, "; every element matched the reference "
                                                     "bit for bit)");
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

std::string FormatNodes(const v1::ListNodesResponse& response, OutputFormat format,
                        absl::Time now) {
  if (auto text = Serialized(response, format, "node", response.nodes(),
                              [](const auto& n) { return Cell(n.node_name()); })) {
    return *text;
  }
  const bool wide = format == OutputFormat::kWide;
  std::vector<Row> rows;
  Row header = {"NAME"};
  if (wide) header.push_back("HOSTNAME");
  header.insert(header.end(), {"INSTANCE", "GPUS"});
  if (wide) header.push_back("GPU-MODEL");
  header.push_back("STATUS");
  if (wide) header.push_back("AGENT");
  header.push_back("AGE");
  rows.push_back(std::move(header));
  for (const v1::Node& n : response.nodes()) {
    Row row = {Cell(n.node_name())};
    if (wide) row.push_back(Cell(n.hostname()));
    row.insert(row.end(), {Cell(n.instance_id()), absl::StrCat(n.gpus_size())});
    if (wide) row.push_back(GpuModels(n));
    row.push_back(NodeStatusName(n.status()));
    if (wide) row.push_back(Cell(n.agent_version()));
    row.push_back(FormatAgeSince(n.last_heartbeat_unix_ms(), now));
    rows.push_back(std::move(row));
  }
  return RenderTable(rows);
}

std::string DescribeNode(const v1::Node& n, absl::Time now) {
  std::string out = LabelBlock(
      {{"Node", Cell(n.node_name())},
       {"Hostname", Cell(n.hostname())},
       {"Instance", Cell(n.instance_id())},
       {"Status", NodeStatusName(n.status())},
       {"Agent", Cell(n.agent_version())},
       {"Heartbeat", absl::StrCat("every ", FormatAge(n.heartbeat_interval_ms() / 1000))},
       {"Last Heartbeat", FormatTimestamp(n.last_heartbeat_unix_ms(), now)},
       {"Registered", FormatTimestamp(n.registered_unix_ms(), now)}},
      "");
  if (n.gpus().empty()) {
    absl::StrAppend(&out, "GPUs:  ", kNone,
                    n.gpu_note().empty() ? "" : absl::StrCat(" (", Cell(n.gpu_note()), ")"), "\n");
  } else {
    absl::StrAppend(&out, "GPUs:\n");
    std::vector<Row> rows = {{"INDEX", "UUID", "MODEL"}};
    for (const v1::GpuIdentity& g : n.gpus()) {
      rows.push_back({absl::StrCat(g.index()), Cell(g.uuid()), Cell(g.model())});
    }
    absl::StrAppend(&out, RenderTable(rows, "  "));
  }
  if (n.diagnostics().empty()) {
    absl::StrAppend(&out, "Diagnostics:  ", kNone, "\n");
    return out;
  }
  absl::StrAppend(&out, "Diagnostics:\n");
  std::vector<Row> rows = {
      {"NAME", "STATE", "GPU", "SIZE", "REPETITIONS", "DEVICES", "MISMATCHES", "AGE"}};
  for (const v1::Diagnostic& d : n.diagnostics()) {
    uint64_t mismatches = 0;
    for (const v1::DiagnosticResult& r : d.results()) mismatches += r.mismatches();
    rows.push_back({absl::StrCat(d.id()), DiagnosticStateName(d.state()),
                    d.gpu_uuid().empty() ? std::string("all") : Cell(d.gpu_uuid()),
                    absl::StrCat(d.size()), absl::StrCat(d.repetitions()),
                    absl::StrCat(d.results_size()), absl::StrCat(mismatches),
                    FormatAgeSince(d.requested_unix_ms(), now)});
  }
  absl::StrAppend(&out, RenderTable(rows, "  "));
  return out;
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

// ---------------------------------------------------------------------------
// JSON and YAML

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Fails only for messages the admin API never sends (an Any of an unknown
  // type); fall back to an empty object rather than half a document.
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) out = "{}";
  while (!out.empty() && out.back() == '\n') out.pop_back();
  out.push_back('\n');
  return out;
}

std::string ToYaml(const google::protobuf::Message& message) {
  YAML::Emitter out;
  out.SetIndent(2);
  EmitMessage(out, message);
  // The emitter fails only on misuse (an unbalanced map or list), a bug
  // here; fall back to an empty mapping rather than half a document.
  if (!out.good()) return "{}\n";
  return absl::StrCat(out.c_str(), "\n");
}

std::string YamlString(absl::string_view text) {
  YAML::Emitter out;
  EmitString(out, text);
  return out.c_str();
}

// ---------------------------------------------------------------------------
// describe incident, describe job, operators, selectors, headers, completion

std::string DescribeIncident(const v1::Incident& i, absl::Time now) {
  Fields fields = {{"Incident", absl::StrCat(i.id())}};
  for (auto& field : IncidentFields(i, now)) fields.push_back(std::move(field));
  fields.push_back({"Request", i.request_id() == 0 ? std::string(kNone)
                                                   : absl::StrCat("request/", i.request_id())});
  fields.push_back({"Resolved By", Cell(i.resolved_by())});
  fields.push_back({"Resolution", Cell(i.resolution())});
  std::string out = LabelBlock(fields, "");
  if (i.resolved_unix_ms() != 0) {
    absl::StrAppend(&out, LabelBlock({{"Resolved", FormatTimestamp(i.resolved_unix_ms(), now)}},
                                     ""));
  }
  return out;
}

std::string DescribeJob(const v1::Job& job, const v1::ListRanksResponse& ranks,
                        const v1::ListIncidentsResponse& incidents, absl::Time now) {
  std::string out = LabelBlock({{"Job", Cell(job.job_id())},
                                {"World Size", absl::StrCat(job.world_size())},
                                {"Attached Ranks", absl::StrCat(job.attached_ranks())},
                                {"Nodes", absl::StrCat(job.nodes())},
                                {"Last Step", absl::StrCat(job.last_step())},
                                {"Open Incidents", absl::StrCat(job.open_incidents())},
                                {"Created", FormatTimestamp(job.created_unix_ms(), now)}},
                               "");
  if (ranks.ranks().empty()) {
    absl::StrAppend(&out, "Ranks:  ", kNone, "\n");
  } else {
    absl::StrAppend(&out, "Ranks:\n");
    std::vector<Row> rows = {{"RANK", "NODE", "GPU", "ATTACHED", "CHECKED-THROUGH"}};
    for (const v1::Rank& r : ranks.ranks()) {
      rows.push_back({absl::StrCat(r.placement().rank()), Cell(r.placement().node_name()),
                      Cell(r.placement().gpu_uuid()), YesNo(r.attached()),
                      absl::StrCat(r.checks_through_step())});
    }
    absl::StrAppend(&out, RenderTable(rows, "  "));
  }
  if (incidents.incidents().empty()) {
    absl::StrAppend(&out, "Incidents:  ", kNone, "\n");
  } else {
    absl::StrAppend(&out, "Incidents:\n");
    for (const v1::Incident& i : incidents.incidents()) {
      absl::StrAppend(&out, IncidentBlock(i, now));
    }
  }
  return out;
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

std::string FormatOperators(const v1::ListOperatorsResponse& response, OutputFormat format,
                            absl::Time now) {
  if (auto text = Serialized(response, format, "operator", response.operators(),
                              [](const v1::Operator& o) { return Cell(o.name()); })) {
    return *text;
  }
  std::vector<Row> rows = {{"NAME", "ROLE", "CREATED-BY", "AGE"}};
  for (const v1::Operator& o : response.operators()) {
    rows.push_back({Cell(o.name()), RoleName(o.role()), Cell(o.created_by()),
                    FormatAgeSince(o.created_unix_ms(), now)});
  }
  return RenderTable(rows);
}

absl::StatusOr<Selector> ParseSelector(absl::string_view text) {
  Selector out;
  for (absl::string_view term : absl::StrSplit(text, ',')) {
    term = absl::StripAsciiWhitespace(term);
    const size_t eq = term.find('=');
    absl::string_view key = eq == absl::string_view::npos ? term : term.substr(0, eq);
    absl::string_view value =
        eq == absl::string_view::npos ? absl::string_view() : term.substr(eq + 1);
    if (absl::StartsWith(value, "=")) value.remove_prefix(1);  // key==value
    if (key.empty() || eq == absl::string_view::npos || value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad label selector term \"", term, "\" (want key=value[,key=value])"));
    }
    out.emplace_back(std::string(key), std::string(value));
  }
  return out;
}

namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// The labels each resource has; an item matches a term when any of its
// values for the key equals the term's value (an incident has one node and
// GPU per blamed rank).
Labels LabelsOf(const v1::ReplacementRequest& r) {
  Labels l = {{"node", r.node_name()}, {"state", absl::AsciiStrToLower(StateName(r.state()))}};
  for (const std::string& g : r.gpu_uuids()) l.emplace_back("gpu", g);
  return l;
}
Labels LabelsOf(const v1::Incident& i) {
  Labels l = {{"job", i.job_id()}, {"check", CheckName(i.check())}, {"outcome", i.outcome()},
              {"state", i.resolved_by().empty() ? "open" : "resolved"}};
  for (const std::string& n : i.node_names()) l.emplace_back("node", n);
  for (const std::string& g : i.gpu_uuids()) l.emplace_back("gpu", g);
  return l;
}
Labels LabelsOf(const v1::Suspect& s) {
  return {{"job", s.job_id()}, {"node", s.node_name()}, {"gpu", s.gpu_uuid()}};
}
Labels LabelsOf(const v1::Job& j) { return {{"job", j.job_id()}}; }
Labels LabelsOf(const v1::Node& n) {
  Labels l = {{"node", n.node_name()}, {"status", absl::AsciiStrToLower(NodeStatusName(n.status()))}};
  for (const v1::GpuIdentity& g : n.gpus()) l.emplace_back("gpu", g.uuid());
  return l;
}

template <typename Items>
absl::Status FilterItems(Items* items, const Selector& selector, const std::set<std::string>& keys,
                         absl::string_view resource) {
  for (const auto& [key, value] : selector) {
    if (keys.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("label \"", key, "\" does not apply to ",
                                                     resource, " (labels: ",
                                                     absl::StrJoin(keys, ", "), ")"));
    }
  }
  Items kept;
  for (const auto& item : *items) {
    const Labels labels = LabelsOf(item);
    bool all = true;
    for (const auto& [key, value] : selector) {
      bool any = false;
      for (const auto& [k, v] : labels) any = any || (k == key && v == value);
      all = all && any;
    }
    if (all) *kept.Add() = item;
  }
  items->Swap(&kept);
  return absl::OkStatus();
}

}  // namespace

absl::Status Filter(v1::ListRequestsResponse* r, const Selector& s) {
  return FilterItems(r->mutable_requests(), s, {"node", "gpu", "state"}, "requests");
}
absl::Status Filter(v1::ListIncidentsResponse* r, const Selector& s) {
  return FilterItems(r->mutable_incidents(), s, {"job", "node", "gpu", "check", "outcome", "state"},
                     "incidents");
}
absl::Status Filter(v1::ListSuspectsResponse* r, const Selector& s) {
  return FilterItems(r->mutable_suspects(), s, {"job", "node", "gpu"}, "suspects");
}
absl::Status Filter(v1::ListJobsResponse* r, const Selector& s) {
  return FilterItems(r->mutable_jobs(), s, {"job"}, "jobs");
}
absl::Status Filter(v1::ListNodesResponse* r, const Selector& s) {
  return FilterItems(r->mutable_nodes(), s, {"node", "gpu", "status"}, "nodes");
}

std::string WithoutHeaders(absl::string_view table) {
  const size_t newline = table.find('\n');
  if (newline == absl::string_view::npos) return "";
  return std::string(table.substr(newline + 1));
}

std::string BashCompletion() {
  return R"(# bash completion for sdcctl. Load with: source <(sdcctl completion bash)
_sdcctl() {
  local cur prev words cword
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev="${COMP_WORDS[COMP_CWORD-1]}"
  local commands="get describe approve deny resolve history diagnose operator whoami version completion help"
  local globals="--server= --token_file= --tls_ca= --tls_cert= --tls_key= --output= --timeout= --no-headers --help"
  # The command words typed so far (flags skipped).
  local -a typed=()
  local i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${COMP_WORDS[i]}" in
      -o|-l|--output|--selector|--state|--job|--reason|--role|--gpu|--size|--repetitions|--interval|--server|--token_file|--tls_ca|--tls_cert|--tls_key|--timeout) ((i++)) ;;
      -*) ;;
      *) typed+=("${COMP_WORDS[i]}") ;;
    esac
  done
  case "$prev" in
    -o|--output) COMPREPLY=($(compgen -W "table wide json yaml name" -- "$cur")); return ;;
    --state) COMPREPLY=($(compgen -W "pending approved executing done failed denied expired" -- "$cur")); return ;;
    --role) COMPREPLY=($(compgen -W "viewer operator admin" -- "$cur")); return ;;
  esac
  local flags="$globals"
  case "${typed[0]}" in
    get) flags="$flags --watch --interval= -l --selector= --state= --job=" ;;
    approve|deny) flags="$flags --reason= --dry-run --force" ;;
    resolve) flags="$flags --reason=" ;;
    diagnose) flags="$flags --gpu= --size= --repetitions=" ;;
    operator) flags="$flags --role=" ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    return
  fi
  case "${#typed[@]}" in
    0) COMPREPLY=($(compgen -W "$commands" -- "$cur")) ;;
    1)
      case "${typed[0]}" in
        get) COMPREPLY=($(compgen -W "requests incidents suspects jobs nodes" -- "$cur")) ;;
        describe) COMPREPLY=($(compgen -W "request incident job node" -- "$cur")) ;;
        resolve) COMPREPLY=($(compgen -W "incident" -- "$cur")) ;;
        history) COMPREPLY=($(compgen -W "gpu node" -- "$cur")) ;;
        diagnose) COMPREPLY=($(compgen -W "node" -- "$cur")) ;;
        operator) COMPREPLY=($(compgen -W "add list remove" -- "$cur")) ;;
        completion) COMPREPLY=($(compgen -W "bash zsh" -- "$cur")) ;;
        help) COMPREPLY=($(compgen -W "$commands" -- "$cur")) ;;
      esac ;;
  esac
}
complete -F _sdcctl sdcctl
)";
}

std::string ZshCompletion() {
  return absl::StrCat(
      "#compdef sdcctl\n"
      "# zsh completion for sdcctl: the bash function through bashcompinit.\n"
      "# Load with: source <(sdcctl completion zsh)\n"
      "autoload -U +X bashcompinit && bashcompinit\n",
      BashCompletion());
}

}  // namespace sdc::sdcctl
