#include "agent/relay.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/log.h"
#include "agent/weight_elision.h"
#include "common/ack.h"
#include "common/stream.h"

namespace sdc::agent {

namespace {

// What one RelayUp carries at most: sdcd accepts 4,096 messages and 16 MiB.
constexpr size_t kMaxBatch = 1024;
constexpr size_t kMaxBatchBytes = 4 << 20;
// MayCheckpoint without a deadline of its own gets this one.
constexpr absl::Duration kCheckpointDeadline = absl::Seconds(30);

}  // namespace

// ---------------------------------------------------------------------------
// One rank's Attach stream, relayed.

class TrainerRelay::Session
    : public common::QueuedStream<v1::TrainerMessage, v1::CoordinatorMessage> {
 public:
  explicit Session(TrainerRelay* relay);

  void OnMalformed(grpc::Status status) override {
    relay_->Close(id_);
    RequestFinish(std::move(status));
  }

  void OnRead(bool ok) override {
    if (!ok) {  // The rank closed its side, or its call broke.
      relay_->Close(id_);
      RequestFinish(grpc::Status::OK);
      return;
    }
    std::string why;
    switch (relay_->Forward(id_, &in_, &why)) {
      case Forwarded::kQueued:
        StartRead(&in_);
        return;
      case Forwarded::kEnding:
        // Whoever ended the session (sdcd's refusal, the stream to sdcd
        // ending, shutdown) finishes it with its own status: read no more.
        return;
      case Forwarded::kRefused:
        RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE, why));
        return;
    }
  }

  void OnDone() override;

 private:
  bool Absorb(v1::CoordinatorMessage& last, v1::CoordinatorMessage& next) override {
    return common::FoldAck(last, next);
  }

  TrainerRelay* const relay_;
  std::shared_ptr<SessionHandle> handle_;
  uint64_t id_ = 0;
  v1::TrainerMessage in_;  // The read path only.
};

// What the relay keeps of a session: pushes after the stream ended are
// dropped (daemon/stream.h).
class TrainerRelay::SessionHandle : public common::StreamHandle<Session> {
 public:
  using StreamHandle::StreamHandle;
  void Push(v1::CoordinatorMessage m) {
    WithReactor([&](Session* s) { s->Enqueue(std::move(m)); });
  }
  void End(grpc::Status status) {
    WithReactor([&](Session* s) { s->RequestFinish(std::move(status)); });
  }
};

TrainerRelay::Session::Session(TrainerRelay* relay)
    : relay_(relay), handle_(std::make_shared<SessionHandle>(this)) {
  id_ = relay_->Open(handle_);
  if (id_ == 0) {
    RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "sdc-agent is shutting down"));
    return;
  }
  StartRead(&in_);
}

void TrainerRelay::Session::OnDone() {
  relay_->Close(id_);
  if (handle_->Close()) delete this;
}

// ---------------------------------------------------------------------------
// The stream to sdcd: a writer thread sends what waits as one RelayUp, a
// reader thread hands replies to their sessions.

class TrainerRelay::Upstream {
 public:
  // Returns at once: the call starts (and may wait for a connection) on the
  // upstream's own thread, so no caller waits for sdcd.
  Upstream(TrainerRelay* relay, v1::TrainerService::Stub* stub, const std::string& bearer)
      : relay_(relay) {
    if (!bearer.empty()) context_.AddMetadata("authorization", absl::StrCat("Bearer ", bearer));
    thread_ = std::thread([this, stub] { Run(stub); });
  }

  ~Upstream() {
    Stop();
    thread_.join();
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    context_.TryCancel();  // Also before the call started: it starts cancelled.
  }

  // False (and *why) when the stream is over, or too much already waits.
  bool Send(v1::RelayedMessage m, std::string* why) {
    size_t bytes = m.ByteSizeLong();
    absl::MutexLock lock(&mu_);
    if (broken_ || stopping_) {
      *why = "sdc-agent's stream to sdcd ended";
      return false;
    }
    if (!m.end() && (waiting_.size() >= kMaxWaiting || waiting_bytes_ + bytes > kMaxWaitingBytes)) {
      *why = absl::StrCat("sdcd is not keeping up: ", waiting_.size(), " messages (",
                          waiting_bytes_ >> 20, " MiB) wait for it in sdc-agent");
      return false;
    }
    // In the order of the stream, and only for what is sent.
    if (m.end()) {
      elision_.End(m.session());
    } else if (elision_.Apply(m.session(), m.mutable_message())) {
      bytes = m.ByteSizeLong();
    }
    waiting_bytes_ += bytes;
    waiting_.push_back(std::move(m));
    return true;
  }

