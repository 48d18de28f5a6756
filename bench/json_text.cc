#include "bench/json_text.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace sdc::bench {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string JsonNumberOrNull(std::optional<double> v) {
  if (!v.has_value() || !std::isfinite(*v)) return "null";
  return absl::StrFormat("%.3f", *v);
}

}  // namespace sdc::bench
