#ifndef SDC_DAEMON_AGENT_SERVICE_H_
#define SDC_DAEMON_AGENT_SERVICE_H_

// sdcd's side of the node agents: thin adapters around AgentRegistry
// (daemon/agents.h).
//
//   AgentHub          joins the registry, the live agent streams, and whoever
//                     waits for a diagnostic or an action to finish.
//   AgentService      AgentService.Connect, one bidi stream per agent, on
//                     the agent listener (--agent_listen). An agent proves
//                     its node (daemon/node_identity.h) and registers that
//                     node only. Callback API; no reaction blocks.
//   NodeAdminService  ListNodes, GetNode, Diagnose for sdcctl, on the admin
//                     listener with AdminService's authentication.
//
// The patterns are common/stream.h's (QueuedStream, StreamHandle): a
// stream's outgoing side is a shared outbox that outlives the reactor; no
// lock is held across StartWrite or Finish, which may run reactions inline.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "admin.grpc.pb.h"
#include "agent.grpc.pb.h"
#include "daemon/agents.h"
#include "daemon/agents_actuator.h"
#include "daemon/core/clock.h"
#include "daemon/admin_auth.h"
#include "daemon/node_identity.h"
#include "daemon/service_metrics.h"
#include "grpcpp/grpcpp.h"

namespace sdc::daemon {

// A live agent stream's outgoing side. Implementations never block.
class AgentSink {
 public:
  virtual ~AgentSink() = default;
  // Queues a message; dropped once the stream has ended.
  virtual void Push(v1::CoordinatorToAgent message) = 0;
  // Ends the stream with `status` once what is queued is written.
  virtual void End(absl::Status status) = 0;
};

// Thread-safe. Lock order: the hub's mutex, then the registry's; no lock is
// held while a sink or a waiter's callback runs.
class AgentHub : public NodeActionRunner {
 public:
  // REQUIRES: `registry` and `clock` (the registry's) outlive the hub.
  AgentHub(AgentRegistry* registry, const core::Clock* clock)
      : registry_(registry), clock_(clock) {}

  const AgentRegistry& registry() const { return *registry_; }

  // A stream said who it is: registers it (AgentRegistry::Register's
  // errors), makes `sink` the node's stream, ends the stream it replaced,
  // and sends the welcome and the node's queued actions.
  absl::StatusOr<uint64_t> OpenStream(const AgentIdentity& identity,
                                      std::shared_ptr<AgentSink> sink);
  // The stream ended: fails what it left unanswered (AgentRegistry::
  // Disconnect) and forgets its sink.
  void CloseStream(const std::string& node, uint64_t session);

  // What a stream sent, into the registry (its errors), answering the
  // waiters of what finished.
  absl::Status Heartbeat(const std::string& node, uint64_t session);
  absl::Status RecordDiagnosticResult(const std::string& node, uint64_t session,
                                      const v1::DiagnosticResult& result);
  absl::Status RecordActionResult(const std::string& node, uint64_t session,
                                  const v1::ActionResult& result);

  // Answers waiters of what `events` finished.
  void Dispatch(AgentEvents events);

  // Records a diagnostic (AgentRegistry::StartDiagnostic's errors) and sends
  // it to the node's agent.
  absl::StatusOr<Diagnostic> StartDiagnostic(const std::string& node,
                                             const std::string& gpu_uuid, uint32_t size,
                                             uint32_t repetitions);

  // Calls `done` exactly once: with the diagnostic when it finishes, or as
  // it stands (still running) once the clock passes `deadline` (Tick), or
  // at once if it already finished or is unknown (NotFound).
  void AwaitDiagnostic(uint64_t id, absl::Time deadline,
                       std::function<void(absl::StatusOr<Diagnostic>)> done);

  // Once a second (sdcd's ticker): ends diagnostics past their timeout and
  // answers waiters whose deadline passed.
  void Tick();

