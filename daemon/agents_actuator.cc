#include "daemon/agents_actuator.h"

#include <utility>

namespace sdc::daemon {
namespace {

class AgentActuator : public Actuator {
 public:
  AgentActuator(NodeActionRunner* runner, absl::Duration timeout)
      : runner_(runner), timeout_(timeout) {}
  std::string name() const override { return kAgentActuatorKind; }
  std::vector<ActuatorResult> Execute(
      const std::vector<core::ReplacementRequest>& requests) override {
    return runner_->RunActions(requests, timeout_);
  }

 private:
  NodeActionRunner* const runner_;
  const absl::Duration timeout_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actuator>> MakeActuatorWithAgents(const ActuatorConfig& config,
                                                                 NodeActionRunner* runner) {
  if (config.kind == kAgentActuatorKind) {
    return std::make_unique<AgentActuator>(runner, config.timeout);
  }
  return MakeActuator(config);
}

ActuatorConfig ForValidation(const ActuatorConfig& config) {
  ActuatorConfig out = config;
  if (out.kind == kAgentActuatorKind) out.kind = "dry-run";
  return out;
}

}  // namespace sdc::daemon
