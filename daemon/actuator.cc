#include "daemon/actuator.h"

#include <algorithm>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/identity.h"
#include "common/subprocess.h"

namespace sdc::daemon {

using common::CommandResult;
using common::RunCommand;

namespace {

constexpr size_t kHyperPodBatch = 25;

std::string OneLine(const std::string& s) {
  std::string out(absl::StripAsciiWhitespace(s));
  std::replace(out.begin(), out.end(), '\n', ' ');
  if (out.size() > 300) out = out.substr(0, 300) + "...";
  return out;
}

ActuatorResult FromCommand(const std::vector<std::string>& argv, const CommandResult& r) {
  const std::string what = absl::StrJoin(argv, " ");
  if (!r.started) return {false, absl::StrCat(what, ": ", OneLine(r.output))};
  if (r.timed_out) return {false, absl::StrCat(what, ": timed out")};
  if (r.exit_code != 0) {
    return {false, absl::StrCat(what, ": exit ", r.exit_code, ": ", OneLine(r.output))};
  }
  return {true, absl::StrCat(what, ": ok", r.output.empty() ? "" : ": ", OneLine(r.output))};
}

// Runs one program per request.
class PerNodeActuator : public Actuator {
 public:
  using ArgvFor = std::function<std::vector<std::string>(const core::ReplacementRequest&)>;
  PerNodeActuator(std::string name, absl::Duration timeout, ArgvFor argv)
      : name_(std::move(name)), timeout_(timeout), argv_(std::move(argv)) {}
  std::string name() const override { return name_; }
  std::vector<ActuatorResult> Execute(
      const std::vector<core::ReplacementRequest>& requests) override {
    std::vector<ActuatorResult> out;
    for (const core::ReplacementRequest& r : requests) {
      if (!IsSafeNodeName(r.node)) {
        out.push_back({false, absl::StrCat("refused: unsafe node name '", r.node, "'")});
        continue;
      }
      const std::vector<std::string> argv = argv_(r);
      out.push_back(FromCommand(argv, RunCommand(argv, timeout_)));
    }
    return out;
  }

