#ifndef SDC_CTL_SERIALIZE_H_
#define SDC_CTL_SERIALIZE_H_

// -o json and -o yaml: any admin API message as one document. Pure
// functions; all thread-safe.

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace sdc::sdcctl {

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

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_SERIALIZE_H_
