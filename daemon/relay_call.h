#ifndef SDC_DAEMON_RELAY_CALL_H_
#define SDC_DAEMON_RELAY_CALL_H_

// TrainerService.Relay: a node agent's stream carrying many ranks'
// sessions (sdc-agent --relay_listen). Each session is handled as an Attach
// stream would be (a RankSession); their replies are batched into as few
// writes as the relay can take. Served on the agent listener only: the
// relay proves its node (daemon/node_identity.h) before its first message
// is handled, and every rank it carries is placed on that node.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/outbox.h"
#include "daemon/rank_session.h"
#include "daemon/stream_call.h"
#include "trainer.pb.h"

namespace sdc::daemon {

class TrainerService;

// Lives as long as its stream (see StreamCall). Thread-safe.
class RelayCall final : public StreamCall<v1::RelayUp, v1::RelayDown>,
                        public SharedReplies,
                        public std::enable_shared_from_this<RelayCall> {
 public:
  // Waits for the next Relay on `queue`.
  static void Arm(TrainerService* service, grpc::ServerCompletionQueue* queue);

  RelayCall(TrainerService* service, grpc::ServerCompletionQueue* queue);

  // Ends the relay and every session on it (sdcd is stopping): the relay
  // ends its ranks' streams with `status`, and they reconnect.
  void End(const grpc::Status& status);

  // One reply for those of `sessions` still open.
  void EnqueueShared(const v1::CoordinatorMessage& message,
                     const std::vector<uint64_t>& sessions) override;

 private:
  class SessionOutbox;
  struct Session {
    std::unique_ptr<RankSession> rank;
    std::shared_ptr<SessionOutbox> outbox;
  };

  const char* Method() const override { return "relay"; }
  void Request() override;
  // This call matched a relay: the service may end it, and the next waits.
  void Rearm() override;
  // A refused message ends its session only; the relay carries on.
  grpc::Status Handle() override;
  void OnDone() override;
  // Replies waiting while a write is in flight go out together. Replies
  // are small (an ack, a plan, a verdict naming at most a few tensors), so
  // 1,024 stay far below the 16 MiB message limit. Packed acknowledgements
  // come after a message's replies: a reply never joins a message that
  // already holds some.
  bool Absorb(v1::RelayDown& last, v1::RelayDown& next) override;

  // One message's acknowledgements, packed, for the sessions still open.
  void EnqueueAcks(const std::vector<std::pair<uint64_t, uint64_t>>& acks);
  // From any thread (sdcd shutting down: StreamRegistry::EndAll).
  void EndSession(uint64_t session, const grpc::Status& status);
  void EnqueueEnd(uint64_t session, const grpc::Status& status);
  static void CloseSession(Session& s);
  // Remembers that sdcd ended `session`, until the relay says it has ended
  // too (the oldest are forgotten beyond a bound).
  void Forget(uint64_t session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sessions_mu_);

  // A node's ranks, with room for a relay that carries several nodes.
  static constexpr size_t kMaxSessions = 4096;
  static constexpr int kMaxMessagesPerBatch = 4096;
  static constexpr int kMaxRepliesPerBatch = 1024;
  static constexpr int kMaxAcksPerBatch = 16384;  // At most 20 bytes each.
  static constexpr size_t kMaxGone = 65536;

  TrainerService* const service_;
  // Who the relay proved to be; set by the first message (the read path).
  std::optional<SessionIdentity> identity_;
  // The relay's latest message set compact_replies: verdicts may be shared.
  std::atomic<bool> compact_{false};
  absl::Mutex sessions_mu_;
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(sessions_mu_);
  std::set<uint64_t> gone_ ABSL_GUARDED_BY(sessions_mu_);  // Ended by sdcd.
  bool ended_ ABSL_GUARDED_BY(sessions_mu_) = false;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_RELAY_CALL_H_
