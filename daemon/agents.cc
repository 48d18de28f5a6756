#include "daemon/agents.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/diagnostic_plan.h"
#include "common/identity.h"
#include "daemon/actuator.h"

namespace sdc::daemon {
namespace {

constexpr uint32_t kMaxDevicesPerDiagnostic = 64;

std::string Ago(absl::Duration d) {
  return absl::StrCat(absl::FormatDuration(absl::Trunc(d, absl::Seconds(1))), " ago");
}

}  // namespace

const char* NodeStatusName(NodeStatus status) {
  switch (status) {
    case NodeStatus::kReady:
      return "Ready";
    case NodeStatus::kStale:
      return "Stale";
    case NodeStatus::kDisconnected:
      return "Disconnected";
  }
  return "Unknown";
}

void AgentEvents::Append(AgentEvents other) {
  for (Diagnostic& d : other.diagnostics) diagnostics.push_back(std::move(d));
  for (ActionOutcome& a : other.actions) actions.push_back(std::move(a));
}

NodeStatus AgentRegistry::StatusOf(const Node& n, absl::Time now) const {
  if (n.session == 0) return NodeStatus::kDisconnected;
  if (now - n.last_heartbeat > options_.stale_after_heartbeats * n.identity.heartbeat_interval) {
    return NodeStatus::kStale;
  }
  return NodeStatus::kReady;
}

void AgentRegistry::Finish(Diagnostic& d, absl::Time now, AgentEvents* events) {
  d.finished = now;
  events->diagnostics.push_back(d);
}

void AgentRegistry::Trim(Node& node) {
  size_t finished = 0;
  for (const Diagnostic& d : node.diagnostics) finished += d.state != DiagnosticState::kRunning;
  for (auto it = node.diagnostics.begin();
       finished > options_.diagnostics_kept_per_node && it != node.diagnostics.end();) {
    if (it->state != DiagnosticState::kRunning) {
      it = node.diagnostics.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

void AgentRegistry::FailSession(Node& node, uint64_t session, const std::string& why,
                                absl::Time now, AgentEvents* events) {
  for (Diagnostic& d : node.diagnostics) {
    if (d.state == DiagnosticState::kRunning && d.session == session) {
      d.state = DiagnosticState::kError;
      d.error = absl::StrCat(why, " before it answered");
      Finish(d, now, events);
    }
  }
  for (auto it = node.actions.begin(); it != node.actions.end();) {
    if (it->second.session == session) {
      events->actions.push_back(
          {it->first, node.identity.node_name, false,
           absl::StrCat(why, " before it reported a result; the action may have run (a reboot "
                             "ends the stream)")});
      it = node.actions.erase(it);
    } else {
      ++it;
    }
  }
  Trim(node);
}

absl::StatusOr<AgentRegistry::Registration> AgentRegistry::Register(
    const AgentIdentity& identity) {
  if (!IsSafeNodeName(identity.node_name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_name '", identity.node_name,
                     "' is not a node name ([A-Za-z0-9._-], 1 to 253 characters)"));
  }
  if (!identity.instance_id.empty() && !common::IsInstanceId(identity.instance_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instance_id '", identity.instance_id, "' is not i- and 8 to 17 hex digits"));
  }
  if (identity.heartbeat_interval < absl::Seconds(1) ||
      identity.heartbeat_interval > absl::Minutes(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_interval_ms ", absl::ToInt64Milliseconds(identity.heartbeat_interval),
                     " is out of range (1000..600000)"));
  }
  std::set<std::string> uuids;
  for (const AgentGpu& g : identity.gpus) {
    if (g.uuid.empty() || !uuids.insert(g.uuid).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU UUID '", g.uuid, "' is empty or listed twice"));
    }
  }
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  Node& n = nodes_[identity.node_name];
  Registration r;
  r.session = next_session_++;
  if (n.session != 0) {
    r.replaced_session = n.session;
    FailSession(n, n.session, "a newer stream of the node's agent replaced the one it was sent on",
                now, &r.events);
  }
  n.identity = identity;
  n.session = r.session;
  n.registered = now;
  n.last_heartbeat = now;
  for (auto& [id, pending] : n.actions) {
    if (pending.session == 0) {
      pending.session = r.session;
      r.actions.push_back(pending.action);
    }
  }
  return r;
}

absl::Status AgentRegistry::Heartbeat(const std::string& node, uint64_t session) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.session != session) {
    return absl::FailedPreconditionError(
        absl::StrCat("this stream of node ", node, " was replaced or has ended"));
  }
  it->second.last_heartbeat = now;
  return absl::OkStatus();
}

AgentEvents AgentRegistry::Disconnect(const std::string& node, uint64_t session) {
  AgentEvents events;
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.session != session || session == 0) return events;
  FailSession(it->second, session, "the agent's stream ended", now, &events);
  it->second.session = 0;
  return events;
}

