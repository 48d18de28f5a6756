// RankSession over a real Coordinator (an in-memory store, a fake clock):
// what a rank may say when, what it is answered, and what its stream's end
// undoes.

#include "daemon/rank_session.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/metrics/collector.h"
#include "common/version.h"
#include "daemon/convert.h"
#include "daemon/core/clock.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/store.h"
#include "daemon/delivery.h"
#include "daemon/outbox.h"
#include "daemon/service_metrics.h"
#include "daemon/stream_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;

class RecordingOutbox : public Outbox {
 public:
  void Push(v1::CoordinatorMessage message) override { pushed.push_back(std::move(message)); }
  void End(grpc::Status) override {}
  std::vector<v1::CoordinatorMessage> pushed;
};

v1::TrainerMessage HelloOf(core::Rank rank, uint32_t world = 2) {
  core::Hello h;
  h.job_id = "job-a";
  h.placement = {rank, "node-a", rank, "GPU-" + std::to_string(rank), 0};
  h.world_size = world;
  h.incarnation = 1;
  h.weight_tensors = {"w", "b"};
  h.parameter_count = 2;
  h.layout_digest = 7;
  h.audit_every = 10;
  h.weight_check_every = 10;
  v1::TrainerMessage m;
  *m.mutable_hello() = ToProto(h);
  return m;
}

v1::TrainerMessage StepReportOf(core::Rank rank, uint64_t sequence, core::Step step) {
  core::Report r;
  r.job_id = "job-a";
  r.rank = rank;
  r.incarnation = 1;
  r.sequence = sequence;
  r.step = step;
  r.body = core::StepReport{};
  v1::TrainerMessage m;
  *m.mutable_report() = ToProto(r);
  return m;
}

class RankSessionTest : public ::testing::Test {
 protected:
  std::unique_ptr<RankSession> Session(std::shared_ptr<RecordingOutbox> outbox) {
    return std::make_unique<RankSession>(context_, std::move(outbox));
  }

  core::FakeClock clock_;
  core::MemoryStore store_;
  core::Coordinator coordinator_{core::CoordinatorOptions{}, &clock_, &store_};
  metrics::Collector registry_;
  ServiceMetrics metrics_{registry_};
  StreamRegistry streams_;
  Delivery delivery_{&store_, &streams_, &metrics_};
  const TrainerContext context_{&coordinator_, &delivery_, &streams_, &metrics_};
};

TEST_F(RankSessionTest, TheFirstMessageMustBeAHello) {
  auto outbox = std::make_shared<RecordingOutbox>();
  auto session = Session(outbox);
  grpc::Status s = session->Handle(StepReportOf(0, 1, 1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "the first message of a stream must be a Hello");
  EXPECT_EQ(streams_.size(), 0u);
  EXPECT_TRUE(outbox->pushed.empty());
}

TEST_F(RankSessionTest, AHelloIsWelcomedAndRegistersTheRankOnce) {
  auto outbox = std::make_shared<RecordingOutbox>();
  auto session = Session(outbox);
  ASSERT_TRUE(session->Handle(HelloOf(0)).ok());
  EXPECT_EQ(streams_.size(), 1u);
  EXPECT_EQ(coordinator_.AttachedRanks(), 1u);
  ASSERT_EQ(outbox->pushed.size(), 1u);
  ASSERT_TRUE(outbox->pushed[0].has_welcome());
  EXPECT_EQ(outbox->pushed[0].welcome().coordinator_version(), kVersion);
  EXPECT_EQ(outbox->pushed[0].welcome().acked_sequence(), 0u);

  grpc::Status again = session->Handle(HelloOf(0));
  EXPECT_EQ(again.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(again.error_message(), "a stream says Hello only once");
  grpc::Status empty = session->Handle(v1::TrainerMessage());
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(empty.error_message(), "a message with neither a Hello nor a report");
}

TEST_F(RankSessionTest, AHelloTheCoordinatorRefusesKeepsItsCode) {
  auto session = Session(std::make_shared<RecordingOutbox>());
  grpc::Status s = session->Handle(HelloOf(5, /*world=*/2));  // Rank beyond the world.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(streams_.size(), 0u);
  EXPECT_EQ(coordinator_.AttachedRanks(), 0u);
}

TEST_F(RankSessionTest, AReportIsAcknowledgedOnceDurableOrLeftToTheCaller) {
  auto outbox = std::make_shared<RecordingOutbox>();
  auto session = Session(outbox);
  ASSERT_TRUE(session->Handle(HelloOf(0)).ok());
  ASSERT_TRUE(session->Handle(StepReportOf(0, 1, 1)).ok());
  ASSERT_EQ(outbox->pushed.size(), 2u);
  EXPECT_EQ(outbox->pushed[1].ack().acked_sequence(), 1u);
  EXPECT_THAT(registry_.Serialize(), HasSubstr("sdc_reports_total{kind=\"step\"} 1\n"));

  uint64_t acked = 0;
  ASSERT_TRUE(session->Handle(StepReportOf(0, 2, 2), &acked).ok());
  EXPECT_EQ(acked, 2u);
  EXPECT_EQ(outbox->pushed.size(), 2u);  // The caller sends this one.
}

TEST_F(RankSessionTest, AReportForAnotherRankIsRefused) {
  auto session = Session(std::make_shared<RecordingOutbox>());
  ASSERT_TRUE(session->Handle(HelloOf(0)).ok());
  grpc::Status s = session->Handle(StepReportOf(1, 1, 1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "report for job job-a rank 1 on the stream of job job-a rank 0");
}

TEST_F(RankSessionTest, CloseDetachesUnlessTheRankAttachedAgainElsewhere) {
  auto first = Session(std::make_shared<RecordingOutbox>());
  ASSERT_TRUE(first->Handle(HelloOf(0)).ok());
  first->Close();
  EXPECT_EQ(streams_.size(), 0u);
  EXPECT_EQ(coordinator_.AttachedRanks(), 0u);

  auto older = Session(std::make_shared<RecordingOutbox>());
  ASSERT_TRUE(older->Handle(HelloOf(1)).ok());
  auto newer = Session(std::make_shared<RecordingOutbox>());
  ASSERT_TRUE(newer->Handle(HelloOf(1)).ok());
  older->Close();  // Its stream ended after the rank came back on another.
  EXPECT_EQ(streams_.size(), 1u);
  EXPECT_EQ(coordinator_.AttachedRanks(), 1u);
  newer->Close();
  EXPECT_EQ(coordinator_.AttachedRanks(), 0u);
}

}  // namespace
}  // namespace sdc::daemon
