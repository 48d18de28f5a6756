#ifndef SDC_DAEMON_OUTBOX_H_
#define SDC_DAEMON_OUTBOX_H_

// A rank's outgoing side as the rest of sdcd sees it: a trainer's Attach
// stream, or one session of a relay. The stream registry and the durability
// callbacks hold outboxes; a callback may run after the stream ended, and
// the outbox then drops its message.

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "trainer.pb.h"

namespace sdc::daemon {

// A stream that carries many ranks' sessions (a relay) and can send one
// message to several of them at once (RelayedReply.also_sessions).
class SharedReplies {
 public:
  virtual ~SharedReplies() = default;
  // One reply naming those of `sessions` still open. Thread-safe.
  virtual void EnqueueShared(const v1::CoordinatorMessage& message,
                             const std::vector<uint64_t>& sessions) = 0;
};

// One message for many ranks (a verdict): the sessions of each stream that
// takes shared replies are gathered, and each such stream gets one reply
// naming them all instead of a copy each. Not thread-safe: one per send.
class SharedPush {
 public:
  void Add(std::shared_ptr<SharedReplies> stream, uint64_t session);
  // Sends `message` to what was gathered, one EnqueueShared per stream, in
  // the order the streams were first added.
  void Send(const v1::CoordinatorMessage& message);

 private:
  std::unordered_map<const SharedReplies*, size_t> index_;
  std::vector<std::pair<std::shared_ptr<SharedReplies>, std::vector<uint64_t>>> streams_;
};

// Implementations are thread-safe.
class Outbox {
 public:
  virtual ~Outbox() = default;
  virtual void Push(v1::CoordinatorMessage message) = 0;
  // `message` goes to many ranks, this one among them: a relay's session
  // may leave it to `shared`. Default: Push.
  virtual void PushShared(const v1::CoordinatorMessage& message, SharedPush& shared) {
    Push(message);
  }
  // Ends the rank's stream with `status` once what is queued is written.
  virtual void End(grpc::Status status) = 0;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_OUTBOX_H_
