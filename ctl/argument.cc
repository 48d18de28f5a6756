#include "ctl/argument.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace sdc::sdcctl {

absl::StatusOr<std::string> Argument::Parse(absl::string_view word) const {
  absl::string_view value = word;
  if (!kind.empty()) value = absl::StripPrefix(value, absl::StrCat(kind, "/"));
  const std::string what = kind.empty()
                               ? absl::AsciiStrToLower(placeholder)
                               : absl::StrCat(kind, " ", absl::AsciiStrToLower(placeholder));
  switch (accepts) {
    case Accepts::kText:
    case Accepts::kCommand:
      if (value.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(placeholder, " must not be empty"));
      }
      break;
    case Accepts::kPositiveInteger: {
      uint64_t id = 0;
      if (value.empty() || value.size() > 20 ||
          !std::all_of(value.begin(), value.end(), absl::ascii_isdigit) ||
          !absl::SimpleAtoi(value, &id) || id == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad ", what, " \"", word, "\" (want a positive integer)"));
      }
      break;
    }
    case Accepts::kChoice:
      if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
        return absl::InvalidArgumentError(absl::StrCat("bad ", what, " \"", word, "\" (want ",
                                                       absl::StrJoin(choices, " or "), ")"));
      }
      break;
  }
  return std::string(value);
}

}  // namespace sdc::sdcctl