absl::StatusOr<Diagnostic> AgentRegistry::StartDiagnostic(const std::string& node,
                                                          const std::string& gpu_uuid,
                                                          uint32_t size, uint32_t repetitions) {
  absl::StatusOr<common::Shape> shape = common::ResolveShape(size, repetitions);
  if (!shape.ok()) return shape.status();
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("no agent has registered node ", node,
                                            " (sdcctl get nodes lists those that have)"));
  }
  Node& n = it->second;
  if (n.session == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the agent of node ", node, " is not connected (last heartbeat ",
        Ago(now - n.last_heartbeat), ")"));
  }
  if (!gpu_uuid.empty() && gpu_uuid != common::kCpuDevice) {
    const bool known = std::any_of(n.identity.gpus.begin(), n.identity.gpus.end(),
                                   [&](const AgentGpu& g) { return g.uuid == gpu_uuid; });
    if (!known) {
      std::vector<std::string> uuids;
      for (const AgentGpu& g : n.identity.gpus) uuids.push_back(g.uuid);
      return absl::NotFoundError(absl::StrCat(
          "node ", node, " has no GPU ", gpu_uuid, " (its GPUs: ",
          uuids.empty() ? std::string("none") : absl::StrJoin(uuids, ", "), "; or \"cpu\")"));
    }
  }
  const size_t running = std::count_if(n.diagnostics.begin(), n.diagnostics.end(), [](const auto& d) {
    return d.state == DiagnosticState::kRunning;
  });
  if (running >= options_.max_running_diagnostics_per_node) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "node ", node, " already runs ", running, " diagnostics; wait for one to finish"));
  }
  Diagnostic d;
  d.id = next_diagnostic_++;
  d.node = node;
  d.gpu_uuid = gpu_uuid;
  d.size = shape->size;
  d.repetitions = shape->repetitions;
  d.requested = now;
  d.session = n.session;
  n.diagnostics.push_back(d);
  return d;
}

absl::StatusOr<AgentEvents> AgentRegistry::RecordDiagnosticResult(const std::string& node,
                                                                  uint64_t session, uint64_t id,
                                                                  const DeviceResult& result) {
  if (result.device_count == 0 || result.device_count > kMaxDevicesPerDiagnostic) {
    return absl::InvalidArgumentError(absl::StrCat("diagnostic ", id, ": device_count ",
                                                   result.device_count, " is out of range (1..",
                                                   kMaxDevicesPerDiagnostic, ")"));
  }
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  Diagnostic* d = nullptr;
  if (it != nodes_.end()) {
    for (Diagnostic& x : it->second.diagnostics) {
      if (x.id == id && x.state == DiagnosticState::kRunning) d = &x;
    }
  }
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat("no running diagnostic ", id, " on node ", node));
  }
  if (d->session != session) {
    return absl::FailedPreconditionError(
        absl::StrCat("diagnostic ", id, " was not sent on this stream"));
  }
  if (!d->results.empty() && d->results.front().device_count != result.device_count) {
    return absl::InvalidArgumentError(absl::StrCat("diagnostic ", id, ": device_count ",
                                                   result.device_count, " after ",
                                                   d->results.front().device_count));
  }
  d->results.push_back(result);
  AgentEvents events;
  if (d->results.size() < result.device_count) return events;
  bool wrong = false;
  bool error = false;
  for (const DeviceResult& r : d->results) {
    if (!r.error.empty()) {
      error = true;
    } else if (!r.pass || r.mismatches > 0) {
      wrong = true;
    }
  }
  d->state = wrong ? DiagnosticState::kFailed
             : error ? DiagnosticState::kError
                     : DiagnosticState::kPassed;
  Finish(*d, now, &events);
  Trim(it->second);
  return events;
}

