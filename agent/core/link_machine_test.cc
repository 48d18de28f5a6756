#include "agent/core/link_machine.h"

#include <vector>

#include "gtest/gtest.h"

namespace sdc::agent::core {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

LinkTiming Timing() {
  LinkTiming t;
  t.heartbeat = absl::Seconds(30);
  t.backoff_min = absl::Seconds(1);
  t.backoff_max = absl::Seconds(8);
  t.welcome_timeout = absl::Seconds(10);
  t.stable_after = absl::Seconds(30);
  return t;
}

// Jitter factor exactly 1.0 (0.5 + 0.5).
double Half() { return 0.5; }

TEST(LinkMachineTest, ConnectsAtOnceThenHeartbeatsEveryPeriod) {
  LinkMachine m(Timing(), Half, kT0);
  EXPECT_EQ(m.phase(), LinkMachine::Phase::kBackoff);
  EXPECT_EQ(m.Poll(kT0).action, LinkMachine::Action::kConnect);
  m.OnConnecting(kT0);
  LinkMachine::Next n = m.Poll(kT0 + absl::Seconds(2));
  EXPECT_EQ(n.action, LinkMachine::Action::kNone);
  EXPECT_EQ(n.wake, kT0 + absl::Seconds(10));  // The welcome deadline.
  m.OnWelcome(kT0 + absl::Seconds(2));
  EXPECT_EQ(m.phase(), LinkMachine::Phase::kRegistered);
  n = m.Poll(kT0 + absl::Seconds(3));
  EXPECT_EQ(n.action, LinkMachine::Action::kNone);
  EXPECT_EQ(n.wake, kT0 + absl::Seconds(32));
  EXPECT_EQ(m.Poll(kT0 + absl::Seconds(32)).action, LinkMachine::Action::kSendHeartbeat);
  m.OnHeartbeatSent(kT0 + absl::Seconds(33));
  n = m.Poll(kT0 + absl::Seconds(34));
  EXPECT_EQ(n.action, LinkMachine::Action::kNone);
  EXPECT_EQ(n.wake, kT0 + absl::Seconds(63));
}

TEST(LinkMachineTest, AbandonsAnAttemptWithoutWelcome) {
  LinkMachine m(Timing(), Half, kT0);
  m.OnConnecting(kT0);
  EXPECT_EQ(m.Poll(kT0 + absl::Seconds(9)).action, LinkMachine::Action::kNone);
  EXPECT_EQ(m.Poll(kT0 + absl::Seconds(10)).action, LinkMachine::Action::kAbandon);
  m.OnStreamEnded(kT0 + absl::Seconds(10));
  EXPECT_EQ(m.phase(), LinkMachine::Phase::kBackoff);
  EXPECT_EQ(m.next_attempt(), kT0 + absl::Seconds(11));
}

TEST(LinkMachineTest, BackoffDoublesUpToTheCapAndResetsAfterAStableSession) {
  LinkMachine m(Timing(), Half, kT0);
  absl::Time now = kT0;
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 6; ++i) {
    m.OnConnecting(now);
    m.OnStreamEnded(now);  // Refused at once.
    waits.push_back(m.next_attempt() - now);
    now = m.next_attempt();
  }
  EXPECT_EQ(waits, (std::vector<absl::Duration>{absl::Seconds(1), absl::Seconds(2),
                                                absl::Seconds(4), absl::Seconds(8),
                                                absl::Seconds(8), absl::Seconds(8)}));
  EXPECT_EQ(m.consecutive_failures(), 6);
  // A session that ends before stable_after does not reset the backoff ...
  m.OnConnecting(now);
  m.OnWelcome(now);
  m.OnStreamEnded(now + absl::Seconds(29));
  EXPECT_EQ(m.next_attempt() - (now + absl::Seconds(29)), absl::Seconds(8));
  EXPECT_EQ(m.consecutive_failures(), 7);
  // ... one that lasted does.
  now = m.next_attempt();
  m.OnConnecting(now);
  m.OnWelcome(now);
  m.OnStreamEnded(now + absl::Seconds(30));
  EXPECT_EQ(m.next_attempt() - (now + absl::Seconds(30)), absl::Seconds(1));
  EXPECT_EQ(m.consecutive_failures(), 0);
  EXPECT_EQ(m.backoff(), absl::Seconds(2));
}

TEST(LinkMachineTest, JitterSpansHalfToOneAndAHalfTimesTheBackoff) {
  for (const auto& [u, want] : std::vector<std::pair<double, absl::Duration>>{
           {0.0, absl::Milliseconds(500)}, {0.25, absl::Milliseconds(750)},
           {0.999, absl::Microseconds(1'499'000)}}) {
    LinkMachine m(Timing(), [u = u] { return u; }, kT0);
    m.OnConnecting(kT0);
    m.OnStreamEnded(kT0);
    EXPECT_EQ(m.next_attempt() - kT0, want) << u;
  }
}

}  // namespace
}  // namespace sdc::agent::core
