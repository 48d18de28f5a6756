#ifndef SDC_CTL_ARGUMENT_H_
#define SDC_CTL_ARGUMENT_H_

// One positional argument of an sdcctl command, as data: its placeholder in
// usage, the values it accepts, and what completion offers for it.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sdc::sdcctl {

struct Argument {
  enum class Accepts {
    kText,             // Any non-empty word.
    kPositiveInteger,  // 1, 2, ... (an id).
    kChoice,           // One of `choices`.
    kCommand,          // The words of an sdcctl command (help COMMAND).
  };

  std::string placeholder;  // In usage: "ID", "NAME", "UUID", "SHELL".
  Accepts accepts = Accepts::kText;
  // Also accepted as "KIND/VALUE", as -o name prints it ("request/7"); "" for
  // none. Names the kind in error messages too.
  std::string kind;
  std::vector<std::string> choices;  // kChoice: the values.
  bool optional = false;             // Shown as [PLACEHOLDER].
  bool rest = false;                 // Takes every remaining word.

  // The argument's value for the word on the line, "KIND/" removed.
  // InvalidArgument naming the argument for a value it does not accept.
  absl::StatusOr<std::string> Parse(absl::string_view word) const;
};

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_ARGUMENT_H_
