#include "daemon/agent_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/stream.h"
#include "common/version.h"
#include "daemon/grpc_edge.h"
#include "protocol/convert.h"

namespace sdc::daemon {

using common::QueuedStream;
using common::StreamHandle;

namespace {

v1::DiagnosticState ToProto(DiagnosticState s) {
  switch (s) {
    case DiagnosticState::kRunning:
      return v1::DIAGNOSTIC_RUNNING;
    case DiagnosticState::kPassed:
      return v1::DIAGNOSTIC_PASSED;
    case DiagnosticState::kFailed:
      return v1::DIAGNOSTIC_FAILED;
    case DiagnosticState::kError:
      return v1::DIAGNOSTIC_ERROR;
  }
  return v1::DIAGNOSTIC_STATE_UNSPECIFIED;
}

v1::NodeStatus ToProto(NodeStatus s) {
  switch (s) {
    case NodeStatus::kReady:
      return v1::NODE_READY;
    case NodeStatus::kStale:
      return v1::NODE_STALE;
    case NodeStatus::kDisconnected:
      return v1::NODE_DISCONNECTED;
  }
  return v1::NODE_STATUS_UNSPECIFIED;
}

// What the orchestrator would be told for this request, for the agent's log.
std::string CommandHint(const core::ReplacementRequest& r) {
  const bool reboot = r.action == "reboot";
  return absl::StrCat("EKS: kubectl label node ", r.node,
                      " sagemaker.amazonaws.com/node-health-status=",
                      reboot ? "UnschedulablePendingReboot" : "UnschedulablePendingReplacement",
                      " --overwrite; Slurm: scontrol update node=", r.node,
                      " state=fail reason=", reboot ? "Action:Reboot" : "Action:Replace");
}

}  // namespace

// ---------------------------------------------------------------------------
// Conversions

AgentIdentity FromProto(const v1::NodeIdentity& p) {
  AgentIdentity id;
  id.node_name = p.node_name();
  id.hostname = p.hostname();
  id.instance_id = p.instance_id();
  for (const v1::GpuIdentity& g : p.gpus()) id.gpus.push_back({g.uuid(), g.model(), g.index()});
  id.gpu_note = p.gpu_note();
  id.agent_version = p.agent_version();
  id.heartbeat_interval = absl::Milliseconds(p.heartbeat_interval_ms());
  return id;
}

DeviceResult FromProto(const v1::DiagnosticResult& p) {
  DeviceResult r;
  r.gpu = p.gpu();
  r.device = p.device();
  r.pass = p.pass();
  r.mismatches = p.mismatches();
  r.max_abs_error = p.max_abs_error();
  r.gflops = p.gflops();
  r.seconds = p.seconds();
  r.size = p.size();
  r.repetitions = p.repetitions();
  r.device_count = p.device_count();
  r.detail = p.detail();
  r.error = p.error();
  return r;
}

v1::DiagnosticResult ToProto(const DeviceResult& r, uint64_t id) {
  v1::DiagnosticResult p;
  p.set_id(id);
  p.set_gpu(r.gpu);
  p.set_device(r.device);
  p.set_pass(r.pass);
  p.set_mismatches(r.mismatches);
  p.set_max_abs_error(r.max_abs_error);
  p.set_gflops(r.gflops);
  p.set_seconds(r.seconds);
  p.set_size(r.size);
  p.set_repetitions(r.repetitions);
  p.set_device_count(r.device_count);
  p.set_detail(r.detail);
  p.set_error(r.error);
  return p;
}

v1::Diagnostic ToProto(const Diagnostic& d) {
  v1::Diagnostic p;
  p.set_id(d.id);
  p.set_node_name(d.node);
  p.set_gpu_uuid(d.gpu_uuid);
  p.set_size(d.size);
  p.set_repetitions(d.repetitions);
  p.set_state(ToProto(d.state));
  for (const DeviceResult& r : d.results) *p.add_results() = ToProto(r, d.id);
  p.set_error(d.error);
  p.set_requested_unix_ms(protocol::UnixMillis(d.requested));
  p.set_finished_unix_ms(protocol::UnixMillis(d.finished));
  return p;
}

v1::Node ToProto(const NodeView& n) {
  v1::Node p;
  p.set_node_name(n.identity.node_name);
  p.set_hostname(n.identity.hostname);
  p.set_instance_id(n.identity.instance_id);
  for (const AgentGpu& g : n.identity.gpus) {
    v1::GpuIdentity* q = p.add_gpus();
    q->set_uuid(g.uuid);
    q->set_model(g.model);
    q->set_index(g.index);
  }
  p.set_gpu_note(n.identity.gpu_note);
  p.set_agent_version(n.identity.agent_version);
  p.set_status(ToProto(n.status));
  p.set_registered_unix_ms(protocol::UnixMillis(n.registered));
  p.set_last_heartbeat_unix_ms(protocol::UnixMillis(n.last_heartbeat));
  p.set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(n.identity.heartbeat_interval)));
  for (const Diagnostic& d : n.diagnostics) *p.add_diagnostics() = ToProto(d);
  return p;
}

