#include "daemon/relay_call.h"

#include "absl/strings/str_cat.h"
#include "daemon/delivery.h"
#include "daemon/grpc_edge.h"
#include "daemon/trainer_service.h"

namespace sdc::daemon {

// One session's outgoing side as the registry sees it. Once closed it
// drops what durability callbacks still push: nothing follows a session's
// end.
class RelayCall::SessionOutbox final : public Outbox {
 public:
  SessionOutbox(std::weak_ptr<RelayCall> call, uint64_t session)
      : call_(std::move(call)), session_(session) {}
  void Push(v1::CoordinatorMessage message) override {
    std::shared_ptr<RelayCall> call = call_.lock();
    if (call == nullptr) return;
    v1::RelayDown down;
    v1::RelayedReply* reply = down.add_replies();
    reply->set_session(session_);
    *reply->mutable_message() = std::move(message);
    absl::MutexLock lock(&mu_);  // Held across Enqueue: no push after Close.
    if (!closed_) call->Enqueue(std::move(down));
  }
  void PushShared(const v1::CoordinatorMessage& message, SharedPush& shared) override {
    std::shared_ptr<RelayCall> call = call_.lock();
    if (call == nullptr) return;
    if (call->compact_.load(std::memory_order_relaxed)) {
      shared.Add(std::move(call), session_);  // RelayCall::EnqueueShared.
    } else {
      Push(message);
    }
  }
  void End(grpc::Status status) override {
    if (std::shared_ptr<RelayCall> call = call_.lock()) call->EndSession(session_, status);
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  std::weak_ptr<RelayCall> call_;
  const uint64_t session_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

RelayCall::RelayCall(TrainerService* service, grpc::ServerCompletionQueue* queue)
    : StreamCall(&service->queues_, service->context_.metrics, queue), service_(service) {}

void RelayCall::Arm(TrainerService* service, grpc::ServerCompletionQueue* queue) {
  auto call = std::make_shared<RelayCall>(service, queue);
  call->Begin(call);
}

void RelayCall::End(const grpc::Status& status) {
  {
    absl::MutexLock lock(&sessions_mu_);
    ended_ = true;
    for (auto& [id, s] : sessions_) CloseSession(s);
    sessions_.clear();
  }
  RequestFinish(status);
}

void RelayCall::Request() {
  service_->RequestRelay(&context_, &stream_, queue_, queue_, &request_tag_);
}

void RelayCall::Rearm() {
  grpc::Status refused;
  if (!service_->AddRelay(weak_from_this(), &refused)) End(refused);
  Arm(service_, queue_);
}

grpc::Status RelayCall::Handle() {
  const TrainerContext& c = service_->context_;
  if (!identity_.has_value()) {
    if (!c.agent_port || c.authenticator == nullptr) {
      return {grpc::StatusCode::PERMISSION_DENIED,
              "relays connect to sdcd's agent listener (--agent_listen), where the agent "
              "proves its node; this is the trainer listener"};
    }
    absl::StatusOr<ProvenNode> proven = c.authenticator->Agent(CredentialsOf(context_));
    if (!proven.ok()) return ToGrpc(proven.status());
    SessionIdentity identity;
    identity.relay_node = proven->node;  // Empty in the development mode.
    identity.trust_stated = proven->node.empty();
    identity_ = std::move(identity);
  }
  if (in_.messages_size() > kMaxMessagesPerBatch) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("a relay message carries at most ", kMaxMessagesPerBatch,
                         " messages, not ", in_.messages_size())};
  }
  const TrainerContext& context = service_->context_;
  // The replies to this message's reports wait for one durability callback.
  Delivery::Batch replies(context.delivery);
  // (session, sequence): the acknowledgements, when the relay takes them
  // packed.
  std::vector<std::pair<uint64_t, uint64_t>> acks;
  const bool packed = in_.compact_replies();
  compact_.store(packed, std::memory_order_relaxed);
  for (const v1::RelayedMessage& m : in_.messages()) {
    grpc::Status refused;
    {
      absl::MutexLock lock(&sessions_mu_);
      if (ended_) return grpc::Status::OK;  // Ending: the relay resends elsewhere.
      auto it = sessions_.find(m.session());
      if (m.end()) {
        if (it != sessions_.end()) {
          CloseSession(it->second);
          sessions_.erase(it);
        }
        gone_.erase(m.session());  // The relay knows it ended.
        continue;
      }
      // What was already on its way for a session sdcd ended: dropped, as
      // an Attach stream that finished reads nothing more.
      if (gone_.count(m.session()) > 0) continue;
      if (it == sessions_.end()) {
        if (sessions_.size() >= kMaxSessions) {
          refused = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat("a relay carries at most ", kMaxSessions, " sessions")};
        } else {
          Session fresh;
          fresh.outbox = std::make_shared<SessionOutbox>(weak_from_this(), m.session());
          fresh.rank = std::make_unique<RankSession>(context, fresh.outbox, *identity_);
          it = sessions_.emplace(m.session(), std::move(fresh)).first;
        }
      }
      if (refused.ok()) {
        uint64_t acked = 0;
        refused = it->second.rank->Handle(m.message(), packed ? &acked : nullptr);
        if (refused.ok()) {
          if (acked != 0) acks.emplace_back(m.session(), acked);
          continue;
        }
        CloseSession(it->second);
        sessions_.erase(it);
      }
      Forget(m.session());
    }
    metrics_->Rejected(RejectReason(refused.error_code()));
    EnqueueEnd(m.session(), refused);
  }
  if (!acks.empty()) {
    // Last in the batch: after every other reply of this message.
    context.delivery->Deliver(
        core::Effects{}, [call = weak_from_this(), acks = std::move(acks)](absl::Status s) {
          if (!s.ok()) return;
          if (std::shared_ptr<RelayCall> c = call.lock()) c->EnqueueAcks(acks);
        });
  }
  return grpc::Status::OK;
}

