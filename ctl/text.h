#ifndef SDC_CTL_TEXT_H_
#define SDC_CTL_TEXT_H_

// Plain-text layout shared by everything sdcctl prints: one-line cells,
// kubectl's aligned tables, describe's "Label:  value" blocks, ages and
// times. Pure functions; all thread-safe.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sdc::sdcctl {

// What an empty cell or field shows.
inline constexpr char kNone[] = "<none>";

// One table cell: never empty (a blank cell would shift what the eye reads as
// the next column; kNone instead) and never more than one line. Tabs and line
// breaks become spaces and other control characters '?', so that a job id
// sent by a trainer cannot drive the terminal.
std::string Cell(absl::string_view text);

// The values joined by "," as one cell.
template <typename Container>
std::string JoinCell(const Container& values) {
  return Cell(absl::StrJoin(values, ","));
}

// "yes" or "no".
std::string YesNo(bool b);

using Row = std::vector<std::string>;

// kubectl's layout: each line starts with `indent`; every column but the last
// is padded to its widest cell (counted in code points, so UTF-8 names stay
// aligned) plus three spaces; no trailing spaces. Every line ends with "\n".
std::string RenderTable(const std::vector<Row>& rows, absl::string_view indent = "");

// --no-headers: a table without its first line.
std::string WithoutHeaders(absl::string_view table);

// kubectl describe's block: "Label:" padded so that the values of one block
// line up two spaces after the longest label, each line after `indent`.
using Fields = std::vector<std::pair<std::string, std::string>>;
std::string LabelBlock(const Fields& fields, absl::string_view indent = "");

// kubectl-style age of something `seconds` old, truncated to its largest
// unit: "45s", "12m", "5h", "3d". Negative ages (clock skew) read "0s".
std::string FormatAge(int64_t seconds);

// The age at `now` of a timestamp in Unix milliseconds; "<unknown>" for 0.
std::string FormatAgeSince(int64_t unix_ms, absl::Time now);

// "2027-01-15T08:00:00Z" (UTC, RFC 3339); "<unknown>" for 0.
std::string FormatUtc(int64_t unix_ms);

// FormatUtc with the age: "2027-01-15T08:00:00Z (12s ago)"; "<unknown>" for 0.
std::string FormatTimestamp(int64_t unix_ms, absl::Time now);

// The shortest decimal that reads back as `d` ("0.1", "1e+300"); ".nan",
// ".inf" and "-.inf" for the non-finite values (YAML's spelling).
std::string ShortestDouble(double d);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_TEXT_H_
