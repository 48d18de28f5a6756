#include "agent/node_action.h"

#include <algorithm>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "agent/core/action_command.h"
#include "common/subprocess.h"

namespace sdc::agent {
namespace {

std::string OneLine(const std::string& s) {
  std::string out(absl::StripAsciiWhitespace(s));
  std::replace(out.begin(), out.end(), '\n', ' ');
  if (out.size() > 300) out = out.substr(0, 300) + "...";
  return out;
}

}  // namespace

ActionOutcome RunNodeAction(const std::vector<std::string>& words, const std::string& action,
                            uint64_t request_id, const std::string& command_hint,
                            const std::string& node, absl::Duration timeout) {
  if (words.empty()) {
    return {false, absl::StrCat("no node-local action configured (sdc-agent --action_command); "
                                "sdcd asked to ", action, " node ", node, " for request ",
                                request_id,
                                command_hint.empty() ? "" : absl::StrCat(" (", command_hint, ")"))};
  }
  absl::StatusOr<std::vector<std::string>> argv =
      core::ExpandAction(words, action, request_id, node);
  if (!argv.ok()) return {false, std::string(argv.status().message())};
  const common::CommandResult r = common::RunCommand(*argv, timeout);
  const std::string what = absl::StrJoin(*argv, " ");
  if (!r.started) return {false, absl::StrCat(what, ": ", OneLine(r.output))};
  if (r.timed_out) {
    return {false, absl::StrCat(what, ": timed out after ", absl::FormatDuration(timeout))};
  }
  if (r.exit_code != 0) {
    return {false, absl::StrCat(what, ": exit ", r.exit_code, r.output.empty() ? "" : ": ",
                                OneLine(r.output))};
  }
  return {true, absl::StrCat(what, ": ok", r.output.empty() ? "" : ": ", OneLine(r.output))};
}

}  // namespace sdc::agent
