#include "daemon/attach_call.h"

#include <utility>

#include "common/ack.h"
#include "daemon/trainer_service.h"

namespace sdc::daemon {

// The stream's outgoing side as the registry sees it.
class AttachCall::AttachOutbox final : public Outbox {
 public:
  explicit AttachOutbox(std::weak_ptr<AttachCall> call) : call_(std::move(call)) {}
  void Push(v1::CoordinatorMessage message) override {
    if (std::shared_ptr<AttachCall> call = call_.lock()) call->Enqueue(std::move(message));
  }
  void End(grpc::Status status) override {
    if (std::shared_ptr<AttachCall> call = call_.lock()) call->RequestFinish(std::move(status));
  }

 private:
  std::weak_ptr<AttachCall> call_;
};

AttachCall::AttachCall(TrainerService* service, grpc::ServerCompletionQueue* queue)
    : StreamCall(&service->queues_, service->context_.metrics, queue), service_(service) {}

void AttachCall::Arm(TrainerService* service, grpc::ServerCompletionQueue* queue) {
  auto call = std::make_shared<AttachCall>(service, queue);
  call->session_ = std::make_unique<RankSession>(
      service->context_, std::make_shared<AttachOutbox>(std::weak_ptr<AttachCall>(call)));
  call->Begin(call);
}

void AttachCall::Request() {
  service_->RequestAttach(&context_, &stream_, queue_, queue_, &request_tag_);
}

grpc::Status AttachCall::Handle() {
  if (!identified_) {
    identified_ = true;
    const TrainerContext& c = service_->context_;
    SessionIdentity identity;
    identity.certificate_nodes = CredentialsOf(context_).certificate_nodes;
    identity.trust_stated = c.authenticator != nullptr && c.authenticator->insecure_dev_mode();
    session_->set_identity(std::move(identity));
  }
  return session_->Handle(in_);
}

bool AttachCall::Absorb(v1::CoordinatorMessage& last, v1::CoordinatorMessage& next) {
  return common::FoldAck(last, next);
}

}  // namespace sdc::daemon
