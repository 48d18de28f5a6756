#ifndef SDC_AGENT_CORE_ACTION_COMMAND_H_
#define SDC_AGENT_CORE_ACTION_COMMAND_H_

// The node-local command an approved action runs (sdc-agent
// --action_command): a template split on spaces into argv words, with
// {action}, {request} and {node} substituted in each word. No shell is
// involved, so a substituted value never becomes more than one argument.
// Pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sdc::agent::core {

// The template's words; empty for an empty (or all-space) template, meaning
// no action is configured. InvalidArgument for a placeholder other than
// {action}, {request} and {node} (a typo would otherwise run literally).
absl::StatusOr<std::vector<std::string>> ParseActionTemplate(absl::string_view text);

// argv for one action. InvalidArgument unless `action` is "replace" or
// "reboot" (the only words sdcd sends; anything else is refused rather than
// handed to a program). REQUIRES: !words.empty().
absl::StatusOr<std::vector<std::string>> ExpandAction(const std::vector<std::string>& words,
                                                      absl::string_view action,
                                                      uint64_t request_id,
                                                      absl::string_view node);

}  // namespace sdc::agent::core

#endif  // SDC_AGENT_CORE_ACTION_COMMAND_H_
