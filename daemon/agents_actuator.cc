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

class LiveIdsHyperPodActuator : public Actuator {
 public:
  LiveIdsHyperPodActuator(ActuatorConfig config, InstanceIdSource ids)
      : config_(std::move(config)), ids_(std::move(ids)) {}
  std::string name() const override { return "hyperpod"; }
  std::vector<ActuatorResult> Execute(
      const std::vector<core::ReplacementRequest>& requests) override {
    ActuatorConfig config = config_;
    for (auto& [node, id] : ids_()) config.node_ids.emplace(node, id);  // The file's win.
    absl::StatusOr<std::unique_ptr<Actuator>> actuator = MakeActuator(config);
    if (!actuator.ok()) {
      return std::vector<ActuatorResult>(
          requests.size(), ActuatorResult{false, std::string(actuator.status().message())});
    }
    return (*actuator)->Execute(requests);
  }

 private:
  const ActuatorConfig config_;
  const InstanceIdSource ids_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actuator>> MakeActuatorWithAgents(const ActuatorConfig& config,
                                                                 NodeActionRunner* runner,
                                                                 InstanceIdSource instance_ids) {
  if (config.kind == kAgentActuatorKind) {
    return std::make_unique<AgentActuator>(runner, config.timeout);
  }
  absl::StatusOr<std::unique_ptr<Actuator>> plain = MakeActuator(config);
  if (!plain.ok() || config.kind != "hyperpod") return plain;
  return std::make_unique<LiveIdsHyperPodActuator>(config, std::move(instance_ids));
}

ActuatorConfig ForValidation(const ActuatorConfig& config) {
  ActuatorConfig out = config;
  if (out.kind == kAgentActuatorKind) out.kind = "dry-run";
  return out;
}

}  // namespace sdc::daemon
