#include "ctl/selector.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace sdc::sdcctl {

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
      return absl::InvalidArgumentError(
          absl::StrCat("bad label selector term \"", term, "\" (want key=value[,key=value])"));
    }
    out.emplace_back(std::string(key), std::string(value));
  }
  return out;
}

bool Matches(const Labels& labels, const Selector& selector) {
  return std::all_of(selector.begin(), selector.end(), [&labels](const auto& term) {
    return std::find(labels.begin(), labels.end(), term) != labels.end();
  });
}

absl::Status CheckKeys(const Selector& selector, const std::vector<std::string>& keys,
                       absl::string_view resource) {
  for (const auto& [key, value] : selector) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat("label \"", key, "\" does not apply to ",
                                                     resource,
                                                     " (labels: ", absl::StrJoin(keys, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sdc::sdcctl
