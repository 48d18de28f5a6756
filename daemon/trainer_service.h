#ifndef SDC_DAEMON_TRAINER_SERVICE_H_
#define SDC_DAEMON_TRAINER_SERVICE_H_

// TrainerService, what trainers (and relays carrying them) call: a thin
// adapter that translates messages, hands them to the coordinator core, and
// sends the core's answers once the store says they are durable. No handler
// blocks (the core's calls are short and durability is awaited with
// NotifyDurable).
//
// Attach (attach_call.h) and Relay (relay_call.h) streams run on the
// asynchronous engine of stream_call.h, over several completion queues (why:
// see there); MayCheckpoint on the callback API.
//
// MayCheckpoint answers the coordinator's decision (CheckpointDecision) once
// what it recorded is durable; a job the coordinator does not know is
// NOT_FOUND, an undecodable request INVALID_ARGUMENT; refusals count in
// sdc_rejected_inputs_total{reason}, decisions (not status_only questions)
// in sdc_checkpoint_decisions_total{decision}.

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/rank_session.h"
#include "daemon/stream_call.h"
#include "grpcpp/grpcpp.h"
#include "trainer.grpc.pb.h"

namespace sdc::daemon {

class AttachCall;
class RelayCall;

// Every method raw. Attach and Relay streams parse their own frames, so that
// a malformed one ends the stream with INVALID_ARGUMENT, not OK;
// MayCheckpoint parses its request, so that an undecodable one is answered
// INVALID_ARGUMENT too (raw_unary.h), not INTERNAL.
using TrainerServiceBase = v1::TrainerService::WithRawMethod_Attach<
    v1::TrainerService::WithRawCallbackMethod_MayCheckpoint<
        v1::TrainerService::WithRawMethod_Relay<v1::TrainerService::Service>>>;

// Lifecycle: AddQueues before the server is built, Start after, Stop after
// the server's Shutdown returned. Thread-safe.
class TrainerService final : public TrainerServiceBase {
 public:
  explicit TrainerService(const TrainerContext& context) : context_(context) {}
  ~TrainerService() override;

  void AddQueues(grpc::ServerBuilder& builder, int queues);
  void Start();
  // Ends every relay stream and its sessions with `status`, and any relay
  // that arrives later (sdcd is stopping; call before StreamRegistry::EndAll
  // and the server's Shutdown). `status` must not be OK.
  void EndRelays(const grpc::Status& status);
  // Relay streams open now.
  size_t relays() const;
  void Stop();

  grpc::ServerUnaryReactor* MayCheckpoint(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override;

 private:
  friend class AttachCall;
  friend class RelayCall;

  // False (with the status to end it with) once EndRelays ran.
  bool AddRelay(std::weak_ptr<RelayCall> relay, grpc::Status* refused);

  const TrainerContext context_;
  CallQueues queues_;
  mutable absl::Mutex relays_mu_;
  std::vector<std::weak_ptr<RelayCall>> relays_ ABSL_GUARDED_BY(relays_mu_);
  size_t relays_live_ ABSL_GUARDED_BY(relays_mu_) = 0;
  grpc::Status relays_end_status_ ABSL_GUARDED_BY(relays_mu_);  // Not OK after EndRelays.
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_TRAINER_SERVICE_H_
