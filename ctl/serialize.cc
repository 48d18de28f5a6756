#include "ctl/serialize.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ctl/text.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace sdc::sdcctl {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

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

}  // namespace

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

}  // namespace sdc::sdcctl
