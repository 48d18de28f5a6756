#ifndef SDC_DAEMON_RANK_SESSION_H_
#define SDC_DAEMON_RANK_SESSION_H_

// One rank's conversation with sdcd, whatever carries it (its own Attach
// stream, or a session of a relay): a Hello, then reports, each handed to
// the coordinator and answered once durable.

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/core/coordinator.h"
#include "daemon/delivery.h"
#include "daemon/outbox.h"
#include "daemon/service_metrics.h"
#include "daemon/stream_registry.h"
#include "grpcpp/grpcpp.h"
#include "trainer.pb.h"

namespace sdc::daemon {

// What the trainer side of sdcd works with; each outlives every session.
struct TrainerContext {
  core::Coordinator* coordinator = nullptr;
  Delivery* delivery = nullptr;
  StreamRegistry* streams = nullptr;
  ServiceMetrics* metrics = nullptr;
};

// Not thread-safe: its stream's reader calls it.
class RankSession {
 public:
  // `outbox` is where this rank's messages go once it said Hello.
  RankSession(const TrainerContext& context, std::shared_ptr<Outbox> outbox)
      : context_(context), outbox_(std::move(outbox)) {}

  // Handles one message. Not OK: the session must end with that status
  // (INVALID_ARGUMENT for a message out of place, the coordinator's code for
  // one it refused). A Hello registers the outbox and is answered with a
  // Welcome once durable; a report is acknowledged once durable. With
  // `acked`, a report's acknowledgement is the caller's to send once its
  // Delivery::Batch is durable: *acked is set to its sequence.
  grpc::Status Handle(const v1::TrainerMessage& in, uint64_t* acked = nullptr);

  // The stream ended: the rank is no longer reachable here. A stream that
  // ends after the rank attached again elsewhere (a new relay, a new Attach
  // stream) detaches nothing.
  void Close();

 private:
  grpc::Status Attach(const v1::Hello& hello);

  const TrainerContext context_;
  const std::shared_ptr<Outbox> outbox_;
  bool attached_ = false;
  std::string job_;
  core::Rank rank_ = 0;
  uint64_t incarnation_ = 0;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_RANK_SESSION_H_