absl::StatusOr<AgentRegistry::ActionDelivery> AgentRegistry::StartAction(
    const std::string& node, const NodeAction& action) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("no agent has registered node ", node));
  }
  Node& n = it->second;
  auto [pending, inserted] = n.actions.try_emplace(action.request_id, PendingAction{action, 0});
  if (!inserted) return ActionDelivery{false, pending->second.session};
  if (n.session == 0) return ActionDelivery{false, 0};
  pending->second.session = n.session;
  return ActionDelivery{true, n.session};
}

absl::StatusOr<AgentEvents> AgentRegistry::RecordActionResult(const std::string& node,
                                                              uint64_t session,
                                                              uint64_t request_id, bool ok,
                                                              const std::string& detail) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  const auto not_found = [&] {
    return absl::NotFoundError(
        absl::StrCat("no pending action for request ", request_id, " on node ", node));
  };
  if (it == nodes_.end()) return not_found();
  auto pending = it->second.actions.find(request_id);
  if (pending == it->second.actions.end()) return not_found();
  if (pending->second.session != session) {
    return absl::FailedPreconditionError(
        absl::StrCat("the action for request ", request_id, " was not sent on this stream"));
  }
  it->second.actions.erase(pending);
  AgentEvents events;
  events.actions.push_back({request_id, node, ok, detail});
  return events;
}

void AgentRegistry::CancelAction(const std::string& node, uint64_t request_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it != nodes_.end()) it->second.actions.erase(request_id);
}

AgentEvents AgentRegistry::Tick() {
  AgentEvents events;
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  for (auto& [name, n] : nodes_) {
    bool any = false;
    for (Diagnostic& d : n.diagnostics) {
      if (d.state == DiagnosticState::kRunning && now - d.requested >= options_.diagnostic_timeout) {
        d.state = DiagnosticState::kError;
        d.error = absl::StrCat("no answer from the agent within ",
                               absl::FormatDuration(options_.diagnostic_timeout));
        Finish(d, now, &events);
        any = true;
      }
    }
    if (any) Trim(n);
  }
  return events;
}

std::vector<NodeView> AgentRegistry::ListNodes() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<NodeView> out;
  for (const auto& [name, n] : nodes_) {
    out.push_back({n.identity, StatusOf(n, now), n.registered, n.last_heartbeat, {}});
  }
  return out;
}

absl::StatusOr<NodeView> AgentRegistry::GetNode(const std::string& node) const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("no agent has registered node ", node));
  }
  const Node& n = it->second;
  return NodeView{n.identity, StatusOf(n, now), n.registered, n.last_heartbeat,
                  std::vector<Diagnostic>(n.diagnostics.rbegin(), n.diagnostics.rend())};
}

absl::StatusOr<Diagnostic> AgentRegistry::GetDiagnostic(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, n] : nodes_) {
    for (const Diagnostic& d : n.diagnostics) {
      if (d.id == id) return d;
    }
  }
  return absl::NotFoundError(absl::StrCat("no diagnostic ", id));
}

std::vector<std::string> AgentRegistry::GpuIds(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return out;
  for (const AgentGpu& g : it->second.identity.gpus) out.push_back(g.uuid);
  return out;
}

}  // namespace sdc::daemon
