#include "daemon/stream_registry.h"

namespace sdc::daemon {

void StreamRegistry::Register(const std::string& job, core::Rank rank,
                              std::shared_ptr<Outbox> outbox) {
  absl::MutexLock lock(&mu_);
  streams_[{job, rank}] = std::move(outbox);
}

bool StreamRegistry::Unregister(const std::string& job, core::Rank rank, const Outbox* outbox) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find({job, rank});
  if (it == streams_.end() || it->second.get() != outbox) return false;
  streams_.erase(it);
  return true;
}

void StreamRegistry::Send(const std::string& job, const std::vector<core::Rank>& ranks,
                          const v1::CoordinatorMessage& message) {
  std::vector<std::shared_ptr<Outbox>> targets;
  {
    absl::MutexLock lock(&mu_);
    for (core::Rank r : ranks) {
      auto it = streams_.find({job, r});
      if (it != streams_.end()) targets.push_back(it->second);
    }
  }
  SharedPush shared;
  for (auto& t : targets) t->PushShared(message, shared);
  shared.Send(message);
}

void StreamRegistry::EndAll(const grpc::Status& status) {
  std::vector<std::shared_ptr<Outbox>> all;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, outbox] : streams_) all.push_back(outbox);
  }
  for (auto& o : all) o->End(status);
}

size_t StreamRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

}  // namespace sdc::daemon