 private:
  void Run(v1::TrainerService::Stub* stub) {
    stream_ = stub->Relay(&context_);
    std::thread writer([this] { WriteLoop(); });
    v1::RelayDown down;
    while (stream_->Read(&down)) {
      for (const v1::RelayedReply& r : down.replies()) relay_->Deliver(this, r);
      if (down.ack_sessions_size() > 0) relay_->DeliverAcks(this, down);
    }
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    writer.join();  // Its Write fails now that the call is over.
    const grpc::Status status = stream_->Finish();
    relay_->Lost(this, status);
  }

  void WriteLoop() {
    while (true) {
      v1::RelayUp up;
      up.set_compact_replies(true);  // Packed acknowledgements, shared verdicts.
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stopping_ || broken_ || !waiting_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_ || broken_) return;
        size_t bytes = 0;
        while (!waiting_.empty() && static_cast<size_t>(up.messages_size()) < kMaxBatch) {
          const size_t next = waiting_.front().ByteSizeLong();
          if (bytes > 0 && bytes + next > kMaxBatchBytes) break;
          bytes += next;
          *up.add_messages() = std::move(waiting_.front());
          waiting_.pop_front();
        }
        waiting_bytes_ -= bytes;
      }
      if (!stream_->Write(up)) {
        absl::MutexLock lock(&mu_);
        broken_ = true;
        return;
      }
    }
  }

  TrainerRelay* const relay_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RelayUp, v1::RelayDown>> stream_;  // Run's.
  std::thread thread_;
  absl::Mutex mu_;
  std::deque<v1::RelayedMessage> waiting_ ABSL_GUARDED_BY(mu_);
  size_t waiting_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  WeightElision elision_ ABSL_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------

TrainerRelay::TrainerRelay(std::shared_ptr<grpc::Channel> coordinator, std::string node,
                           std::function<std::string()> bearer)
    : channel_(std::move(coordinator)),
      stub_(v1::TrainerService::NewStub(channel_)),
      node_(std::move(node)),
      bearer_(std::move(bearer)) {}

TrainerRelay::~TrainerRelay() { Shutdown(); }

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TrainerRelay::Attach(
    grpc::CallbackServerContext* context) {
  return new Session(this);
}

grpc::ServerUnaryReactor* TrainerRelay::MayCheckpoint(grpc::CallbackServerContext* context,
                                                      const v1::CheckpointRequest* request,
                                                      v1::CheckpointDecision* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto* call = new grpc::ClientContext;
  const absl::Time ceiling = absl::Now() + kCheckpointDeadline;
  const absl::Time asked = absl::FromChrono(context->deadline());
  call->set_deadline(absl::ToChronoTime(std::min(asked, ceiling)));
  stub_->async()->MayCheckpoint(call, request, response, [reactor, call](grpc::Status s) {
    reactor->Finish(s);
    delete call;
  });
  return reactor;
}

uint64_t TrainerRelay::Open(std::shared_ptr<SessionHandle> handle) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return 0;
  const uint64_t id = next_session_++;
  sessions_.emplace(id, std::move(handle));
  return id;
}

TrainerRelay::Forwarded TrainerRelay::Forward(uint64_t session, v1::TrainerMessage* message,
                                               std::string* why) {
  v1::RelayedMessage m;
  m.set_session(session);
  m.mutable_message()->Swap(message);  // The next read refills it.
  if (m.message().has_hello()) {
    v1::RankPlacement* placement = m.mutable_message()->mutable_hello()->mutable_placement();
    if (placement->node_name() != node_) {
      Log(absl::StrCat("relay: rank ", placement->rank(), " of job ",
                       m.message().hello().job_id().substr(0, 128), " says node '",
                       placement->node_name().substr(0, 253), "'; it runs on ", node_,
                       ", which is what sdcd is told"));
      placement->set_node_name(node_);
    }
  }
  // The token is read (a file) outside the lock, for a new stream to sdcd.
  bool opening;
  {
    absl::MutexLock lock(&mu_);
    opening = upstream_ == nullptr;
  }
  const std::string bearer = opening && bearer_ ? bearer_() : "";
  absl::MutexLock lock(&mu_);
  if (shut_down_ || sessions_.count(session) == 0) return Forwarded::kEnding;
  if (upstream_ == nullptr) {
    upstream_ = std::make_unique<Upstream>(this, stub_.get(), bearer);
    Log("relay: opening a stream to sdcd");
  }
  if (upstream_->Send(std::move(m), why)) return Forwarded::kQueued;
  // Too much waits (a broken stream's Lost is on its way and ends the
  // session itself): this session ends here, and sdcd is told.
  sessions_.erase(session);
  SendEnd(session);
  return Forwarded::kRefused;
}

