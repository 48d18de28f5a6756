#ifndef SDC_AGENT_RELAY_H_
#define SDC_AGENT_RELAY_H_

// The agent's trainer relay (sdc-agent --relay_listen): trainers on this
// node attach to the agent exactly as they would to sdcd (the same
// TrainerService, so SDC_COORDINATOR simply names the agent), and the agent
// carries all their streams to sdcd on one TrainerService.Relay stream,
// batched. The relay proves its node to sdcd (its certificate or token),
// and every Hello it carries is placed on this node: the relay overwrites
// the placement's node name with its own (sdcd does the same), since a rank
// it relays runs here whatever it says. At 16,384 ranks that turns 16,384 streams and one gRPC message
// per report into 2,048 streams and one message per node per batch (see
// docs/ARCHITECTURE.md, "Relay").
//
// Nothing is acknowledged by the agent: acknowledgements, plans and
// verdicts come from sdcd, through the relay, to the rank they name, and a
// rank keeps (and resends) every report until sdcd acknowledged it. When
// the relay's stream to sdcd ends, every rank stream relayed on it ends
// with UNAVAILABLE; the ranks reconnect (to the agent), which opens a fresh
// stream to sdcd for them. MayCheckpoint is forwarded as it is.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "trainer.grpc.pb.h"

namespace sdc::agent {

// Attach is a raw method: a session parses its own frames, so a malformed
// one ends it with INVALID_ARGUMENT, not OK (daemon/stream.h).
class TrainerRelay final
    : public v1::TrainerService::WithRawCallbackMethod_Attach<
          v1::TrainerService::WithCallbackMethod_MayCheckpoint<v1::TrainerService::Service>> {
 public:
  // `node` is this agent's node; `bearer` (may be null) gives the token to
  // send with each stream to sdcd (read afresh: kubelet rotates it).
  TrainerRelay(std::shared_ptr<grpc::Channel> coordinator, std::string node,
               std::function<std::string()> bearer);
  ~TrainerRelay() override;  // Shutdown().

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Attach(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* MayCheckpoint(grpc::CallbackServerContext* context,
                                          const v1::CheckpointRequest* request,
                                          v1::CheckpointDecision* response) override;

  // Ends every rank stream (UNAVAILABLE) and the stream to sdcd, and joins
  // its threads. Idempotent; call before the server's Shutdown.
  void Shutdown();

  // Rank streams relayed now.
  size_t sessions() const;
  // Rank streams accepted since the relay started.
  uint64_t sessions_opened() const;

  // Messages (or bytes) waiting for the stream to sdcd beyond which a rank
  // stream that adds more is ended (UNAVAILABLE, saying so): sdcd is not
  // keeping up, and the rank keeps its unacknowledged reports to resend.
  static constexpr size_t kMaxWaiting = 100'000;
  static constexpr size_t kMaxWaitingBytes = size_t{256} << 20;
  // The largest message a rank may send the relay: its own limit (16 MiB)
  // less room for the relay's wrapping, so that sdcd accepts it wrapped.
  static constexpr int kMaxRankMessageBytes = (16 << 20) - (64 << 10);

 private:
  class Session;
  class SessionHandle;
  class Upstream;
  friend class Session;
  friend class Upstream;

  enum class Forwarded {
    kQueued,   // On its way to sdcd.
    kEnding,   // The session is over; whoever ended it finishes the stream.
    kRefused,  // Too much waits for sdcd: the session ends here, with *why.
  };
  // Queues a session's message for sdcd (taking its contents).
  Forwarded Forward(uint64_t session, v1::TrainerMessage* message, std::string* why);
  // A new session's id (from 1); 0 once shut down.
  uint64_t Open(std::shared_ptr<SessionHandle> handle);
  // The rank's stream ended; tells sdcd unless sdcd ended it.
  void Close(uint64_t session);
  // Tells sdcd that `session` ended.
  void SendEnd(uint64_t session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // From an upstream's reader thread.
  void Deliver(Upstream* from, const v1::RelayedReply& reply);
  // RelayDown's packed acknowledgements, after its replies.
  void DeliverAcks(Upstream* from, const v1::RelayDown& down);
  void Lost(Upstream* from, const grpc::Status& status);

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::TrainerService::Stub> stub_;
  const std::string node_;
  const std::function<std::string()> bearer_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<SessionHandle>> sessions_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Upstream> upstream_ ABSL_GUARDED_BY(mu_);
  // Upstreams that ended, joined by the next one's end or Shutdown.
  std::vector<std::unique_ptr<Upstream>> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::agent

#endif  // SDC_AGENT_RELAY_H_