// ---------------------------------------------------------------------------
// Hub

std::shared_ptr<AgentSink> AgentHub::SinkFor(const std::string& node, uint64_t session) {
  auto it = streams_.find(node);
  if (it == streams_.end() || it->second.session != session) return nullptr;
  return it->second.sink;
}

absl::StatusOr<uint64_t> AgentHub::OpenStream(const AgentIdentity& identity,
                                              std::shared_ptr<AgentSink> sink) {
  std::shared_ptr<AgentSink> replaced;
  AgentRegistry::Registration r;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<AgentRegistry::Registration> registered = registry_->Register(identity);
    if (!registered.ok()) return registered.status();
    r = *std::move(registered);
    Stream& s = streams_[identity.node_name];
    replaced = std::move(s.sink);
    s = {r.session, sink};
  }
  if (replaced != nullptr) {
    replaced->End(absl::AbortedError("a newer stream of this node's agent replaced this one"));
  }
  v1::CoordinatorToAgent welcome;
  welcome.mutable_welcome()->set_coordinator_version(kVersion);
  sink->Push(std::move(welcome));
  for (const NodeAction& a : r.actions) {
    v1::CoordinatorToAgent m;
    m.mutable_action()->set_request_id(a.request_id);
    m.mutable_action()->set_action(a.action);
    m.mutable_action()->set_command_hint(a.command_hint);
    sink->Push(std::move(m));
  }
  Dispatch(std::move(r.events));
  return r.session;
}

void AgentHub::CloseStream(const std::string& node, uint64_t session) {
  AgentEvents events;
  {
    absl::MutexLock lock(&mu_);
    events = registry_->Disconnect(node, session);
    auto it = streams_.find(node);
    if (it != streams_.end() && it->second.session == session) streams_.erase(it);
  }
  Dispatch(std::move(events));
}

absl::Status AgentHub::Heartbeat(const std::string& node, uint64_t session) {
  return registry_->Heartbeat(node, session);
}

absl::Status AgentHub::RecordDiagnosticResult(const std::string& node, uint64_t session,
                                              const v1::DiagnosticResult& result) {
  absl::StatusOr<AgentEvents> events =
      registry_->RecordDiagnosticResult(node, session, result.id(), FromProto(result));
  if (!events.ok()) return events.status();
  Dispatch(*std::move(events));
  return absl::OkStatus();
}

absl::Status AgentHub::RecordActionResult(const std::string& node, uint64_t session,
                                          const v1::ActionResult& result) {
  absl::StatusOr<AgentEvents> events = registry_->RecordActionResult(
      node, session, result.request_id(), result.ok(), result.detail());
  if (!events.ok()) return events.status();
  Dispatch(*std::move(events));
  return absl::OkStatus();
}

