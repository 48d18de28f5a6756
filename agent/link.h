#ifndef SDC_AGENT_LINK_H_
#define SDC_AGENT_LINK_H_

// The agent's stream to sdcd (AgentService.Connect), owned by a background
// thread: connects when core::LinkMachine says so (backoff with jitter),
// sends the NodeIdentity, then heartbeats and whatever the agent queues with
// Send(), and hands sdcd's requests to the handlers. The handlers run on the
// stream's reader thread and must not block: they queue work elsewhere.
//
// A stream is a session. What sdcd asked on one session is answered on that
// session only: sdcd fails a request whose stream ended, so an answer
// produced after a reconnect is dropped, never sent on the new stream.
//
// Every call is bounded: connecting by the welcome timeout, the stream
// itself by HTTP/2 keepalive pings every 30 s (client/coordinator_link.h's
// numbers, which sdcd accepts). Thread-safe.

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent.grpc.pb.h"
#include "agent/core/link_machine.h"
#include "grpcpp/grpcpp.h"

namespace sdc::agent {

struct LinkOptions {
  std::string coordinator;  // HOST:PORT.
  std::string tls_ca;       // Non-empty: TLS, trusting this CA (PEM file).
  std::string tls_cert;     // Optional client certificate (PEM file) ...
  std::string tls_key;      // ... and its key.
  // Optional: a file holding a bearer token (EKS: the pod's projected
  // service-account token), read again for every stream.
  std::string token_file;
  core::LinkTiming timing;
};

// What the link has done so far, for the agent's metrics and /healthz.
struct LinkStats {
  bool registered = false;       // sdcd welcomed the current stream.
  uint64_t streams_started = 0;  // Connection attempts (the first and every reconnect).
  uint64_t heartbeats_sent = 0;
};

class AgentLink {
 public:
  using DiagnosticHandler = std::function<void(uint64_t session, const v1::DiagnosticRequest&)>;
  using ActionHandler = std::function<void(uint64_t session, const v1::NodeAction&)>;
  // Fills a heartbeat's counters; called on the link's thread, no lock held.
  using HeartbeatFiller = std::function<void(v1::Heartbeat*)>;

  AgentLink(LinkOptions options, v1::NodeIdentity identity, DiagnosticHandler on_diagnostic,
            ActionHandler on_action, HeartbeatFiller fill_heartbeat);
  ~AgentLink();  // Stop().

  void Start();
  // Ends the stream and joins the threads. Idempotent.
  void Stop();

  // Queues `message` for the stream of `session`; dropped (with a log line)
  // when that stream has ended. At most kMaxQueued messages wait; beyond,
  // the oldest is dropped.
  void Send(uint64_t session, v1::AgentMessage message);

  LinkStats Stats() const;

  static constexpr size_t kMaxQueued = 1000;

 private:
  void Run();
  // One stream's life; returns why it ended.
  std::string Session(uint64_t session);
  // Waits until the channel is connected, the attempt's welcome deadline, or
  // Stop(); true when connected.
  bool WaitConnected(absl::Time deadline);
  // Why the channel cannot connect, in gRPC's words (a short probe).
  std::string ConnectFailure();

  const LinkOptions options_;
  const v1::NodeIdentity identity_;
  const DiagnosticHandler on_diagnostic_;
  const ActionHandler on_action_;
  const HeartbeatFiller fill_heartbeat_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  core::LinkMachine machine_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sessions_ ABSL_GUARDED_BY(mu_) = 0;         // Streams started.
  uint64_t registered_session_ ABSL_GUARDED_BY(mu_) = 0;  // Welcomed and alive; 0: none.
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;  // Bumped when the schedule changes.
  uint64_t heartbeats_sent_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<v1::AgentMessage> outbox_ ABSL_GUARDED_BY(mu_);
};

// The token in `path`, whitespace trimmed; "" when it cannot be read.
std::string ReadToken(const std::string& path);

// A channel to sdcd with the trainers' keepalive settings and TLS when
// options.tls_ca is set. Unreadable files give an empty PEM (Validate
// checked them at start).
std::shared_ptr<grpc::Channel> MakeAgentChannel(const LinkOptions& options);

// The trainer relay's channel to sdcd: the same, with trainers' message size
// limit (16 MiB), and gRPC's own reconnect backoff (the ranks pace theirs).
std::shared_ptr<grpc::Channel> MakeRelayChannel(const LinkOptions& options);

}  // namespace sdc::agent

#endif  // SDC_AGENT_LINK_H_
