// StreamRegistry with hand-written outboxes: who gets a message, a newer
// stream replacing an older one, one shared reply per relay, EndAll.

#include "daemon/stream_registry.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/outbox.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

v1::CoordinatorMessage Verdict(uint64_t step) {
  v1::CoordinatorMessage m;
  m.mutable_weight_verdict()->set_step(step);
  return m;
}

// An Attach stream's outbox: keeps what it is given.
class RecordingOutbox : public Outbox {
 public:
  void Push(v1::CoordinatorMessage message) override { pushed.push_back(std::move(message)); }
  void End(grpc::Status status) override { ended.push_back(std::move(status)); }
  std::vector<v1::CoordinatorMessage> pushed;
  std::vector<grpc::Status> ended;
};

// A relay: keeps each shared reply with the sessions it names.
class FakeRelay : public SharedReplies {
 public:
  void EnqueueShared(const v1::CoordinatorMessage& message,
                     const std::vector<uint64_t>& sessions) override {
    replies.emplace_back(message, sessions);
  }
  std::vector<std::pair<v1::CoordinatorMessage, std::vector<uint64_t>>> replies;
};

// A relay session's outbox that takes shared replies.
class SessionOutbox : public RecordingOutbox {
 public:
  SessionOutbox(std::shared_ptr<FakeRelay> relay, uint64_t session)
      : relay_(std::move(relay)), session_(session) {}
  void PushShared(const v1::CoordinatorMessage& message, SharedPush& shared) override {
    shared.Add(relay_, session_);
  }

 private:
  std::shared_ptr<FakeRelay> relay_;
  uint64_t session_;
};

TEST(StreamRegistryTest, SendsToTheRegisteredRanksOfTheJobOnly) {
  StreamRegistry registry;
  auto r0 = std::make_shared<RecordingOutbox>();
  auto r1 = std::make_shared<RecordingOutbox>();
  auto other_job = std::make_shared<RecordingOutbox>();
  registry.Register("job", 0, r0);
  registry.Register("job", 1, r1);
  registry.Register("other", 0, other_job);
  EXPECT_EQ(registry.size(), 3u);
  registry.Send("job", {0, 2}, Verdict(7));  // Rank 2 has no stream: skipped.
  ASSERT_EQ(r0->pushed.size(), 1u);
  EXPECT_EQ(r0->pushed[0].weight_verdict().step(), 7u);
  EXPECT_TRUE(r1->pushed.empty());
  EXPECT_TRUE(other_job->pushed.empty());
}

TEST(StreamRegistryTest, ANewerStreamReplacesTheOldAndTheOldUnregistersNothing) {
  StreamRegistry registry;
  auto old_stream = std::make_shared<RecordingOutbox>();
  auto new_stream = std::make_shared<RecordingOutbox>();
  registry.Register("job", 3, old_stream);
  registry.Register("job", 3, new_stream);
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_FALSE(registry.Unregister("job", 3, old_stream.get()));
  registry.Send("job", {3}, Verdict(1));
  EXPECT_TRUE(old_stream->pushed.empty());
  EXPECT_EQ(new_stream->pushed.size(), 1u);
  EXPECT_TRUE(registry.Unregister("job", 3, new_stream.get()));
  EXPECT_EQ(registry.size(), 0u);
  EXPECT_FALSE(registry.Unregister("job", 3, new_stream.get()));
}

TEST(StreamRegistryTest, ARelaysSessionsGetOneSharedReply) {
  StreamRegistry registry;
  auto relay_a = std::make_shared<FakeRelay>();
  auto relay_b = std::make_shared<FakeRelay>();
  auto attach = std::make_shared<RecordingOutbox>();
  registry.Register("job", 0, std::make_shared<SessionOutbox>(relay_a, 10));
  registry.Register("job", 1, attach);
  registry.Register("job", 2, std::make_shared<SessionOutbox>(relay_b, 20));
  registry.Register("job", 3, std::make_shared<SessionOutbox>(relay_a, 11));
  registry.Send("job", {0, 1, 2, 3}, Verdict(9));
  ASSERT_EQ(relay_a->replies.size(), 1u);
  EXPECT_EQ(relay_a->replies[0].first.weight_verdict().step(), 9u);
  EXPECT_EQ(relay_a->replies[0].second, (std::vector<uint64_t>{10, 11}));
  ASSERT_EQ(relay_b->replies.size(), 1u);
  EXPECT_EQ(relay_b->replies[0].second, (std::vector<uint64_t>{20}));
  EXPECT_EQ(attach->pushed.size(), 1u);
}

TEST(StreamRegistryTest, EndAllEndsEveryStreamWithTheStatus) {
  StreamRegistry registry;
  auto a = std::make_shared<RecordingOutbox>();
  auto b = std::make_shared<RecordingOutbox>();
  registry.Register("job", 0, a);
  registry.Register("other", 0, b);
  registry.EndAll(grpc::Status(grpc::StatusCode::UNAVAILABLE, "sdcd is shutting down"));
  for (const auto& o : {a, b}) {
    ASSERT_EQ(o->ended.size(), 1u);
    EXPECT_EQ(o->ended[0].error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(o->ended[0].error_message(), "sdcd is shutting down");
  }
}

}  // namespace
}  // namespace sdc::daemon