void AgentHub::Dispatch(AgentEvents events) {
  if (events.empty()) return;
  std::vector<std::pair<std::function<void(absl::StatusOr<Diagnostic>)>, Diagnostic>> calls;
  {
    absl::MutexLock lock(&mu_);
    for (const Diagnostic& d : events.diagnostics) {
      auto it = diagnostic_waits_.find(d.id);
      if (it == diagnostic_waits_.end()) continue;
      for (DiagnosticWait& w : it->second) calls.push_back({std::move(w.done), d});
      diagnostic_waits_.erase(it);
    }
    for (const ActionOutcome& a : events.actions) {
      auto it = action_waits_.find(a.request_id);
      if (it == action_waits_.end() || it->second->node != a.node) continue;
      it->second->result = {a.ok, a.detail};
      it->second->done.Notify();
      action_waits_.erase(it);
    }
  }
  for (auto& [done, d] : calls) done(d);
}

absl::StatusOr<Diagnostic> AgentHub::StartDiagnostic(const std::string& node,
                                                     const std::string& gpu_uuid, uint32_t size,
                                                     uint32_t repetitions) {
  std::shared_ptr<AgentSink> sink;
  absl::StatusOr<Diagnostic> d;
  {
    // Under the hub's lock, the session the registry names is the one whose
    // sink is in streams_ (OpenStream and CloseStream hold it too).
    absl::MutexLock lock(&mu_);
    d = registry_->StartDiagnostic(node, gpu_uuid, size, repetitions);
    if (!d.ok()) return d;
    sink = SinkFor(node, d->session);
  }
  if (sink != nullptr) {
    v1::CoordinatorToAgent m;
    v1::DiagnosticRequest* q = m.mutable_diagnostic();
    q->set_id(d->id);
    q->set_gpu_uuid(d->gpu_uuid);
    q->set_size(d->size);
    q->set_repetitions(d->repetitions);
    sink->Push(std::move(m));
  }
  return d;
}

void AgentHub::AwaitDiagnostic(uint64_t id, absl::Time deadline,
                               std::function<void(absl::StatusOr<Diagnostic>)> done) {
  absl::StatusOr<Diagnostic> now;
  {
    absl::MutexLock lock(&mu_);
    // Checked under the lock: a diagnostic that finishes after this check is
    // dispatched after the waiter is in place.
    now = registry_->GetDiagnostic(id);
    if (now.ok() && now->state == DiagnosticState::kRunning) {
      diagnostic_waits_[id].push_back({deadline, std::move(done)});
      return;
    }
  }
  done(std::move(now));
}

void AgentHub::Tick() {
  Dispatch(registry_->Tick());
  std::vector<std::pair<std::function<void(absl::StatusOr<Diagnostic>)>, uint64_t>> due;
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&mu_);
    for (auto it = diagnostic_waits_.begin(); it != diagnostic_waits_.end();) {
      std::vector<DiagnosticWait>& waits = it->second;
      for (auto w = waits.begin(); w != waits.end();) {
        if (w->deadline <= now) {
          due.push_back({std::move(w->done), it->first});
          w = waits.erase(w);
        } else {
          ++w;
        }
      }
      it = waits.empty() ? diagnostic_waits_.erase(it) : std::next(it);
    }
  }
  for (auto& [done, id] : due) done(registry_->GetDiagnostic(id));
}

