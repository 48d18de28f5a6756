#ifndef SDC_AGENT_NODE_ACTION_H_
#define SDC_AGENT_NODE_ACTION_H_

// Carries out an approved action on this node: runs the operator's
// --action_command (agent/core/action_command.h) without a shell, bounded by
// a timeout. Thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace sdc::agent {

struct ActionOutcome {
  bool ok = false;     // The command ran and exited 0.
  std::string detail;  // One line: what ran and what came of it.
};

// `words`: the parsed template; empty when none is configured, and then the
// outcome is not ok and says so (with sdcd's hint, for the operator). Never
// fails otherwise: a refused action, a command that cannot start, times out
// or exits non-zero is an outcome that is not ok.
ActionOutcome RunNodeAction(const std::vector<std::string>& words, const std::string& action,
                            uint64_t request_id, const std::string& command_hint,
                            const std::string& node, absl::Duration timeout);

}  // namespace sdc::agent

#endif  // SDC_AGENT_NODE_ACTION_H_
