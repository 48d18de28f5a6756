// The stream engine over real gRPC on loopback, with a toy meaning: each
// report is acknowledged with its sequence, a Hello with world size N
// queues acknowledgements 1..N inside one BatchScope, and a report from
// rank 99 is refused after one more acknowledgement was queued. What is
// checked is the engine's: order, folding (Absorb), one write per batch,
// malformed frames and refusals ending the stream with their status (and
// counted), a clean close flushed, and every call released at Stop.

#include "daemon/stream_call.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics/collector.h"
#include "daemon/batch_scope.h"
#include "daemon/service_metrics.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/sdcd.h"
#include "trainer.grpc.pb.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;

using EchoService = v1::TrainerService::WithRawMethod_Attach<v1::TrainerService::Service>;

std::atomic<int> g_live_calls{0};
std::atomic<int> g_done_calls{0};

class EchoCall final : public StreamCall<v1::TrainerMessage, v1::CoordinatorMessage>,
                       public std::enable_shared_from_this<EchoCall> {
 public:
  static void Arm(EchoService* service, CallQueues* queues, ServiceMetrics* metrics,
                  grpc::ServerCompletionQueue* queue) {
    auto call = std::make_shared<EchoCall>(service, queues, metrics, queue);
    call->Begin(call);
  }

  EchoCall(EchoService* service, CallQueues* queues, ServiceMetrics* metrics,
           grpc::ServerCompletionQueue* queue)
      : StreamCall(queues, metrics, queue), service_(service) {
    ++g_live_calls;
  }
  ~EchoCall() override { --g_live_calls; }

 private:
  static v1::CoordinatorMessage Ack(uint64_t sequence) {
    v1::CoordinatorMessage m;
    m.mutable_ack()->set_acked_sequence(sequence);
    return m;
  }

  const char* Method() const override { return "attach"; }
  void Request() override {
    service_->RequestAttach(&context_, &stream_, queue_, queue_, &request_tag_);
  }
  void Rearm() override { Arm(service_, queues_, metrics_, queue_); }
  grpc::Status Handle() override {
    if (in_.has_hello()) {
      BatchScope batch;
      for (uint32_t i = 1; i <= in_.hello().world_size(); ++i) Enqueue(Ack(i));
      return grpc::Status::OK;
    }
    if (in_.report().rank() == 99) {
      Enqueue(Ack(in_.report().sequence()));
      return {grpc::StatusCode::FAILED_PRECONDITION, "rank 99 is refused"};
    }
    Enqueue(Ack(in_.report().sequence()));
    return grpc::Status::OK;
  }
  void OnDone() override { ++g_done_calls; }
  bool Absorb(v1::CoordinatorMessage& last, v1::CoordinatorMessage& next) override {
    if (!last.has_ack() || !next.has_ack()) return false;
    last.mutable_ack()->set_acked_sequence(
        std::max(last.ack().acked_sequence(), next.ack().acked_sequence()));
    return true;
  }

  EchoService* const service_;
};

v1::TrainerMessage Report(uint64_t sequence, uint32_t rank = 0) {
  v1::TrainerMessage m;
  m.mutable_report()->set_rank(rank);
  m.mutable_report()->set_sequence(sequence);
  return m;
}

class StreamCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_done_calls = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    queues_.Add(builder, 2);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    queues_.Start([this](grpc::ServerCompletionQueue* queue) {
      EchoCall::Arm(&service_, &queues_, &metrics_, queue);
    });
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::TrainerService::NewStub(channel_);
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    queues_.Stop();
    // Every call let go of itself once its last operation returned.
    EXPECT_EQ(g_live_calls.load(), 0);
  }

  void WithDeadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  // Waits (up to 10 s) for `n` calls to have ended on the server.
  bool WaitDone(int n) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (g_done_calls.load() < n && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
    return g_done_calls.load() >= n;
  }

  metrics::Collector registry_;
  ServiceMetrics metrics_{registry_};
  EchoService service_;
  CallQueues queues_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
};

TEST_F(StreamCallTest, AnswersInOrderAndFinishesOkWhenTheClientCloses) {
  grpc::ClientContext context;
  WithDeadline(&context);
  auto stream = stub_->Attach(&context);
  v1::CoordinatorMessage reply;
  for (uint64_t sequence = 1; sequence <= 3; ++sequence) {
    ASSERT_TRUE(stream->Write(Report(sequence)));
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.ack().acked_sequence(), sequence);
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&reply));
  grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(WaitDone(1));
}

TEST_F(StreamCallTest, WhatOneBatchQueuesLeavesInOneWriteFoldedByAbsorb) {
  grpc::ClientContext context;
  WithDeadline(&context);
  auto stream = stub_->Attach(&context);
  v1::TrainerMessage hello;
  hello.mutable_hello()->set_world_size(3);
  ASSERT_TRUE(stream->Write(hello));
  v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.ack().acked_sequence(), 3u);  // Not 1: acks 2 and 3 were folded in.
  ASSERT_TRUE(stream->Write(Report(10)));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.ack().acked_sequence(), 10u);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(StreamCallTest, ARefusalEndsTheStreamWithItsStatusAfterWhatWasQueued) {
  grpc::ClientContext context;
  WithDeadline(&context);
  auto stream = stub_->Attach(&context);
  v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Write(Report(1)));
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(stream->Write(Report(5, /*rank=*/99)));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.ack().acked_sequence(), 5u);
  EXPECT_FALSE(stream->Read(&reply));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "rank 99 is refused");
  EXPECT_THAT(registry_.Serialize(),
              HasSubstr("sdc_rejected_inputs_total{reason=\"failed_precondition\"} 1\n"));
}

TEST_F(StreamCallTest, AMalformedFrameEndsTheStreamInvalidArgumentAndIsCounted) {
  grpc::Status status =
      testing::SendRawFrame(channel_, "/sdc.v1.TrainerService/Attach", "\xff\xff\xff\xff");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("malformed message: not a sdc.v1.TrainerMessage"));
  const std::string text = registry_.Serialize();
  EXPECT_THAT(text, HasSubstr("sdc_malformed_messages_total{method=\"attach\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("sdc_rejected_inputs_total{reason=\"invalid_argument\"} 1\n"));
}

TEST_F(StreamCallTest, AStreamStillOpenAtShutdownIsReleased) {
  grpc::ClientContext context;
  WithDeadline(&context);
  auto stream = stub_->Attach(&context);
  v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Write(Report(1)));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_GE(g_live_calls.load(), 2);  // This stream's call and the ones waiting.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  queues_.Stop();
  EXPECT_EQ(g_live_calls.load(), 0);
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_FALSE(stream->Finish().ok());
}

}  // namespace
}  // namespace sdc::daemon
