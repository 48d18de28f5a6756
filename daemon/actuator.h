#ifndef SDC_DAEMON_ACTUATOR_H_
#define SDC_DAEMON_ACTUATOR_H_

// What an approved replacement request does. One interface, selected by
// sdcd's --actuator flag:
//   dry-run   log and record only (the default)
//   eks       kubectl label node NAME
//             sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement
//             (...PendingReboot for --action=reboot) --overwrite
//   slurm     scontrol update node=NAME state=fail reason=Action:Replace
//             (the shell form is reason="Action:Replace"; argv carries no quotes)
//   hyperpod  aws sagemaker batch-replace-cluster-nodes --cluster-name C
//             --node-ids ID... (at most 25 ids a call; per-node failures).
//             A node's instance id comes from configuration
//             (--hyperpod_node_ids_file), from a HyperPod EKS node name
//             ("hyperpod-i-..." exactly), or with
//             --hyperpod_instance_ids_from_kubernetes from the Node's
//             spec.providerID (kubectl get node): the cluster's records,
//             never what an agent or a trainer says. An id in never_replace
//             is refused.
//   command   an operator's program: --actuator_command="/path/prog {node}
//             {action} {request}" (split on spaces, placeholders substituted)
// Programs run without a shell (node names come from trainers and are
// checked against [A-Za-z0-9._-]), with a timeout.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/records.h"

namespace sdc::daemon {

struct ActuatorResult {
  bool ok = false;
  std::string detail;  // One line: what ran and what came of it.
};

class Actuator {
 public:
  virtual ~Actuator() = default;
  virtual std::string name() const = 0;
  // Carries out each request (the same order as the input). Blocking; every
  // program it runs is bounded by the actuator's timeout.
  virtual std::vector<ActuatorResult> Execute(
      const std::vector<core::ReplacementRequest>& requests) = 0;
};

struct ActuatorConfig {
  std::string kind = "dry-run";  // dry-run | eks | slurm | hyperpod | command
  absl::Duration timeout = absl::Seconds(60);
  std::string command;           // For kind=command.
  std::string hyperpod_cluster;  // For kind=hyperpod.
  // For kind=hyperpod: node name -> HyperPod instance id; names that embed an
  // id ("hyperpod-i-0abc...") need no entry.
  std::map<std::string, std::string> node_ids;
  // For kind=hyperpod: look a node's id up in its Kubernetes Node's
  // spec.providerID (`kubectl get node NAME -o jsonpath={.spec.providerID}`)
  // when neither of the above gives one.
  bool instance_ids_from_kubernetes = false;
  // Node names and instance ids never acted on (sdcd --never_replace); the
  // coordinator core refuses names, the hyperpod actuator resolved ids.
  std::set<std::string> never_replace;
};

// InvalidArgument naming the problem (unknown kind, missing command or
// cluster, an empty command template).
absl::StatusOr<std::unique_ptr<Actuator>> MakeActuator(const ActuatorConfig& config);

// True for names safe to hand to a program: [A-Za-z0-9._-], 1..253 chars.
using core::IsSafeNodeName;

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_ACTUATOR_H_
