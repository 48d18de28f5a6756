// sdcd end to end over loopback: a real daemon on free ports with a fresh
// database; scripted ranks (3 nodes x 2 GPUs) speak the real gRPC API; one
// rank is faulty in a replay audit; the real sdcctl approves the replacement
// request; the EKS actuator runs a recording stand-in for kubectl.

#include <memory>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string> kTensors = {"embed.weight", "block.0.weight", "head.weight"};

class SdcdEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir("e2e");
    bin_ = dir_ + "/bin";
    testing::Run({"mkdir", "-p", bin_});
    WriteRecordingStandIn(bin_ + "/kubectl", dir_ + "/kubectl.calls",
                          "node/node-b labeled");
    absl::StatusOr<std::unique_ptr<Sdcd>> d =
        Sdcd::Start(dir_, {"--actuator=eks", "--report_deadline=30s"},
                    {{"PATH", bin_ + ":" + std::string(getenv("PATH"))}});
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
    absl::StatusOr<testing::Ranks> ranks =
        testing::ConnectRanks(sdcd_->trainer_address(), "job-e2e", 6, 2, kTensors);
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    ranks_ = *std::move(ranks);
  }

  // The scheduled audit of `step`; `faulty` gets its own batch and its
  // replays wrong.
  void RunAudit(core::Step step, std::optional<core::Rank> faulty) {
    ASSERT_TRUE(SendScheduledAudit(ranks_, step, faulty).ok());
  }

  std::string dir_, bin_;
  std::unique_ptr<Sdcd> sdcd_;
  std::vector<std::unique_ptr<ScriptedRank>> ranks_;
};

TEST_F(SdcdEndToEndTest, FaultyRankIsAttributedApprovedAndReplaced) {
  RunAudit(10, /*faulty=*/3);
  // Every rank hears the final verdict (after the interim "tie-breaks
  // pending": rank 3's two partners alone are not proof).
  for (auto& rank : ranks_) {
    absl::StatusOr<v1::CoordinatorMessage> v = rank->WaitFor([](const auto& m) {
      return m.has_audit_verdict() && m.audit_verdict().step() == 10 &&
             m.audit_verdict().outcome() != v1::TIEBREAK_PENDING;
    });
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->audit_verdict().outcome(), v1::FAULTY);
    EXPECT_THAT(v->audit_verdict().faulty_ranks(), ElementsAre(3));
  }
  // The incident and the request, through the admin API.
  auto admin = sdcd_->Admin();
  v1::ListIncidentsResponse incidents;
  ASSERT_TRUE(admin->ListIncidents(sdcd_->AdminContext().get(), {}, &incidents).ok());
  ASSERT_EQ(incidents.incidents_size(), 1);
  EXPECT_EQ(incidents.incidents(0).check(), v1::CHECK_REPLAY);
  EXPECT_THAT(incidents.incidents(0).ranks(), ElementsAre(3));
  EXPECT_THAT(incidents.incidents(0).node_names(), ElementsAre("node-b"));
  EXPECT_THAT(incidents.incidents(0).gpu_uuids(), ElementsAre("GPU-3"));
  EXPECT_TRUE(incidents.incidents(0).confirmed());
  v1::ListRequestsResponse requests;
  ASSERT_TRUE(admin->ListRequests(sdcd_->AdminContext().get(), {}, &requests).ok());
  ASSERT_EQ(requests.requests_size(), 1);
  const uint64_t id = requests.requests(0).id();
  EXPECT_EQ(requests.requests(0).node_name(), "node-b");
  EXPECT_EQ(requests.requests(0).state(), v1::PENDING);
  // Issue 27, item 6: the incident and the request were created while sdcd
  // ingested the results, not by its timer; its log says so as well.
  EXPECT_TRUE(sdcd_->process().WaitForLog("incident 1: replay check, job .* step 10, faulty",
                                          absl::Seconds(5)).ok())
      << sdcd_->process().Log();
  EXPECT_TRUE(sdcd_->process().WaitForLog("request 1 for node node-b is Pending", absl::Seconds(5))
                  .ok())
      << sdcd_->process().Log();

  // The operator approves with the real CLI.
  RunResult approve =
      sdcd_->Sdcctl({"approve", absl::StrCat(id), "--reason=confirmed by replay audit"});
  ASSERT_EQ(approve.exit_code, 0) << approve.output;
  EXPECT_THAT(approve.output, HasSubstr("wipes"));
  EXPECT_THAT(approve.output, HasSubstr(absl::StrCat("request ", id, " approved")));

  // The actuator runs and the request ends Done.
  v1::ReplacementRequest done;
  for (int i = 0; i < 100; ++i) {
    v1::GetRequestRequest q;
    q.set_id(id);
    ASSERT_TRUE(admin->GetRequest(sdcd_->AdminContext().get(), q, &done).ok());
    if (done.state() == v1::DONE || done.state() == v1::FAILED) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(done.state(), v1::DONE) << done.actuator_result();
  EXPECT_EQ(done.actuator(), "eks");
  EXPECT_EQ(ReadFile(dir_ + "/kubectl.calls"),
            "kubectl label node node-b "
            "sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement "
            "--overwrite\n");
  // Every transition, with who approved (the credential's operator: the
  // bootstrap token is root, whatever $USER says) and why.
  ASSERT_GE(done.transitions_size(), 4);
  EXPECT_EQ(done.transitions(1).to(), v1::APPROVED);
  EXPECT_EQ(done.transitions(1).actor(), "root");
  EXPECT_EQ(done.transitions(1).reason(), "confirmed by replay audit");
  EXPECT_EQ(done.transitions(2).to(), v1::EXECUTING);
  EXPECT_EQ(done.transitions(3).to(), v1::DONE);
  ASSERT_EQ(done.evidence_size(), 1);
  // describe shows the history and evidence.
  RunResult describe = sdcd_->Sdcctl({"describe", "request", absl::StrCat(id)});
  ASSERT_EQ(describe.exit_code, 0) << describe.output;
  EXPECT_THAT(describe.output, HasSubstr("confirmed by replay audit"));
  EXPECT_THAT(describe.output, HasSubstr("GPU-3"));
}

