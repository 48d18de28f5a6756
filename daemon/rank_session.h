#ifndef SDC_DAEMON_RANK_SESSION_H_
#define SDC_DAEMON_RANK_SESSION_H_

// One rank's conversation with sdcd, whatever carries it (its own Attach
// stream, or a session of a relay): a Hello, then reports, each handed to
// the coordinator and answered once durable. The Hello's placement is bound
// to who carries it (docs/operations.md, "Trust model"): a relay's node
// replaces the Hello's, a direct stream's node certificate must name it,
// and a rank nobody proved is attached unauthenticated.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/coordinator.h"
#include "daemon/delivery.h"
#include "daemon/node_identity.h"
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
  // How callers prove nodes (daemon/node_identity.h); null: nobody proves
  // anything (every rank unauthenticated, no relay served).
  const NodeAuthenticator* authenticator = nullptr;
  // This service is on the agent listener: relays (authenticated agents)
  // are served. On the trainer listener a relay is refused.
  bool agent_port = false;
  // The GPU UUIDs a node's agent listed (AgentRegistry::GpuIds); null: none.
  std::function<std::vector<std::string>(const std::string& node)> node_gpus;
};

// Who carries a session, as its stream proved it.
struct SessionIdentity {
  // A relay's proven node: every Hello on it is placed there ("the relay
  // overwrites the field"). Empty: the stream is a rank's own.
  std::string relay_node;
  // A direct stream's verified certificate's node names.
  std::vector<std::string> certificate_nodes;
  // sdcd --insecure_dev_mode: a caller that proved nothing is taken at its
  // word.
  bool trust_stated = false;
};

// Not thread-safe: its stream's reader calls it.
class RankSession {
 public:
  // `outbox` is where this rank's messages go once it said Hello; `identity`
  // who carries it.
  RankSession(const TrainerContext& context, std::shared_ptr<Outbox> outbox,
              SessionIdentity identity = {})
      : context_(context), outbox_(std::move(outbox)), identity_(std::move(identity)) {}

  // Set before the Hello arrives (a direct stream learns its credentials
  // when its call starts).
  void set_identity(SessionIdentity identity) { identity_ = std::move(identity); }

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
  // Who proved the Hello's node (see the top).
  core::Caller CallerFor(const core::Hello& hello) const;

  const TrainerContext context_;
  const std::shared_ptr<Outbox> outbox_;
  SessionIdentity identity_;
  bool attached_ = false;
  std::string job_;
  core::Rank rank_ = 0;
  uint64_t incarnation_ = 0;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_RANK_SESSION_H_
