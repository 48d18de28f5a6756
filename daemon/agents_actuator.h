#ifndef SDC_DAEMON_AGENTS_ACTUATOR_H_
#define SDC_DAEMON_AGENTS_ACTUATOR_H_

// sdcd's actuators with the node agents' help, next to the built-in ones of
// daemon/actuator.h (which stays unchanged):
//   agent     delivers the approved action to the node's sdc-agent
//             (NodeAction on its stream) and waits, bounded by
//             --actuator_timeout, for its ActionResult; the agent runs its
//             own --action_command. Succeeds only when that command did.
//   others    exactly MakeActuator's.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/actuator.h"
#include "daemon/core/records.h"

namespace sdc::daemon {

inline constexpr char kAgentActuatorKind[] = "agent";

// Carries approved actions to node agents (implemented by AgentHub).
class NodeActionRunner {
 public:
  virtual ~NodeActionRunner() = default;
  // One result per request, in order. Blocks until every agent answered or
  // `timeout` passed (for the whole batch).
  virtual std::vector<ActuatorResult> RunActions(
      const std::vector<core::ReplacementRequest>& requests, absl::Duration timeout) = 0;
};

// InvalidArgument as MakeActuator. REQUIRES: `runner` (for kind agent)
// outlives the actuator. Instance ids never come from agents (what an agent
// says of itself is no record of the node): the hyperpod actuator takes them
// from the cluster's records (daemon/actuator.h).
absl::StatusOr<std::unique_ptr<Actuator>> MakeActuatorWithAgents(const ActuatorConfig& config,
                                                                 NodeActionRunner* runner);

// `config` as daemon/config.h's Validate can check it: the agent kind
// (which Validate does not know) reads as dry-run; others are unchanged.
ActuatorConfig ForValidation(const ActuatorConfig& config);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_AGENTS_ACTUATOR_H_
