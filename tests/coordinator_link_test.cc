// The client's link to a real sdcd over loopback: when reports travel.
// A clean step's report waits (options.report_linger) for company; any other
// report, a Flush, or the wait running out sends everything waiting. An
// acknowledgement is the observable: sdcd acknowledges a report once it is
// durable, so one that was never written stays unacknowledged. And what the
// link does while sdcd is away (issue 37): it holds reports within a stated
// bound, drops the least useful first and never an incident's evidence,
// says so, and delivers the rest when sdcd is back.

#include <memory>
#include <string>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_link.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::HasSubstr;
using client::CoordinatorLink;

protocol::StepReport Clean() { return protocol::StepReport{}; }

uint64_t Dropped(const CoordinatorLink::Stats& s, CoordinatorLink::Kind kind,
                 CoordinatorLink::Drop reason) {
  return s.dropped_by[static_cast<int>(kind)][static_cast<int>(reason)];
}

// A loopback port nothing listens on (sdcd starts there later).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

class CoordinatorLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir("link");
    absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir_);
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
  }

  // A started link for rank 0 of a one-rank job, connected (Welcome in).
  std::unique_ptr<client::CoordinatorLink> Link(const std::string& job, absl::Duration linger,
                                                absl::Duration reconnect_max = absl::Seconds(10)) {
    client::GuardOptions o;
    o.coordinator = sdcd_->trainer_address();
    o.job_id = job;
    o.report_linger = linger;
    o.reconnect_max = reconnect_max;
    auto link = std::make_unique<client::CoordinatorLink>(
        o, TestHello(job, 0, /*world=*/1, /*gpus_per_node=*/1, {"w"}));
    link->Start();
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!link->stats().connected && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_TRUE(link->stats().connected) << link->stats().last_error;
    return link;
  }

  // Waits until `sequence` is acknowledged; false after 10 s.
  static bool WaitAcked(client::CoordinatorLink& link, uint64_t sequence) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (link.stats().acked < sequence && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return link.stats().acked >= sequence;
  }

  std::string dir_;
  std::unique_ptr<Sdcd> sdcd_;
};

TEST_F(CoordinatorLinkTest, CleanStepReportsWaitForTheNextThatCannot) {
  std::unique_ptr<client::CoordinatorLink> link = Link("job-wait", absl::Seconds(60));
  for (protocol::Step s = 1; s <= 3; ++s) link->Send(s, Clean());
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(link->stats().acked, 0u) << "clean step reports went before the linger ran out";
  // A step whose verdict never came: it goes at once, and the three with it.
  protocol::StepReport unverified;
  unverified.audit_unverified = true;
  EXPECT_EQ(link->Send(4, unverified), 4u) << "the fourth report queued";
  EXPECT_TRUE(WaitAcked(*link, 4));
  // A skipped step cannot wait either.
  link->Send(5, Clean());
  protocol::StepReport skipped;
  skipped.applied = false;
  skipped.skip_reason = "local NaN/Inf";
  link->Send(6, skipped);
  EXPECT_TRUE(WaitAcked(*link, 6));
  // Flush sends what waits.
  link->Send(7, Clean());
  EXPECT_TRUE(link->Flush(absl::Seconds(10)));
  EXPECT_EQ(link->stats().acked, 7u);
  EXPECT_EQ(link->stats().dropped, 0u);
}

TEST_F(CoordinatorLinkTest, AWaitingReportGoesWhenItsLingerRunsOut) {
  std::unique_ptr<client::CoordinatorLink> link = Link("job-linger", absl::Seconds(2));
  const absl::Time sent = absl::Now();
  link->Send(1, Clean());
  ASSERT_TRUE(WaitAcked(*link, 1));
  EXPECT_GE(absl::Now() - sent, absl::Seconds(2));
}

TEST_F(CoordinatorLinkTest, NoLingerSendsEachReportAtOnce) {
  std::unique_ptr<client::CoordinatorLink> link = Link("job-now", absl::ZeroDuration());
  const absl::Time sent = absl::Now();
  link->Send(1, Clean());
  ASSERT_TRUE(WaitAcked(*link, 1));
  // Well under a second: nothing waited (sdcd commits with one fsync).
  EXPECT_LT(absl::Now() - sent, absl::Seconds(1));
}

