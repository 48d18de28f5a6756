#include "agent/core/action_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace sdc::agent::core {

absl::StatusOr<std::vector<std::string>> ParseActionTemplate(absl::string_view text) {
  std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
  for (const std::string& w : words) {
    size_t at = 0;
    while ((at = w.find('{', at)) != std::string::npos) {
      const size_t end = w.find('}', at);
      const std::string name = w.substr(at, end == std::string::npos ? std::string::npos
                                                                     : end - at + 1);
      if (name != "{action}" && name != "{request}" && name != "{node}") {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown placeholder \"", name, "\" (known: {action}, {request}, {node})"));
      }
      at = end;
    }
  }
  return words;
}

absl::StatusOr<std::vector<std::string>> ExpandAction(const std::vector<std::string>& words,
                                                      absl::string_view action,
                                                      uint64_t request_id,
                                                      absl::string_view node) {
  if (action != "replace" && action != "reboot") {
    return absl::InvalidArgumentError(
        absl::StrCat("refusing unknown action \"", action, "\" (want replace or reboot)"));
  }
  std::vector<std::string> argv;
  argv.reserve(words.size());
  for (const std::string& w : words) {
    argv.push_back(absl::StrReplaceAll(
        w, {{"{action}", action}, {"{request}", absl::StrCat(request_id)}, {"{node}", node}}));
  }
  return argv;
}

}  // namespace sdc::agent::core