  // NodeActionRunner: sends each request's action to its node's agent (or
  // queues it until the agent registers) and waits in real time, up to
  // `timeout` for the batch, for the results. Blocking: the actuator's
  // thread only.
  std::vector<ActuatorResult> RunActions(const std::vector<core::ReplacementRequest>& requests,
                                         absl::Duration timeout) override;

  // Ends every wait of RunActions now ("sdcd is shutting down") and every
  // agent stream (UNAVAILABLE, so agents reconnect).
  void Shutdown();

 private:
  struct ActionWait {
    std::string node;
    absl::Notification done;
    ActuatorResult result;  // Written once, before `done`.
  };
  struct DiagnosticWait {
    absl::Time deadline;
    std::function<void(absl::StatusOr<Diagnostic>)> done;
  };
  struct Stream {
    uint64_t session = 0;
    std::shared_ptr<AgentSink> sink;
  };

  // The node's sink if `session` is still its stream.
  std::shared_ptr<AgentSink> SinkFor(const std::string& node, uint64_t session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AgentRegistry* const registry_;
  const core::Clock* const clock_;
  absl::Mutex mu_;
  std::map<std::string, Stream> streams_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<DiagnosticWait>> diagnostic_waits_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<ActionWait>> action_waits_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// One reactor per agent stream; thread-safe (gRPC runs reactions on its own
// threads; the hub serializes what they share).
// Connect is a raw method: the stream parses its own frames (daemon/stream.h).
class AgentService final
    : public v1::AgentService::WithRawCallbackMethod_Connect<v1::AgentService::Service> {
 public:
  // `authenticator` outlives the service.
  AgentService(AgentHub* hub, ServiceMetrics* metrics, const NodeAuthenticator* authenticator)
      : hub_(hub), metrics_(metrics), authenticator_(authenticator) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Connect(
      grpc::CallbackServerContext* context) override;

 private:
  friend class AgentStreamReactor;
  AgentHub* const hub_;
  ServiceMetrics* const metrics_;
  const NodeAuthenticator* const authenticator_;
};

// Thread-safe. Diagnose with `wait` holds no thread while it waits: its
// reactor is finished by the hub's waiter (the result, or Tick at the
// deadline) or by the caller's cancellation, whichever comes first.
// Every method raw: authentication precedes parsing (ServeAuthenticated).
using NodeAdminServiceBase = v1::NodeAdminService::WithRawCallbackMethod_ListNodes<
    v1::NodeAdminService::WithRawCallbackMethod_GetNode<
        v1::NodeAdminService::WithRawCallbackMethod_Diagnose<v1::NodeAdminService::Service>>>;

class NodeAdminService final : public NodeAdminServiceBase {
 public:
  // Diagnose with wait answers at most this long after it is asked, and
  // this margin before the caller's deadline, so the caller reads sdcd's
  // answer (the diagnostic, still running) rather than a timeout.
  static constexpr absl::Duration kMaxWait = absl::Minutes(30);
  static constexpr absl::Duration kAnswerMargin = absl::Seconds(2);

  NodeAdminService(AgentHub* hub, const core::Clock* clock, ServiceMetrics* metrics,
                   AdminAuth auth)
      : hub_(hub), clock_(clock), metrics_(metrics), auth_(std::move(auth)) {}

  // ListNodes and GetNode need a viewer, Diagnose an operator (a
  // diagnostic occupies the node's GPUs).
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* c, const grpc::ByteBuffer* in,
                                      grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* c, const grpc::ByteBuffer* in,
                                    grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Diagnose(grpc::CallbackServerContext* c, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override;

 private:

  AgentHub* const hub_;
  const core::Clock* const clock_;
  ServiceMetrics* const metrics_;
  const AdminAuth auth_;
};

// Wire conversions (exposed for tests).
AgentIdentity FromProto(const v1::NodeIdentity& identity);
DeviceResult FromProto(const v1::DiagnosticResult& result);
v1::DiagnosticResult ToProto(const DeviceResult& result, uint64_t id);
v1::Diagnostic ToProto(const Diagnostic& diagnostic);
v1::Node ToProto(const NodeView& node);

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_AGENT_SERVICE_H_
