// Bad input through the real API: each gets a specific status and message,
// is counted in sdc_rejected_inputs_total, and sdcd keeps serving.

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"
#include "daemon/convert.h"

namespace sdc::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kTensors = {"a", "b"};

class SdcdBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir("bad-input");
    absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir_);
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
  }

  // A stream that sends `first` then expects the server to end it.
  grpc::Status StreamEndingWith(const v1::TrainerMessage& first,
                                const v1::TrainerMessage* second = nullptr) {
    auto stub = v1::TrainerService::NewStub(Channel(sdcd_->trainer_address()));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->Attach(&c);
    stream->Write(first);
    if (second != nullptr) stream->Write(*second);
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    return stream->Finish();
  }

  std::string dir_;
  std::unique_ptr<Sdcd> sdcd_;
};

TEST_F(SdcdBadInputTest, EachBadInputHasItsStatusAndIsCounted) {
  // A first message that is not a Hello.
  v1::TrainerMessage report_first;
  report_first.mutable_report()->set_job_id("j");
  grpc::Status s = StreamEndingWith(report_first);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("first message of a stream must be a Hello"));

  // A Hello naming a rank beyond the world.
  v1::TrainerMessage bad_rank;
  core::Hello h = TestHello("job-x", 9, 6, 2, kTensors);
  *bad_rank.mutable_hello() = daemon::ToProto(h);
  s = StreamEndingWith(bad_rank);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("rank 9 is not below the world size 6"));
  EXPECT_EQ(sdcd_->Rejected("invalid_argument"), 2);

  // A good rank, then a report for another job and one without a body.
  ScriptedRank rank(Channel(sdcd_->trainer_address()), TestHello("job-x", 0, 6, 2, kTensors));
  ASSERT_TRUE(rank.Connect().ok());
  v1::Report wrong_job;
  wrong_job.set_job_id("job-y");
  wrong_job.set_rank(0);
  wrong_job.set_incarnation(1);
  wrong_job.set_sequence(1);
  wrong_job.mutable_step_report();
  rank.SendRaw(wrong_job);
  s = rank.WaitFinished();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("report for job job-y rank 0 on the stream of job job-x"));
  ASSERT_TRUE(rank.Connect().ok());
  v1::Report no_body;
  no_body.set_job_id("job-x");
  no_body.set_incarnation(1);
  no_body.set_sequence(1);
  rank.SendRaw(no_body);
  s = rank.WaitFinished();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("report has no body"));
  // A gap in sequence numbers.
  ASSERT_TRUE(rank.Connect().ok());
  rank.set_next_sequence(5);
  rank.Send(1, core::StepReport{});
  s = rank.WaitFinished();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(s.error_message(), HasSubstr("resend from 1"));
  EXPECT_EQ(sdcd_->Rejected("out_of_range"), 1);
  // A weight report with the wrong tensor count: refused, and consumed (an
  // acknowledgement says so), so the rank's later reports go on (issue 37).
  ASSERT_TRUE(rank.Connect().ok());
  core::WeightReport w;
  w.tensors = {{8, 1, 1}};
  const uint64_t bad = rank.Send(10, w);
  absl::StatusOr<v1::CoordinatorMessage> refusal = rank.WaitFor(
      [](const v1::CoordinatorMessage& m) { return m.ack().refused_sequence() != 0; });
  ASSERT_TRUE(refusal.ok()) << refusal.status();
  EXPECT_EQ(refusal->ack().refused_sequence(), bad);
  EXPECT_EQ(refusal->ack().acked_sequence(), bad);
  EXPECT_THAT(refusal->ack().refused_reason(),
              HasSubstr("has 1 tensors; the layout of replica group 0 has 2"));
  EXPECT_TRUE(rank.WaitAcked(rank.Send(11, core::StepReport{})).ok());
  EXPECT_EQ(sdcd_->Rejected("invalid_argument"), 5);

  // An oversized message: refused by gRPC before it reaches sdcd.
  ASSERT_TRUE(rank.Connect().ok());
  core::WeightReport huge;
  huge.tensors.assign(1'000'000, {8, 1, 1});
  rank.Send(10, huge);
  s = rank.WaitFinished();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();

  // The checkpoint gate for an unknown job.
  auto trainer = v1::TrainerService::NewStub(Channel(sdcd_->trainer_address()));
  v1::CheckpointRequest cq;
  cq.set_job_id("nope");
  cq.set_step(1);
  v1::CheckpointDecision cd;
  grpc::ClientContext cc;
  s = trainer->MayCheckpoint(&cc, cq, &cd);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown job nope"));

  // Admin: no token, a wrong token, unknown and already-denied requests.
  auto admin = sdcd_->Admin();
  v1::ListJobsResponse jobs;
  grpc::ClientContext no_token;
  s = admin->ListJobs(&no_token, {}, &jobs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("authorization: Bearer"));
  // A wrong token names nobody: UNAUTHENTICATED, as no token (gRPC keeps
  // PERMISSION_DENIED for a known caller without the role).
  grpc::ClientContext wrong_token;
  wrong_token.AddMetadata("authorization", "Bearer not-the-token");
  s = admin->ListJobs(&wrong_token, {}, &jobs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(), "the admin token is not valid");
  EXPECT_EQ(sdcd_->Rejected("unauthenticated"), 2);
  EXPECT_EQ(sdcd_->Rejected("permission_denied"), 0);
  v1::DecideRequest approve_unknown;
  approve_unknown.set_id(77);
  approve_unknown.set_reason("r");
  v1::ReplacementRequest out;
  s = admin->Approve(sdcd_->AdminContext().get(), approve_unknown, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("no replacement request 77"));
  RunResult cli = sdcd_->Sdcctl({"approve", "77", "--reason=x"});
  EXPECT_EQ(cli.exit_code, 3) << cli.output;
  EXPECT_THAT(cli.output, HasSubstr("sdcctl: error:"));

  // A real request, denied, then approved without --force.
  absl::StatusOr<testing::Ranks> connected =
      testing::ConnectRanks(sdcd_->trainer_address(), "job-z", 6, 2, kTensors);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::vector<std::unique_ptr<ScriptedRank>> ranks = *std::move(connected);
  std::vector<uint64_t> last(6);
  for (core::Rank r = 0; r < 6; ++r) {
    core::WeightReport wr;
    wr.tensors = {{8, 1, 1}, {8, 2, r == 1 ? 9u : 2u}};
    wr.digest = r == 1 ? 2 : 1;
    last[r] = ranks[r]->Send(10, wr);
  }
  for (core::Rank r = 0; r < 6; ++r) {
    const absl::Status acked = ranks[r]->WaitAcked(last[r]);
    ASSERT_TRUE(acked.ok()) << acked;
  }
  RunResult deny = sdcd_->Sdcctl({"deny", "1", "--reason=sensor glitch"});
  ASSERT_EQ(deny.exit_code, 0) << deny.output;
  RunResult late = sdcd_->Sdcctl({"approve", "1", "--reason=changed my mind"});
  EXPECT_EQ(late.exit_code, 4) << late.output;
  EXPECT_THAT(late.output, HasSubstr("already Denied"));
  EXPECT_THAT(late.output, HasSubstr("--force"));
  EXPECT_GE(sdcd_->Rejected("failed_precondition"), 1);

  // Still serving: a new rank is welcomed and acknowledged.
  ScriptedRank fresh(Channel(sdcd_->trainer_address()), TestHello("job-x", 1, 6, 2, kTensors));
  ASSERT_TRUE(fresh.Connect().ok());
  EXPECT_TRUE(fresh.WaitAcked(fresh.Send(1, core::StepReport{})).ok());
}