std::vector<ActuatorResult> AgentHub::RunActions(
    const std::vector<core::ReplacementRequest>& requests, absl::Duration timeout) {
  std::vector<ActuatorResult> out(requests.size());
  std::vector<std::shared_ptr<ActionWait>> waits(requests.size());
  std::vector<bool> delivered(requests.size(), false);
  for (size_t i = 0; i < requests.size(); ++i) {
    const core::ReplacementRequest& r = requests[i];
    const NodeAction action{r.id, r.action, CommandHint(r)};
    std::shared_ptr<AgentSink> sink;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) {
        out[i] = {false, "sdcd is shutting down"};
        continue;
      }
      absl::StatusOr<AgentRegistry::ActionDelivery> delivery = registry_->StartAction(r.node, action);
      if (!delivery.ok()) {
        out[i] = {false, absl::StrCat("agent: ", delivery.status().message())};
        continue;
      }
      waits[i] = std::make_shared<ActionWait>();
      waits[i]->node = r.node;
      action_waits_[r.id] = waits[i];
      delivered[i] = delivery->session != 0;
      if (delivery->send_now) sink = SinkFor(r.node, delivery->session);
    }
    if (sink != nullptr) {
      v1::CoordinatorToAgent m;
      m.mutable_action()->set_request_id(action.request_id);
      m.mutable_action()->set_action(action.action);
      m.mutable_action()->set_command_hint(action.command_hint);
      sink->Push(std::move(m));
    }
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (waits[i] == nullptr) continue;
    const core::ReplacementRequest& r = requests[i];
    waits[i]->done.WaitForNotificationWithDeadline(deadline);
    {
      absl::MutexLock lock(&mu_);
      auto it = action_waits_.find(r.id);
      if (it != action_waits_.end() && it->second == waits[i]) action_waits_.erase(it);
      // Notify happens under mu_ (Dispatch, Shutdown): checked under it, the
      // result is final.
      if (waits[i]->done.HasBeenNotified()) {
        out[i] = waits[i]->result;
        out[i].detail = absl::StrCat("agent on ", r.node, ": ", out[i].detail);
        continue;
      }
      registry_->CancelAction(r.node, r.id);
    }
    out[i] = {false, absl::StrCat("agent on ", r.node, ": no result within ",
                                  absl::FormatDuration(timeout),
                                  delivered[i] ? "" : " (its agent was not connected)")};
  }
  return out;
}

void AgentHub::Shutdown() {
  std::vector<std::shared_ptr<AgentSink>> sinks;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [id, wait] : action_waits_) {
      wait->result = {false, "sdcd is shutting down"};
      wait->done.Notify();
    }
    action_waits_.clear();
    for (auto& [node, stream] : streams_) sinks.push_back(stream.sink);
  }
  // Agents reconnect (to this sdcd's successor) at once instead of holding
  // the server's shutdown until its deadline.
  for (auto& sink : sinks) sink->End(absl::UnavailableError("sdcd is shutting down"));
}

// ---------------------------------------------------------------------------
// The agent stream

class AgentStreamReactor;

// The stream's outgoing side, shared with the hub, which may push after the
// stream ended (see daemon/stream.h).
class AgentOutbox : public AgentSink, public StreamHandle<AgentStreamReactor> {
 public:
  using StreamHandle::StreamHandle;
  void Push(v1::CoordinatorToAgent message) override;
  void End(absl::Status status) override;
};

class AgentStreamReactor : public QueuedStream<v1::AgentMessage, v1::CoordinatorToAgent> {
 public:
  AgentStreamReactor(AgentService* service, absl::StatusOr<ProvenNode> proven)
      : service_(service), outbox_(std::make_shared<AgentOutbox>(this)),
        proven_(std::move(proven)) {
    if (!proven_.ok()) {
      // Refused before a byte of its messages is read.
      service_->metrics_->Rejected(RejectReason(proven_.status().code()));
      RequestFinish(ToGrpc(proven_.status()));
      return;
    }
    StartRead(&in_);
  }

  void OnMalformed(grpc::Status status) override {
    service_->metrics_->Malformed("agent_connect");
    RequestFinish(std::move(status));
  }

  void OnRead(bool ok) override {
    if (!ok) {
      RequestFinish(grpc::Status::OK);
      return;
    }
    const absl::Status handled = Handle();
    if (!handled.ok()) {
      service_->metrics_->Rejected(RejectReason(handled.code()));
      RequestFinish(ToGrpc(handled));
      return;
    }
    StartRead(&in_);
  }

