#include "daemon/outbox.h"

namespace sdc::daemon {

void SharedPush::Add(std::shared_ptr<SharedReplies> stream, uint64_t session) {
  auto [it, fresh] = index_.try_emplace(stream.get(), streams_.size());
  if (fresh) streams_.emplace_back(std::move(stream), std::vector<uint64_t>());
  streams_[it->second].second.push_back(session);
}

void SharedPush::Send(const v1::CoordinatorMessage& message) {
  for (const auto& [stream, sessions] : streams_) stream->EnqueueShared(message, sessions);
}

}  // namespace sdc::daemon
