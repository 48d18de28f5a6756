// kill -9 sdcd while ranks stream reports; restart it on the same database
// and port; the ranks reconnect and resend what was not acknowledged.
// Asserts: nothing acknowledged was lost, nothing was applied twice, a
// pending replacement request is still pending.

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

const std::vector<std::string> kTensors = {"w0", "w1"};
constexpr core::Rank kWorld = 6;
constexpr core::Step kSteps = 300;
constexpr core::Step kWeightStep = 5;

// The report a rank sends with sequence `seq`: step reports for steps
// 1..kSteps, with the weight report of step 5 right after step 5's report.
// Rank 2's weights differ (one replacement request).
decltype(core::Report::body) ReportFor(core::Rank rank, uint64_t seq, core::Step* step) {
  if (seq == kWeightStep + 1) {
    *step = kWeightStep;
    core::WeightReport w;
    w.tensors = {{8, 1, 1}, {8, 2, rank == 2 ? 3u : 2u}};
    w.digest = rank == 2 ? 2 : 1;
    return w;
  }
  *step = seq <= kWeightStep ? seq : seq - 1;
  return core::StepReport{0, 0, 1.0, 5, true, "", false};
}

uint64_t LastSequence() { return kSteps + 1; }

TEST(SdcdDurabilityTest, KillNineLosesNothingAcknowledgedAndAppliesNothingTwice) {
  const std::string dir = TestDir("durability");
  absl::StatusOr<std::unique_ptr<Sdcd>> first = Sdcd::Start(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->trainer_port();
  absl::StatusOr<testing::Ranks> connected =
      testing::ConnectRanks((*first)->trainer_address(), "job-d", kWorld, 2, kTensors);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::vector<std::unique_ptr<ScriptedRank>> ranks = *std::move(connected);
  // Stream the first 150 sequences of every rank without waiting, then
  // wait for the weight vote's request, then crash the daemon mid-stream.
  auto send = [&](core::Rank r, uint64_t seq) {
    core::Step step = 0;
    auto body = ReportFor(r, seq, &step);
    ranks[r]->set_next_sequence(seq);
    ranks[r]->Send(step, body);
  };
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    for (core::Rank r = 0; r < kWorld; ++r) send(r, seq);
  }
  for (core::Rank r = 0; r < kWorld; ++r) ASSERT_TRUE(ranks[r]->WaitAcked(10).ok());
  auto admin = (*first)->Admin();
  v1::ListRequestsResponse before;
  ASSERT_TRUE(admin->ListRequests((*first)->AdminContext().get(), {}, &before).ok());
  ASSERT_EQ(before.requests_size(), 1);
  EXPECT_EQ(before.requests(0).state(), v1::PENDING);
  for (uint64_t seq = 11; seq <= 150; ++seq) {
    for (core::Rank r = 0; r < kWorld; ++r) send(r, seq);
  }
  (*first)->process().Kill();
  std::vector<uint64_t> acked_before_crash;
  for (auto& r : ranks) {
    r->WaitFinished();
    acked_before_crash.push_back(r->acked());
  }

  // Restart on the same database and port.
  absl::StatusOr<std::unique_ptr<Sdcd>> second = Sdcd::Start(dir, {}, {}, port);
  ASSERT_TRUE(second.ok()) << second.status();
  for (core::Rank r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(ranks[r]->Connect(absl::Seconds(20)).ok()) << r;
    // Nothing acknowledged was lost.
    EXPECT_GE(ranks[r]->welcome_acked(), acked_before_crash[r]) << "rank " << r;
  }
  // Applied once: replaying acknowledged sequences changes nothing.
  for (core::Rank r = 0; r < kWorld; ++r) {
    const uint64_t resume = ranks[r]->welcome_acked() + 1;
    for (uint64_t seq = std::max<uint64_t>(1, resume - 3); seq < resume; ++seq) send(r, seq);
    for (uint64_t seq = resume; seq <= LastSequence(); ++seq) send(r, seq);
  }
  for (core::Rank r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(ranks[r]->WaitAcked(LastSequence(), absl::Seconds(30)).ok()) << r;
  }
  auto admin2 = (*second)->Admin();
  v1::ListRanksRequest rq;
  rq.set_job_id("job-d");
  v1::ListRanksResponse rs;
  ASSERT_TRUE(admin2->ListRanks((*second)->AdminContext().get(), rq, &rs).ok());
  ASSERT_EQ(rs.ranks_size(), static_cast<int>(kWorld));
  for (const auto& r : rs.ranks()) EXPECT_EQ(r.checks_through_step(), kSteps);
  v1::ListIncidentsResponse incidents;
  ASSERT_TRUE(admin2->ListIncidents((*second)->AdminContext().get(), {}, &incidents).ok());
  ASSERT_EQ(incidents.incidents_size(), 1) << "the weight minority, recorded once";
  EXPECT_THAT(incidents.incidents(0).ranks(), ::testing::ElementsAre(2));
  v1::ListRequestsResponse after;
  ASSERT_TRUE(admin2->ListRequests((*second)->AdminContext().get(), {}, &after).ok());
  ASSERT_EQ(after.requests_size(), 1);
  EXPECT_EQ(after.requests(0).id(), before.requests(0).id());
  EXPECT_EQ(after.requests(0).state(), v1::PENDING);
}

}  // namespace
}  // namespace sdc::testing