  void OnDone() override {
    if (session_ != 0) service_->hub_->CloseStream(node_, session_);
    if (outbox_->Close()) delete this;
  }

 private:
  // One message from the agent. A non-OK status ends the stream with it.
  absl::Status Handle() {
    AgentHub* hub = service_->hub_;
    if (session_ == 0) {
      if (!in_.has_identity()) {
        return absl::InvalidArgumentError("the first message of a stream must be a NodeIdentity");
      }
      AgentIdentity identity = FromProto(in_.identity());
      // Only a node speaks for itself: the node this stream registers is
      // the one its credentials proved.
      if (!proven_->node.empty() && identity.node_name != proven_->node) {
        return absl::PermissionDeniedError(absl::StrCat(
            "this agent proved to be node ", proven_->node, " (", proven_->proof,
            ") and may not register node '", identity.node_name.substr(0, 253), "'"));
      }
      absl::StatusOr<uint64_t> session = hub->OpenStream(identity, outbox_);
      if (!session.ok()) return session.status();
      session_ = *session;
      node_ = identity.node_name;
      return absl::OkStatus();
    }
    switch (in_.body_case()) {
      case v1::AgentMessage::kIdentity:
        return absl::InvalidArgumentError("a stream sends its NodeIdentity only once");
      case v1::AgentMessage::kHeartbeat:
        // FailedPrecondition when a newer stream replaced this one.
        return hub->Heartbeat(node_, session_);
      case v1::AgentMessage::kDiagnosticResult:
        return Answered(hub->RecordDiagnosticResult(node_, session_, in_.diagnostic_result()));
      case v1::AgentMessage::kActionResult:
        return Answered(hub->RecordActionResult(node_, session_, in_.action_result()));
      case v1::AgentMessage::BODY_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("empty message");
  }

  // A late answer (its diagnostic timed out, its action was given up) is
  // dropped and counted; a malformed one ends the stream.
  absl::Status Answered(const absl::Status& s) {
    if (s.code() == absl::StatusCode::kNotFound) {
      service_->metrics_->Rejected(RejectReason(s.code()));
      return absl::OkStatus();
    }
    return s;
  }

  AgentService* const service_;
  const std::shared_ptr<AgentOutbox> outbox_;
  const absl::StatusOr<ProvenNode> proven_;  // What its credentials proved.
  v1::AgentMessage in_;  // Touched only by the read path, one read at a time.
  uint64_t session_ = 0;
  std::string node_;

};

void AgentOutbox::Push(v1::CoordinatorToAgent message) {
  WithReactor([&](AgentStreamReactor* r) { r->Enqueue(std::move(message)); });
}

void AgentOutbox::End(absl::Status status) {
  WithReactor([&](AgentStreamReactor* r) { r->RequestFinish(ToGrpc(status)); });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AgentService::Connect(
    grpc::CallbackServerContext* context) {
  return new AgentStreamReactor(this, authenticator_->Agent(CredentialsOf(*context)));
}

// ---------------------------------------------------------------------------
// Admin

grpc::ServerUnaryReactor* NodeAdminService::ListNodes(grpc::CallbackServerContext* c,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListNodesRequest, v1::ListNodesResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListNodesRequest&, auto* reactor) {
        for (const NodeView& n : hub_->registry().ListNodes()) {
          *reactor->response()->add_nodes() = ToProto(n);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* NodeAdminService::GetNode(grpc::CallbackServerContext* c,
                                                    const grpc::ByteBuffer* in,
                                                    grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::GetNodeRequest, v1::Node>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::GetNodeRequest& q, auto* reactor) {
        absl::StatusOr<NodeView> node = hub_->registry().GetNode(q.node_name());
        if (!node.ok()) {
          metrics_->Rejected(RejectReason(node.status().code()));
          reactor->Reply(ToGrpc(node.status()));
          return;
        }
        *reactor->response() = ToProto(*node);
        reactor->Reply(grpc::Status::OK);
      });
}

namespace {

// A Diagnose call waiting for its diagnostic, shared with the hub's waiter:
// whoever comes first (the result, the deadline, the caller's cancellation)
// finishes it; later arrivals find it finished and do nothing.
class DiagnoseCall {
 public:
  DiagnoseCall(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* response)
      : reactor_(reactor), response_(response) {}

  void Complete(const absl::StatusOr<Diagnostic>& d) {
    Finish(d.ok() ? grpc::Status::OK : ToGrpc(d.status()), d.ok() ? &*d : nullptr);
  }

  // The first call finishes the RPC (with `d` serialized as the response
  // when OK); later ones do nothing.
  void Finish(grpc::Status status, const Diagnostic* d) {
    grpc::ServerUnaryReactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr) return;
      reactor = reactor_;
      reactor_ = nullptr;
      if (d != nullptr && status.ok()) {
        bool own_buffer = false;
        status = grpc::SerializationTraits<v1::Diagnostic>::Serialize(ToProto(*d), response_,
                                                                      &own_buffer);
      }
    }
    // Finish may run OnDone inline, which deletes the reactor: nothing of it
    // is touched after this.
    reactor->Finish(status);
  }

 private:
  absl::Mutex mu_;
  grpc::ServerUnaryReactor* reactor_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer* const response_;
};

class DiagnoseReactor : public grpc::ServerUnaryReactor {
 public:
  explicit DiagnoseReactor(grpc::ByteBuffer* response)
      : call_(std::make_shared<DiagnoseCall>(this, response)) {}
  std::shared_ptr<DiagnoseCall> call() const { return call_; }
  void OnCancel() override {
    call_->Complete(absl::CancelledError("the caller cancelled or its deadline passed"));
  }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<DiagnoseCall> call_;
};

}  // namespace