 private:
  const std::string name_;
  const absl::Duration timeout_;
  const ArgvFor argv_;
};

class DryRunActuator : public Actuator {
 public:
  std::string name() const override { return "dry-run"; }
  std::vector<ActuatorResult> Execute(
      const std::vector<core::ReplacementRequest>& requests) override {
    std::vector<ActuatorResult> out;
    for (const core::ReplacementRequest& r : requests) {
      out.push_back({true, absl::StrCat("dry run: would ", r.action, " node ", r.node)});
    }
    return out;
  }
};

// Ids of the "Failed" entries in batch-replace-cluster-nodes' JSON output,
// with their messages. The CLI prints
//   {"Successful": ["i-..."], "Failed": [{"NodeId": "i-...", "ErrorCode": "...",
//    "Message": "..."}]}
std::map<std::string, std::string> FailedNodes(const std::string& json) {
  std::map<std::string, std::string> failed;
  const size_t at = json.find("\"Failed\"");
  if (at == std::string::npos) return failed;
  static const std::regex kEntry(
      R"re(\{[^{}]*"NodeId"\s*:\s*"([^"]+)"[^{}]*?(?:"Message"\s*:\s*"([^"]*)")?[^{}]*\})re");
  const std::string tail = json.substr(at);
  for (auto it = std::sregex_iterator(tail.begin(), tail.end(), kEntry);
       it != std::sregex_iterator(); ++it) {
    failed[(*it)[1]] = (*it)[2].matched ? (*it)[2].str() : "failed";
  }
  return failed;
}

class HyperPodApiActuator : public Actuator {
 public:
  explicit HyperPodApiActuator(const ActuatorConfig& config)
      : cluster_(config.hyperpod_cluster),
        ids_(config.node_ids),
        from_kubernetes_(config.instance_ids_from_kubernetes),
        never_replace_(config.never_replace),
        timeout_(config.timeout) {}
  std::string name() const override { return "hyperpod"; }

  std::vector<ActuatorResult> Execute(
      const std::vector<core::ReplacementRequest>& requests) override {
    std::vector<ActuatorResult> out(requests.size());
    std::vector<std::pair<size_t, std::string>> todo;  // (request index, instance id)
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::string& node = requests[i].node;
      std::string where;
      std::string id = InstanceId(node, &where);
      if (id.empty()) {
        out[i] = {false, absl::StrCat("no HyperPod instance id known for node ", node, " (",
                                      where, ")")};
      } else if (never_replace_.count(id) > 0) {
        out[i] = {false, absl::StrCat("refused: node ", node, " is instance ", id, " (", where,
                                      "), which is marked never-replace")};
      } else {
        todo.push_back({i, id});
      }
    }
    for (size_t begin = 0; begin < todo.size(); begin += kHyperPodBatch) {
      const size_t end = std::min(todo.size(), begin + kHyperPodBatch);
      std::vector<std::string> argv = {"aws", "sagemaker", "batch-replace-cluster-nodes",
                                       "--cluster-name", cluster_, "--node-ids"};
      for (size_t k = begin; k < end; ++k) argv.push_back(todo[k].second);
      argv.push_back("--output");
      argv.push_back("json");
      const CommandResult r = RunCommand(argv, timeout_);
      const ActuatorResult call = FromCommand(argv, r);
      const std::map<std::string, std::string> failed =
          call.ok ? FailedNodes(r.output) : std::map<std::string, std::string>{};
      for (size_t k = begin; k < end; ++k) {
        const auto& [index, id] = todo[k];
        auto f = failed.find(id);
        if (!call.ok) {
          out[index] = call;
        } else if (f != failed.end()) {
          out[index] = {false, absl::StrCat("batch-replace-cluster-nodes failed for ", id, ": ",
                                            f->second)};
        } else {
          out[index] = {true, absl::StrCat("batch-replace-cluster-nodes accepted ", id,
                                           " (cluster ", cluster_, ")")};
        }
      }
    }
    return out;
  }

 private:
  // The node's instance id from the cluster's records, and *where says
  // which (or, when none, where it looked). Never a substring of a name: a
  // node named "x-i-<controller's id>" is no instance at all.
  std::string InstanceId(const std::string& node, std::string* where) const {
    auto it = ids_.find(node);
    if (it != ids_.end()) {
      *where = "--hyperpod_node_ids_file";
      return it->second;
    }
    if (std::string id = common::InstanceIdFromNodeName(node); !id.empty()) {
      *where = "its HyperPod node name";
      return id;
    }
    if (!from_kubernetes_) {
      *where = "not in --hyperpod_node_ids_file, and not a hyperpod-i-... node name";
      return "";
    }
    if (!IsSafeNodeName(node)) {
      *where = "not a node name";
      return "";
    }
    const std::vector<std::string> argv = {"kubectl", "get", "node", node, "-o",
                                           "jsonpath={.spec.providerID}"};
    const CommandResult r = RunCommand(argv, timeout_);
    if (!r.started || r.timed_out || r.exit_code != 0) {
      *where = FromCommand(argv, r).detail;
      return "";
    }
    std::string id = common::InstanceIdFromProviderId(r.output);
    *where = id.empty() ? absl::StrCat("its Node's providerID \"", OneLine(r.output),
                                       "\" names no instance")
                        : "its Node's spec.providerID";
    return id;
  }

  const std::string cluster_;
  const std::map<std::string, std::string> ids_;
  const bool from_kubernetes_;
  const std::set<std::string> never_replace_;
  const absl::Duration timeout_;
};

std::string HealthLabel(const std::string& action) {
  return absl::StrCat("sagemaker.amazonaws.com/node-health-status=",
                      action == "reboot" ? "UnschedulablePendingReboot"
                                         : "UnschedulablePendingReplacement");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Actuator>> MakeActuator(const ActuatorConfig& config) {
  if (config.kind == "dry-run") return std::make_unique<DryRunActuator>();
  if (config.kind == "eks") {
    return std::make_unique<PerNodeActuator>(
        "eks", config.timeout, [](const core::ReplacementRequest& r) {
          return std::vector<std::string>{"kubectl", "label", "node", r.node,
                                          HealthLabel(r.action), "--overwrite"};
        });
  }
  if (config.kind == "slurm") {
    return std::make_unique<PerNodeActuator>(
        "slurm", config.timeout, [](const core::ReplacementRequest& r) {
          return std::vector<std::string>{
              "scontrol", "update", absl::StrCat("node=", r.node), "state=fail",
              r.action == "reboot" ? "reason=Action:Reboot" : "reason=Action:Replace"};
        });
  }
  if (config.kind == "hyperpod") {
    if (config.hyperpod_cluster.empty()) {
      return absl::InvalidArgumentError("--actuator=hyperpod needs --hyperpod_cluster");
    }
    return std::make_unique<HyperPodApiActuator>(config);
  }
  if (config.kind == "command") {
    const std::vector<std::string> words =
        absl::StrSplit(config.command, ' ', absl::SkipEmpty());
    if (words.empty()) {
      return absl::InvalidArgumentError("--actuator=command needs --actuator_command");
    }
    return std::make_unique<PerNodeActuator>(
        "command", config.timeout, [words](const core::ReplacementRequest& r) {
          std::vector<std::string> argv;
          for (const std::string& w : words) {
            argv.push_back(absl::StrReplaceAll(
                w, {{"{node}", r.node}, {"{action}", r.action},
                    {"{request}", absl::StrCat(r.id)}}));
          }
          return argv;
        });
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown actuator '", config.kind, "' (one of: dry-run, eks, slurm, hyperpod, command)"));
}

}  // namespace sdc::daemon