TEST_F(SdcdEndToEndTest, CheckpointGateOverTheWire) {
  for (core::Step s = 1; s <= 10; ++s) {
    for (auto& r : ranks_) r->Send(s, core::StepReport{0, 0, 1.0, 77, true, "", false});
  }
  std::vector<uint64_t> last(6);
  for (core::Rank r = 0; r < 6; ++r) {
    core::WeightReport w;
    w.tensors = {{8, 1, 2}, {8, 3, 4}, {8, 5, 6}};
    w.digest = 99;
    last[r] = ranks_[r]->Send(10, w);
  }
  RunAudit(10, /*faulty=*/std::nullopt);
  for (core::Rank r = 0; r < 6; ++r) ASSERT_TRUE(ranks_[r]->WaitAcked(last[r]).ok());
  auto stub = v1::TrainerService::NewStub(Channel(sdcd_->trainer_address()));
  v1::CheckpointRequest q;
  q.set_job_id("job-e2e");
  q.set_step(10);
  v1::CheckpointDecision d;
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(stub->MayCheckpoint(&c, q, &d).ok());
  EXPECT_TRUE(d.allowed()) << d.reason();
  q.set_step(11);
  grpc::ClientContext c2;
  ASSERT_TRUE(stub->MayCheckpoint(&c2, q, &d).ok());
  EXPECT_FALSE(d.allowed());
  EXPECT_TRUE(d.retryable());
  EXPECT_THAT(d.reason(), HasSubstr("checks of step 11 not yet reported by ranks 0, 1, 2, 3, 4, 5"));
  // Checkpoint 10 is provisional: nothing is confirmed, nothing revoked.
  q.set_status_only(true);
  grpc::ClientContext c3;
  ASSERT_TRUE(stub->MayCheckpoint(&c3, q, &d).ok());
  EXPECT_FALSE(d.allowed());
  EXPECT_EQ(d.confirmed_through_step(), 0u);
  EXPECT_EQ(d.revoked_steps_size(), 0);
}

TEST_F(SdcdEndToEndTest, ShutdownEndsTrainerStreamsSoTheyReconnect) {
  EXPECT_EQ(sdcd_->process().Stop(absl::Seconds(30)), 0) << "a clean exit on SIGTERM";
  for (core::Rank r = 0; r < 6; ++r) {
    const grpc::Status s = ranks_[r]->WaitFinished();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << r;
    EXPECT_EQ(s.error_message(), "sdcd is shutting down") << r;
  }
}

}  // namespace
}  // namespace sdc::testing
