// Delivery against a store whose durability the test decides: nothing is
// sent, counted or logged before the store says durable; a failed commit
// sends nothing; a Batch waits for one callback at its highest ticket.

#include "daemon/delivery.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics/collector.h"
#include "daemon/core/store.h"
#include "daemon/outbox.h"
#include "daemon/service_metrics.h"
#include "daemon/stream_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A store whose commits happen when the test calls Commit.
class ManualStore : public core::Store {
 public:
  absl::StatusOr<core::Snapshot> Load() override { return core::Snapshot{}; }
  absl::StatusOr<uint64_t> Apply(core::Mutation) override { return ++tickets_; }
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  void NotifyDurable(uint64_t ticket, std::function<void(absl::Status)> done) override {
    waiting.emplace_back(ticket, std::move(done));
  }
  // Runs every waiting callback with `status`.
  void Commit(absl::Status status = absl::OkStatus()) {
    auto due = std::move(waiting);
    waiting.clear();
    for (auto& [ticket, done] : due) done(status);
  }
  std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> waiting;

 private:
  uint64_t tickets_ = 0;
};

class RecordingOutbox : public Outbox {
 public:
  void Push(v1::CoordinatorMessage message) override { pushed.push_back(std::move(message)); }
  void End(grpc::Status) override {}
  std::vector<v1::CoordinatorMessage> pushed;
};

core::OutMessage WeightVerdictFor(std::vector<core::Rank> ranks, core::Step step) {
  core::WeightVerdictMessage verdict;
  verdict.step = step;
  return core::OutMessage{"job", std::move(ranks), verdict};
}

class DeliveryTest : public ::testing::Test {
 protected:
  DeliveryTest() {
    streams_.Register("job", 0, r0_);
    streams_.Register("job", 1, r1_);
  }

  core::Effects Decided(uint64_t ticket, core::Step step) {
    core::Effects e;
    e.ticket = ticket;
    e.messages.push_back(WeightVerdictFor({0, 1}, step));
    e.checks.push_back({core::CheckKind::kWeights, "minority", absl::Milliseconds(20)});
    return e;
  }

  std::string Checks() {
    return registry_.Serialize();
  }

  ManualStore store_;
  StreamRegistry streams_;
  metrics::Collector registry_;
  ServiceMetrics metrics_{registry_};
  std::vector<core::Effects> logged_;
  Delivery delivery_{&store_, &streams_, &metrics_,
                     [this](const core::Effects& e) { logged_.push_back(e); }};
  std::shared_ptr<RecordingOutbox> r0_ = std::make_shared<RecordingOutbox>();
  std::shared_ptr<RecordingOutbox> r1_ = std::make_shared<RecordingOutbox>();
};

constexpr char kMinority[] = "sdc_checks_total{check=\"weights\",result=\"minority\"} 1\n";

TEST_F(DeliveryTest, NothingGoesOutBeforeTheStoreSaysDurable) {
  std::vector<absl::Status> then;
  delivery_.Deliver(Decided(4, 30), [&](absl::Status s) { then.push_back(s); });
  ASSERT_EQ(store_.waiting.size(), 1u);
  EXPECT_EQ(store_.waiting[0].first, 4u);
  EXPECT_TRUE(r0_->pushed.empty());
  EXPECT_TRUE(then.empty());
  EXPECT_TRUE(logged_.empty());
  EXPECT_THAT(Checks(), Not(HasSubstr(kMinority)));

  store_.Commit();
  ASSERT_EQ(r0_->pushed.size(), 1u);
  ASSERT_EQ(r1_->pushed.size(), 1u);
  EXPECT_EQ(r1_->pushed[0].weight_verdict().step(), 30u);
  ASSERT_EQ(then.size(), 1u);
  EXPECT_TRUE(then[0].ok());
  EXPECT_EQ(logged_.size(), 1u);
  EXPECT_THAT(Checks(), HasSubstr(kMinority));
}

TEST_F(DeliveryTest, AFailedCommitSendsNothingAndTellsThen) {
  std::vector<absl::Status> then;
  delivery_.Deliver(Decided(4, 30), [&](absl::Status s) { then.push_back(s); });
  store_.Commit(absl::UnavailableError("disk full"));
  EXPECT_TRUE(r0_->pushed.empty());
  EXPECT_TRUE(logged_.empty());
  EXPECT_THAT(Checks(), Not(HasSubstr(kMinority)));
  ASSERT_EQ(then.size(), 1u);
  EXPECT_EQ(then[0].code(), absl::StatusCode::kUnavailable);
}

TEST_F(DeliveryTest, EffectsWithoutATicketGoAtOnceAndBareTicketsWaitForNothing) {
  bool done = false;
  delivery_.Deliver(Decided(0, 5), [&](absl::Status s) { done = s.ok(); });
  EXPECT_TRUE(done);
  EXPECT_EQ(r0_->pushed.size(), 1u);
  core::Effects bare;
  bare.ticket = 9;  // A report's effects: nothing to send, nobody waiting.
  delivery_.Deliver(std::move(bare));
  EXPECT_TRUE(store_.waiting.empty());
}

TEST_F(DeliveryTest, ABatchWaitsForOneCallbackAtItsHighestTicketAndKeepsTheOrder) {
  std::vector<int> order;
  {
    Delivery::Batch batch(&delivery_);
    delivery_.Deliver(Decided(3, 1), [&](absl::Status) { order.push_back(1); });
    core::Effects bare;
    bare.ticket = 9;
    delivery_.Deliver(std::move(bare));
    delivery_.Deliver(Decided(5, 2), [&](absl::Status) { order.push_back(2); });
    EXPECT_TRUE(store_.waiting.empty());  // Not before the batch closes.
  }
  ASSERT_EQ(store_.waiting.size(), 1u);
  EXPECT_EQ(store_.waiting[0].first, 9u);
  EXPECT_TRUE(r0_->pushed.empty());
  store_.Commit();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  ASSERT_EQ(r0_->pushed.size(), 2u);
  EXPECT_EQ(r0_->pushed[0].weight_verdict().step(), 1u);
  EXPECT_EQ(r0_->pushed[1].weight_verdict().step(), 2u);
  EXPECT_EQ(logged_.size(), 2u);
}

TEST_F(DeliveryTest, ABatchOfAnotherDeliveryDoesNotHoldThisOnesEffects) {
  ManualStore other_store;
  Delivery other(&other_store, &streams_, &metrics_);
  {
    Delivery::Batch batch(&other);
    delivery_.Deliver(Decided(2, 8));
    EXPECT_EQ(store_.waiting.size(), 1u);
  }
  EXPECT_TRUE(other_store.waiting.empty());
}

}  // namespace
}  // namespace sdc::daemon
