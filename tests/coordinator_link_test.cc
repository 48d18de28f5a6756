// The client's link to a real sdcd over loopback: when reports travel.
// A clean step's report waits (options.report_linger) for company; any other
// report, a Flush, or the wait running out sends everything waiting. An
// acknowledgement is the observable: sdcd acknowledges a report once it is
// durable, so one that was never written stays unacknowledged.

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_link.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

protocol::StepReport Clean() { return protocol::StepReport{}; }

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
  EXPECT_EQ(link->Send(4, unverified), 4u);
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

}  // namespace
}  // namespace sdc::testing
