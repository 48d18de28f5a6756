#ifndef SDC_DAEMON_STREAM_REGISTRY_H_
#define SDC_DAEMON_STREAM_REGISTRY_H_

// Live trainer streams by (job, rank): where the coordinator's messages for
// a rank go.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/types.h"
#include "daemon/outbox.h"
#include "grpcpp/grpcpp.h"
#include "trainer.pb.h"

namespace sdc::daemon {

// Thread-safe.
class StreamRegistry {
 public:
  // `outbox` replaces the rank's registered stream, if any.
  void Register(const std::string& job, core::Rank rank, std::shared_ptr<Outbox> outbox);
  // True if `outbox` was the rank's registered stream (a newer stream of
  // the rank may have replaced it).
  bool Unregister(const std::string& job, core::Rank rank, const Outbox* outbox);
  // Pushes `message` to those of `ranks` with a stream here (PushShared:
  // one reply per relay for its sessions among them); others are skipped.
  void Send(const std::string& job, const std::vector<core::Rank>& ranks,
            const v1::CoordinatorMessage& message);
  // Ends every stream with `status` once its queued messages are written
  // (at shutdown: trainers reconnect instead of holding the server open).
  void EndAll(const grpc::Status& status);
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, core::Rank>, std::shared_ptr<Outbox>> streams_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_STREAM_REGISTRY_H_
