#include "daemon/trainer_service.h"

#include <algorithm>
#include <utility>

#include "daemon/attach_call.h"
#include "daemon/grpc_edge.h"
#include "daemon/raw_unary.h"
#include "daemon/relay_call.h"

namespace sdc::daemon {

TrainerService::~TrainerService() { Stop(); }

void TrainerService::AddQueues(grpc::ServerBuilder& builder, int queues) {
  queues_.Add(builder, queues);
}

void TrainerService::Start() {
  queues_.Start([this](grpc::ServerCompletionQueue* queue) {
    AttachCall::Arm(this, queue);
    RelayCall::Arm(this, queue);
  });
}

void TrainerService::Stop() { queues_.Stop(); }

bool TrainerService::AddRelay(std::weak_ptr<RelayCall> relay, grpc::Status* refused) {
  absl::MutexLock lock(&relays_mu_);
  if (!relays_end_status_.ok()) {  // EndRelays ran: a relay back at once ends too.
    *refused = relays_end_status_;
    return false;
  }
  // Forget relays that are gone, now and then (amortized).
  if (relays_.size() >= 2 * relays_live_ + 64) {
    relays_.erase(std::remove_if(relays_.begin(), relays_.end(),
                                 [](const std::weak_ptr<RelayCall>& r) { return r.expired(); }),
                  relays_.end());
    relays_live_ = relays_.size();
  }
  relays_.push_back(std::move(relay));
  return true;
}

size_t TrainerService::relays() const {
  absl::MutexLock lock(&relays_mu_);
  return std::count_if(relays_.begin(), relays_.end(),
                       [](const std::weak_ptr<RelayCall>& r) { return !r.expired(); });
}

void TrainerService::EndRelays(const grpc::Status& status) {
  std::vector<std::weak_ptr<RelayCall>> relays;
  {
    absl::MutexLock lock(&relays_mu_);
    relays_end_status_ = status;
    relays.swap(relays_);
  }
  for (auto& r : relays) {
    if (std::shared_ptr<RelayCall> call = r.lock()) call->End(status);
  }
}

grpc::ServerUnaryReactor* TrainerService::MayCheckpoint(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  auto* reactor = new RawUnaryReactor<v1::CheckpointDecision>(out);
  v1::CheckpointRequest request;
  if (!ParseRequest(context_.metrics, in, &request, reactor)) return reactor;
  absl::StatusOr<core::CheckpointResult> result =
      request.status_only()
          ? context_.coordinator->CheckpointStatus(request.job_id())
          : context_.coordinator->MayCheckpoint(request.job_id(), request.step());
  if (!result.ok()) {
    context_.metrics->Rejected(RejectReason(result.status().code()));
    reactor->Reply(ToGrpc(result.status()));
    return reactor;
  }
  v1::CheckpointDecision* response = reactor->response();
  response->set_allowed(result->allowed);
  response->set_reason(result->reason);
  response->set_retryable(result->retryable);
  response->set_confirmed_through_step(result->confirmed_through);
  for (core::Step s : result->revoked) response->add_revoked_steps(s);
  if (!request.status_only()) {
    context_.metrics->Checkpoint(result->allowed ? "allowed"
                                 : result->retryable ? "wait"
                                                     : "denied");
  }
  context_.delivery->Deliver(std::move(result->effects),
                             [reactor](absl::Status s) { reactor->Reply(ToGrpc(s)); });
  return reactor;
}

}  // namespace sdc::daemon