void RelayCall::EnqueueShared(const v1::CoordinatorMessage& message,
                              const std::vector<uint64_t>& sessions) {
  v1::RelayDown down;
  v1::RelayedReply* reply = nullptr;
  absl::MutexLock lock(&sessions_mu_);  // Held across Enqueue: nothing after a session's end.
  if (ended_) return;
  for (uint64_t session : sessions) {
    if (sessions_.count(session) == 0) continue;
    if (reply == nullptr) {
      reply = down.add_replies();
      reply->set_session(session);
      *reply->mutable_message() = message;
    } else {
      reply->add_also_sessions(session);
    }
  }
  if (reply != nullptr) Enqueue(std::move(down));
}

void RelayCall::EnqueueAcks(const std::vector<std::pair<uint64_t, uint64_t>>& acks) {
  v1::RelayDown down;
  down.mutable_ack_sessions()->Reserve(static_cast<int>(acks.size()));
  down.mutable_ack_sequences()->Reserve(static_cast<int>(acks.size()));
  absl::MutexLock lock(&sessions_mu_);  // Held across Enqueue: nothing after a session's end.
  if (ended_) return;
  for (const auto& [session, sequence] : acks) {
    if (sessions_.count(session) == 0) continue;
    down.add_ack_sessions(session);
    down.add_ack_sequences(sequence);
  }
  if (down.ack_sessions_size() > 0) Enqueue(std::move(down));
}

void RelayCall::OnDone() {
  absl::MutexLock lock(&sessions_mu_);
  ended_ = true;
  for (auto& [id, s] : sessions_) CloseSession(s);
  sessions_.clear();
}

void RelayCall::EndSession(uint64_t session, const grpc::Status& status) {
  {
    absl::MutexLock lock(&sessions_mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    CloseSession(it->second);
    sessions_.erase(it);
    Forget(session);
  }
  EnqueueEnd(session, status);
}

void RelayCall::CloseSession(Session& s) {
  s.outbox->Close();
  s.rank->Close();
}

void RelayCall::Forget(uint64_t session) {
  gone_.insert(session);
  if (gone_.size() > kMaxGone) gone_.erase(gone_.begin());
}

void RelayCall::EnqueueEnd(uint64_t session, const grpc::Status& status) {
  v1::RelayDown down;
  v1::RelayedReply* reply = down.add_replies();
  reply->set_session(session);
  reply->set_end(true);
  reply->set_status_code(status.error_code());
  reply->set_status_message(status.error_message());
  Enqueue(std::move(down));
}

bool RelayCall::Absorb(v1::RelayDown& last, v1::RelayDown& next) {
  if (last.replies_size() >= kMaxRepliesPerBatch || last.ack_sessions_size() >= kMaxAcksPerBatch ||
      (last.ack_sessions_size() > 0 && next.replies_size() > 0)) {
    return false;
  }
  for (v1::RelayedReply& r : *next.mutable_replies()) *last.add_replies() = std::move(r);
  last.mutable_ack_sessions()->Add(next.ack_sessions().begin(), next.ack_sessions().end());
  last.mutable_ack_sequences()->Add(next.ack_sequences().begin(), next.ack_sequences().end());
  return true;
}

}  // namespace sdc::daemon
