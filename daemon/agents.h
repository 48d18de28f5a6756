#ifndef SDC_DAEMON_AGENTS_H_
#define SDC_DAEMON_AGENTS_H_

// What sdcd knows about node agents (sdc-agent), as plain C++ with an
// injected clock: no gRPC, no files. daemon/agent_service.cc translates the
// wire messages into these calls.
//
//   nodes        keyed by node name: the identity an agent registered (host,
//                HyperPod instance id, GPUs), its current stream ("session"),
//                last heartbeat. Ready while heartbeats come; Stale after
//                `stale_after_heartbeats` periods without one; Disconnected
//                once its stream ends.
//   diagnostics  confirmation diagnostics asked of a node's agent: a queue
//                of running ones per node (bounded), results per device,
//                and the last `diagnostics_kept_per_node` finished ones.
//   actions      approved actions for a node (sdcd --actuator=agent): sent
//                at once to a connected agent, else queued until its agent
//                registers; each ends with the agent's result, or fails when
//                the stream it was sent on ends unanswered.
//
// Everything is in memory, on purpose: agents register again on every
// reconnect (and after an sdcd restart, within one reconnect backoff), so
// the registry rebuilds itself, and a diagnostic or action in flight when
// sdcd stops has no one left to answer it. What must survive restarts
// (replacement requests and their outcomes) is the coordinator's, in SQLite.
//
// A stream owns what was sent on it: when it ends, or a newer stream of the
// same node replaces it, its unanswered diagnostics and actions fail, and a
// late answer on it is refused. Nothing is resent.
//
// Thread-safe: one mutex; every call is short and never blocks.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/clock.h"

namespace sdc::daemon {

struct AgentGpu {
  std::string uuid;
  std::string model;
  uint32_t index = 0;
};

struct AgentIdentity {
  std::string node_name;  // Proven by the stream's credentials (AgentService).
  std::string hostname;
  // "" or "i-" + 8..17 hex digits: what the agent says, shown to operators
  // only. Actuators never act on it (daemon/actuator.h).
  std::string instance_id;
  std::vector<AgentGpu> gpus;
  std::string gpu_note;     // Why `gpus` is empty.
  std::string agent_version;
  absl::Duration heartbeat_interval = absl::Seconds(30);  // 1 s..10 min.
};

enum class NodeStatus { kReady, kStale, kDisconnected };
// "Ready", "Stale", "Disconnected".
const char* NodeStatusName(NodeStatus status);

// One device's answer (DiagnosticResult on the wire).
struct DeviceResult {
  std::string gpu;     // A GPU UUID or "cpu".
  std::string device;  // "cpu" or "cuda:N".
  bool pass = false;
  uint64_t mismatches = 0;
  double max_abs_error = 0;
  double gflops = 0;
  double seconds = 0;
  uint32_t size = 0;
  uint32_t repetitions = 0;
  uint32_t device_count = 1;  // Results the request produces in all.
  std::string detail;
  std::string error;          // Non-empty: could not run.
};

enum class DiagnosticState { kRunning, kPassed, kFailed, kError };

struct Diagnostic {
  uint64_t id = 0;
  std::string node;
  std::string gpu_uuid;  // As requested: a UUID, "cpu", or "" (every GPU).
  uint32_t size = 0;
  uint32_t repetitions = 0;
  DiagnosticState state = DiagnosticState::kRunning;
  std::vector<DeviceResult> results;
  std::string error;     // Why kError, when no result says it.
  absl::Time requested;
  absl::Time finished = absl::InfinitePast();  // InfinitePast while running.
  uint64_t session = 0;  // The stream it was sent on.
};

struct NodeView {
  AgentIdentity identity;
  NodeStatus status = NodeStatus::kDisconnected;
  absl::Time registered;      // Start of the current (or last) stream.
  absl::Time last_heartbeat;  // Registering counts as one.
  std::vector<Diagnostic> diagnostics;  // GetNode only: newest first.
};

struct NodeAction {
  uint64_t request_id = 0;
  std::string action;        // "replace" or "reboot".
  std::string command_hint;  // For the agent's log; never run.
};

struct ActionOutcome {
  uint64_t request_id = 0;
  std::string node;
  bool ok = false;
  std::string detail;
};

// What a call finished, for whoever waits on it (admin calls, the actuator).
struct AgentEvents {
  std::vector<Diagnostic> diagnostics;  // Just finished (any final state).
  std::vector<ActionOutcome> actions;   // Just finished.
  bool empty() const { return diagnostics.empty() && actions.empty(); }
  void Append(AgentEvents other);
};

struct AgentRegistryOptions {
  // The status of a connected agent without a heartbeat for this many of
  // its periods is Stale. Default: 3.
  int stale_after_heartbeats = 3;
  // Finished diagnostics kept per node. Default: 20.
  size_t diagnostics_kept_per_node = 20;
  // Running diagnostics per node; more are refused. Default: 4.
  size_t max_running_diagnostics_per_node = 4;
  // A diagnostic running longer than this ends in kError. Default: 30 min.
  absl::Duration diagnostic_timeout = absl::Minutes(30);
};

class AgentRegistry {
 public:
  AgentRegistry(const AgentRegistryOptions& options, const core::Clock* clock)
      : options_(options), clock_(clock) {}