void TrainerRelay::Close(uint64_t session) {
  absl::MutexLock lock(&mu_);
  if (sessions_.erase(session) == 0 || upstream_ == nullptr) return;
  SendEnd(session);
}

void TrainerRelay::SendEnd(uint64_t session) {
  v1::RelayedMessage end;
  end.set_session(session);
  end.set_end(true);
  std::string ignored;
  // Lost only with the stream itself, and sdcd then ends the session anyway.
  upstream_->Send(std::move(end), &ignored);
}

void TrainerRelay::Deliver(Upstream* from, const v1::RelayedReply& reply) {
  std::shared_ptr<SessionHandle> handle;
  std::vector<std::shared_ptr<SessionHandle>> also;  // A reply shared with other sessions.
  {
    absl::MutexLock lock(&mu_);
    if (upstream_.get() != from) return;
    if (!reply.end()) {
      for (uint64_t session : reply.also_sessions()) {
        auto it = sessions_.find(session);
        if (it != sessions_.end()) also.push_back(it->second);
      }
    }
    auto it = sessions_.find(reply.session());
    if (it != sessions_.end()) handle = it->second;
    if (handle != nullptr && reply.end()) {
      sessions_.erase(it);
      // sdcd drops what was still on its way for the session until the
      // relay says it saw the end.
      SendEnd(reply.session());
    }
  }
  if (reply.end()) {
    if (handle != nullptr) {
      handle->End(grpc::Status(static_cast<grpc::StatusCode>(reply.status_code()),
                               reply.status_message()));
    }
    return;
  }
  if (handle != nullptr) handle->Push(reply.message());
  for (auto& h : also) h->Push(reply.message());
}

void TrainerRelay::DeliverAcks(Upstream* from, const v1::RelayDown& down) {
  if (down.ack_sessions_size() != down.ack_sequences_size()) {
    Log(absl::StrCat("relay: sdcd sent ", down.ack_sessions_size(), " packed acknowledgements with ",
                     down.ack_sequences_size(), " sequences; ignored"));
    return;
  }
  std::vector<std::pair<std::shared_ptr<SessionHandle>, uint64_t>> acks;
  acks.reserve(down.ack_sessions_size());
  {
    absl::MutexLock lock(&mu_);
    if (upstream_.get() != from) return;
    for (int i = 0; i < down.ack_sessions_size(); ++i) {
      auto it = sessions_.find(down.ack_sessions(i));
      if (it != sessions_.end()) acks.emplace_back(it->second, down.ack_sequences(i));
    }
  }
  for (auto& [handle, sequence] : acks) {
    v1::CoordinatorMessage ack;
    ack.mutable_ack()->set_acked_sequence(sequence);
    handle->Push(std::move(ack));
  }
}

void TrainerRelay::Lost(Upstream* from, const grpc::Status& status) {
  std::map<uint64_t, std::shared_ptr<SessionHandle>> ended;
  std::vector<std::unique_ptr<Upstream>> joined;  // Earlier ones; not this thread's own.
  {
    absl::MutexLock lock(&mu_);
    if (upstream_.get() != from) return;  // Shutdown took it.
    joined.swap(retired_);
    retired_.push_back(std::move(upstream_));
    ended.swap(sessions_);
  }
  Log(absl::StrCat("relay: the stream to sdcd ended (", status.error_message(), "); ending ",
                   ended.size(), " rank streams, which reconnect"));
  for (auto& [id, handle] : ended) {
    handle->End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             absl::StrCat("sdc-agent lost its stream to sdcd: ",
                                          status.error_message())));
  }
}

void TrainerRelay::Shutdown() {
  std::map<uint64_t, std::shared_ptr<SessionHandle>> ended;
  std::unique_ptr<Upstream> upstream;
  std::vector<std::unique_ptr<Upstream>> retired;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    ended.swap(sessions_);
    upstream = std::move(upstream_);
    retired.swap(retired_);
  }
  for (auto& [id, handle] : ended) {
    handle->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "sdc-agent is shutting down"));
  }
  // Destroying them cancels and joins their threads.
}

size_t TrainerRelay::sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

uint64_t TrainerRelay::sessions_opened() const {
  absl::MutexLock lock(&mu_);
  return next_session_ - 1;
}

}  // namespace sdc::agent