// Issue 27, item 8: reports not acknowledged when the link stops are lost
// with the process; they were neither counted nor said (dropped stayed 0).
TEST_F(CoordinatorLinkTest, ReportsUnacknowledgedAtStopAreCountedAsDropped) {
  std::unique_ptr<client::CoordinatorLink> link = Link("job-lost", absl::ZeroDuration());
  link->Send(1, Clean());
  ASSERT_TRUE(WaitAcked(*link, 1));
  sdcd_->process().Kill();
  link->Send(2, Clean());
  link->Send(3, Clean());
  link->Stop(absl::Milliseconds(500));
  EXPECT_EQ(link->stats().acked, 1u);
  EXPECT_EQ(link->stats().dropped, 2u);
}

// Issue 27, item 8: a coordinator back within the exit flush gets every
// report, however long the reconnect backoff grew while it was away (6 s
// down: attempts at 0.1, 0.2, 0.4, 0.8, 1.6, 3.2 s... with jitter, so the
// next one fell after a 3 s flush).
TEST_F(CoordinatorLinkTest, TheExitFlushRetriesUntilItsDeadlineWhateverTheBackoff) {
  std::unique_ptr<client::CoordinatorLink> link =
      Link("job-back", absl::ZeroDuration(), /*reconnect_max=*/absl::Seconds(30));
  link->Send(1, Clean());
  ASSERT_TRUE(WaitAcked(*link, 1));
  const int trainer = sdcd_->trainer_port(), admin = sdcd_->admin_port(),
            metrics = sdcd_->metrics_port();
  sdcd_->process().Kill();
  for (protocol::Step s = 2; s <= 4; ++s) link->Send(s, Clean());
  absl::SleepFor(absl::Seconds(6));
  absl::StatusOr<std::unique_ptr<Sdcd>> back =
      Sdcd::Start(dir_, {}, {}, trainer, admin, metrics);  // The same database.
  ASSERT_TRUE(back.ok()) << back.status();
  sdcd_ = *std::move(back);
  const absl::Time stop = absl::Now();
  link->Stop(absl::Seconds(3));
  EXPECT_EQ(link->stats().acked, 4u) << link->stats().last_error;
  EXPECT_EQ(link->stats().dropped, 0u);
  EXPECT_LT(absl::Now() - stop, absl::Seconds(3)) << "it should not have needed the whole flush";
}

// A report sdcd refuses (a weight report whose tensor count is not the
// layout's) is acknowledged with the refusal: counted, logged, dropped, and
// the reports behind it are taken. It used to end the stream, and the link
// sent the same report again forever (its status read as CANCELLED).
TEST_F(CoordinatorLinkTest, ARefusedReportIsCountedAndTheNextOnesGoOn) {
  std::unique_ptr<CoordinatorLink> link = Link("job-refused", absl::ZeroDuration());
  ::testing::internal::CaptureStderr();
  protocol::WeightReport wrong;
  wrong.tensors = {{8, 1, 1}, {8, 2, 2}};  // The layout has one tensor.
  link->Send(10, wrong);
  link->Send(11, Clean());
  ASSERT_TRUE(link->Flush(absl::Seconds(10))) << link->stats().last_error;
  const std::string log = ::testing::internal::GetCapturedStderr();
  const CoordinatorLink::Stats s = link->stats();
  EXPECT_EQ(s.sent, 2u);
  EXPECT_EQ(s.acked, 1u);
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(Dropped(s, CoordinatorLink::Kind::kWeights, CoordinatorLink::Drop::kRefused), 1u);
  EXPECT_TRUE(s.connected) << "the stream goes on";
  EXPECT_EQ(s.reconnects, 0u);
  EXPECT_THAT(log, HasSubstr("sdcd refused report 1 (weights, step 10): weight report from rank 0 "
                             "has 2 tensors"));
}

