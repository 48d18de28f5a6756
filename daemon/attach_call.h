#ifndef SDC_DAEMON_ATTACH_CALL_H_
#define SDC_DAEMON_ATTACH_CALL_H_

// TrainerService.Attach: one trainer rank's own stream, its conversation a
// RankSession.

#include <memory>

#include "daemon/rank_session.h"
#include "daemon/stream_call.h"
#include "trainer.pb.h"

namespace sdc::daemon {

class TrainerService;

// Lives as long as its stream (see StreamCall).
class AttachCall final : public StreamCall<v1::TrainerMessage, v1::CoordinatorMessage>,
                         public std::enable_shared_from_this<AttachCall> {
 public:
  // Waits for the next Attach on `queue`.
  static void Arm(TrainerService* service, grpc::ServerCompletionQueue* queue);

  AttachCall(TrainerService* service, grpc::ServerCompletionQueue* queue);

 private:
  class AttachOutbox;

  const char* Method() const override { return "attach"; }
  void Request() override;
  void Rearm() override { Arm(service_, queue_); }
  // The first message learns who carries the stream (its certificate).
  grpc::Status Handle() override;
  void OnDone() override { session_->Close(); }
  // Acknowledgements are watermarks: one waiting absorbs the next.
  bool Absorb(v1::CoordinatorMessage& last, v1::CoordinatorMessage& next) override;

  TrainerService* const service_;
  std::unique_ptr<RankSession> session_;
  bool identified_ = false;  // The read path only.
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_ATTACH_CALL_H_