  struct Registration {
    uint64_t session = 0;           // The new stream's id (never 0).
    uint64_t replaced_session = 0;  // The node's previous live stream; 0: none.
    std::vector<NodeAction> actions;  // Queued actions, now sent on this session.
    AgentEvents events;             // What the replaced stream left unanswered.
  };
  // A new stream from a node's agent. InvalidArgument naming the field for
  // a node name actuators would refuse (IsSafeNodeName), an instance id not
  // "i-" + 8..17 hex digits, a heartbeat period outside 1 s..10 min, or GPU
  // UUIDs that are empty or repeated.
  absl::StatusOr<Registration> Register(const AgentIdentity& identity);

  // FailedPrecondition when `session` is not the node's live stream (it was
  // replaced or ended): the caller ends that stream.
  absl::Status Heartbeat(const std::string& node, uint64_t session);

  // The stream ended. Fails what was sent on it and not answered. A session
  // that is not the node's live one changes nothing.
  AgentEvents Disconnect(const std::string& node, uint64_t session);

  // Records a diagnostic for `node` and returns it (id, resolved size and
  // repetitions, the session to send it on). NotFound: no agent ever
  // registered the node, or the node has no GPU `gpu_uuid`;
  // FailedPrecondition: its agent is not connected; InvalidArgument: size
  // or repetitions out of range (common/diagnostic_plan.h);
  // ResourceExhausted: too many running there.
  absl::StatusOr<Diagnostic> StartDiagnostic(const std::string& node,
                                             const std::string& gpu_uuid, uint32_t size,
                                             uint32_t repetitions);

  // One device's result for diagnostic `id`. The diagnostic finishes when
  // the agent's device_count results are in: kFailed if any device computed
  // wrong values, else kError if any could not run, else kPassed.
  // NotFound: no such running diagnostic on this node (finished, timed out,
  // or never asked); FailedPrecondition: `session` is not the one it was
  // sent on; InvalidArgument: device_count is 0, above 64, or differs from
  // an earlier result's.
  absl::StatusOr<AgentEvents> RecordDiagnosticResult(const std::string& node, uint64_t session,
                                                     uint64_t id, const DeviceResult& result);

  struct ActionDelivery {
    bool send_now = false;  // Connected: send on `session` now.
    uint64_t session = 0;
  };
  // An approved action for `node`: sent now when its agent is connected,
  // else queued for its next registration. Asking again for a request
  // already pending returns the same delivery (not sent twice). NotFound
  // when no agent ever registered the node.
  absl::StatusOr<ActionDelivery> StartAction(const std::string& node, const NodeAction& action);

  // The agent's answer. NotFound: no such pending action on this node;
  // FailedPrecondition: it was not sent on `session`.
  absl::StatusOr<AgentEvents> RecordActionResult(const std::string& node, uint64_t session,
                                                 uint64_t request_id, bool ok,
                                                 const std::string& detail);

  // Forgets a pending action (the actuator stopped waiting); a later answer
  // is refused with NotFound.
  void CancelAction(const std::string& node, uint64_t request_id);

  // Ends diagnostics running past the timeout (kError).
  AgentEvents Tick();

  // Every node, by name, without diagnostics.
  std::vector<NodeView> ListNodes() const;
  // One node with its diagnostics, newest first. NotFound if unknown.
  absl::StatusOr<NodeView> GetNode(const std::string& node) const;
  // NotFound if unknown or no longer kept.
  absl::StatusOr<Diagnostic> GetDiagnostic(uint64_t id) const;

  // The GPU UUIDs `node`'s agent listed when it last registered; empty
  // when it listed none or never registered. Rank placements are checked
  // against them (a GPU id counts only if its node's agent listed it).
  std::vector<std::string> GpuIds(const std::string& node) const;

 private:
  struct PendingAction {
    NodeAction action;
    uint64_t session = 0;  // Sent on; 0: queued.
  };
  struct Node {
    AgentIdentity identity;
    uint64_t session = 0;  // Live stream; 0: disconnected.
    absl::Time registered;
    absl::Time last_heartbeat;
    std::deque<Diagnostic> diagnostics;  // Oldest first; running ones included.
    std::map<uint64_t, PendingAction> actions;  // By request id.
  };

  NodeStatus StatusOf(const Node& n, absl::Time now) const;
  // Fails the diagnostics and actions sent on `session` of `node`.
  void FailSession(Node& node, uint64_t session, const std::string& why, absl::Time now,
                   AgentEvents* events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Diagnostic& d, absl::Time now, AgentEvents* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Trim(Node& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AgentRegistryOptions options_;
  const core::Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_diagnostic_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_AGENTS_H_