grpc::ServerUnaryReactor* NodeAdminService::Diagnose(grpc::CallbackServerContext* c,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  auto* reactor = new DiagnoseReactor(out);
  std::shared_ptr<DiagnoseCall> call = reactor->call();
  // Authenticated before the request is parsed (as ServeAuthenticated); a
  // diagnostic occupies a node's GPUs: operators only.
  if (grpc::Status auth = AuthorizeAdmin(auth_, metrics_, c, Role::kOperator); !auth.ok()) {
    call->Finish(auth, nullptr);
    return reactor;
  }
  v1::DiagnoseRequest request;
  grpc::ByteBuffer bytes(*in);
  if (!grpc::SerializationTraits<v1::DiagnoseRequest>::Deserialize(&bytes, &request).ok()) {
    metrics_->Rejected("invalid_argument");
    call->Finish({grpc::StatusCode::INVALID_ARGUMENT,
                  "the request is not a valid sdc.v1.DiagnoseRequest"},
                 nullptr);
    return reactor;
  }
  const v1::DiagnoseRequest* q = &request;
  absl::StatusOr<Diagnostic> d =
      hub_->StartDiagnostic(q->node_name(), q->gpu_uuid(), q->size(), q->repetitions());
  if (!d.ok()) metrics_->Rejected(RejectReason(d.status().code()));
  if (!d.ok() || !q->wait()) {
    call->Complete(d);
    return reactor;
  }
  // Answer before the caller's deadline (kAnswerMargin), and within kMaxWait.
  const absl::Duration left = absl::FromChrono(c->deadline()) - absl::Now();
  const absl::Duration wait = std::max(absl::ZeroDuration(),
                                       std::min(kMaxWait, left - kAnswerMargin));
  hub_->AwaitDiagnostic(d->id, clock_->Now() + wait,
                        [call](absl::StatusOr<Diagnostic> done) { call->Complete(done); });
  return reactor;
}

}  // namespace sdc::daemon