// Issue 27, item 4: a frame that does not parse ended Attach, Relay and
// Connect with OK, exactly like a clean close (gRPC's typed reads cannot
// tell them apart). Each now ends with INVALID_ARGUMENT and the reason, is
// counted, and sdcd keeps serving.
TEST_F(SdcdBadInputTest, MalformedFramesEndStreamsWithInvalidArgument) {
  const std::string garbage("\xff\xff\xff\xff", 4);  // A truncated varint tag.
  const struct {
    const char* method;
    const char* label;
    const char* type;
  } cases[] = {
      {"/sdc.v1.TrainerService/Attach", "attach", "sdc.v1.TrainerMessage"},
      {"/sdc.v1.TrainerService/Relay", "relay", "sdc.v1.RelayUp"},
      {"/sdc.v1.AgentService/Connect", "agent_connect", "sdc.v1.AgentMessage"},
  };
  for (const auto& c : cases) {
    // Relays and agents are served on the agent listener.
    const std::string address = std::string(c.label) == "attach" ? sdcd_->trainer_address()
                                                                   : sdcd_->agent_address();
    const grpc::Status s = SendRawFrame(Channel(address), c.method, garbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.method << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("malformed message: not a ", c.type)));
    EXPECT_EQ(sdcd_->Counter("sdc_malformed_messages_total", "method", c.label), 1) << c.label;
  }
  // An empty frame parses (as an empty message) and is refused as one.
  grpc::Status empty = SendRawFrame(Channel(sdcd_->trainer_address()),
                                    "/sdc.v1.TrainerService/Attach", "");
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty.error_message(), HasSubstr("must be a Hello"));
  EXPECT_GE(sdcd_->Rejected("invalid_argument"), 4);
  // The unary checkpoint gate parses its own request too: INVALID_ARGUMENT
  // (gRPC's typed method would answer INTERNAL), counted as a refusal, not
  // as a malformed stream frame.
  const double refused_before = sdcd_->Rejected("invalid_argument");
  grpc::Status gate = SendRawFrame(Channel(sdcd_->trainer_address()),
                                   "/sdc.v1.TrainerService/MayCheckpoint", garbage);
  EXPECT_EQ(gate.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << gate.error_message();
  EXPECT_EQ(gate.error_message(), "the request is not a valid sdc.v1.CheckpointRequest");
  EXPECT_EQ(sdcd_->Rejected("invalid_argument"), refused_before + 1);
  // Still serving.
  ScriptedRank fresh(Channel(sdcd_->trainer_address()), TestHello("job-m", 0, 1, 1, kTensors));
  ASSERT_TRUE(fresh.Connect().ok());
  EXPECT_TRUE(fresh.WaitAcked(fresh.Send(1, core::StepReport{})).ok());
}

