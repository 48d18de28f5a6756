#include "ctl/text.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sdc::sdcctl {
namespace {

size_t DisplayWidth(absl::string_view text) {
  size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace

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

std::string YesNo(bool b) { return b ? "yes" : "no"; }

std::string RenderTable(const std::vector<Row>& rows, absl::string_view indent) {
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
      if (i + 1 < row.size()) out.append(widths[i] - DisplayWidth(row[i]) + 3, ' ');
    }
    out.push_back('\n');
  }
  return out;
}

std::string WithoutHeaders(absl::string_view table) {
  const size_t newline = table.find('\n');
  if (newline == absl::string_view::npos) return "";
  return std::string(table.substr(newline + 1));
}

std::string LabelBlock(const Fields& fields, absl::string_view indent) {
  size_t width = 0;
  for (const auto& [label, value] : fields) width = std::max(width, label.size() + 1);
  std::string out;
  for (const auto& [label, value] : fields) {
    absl::StrAppend(&out, indent, label, ":", std::string(width - label.size() - 1 + 2, ' '), value,
                    "\n");
  }
  return out;
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

std::string FormatUtc(int64_t unix_ms) {
  if (unix_ms == 0) return "<unknown>";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string FormatTimestamp(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "<unknown>";
  return absl::StrCat(FormatUtc(unix_ms), " (", FormatAgeSince(unix_ms, now), " ago)");
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

}  // namespace sdc::sdcctl
