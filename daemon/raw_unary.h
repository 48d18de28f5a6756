#ifndef SDC_DAEMON_RAW_UNARY_H_
#define SDC_DAEMON_RAW_UNARY_H_

// A unary method registered raw (grpc::ByteBuffer in and out) parses its own
// request: gRPC's typed unary methods answer a request that does not parse
// with INTERNAL, and parse before the handler runs (an admin call must
// authenticate first, admin_auth.h). A raw one answers INVALID_ARGUMENT,
// as the streams do.

#include <utility>

#include "daemon/service_metrics.h"
#include "grpcpp/grpcpp.h"

namespace sdc::daemon {

// The reactor of a raw unary call: Reply serializes the response (when the
// status is OK) into the call's response buffer and finishes the call. It
// deletes itself when the call is done. Reply once, from any thread.
template <typename Response>
class RawUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit RawUnaryReactor(grpc::ByteBuffer* out) : out_(out) {}
  Response* response() { return &response_; }
  void Reply(grpc::Status status) {
    if (status.ok()) {
      bool own_buffer = false;
      status = grpc::SerializationTraits<Response>::Serialize(response_, out_, &own_buffer);
    }
    Finish(std::move(status));
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer* const out_;
  Response response_;
};

// Parses raw request bytes `in` as Request: false (after answering
// INVALID_ARGUMENT on `reactor` and counting the refusal) if they are not
// one.
template <typename Request, typename Response>
bool ParseRequest(ServiceMetrics* metrics, const grpc::ByteBuffer* in, Request* request,
                  RawUnaryReactor<Response>* reactor) {
  grpc::ByteBuffer bytes(*in);  // Deserialize consumes its buffer.
  if (grpc::SerializationTraits<Request>::Deserialize(&bytes, request).ok()) return true;
  metrics->Rejected("invalid_argument");
  reactor->Reply({grpc::StatusCode::INVALID_ARGUMENT,
                  "the request is not a valid " + Request::descriptor()->full_name()});
  return false;
}

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_RAW_UNARY_H_