// Issue 24, item 12, through the real CLI: a never-replace node's faulty GPU
// gets no request, and `sdcctl resolve incident` is the operator's remedy
// (audited: --reason and the credential's operator, root here, are kept).
TEST(SdcctlResolveTest, AnIncidentWithoutARequestIsResolvedFromTheCli) {
  const std::string dir = TestDir("resolve");
  absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir, {"--never_replace=node-b"});
  ASSERT_TRUE(d.ok()) << d.status();
  std::unique_ptr<Sdcd> sdcd = *std::move(d);
  absl::StatusOr<Ranks> ranks = ConnectRanks(sdcd->trainer_address(), "job-r", 6, 2, kTensors);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_TRUE(SendScheduledAudit(*ranks, 10, /*faulty=*/3).ok());
  RunResult requests = sdcd->Sdcctl({"get", "requests"});
  EXPECT_THAT(requests.output, HasSubstr("No resources found")) << requests.output;
  RunResult usage = sdcd->Sdcctl({"resolve", "incident", "1"});
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  EXPECT_THAT(usage.output, HasSubstr("resolve needs --reason=TEXT"));
  RunResult resolved =
      sdcd->Sdcctl({"resolve", "incident", "1", "--reason=drained by hand"});
  ASSERT_EQ(resolved.exit_code, 0) << resolved.output;
  EXPECT_THAT(resolved.output, HasSubstr("faulty (resolved)"));
  RunResult json = sdcd->Sdcctl({"get", "incidents", "-o", "json"});
  EXPECT_THAT(json.output, HasSubstr("\"resolved_by\": \"root\""));
  EXPECT_THAT(json.output, HasSubstr("\"resolution\": \"drained by hand\""));
  RunResult again = sdcd->Sdcctl({"resolve", "incident", "1", "--reason=again"});
  EXPECT_EQ(again.exit_code, 4) << again.output;
  EXPECT_THAT(again.output, HasSubstr("already resolved by root"));
}

// TLS with client certificates: a trainer without one is refused.
// Issue 27, item 3: an error that echoes its input must not grow with it. A
// 1 MB job id made a 1 MB status message, which exceeds what a gRPC client
// takes in trailers by default: the caller saw RESOURCE_EXHAUSTED, not
// NOT_FOUND.
TEST_F(SdcdBadInputTest, AHugeEchoedValueKeepsItsStatus) {
  const std::string huge(1 << 20, 'j');
  v1::ListRanksRequest request;
  request.set_job_id(huge);
  v1::ListRanksResponse response;
  grpc::Status s = sdcd_->Admin()->ListRanks(sdcd_->AdminContext().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message().substr(0, 200);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown job jjjj"));
  EXPECT_LT(s.error_message().size(), 2048u);
  // The same through a trainer stream: a Hello whose job id is over the
  // limit is refused with its reason, not with a message a megabyte long.
  v1::TrainerMessage hello;
  core::Hello h = TestHello(huge, 0, 6, 2, kTensors);
  *hello.mutable_hello() = daemon::ToProto(h);
  s = StreamEndingWith(hello);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message().substr(0, 200);
  EXPECT_LT(s.error_message().size(), 2048u);
}

TEST(SdcdTlsTest, TrainerWithoutClientCertificateIsRefused) {
  const std::string dir = TestDir("tls");
  ASSERT_TRUE(WriteTestCertificates(dir).ok());
  absl::StatusOr<std::unique_ptr<Sdcd>> sdcd =
      Sdcd::Start(dir, {absl::StrCat("--tls_cert=", dir, "/server.pem"),
                        absl::StrCat("--tls_key=", dir, "/server.key"),
                        absl::StrCat("--tls_client_ca=", dir, "/ca.pem")});
  ASSERT_TRUE(sdcd.ok()) << sdcd.status();
  auto connect = [&](bool with_cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadFile(dir + "/ca.pem");
    if (with_cert) {
      o.pem_private_key = ReadFile(dir + "/client.key");
      o.pem_cert_chain = ReadFile(dir + "/client.pem");
    }
    auto channel = grpc::CreateChannel(absl::StrCat("localhost:", (*sdcd)->trainer_port()),
                                       grpc::SslCredentials(o));
    ScriptedRank rank(channel, TestHello("job-t", 0, 3, 1, kTensors));
    return rank.Connect(absl::Seconds(5));
  };
  const absl::Status without = connect(false);
  EXPECT_FALSE(without.ok());
  EXPECT_TRUE(connect(true).ok());
}

}  // namespace
}  // namespace sdc::testing