// sdcd is not there yet (or is gone): the link holds what it can within
// SDC_REPORT_BUFFER, dropping clean step reports first, then superseded
// weight reports, and never the evidence of a fault; says so; and delivers
// the rest, in order, once sdcd is there.
TEST(CoordinatorLinkAwayTest, WhileSdcdIsAwayTheBufferKeepsWhatMatters) {
  const std::string dir = TestDir("link-away");
  const int port = FreePort();
  client::GuardOptions o;
  o.coordinator = "127.0.0.1:" + std::to_string(port);
  o.job_id = "job-away";
  o.report_linger = absl::ZeroDuration();
  o.reconnect_max = absl::Milliseconds(500);
  o.report_buffer = 6;
  ::testing::internal::CaptureStderr();
  auto link = std::make_unique<CoordinatorLink>(o, TestHello("job-away", 0, /*world=*/1, 1, {"w"}));
  link->Start();
  protocol::WeightReport w;
  w.digest = 7;
  w.tensors = {{8, 1, 1}};
  protocol::StepReport nan;
  nan.local_nonfinite = 3;
  nan.applied = false;
  nan.skip_reason = "NaN/Inf in the local gradients of rank 0";
  link->Send(1, Clean());
  link->Send(1, w);        // Superseded by step 3's.
  link->Send(2, Clean());
  link->Send(2, nan);      // Evidence.
  link->Send(3, w);
  link->Send(3, Clean());  // Six held.
  for (protocol::Step step = 4; step <= 7; ++step) link->Send(step, Clean());  // Steps 1-4's go.
  link->Send(8, w);        // Step 5's clean report goes.
  CoordinatorLink::Stats s = link->stats();
  EXPECT_EQ(s.held, 6u);
  EXPECT_EQ(Dropped(s, CoordinatorLink::Kind::kStep, CoordinatorLink::Drop::kOverflow), 5u);
  EXPECT_EQ(Dropped(s, CoordinatorLink::Kind::kWeights, CoordinatorLink::Drop::kOverflow), 0u);
  link->Send(9, w);        // Steps 6 and 7's clean reports go.
  link->Send(10, w);
  link->Send(11, w);       // No clean step report left: step 1's weights (superseded).
  protocol::StepReport skipped;
  skipped.applied = false;
  skipped.skip_reason = "replay audit mismatch";
  link->Send(12, skipped);  // Step 3's weights.
  s = link->stats();
  EXPECT_EQ(Dropped(s, CoordinatorLink::Kind::kStep, CoordinatorLink::Drop::kOverflow), 7u);
  EXPECT_EQ(Dropped(s, CoordinatorLink::Kind::kWeights, CoordinatorLink::Drop::kOverflow), 2u);
  // Held: the two steps skipped in-band (evidence) and the weights of
  // steps 8 to 11.
  absl::SleepFor(absl::Seconds(1));
  absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir, {}, {}, port);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(link->Flush(absl::Seconds(20))) << link->stats().last_error;
  s = link->stats();
  EXPECT_EQ(s.sent, 15u);
  EXPECT_EQ(s.acked, 6u);
  EXPECT_EQ(s.acked + s.dropped, s.sent);
  EXPECT_EQ(s.held, 0u);
  link->Stop(absl::ZeroDuration());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("cannot connect to sdcd at " + o.coordinator));
  EXPECT_THAT(log, HasSubstr("back after"));
  EXPECT_THAT(log, HasSubstr("delivered the 6 reports held while it was away"));
  EXPECT_THAT(log, HasSubstr("sent 15 reports, 6 acknowledged, 9 dropped: 7 step (overflow), "
                             "2 weights (overflow)"));
}

// sdcd lost its database (a fresh one at the same address): its Welcome
// acknowledges less than it had. The reports it lacks are numbered again
// from its Welcome and delivered; none is refused for a gap.
TEST_F(CoordinatorLinkTest, ASdcdThatLostItsDatabaseGetsWhatItLacks) {
  std::unique_ptr<CoordinatorLink> link = Link("job-lost-db", absl::ZeroDuration());
  for (protocol::Step s = 1; s <= 3; ++s) link->Send(s, Clean());
  ASSERT_TRUE(link->Flush(absl::Seconds(10)));
  const int trainer = sdcd_->trainer_port();
  sdcd_->process().Kill();
  link->Send(4, Clean());
  link->Send(5, Clean());
  absl::StatusOr<std::unique_ptr<Sdcd>> fresh = Sdcd::Start(TestDir("link-fresh"), {}, {}, trainer);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  sdcd_ = *std::move(fresh);
  ASSERT_TRUE(link->Flush(absl::Seconds(20))) << link->stats().last_error;
  EXPECT_EQ(link->stats().acked, 5u);
  EXPECT_EQ(link->stats().rejected, 0u);
}

}  // namespace
}  // namespace sdc::testing
