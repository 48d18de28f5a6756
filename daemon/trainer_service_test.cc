// TrainerService over real gRPC on loopback, with a real Coordinator (an
// in-memory store, a fake clock): an Attach stream's Hello and report, a
// relay (an agent proving its node with a service-account token) and its
// sessions (one refused, the relay carrying on, every rank placed on the
// relay's node) and its end at shutdown, a relay refused on the trainer
// listener or without credentials, and the checkpoint gate's answers, an
// undecodable request included.

#include "daemon/trainer_service.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics/collector.h"
#include "common/version.h"
#include "daemon/convert.h"
#include "daemon/core/clock.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/store.h"
#include "daemon/delivery.h"
#include "daemon/service_metrics.h"
#include "daemon/stream_registry.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "daemon/node_identity.h"
#include "daemon/service_account_token.h"
#include "tests/testing/sdcd.h"
#include "tests/testing/token_issuer.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;

v1::TrainerMessage HelloOf(core::Rank rank, uint32_t world = 2) {
  core::Hello h;
  h.job_id = "job-t";
  h.placement = {rank, "node-a", rank, absl::StrCat("GPU-", rank), 0};
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
  r.job_id = "job-t";
  r.rank = rank;
  r.incarnation = 1;
  r.sequence = sequence;
  r.step = step;
  r.body = core::StepReport{};
  v1::TrainerMessage m;
  *m.mutable_report() = ToProto(r);
  return m;
}

// The agent listener's service: relays prove their node with a token.
TrainerContext AgentPort(TrainerContext c, const NodeAuthenticator* authenticator) {
  c.authenticator = authenticator;
  c.agent_port = true;
  return c;
}

class TrainerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TokenIssuer> issuer =
        testing::TokenIssuer::Create(testing::TokenIssuer::Algorithm::kES256, "k1");
    ASSERT_TRUE(issuer.ok());
    issuer_ = std::make_unique<testing::TokenIssuer>(*std::move(issuer));
    TokenPolicy policy;
    policy.issuer = testing::PodTokenClaims().issuer;
    policy.subjects = {"system:serviceaccount:sdc-agent:sdc-agent"};
    absl::StatusOr<std::unique_ptr<TokenVerifier>> verifier =
        TokenVerifier::Create(issuer_->Jwks(), policy);
    ASSERT_TRUE(verifier.ok()) << verifier.status();
    verifier_ = *std::move(verifier);
    authenticator_ = std::make_unique<NodeAuthenticator>(verifier_.get(), &clock_, false);
    service_ = std::make_unique<TrainerService>(
        AgentPort(TrainerContext{&coordinator_, &delivery_, &streams_, &metrics_},
                  authenticator_.get()));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    service_->AddQueues(builder, 2);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    service_->Start();
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::TrainerService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ == nullptr) return;
    service_->EndRelays(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stopping"));
    streams_.EndAll(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stopping"));
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    service_->Stop();
  }

  // A relay call carrying node-b's agent token (kubelet's, as the issuer
  // signs it).
  void AsAgentOf(const std::string& node, grpc::ClientContext* context) {
    testing::PodTokenClaims claims;
    claims.node = node;
    claims.expiry = clock_.Now() + absl::Hours(1);  // sdcd's (fake) clock judges it.
    context->AddMetadata("authorization", "Bearer " + issuer_->PodToken(claims));
  }

  static void WithDeadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  grpc::Status Gate(const v1::CheckpointRequest& q, v1::CheckpointDecision* d) {
    grpc::ClientContext context;
    WithDeadline(&context);
    return stub_->MayCheckpoint(&context, q, d);
  }

  std::string Metrics() { return registry_.Serialize(); }

  core::FakeClock clock_;
  core::MemoryStore store_;
  core::Coordinator coordinator_{core::CoordinatorOptions{}, &clock_, &store_};
  metrics::Collector registry_;
  ServiceMetrics metrics_{registry_};
  StreamRegistry streams_;
  Delivery delivery_{&store_, &streams_, &metrics_};
  std::unique_ptr<testing::TokenIssuer> issuer_;
  std::unique_ptr<TokenVerifier> verifier_;
  std::unique_ptr<NodeAuthenticator> authenticator_;
  std::unique_ptr<TrainerService> service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
};

TEST_F(TrainerServiceTest, AnAttachStreamIsWelcomedAndAcknowledged) {
  grpc::ClientContext context;
  WithDeadline(&context);
  auto stream = stub_->Attach(&context);
  ASSERT_TRUE(stream->Write(HelloOf(0)));
  v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_welcome());
  EXPECT_EQ(reply.welcome().coordinator_version(), kVersion);
  ASSERT_TRUE(stream->Write(StepReportOf(0, 1, 1)));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.ack().acked_sequence(), 1u);
  EXPECT_EQ(coordinator_.AttachedRanks(), 1u);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_TRUE(stream->Finish().ok());
}

// Issue 42: the Welcome says the job's attempt, and why its resume is
// doubtful (here: sdcd never saw the job's checkpoints).
TEST_F(TrainerServiceTest, TheWelcomeSaysTheAttemptAndItsResumeWarning) {
  grpc::ClientContext context;
  WithDeadline(&context);
  auto stream = stub_->Attach(&context);
  v1::TrainerMessage hello = HelloOf(0);
  hello.mutable_hello()->set_attempt(3);
  hello.mutable_hello()->set_resume_step(50);
  ASSERT_TRUE(stream->Write(hello));
  v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_welcome());
  EXPECT_EQ(reply.welcome().attempt(), 3u);
  EXPECT_EQ(reply.welcome().resume_warning(),
            "sdcd holds no checkpoint decisions of job job-t: it cannot say whether step 50's "
            "checkpoint is final");
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(TrainerServiceTest, ARelayCarriesSessionsEndsARefusedOneAndEndsAtShutdown) {
  grpc::ClientContext context;
  WithDeadline(&context);
  AsAgentOf("node-b", &context);
  auto relay = stub_->Relay(&context);
  v1::RelayUp up;
  auto* first = up.add_messages();
  first->set_session(1);
  *first->mutable_message() = HelloOf(0);
  auto* refused = up.add_messages();
  refused->set_session(2);
  *refused->mutable_message() = StepReportOf(1, 1, 1);  // Not a Hello first.
  ASSERT_TRUE(relay->Write(up));
  // Session 2's end and session 1's welcome, in either order (the end is
  // queued at once, the welcome once durable).
  bool welcomed = false;
  bool ended = false;
  v1::RelayDown down;
  while ((!welcomed || !ended) && relay->Read(&down)) {
    for (const v1::RelayedReply& r : down.replies()) {
      if (r.session() == 1 && r.message().has_welcome()) welcomed = true;
      if (r.session() == 2 && r.end()) {
        ended = true;
        EXPECT_EQ(r.status_code(), grpc::StatusCode::INVALID_ARGUMENT);
        EXPECT_EQ(r.status_message(), "the first message of a stream must be a Hello");
      }
    }
  }
  EXPECT_TRUE(welcomed);
  EXPECT_TRUE(ended);
  EXPECT_EQ(service_->relays(), 1u);
  EXPECT_EQ(coordinator_.AttachedRanks(), 1u);
  EXPECT_THAT(Metrics(), HasSubstr("sdc_rejected_inputs_total{reason=\"invalid_argument\"} 1\n"));
  // The Hello said node-a; the relay proved node-b, which is where it runs.
  absl::StatusOr<std::vector<core::RankSummary>> ranks = coordinator_.ListRanks("job-t");
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].placement.node, "node-b");
  EXPECT_EQ((*ranks)[0].identity, "node-b");
  EXPECT_EQ((*ranks)[0].proof, "relay");
  EXPECT_EQ((*ranks)[0].unproven, "");

  service_->EndRelays(grpc::Status(grpc::StatusCode::UNAVAILABLE, "sdcd is shutting down"));
  while (relay->Read(&down)) {
  }
  grpc::Status status = relay->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status.error_message(), "sdcd is shutting down");
  EXPECT_EQ(coordinator_.AttachedRanks(), 0u);
}

// A relay that proves no node, or comes to the trainer listener, ends
// before its first message is handled.
TEST_F(TrainerServiceTest, ARelayWithoutANodeOrOnTheTrainerPortIsRefused) {
  v1::RelayUp up;
  auto* hello = up.add_messages();
  hello->set_session(1);
  *hello->mutable_message() = HelloOf(0);
  {
    grpc::ClientContext context;
    WithDeadline(&context);
    auto relay = stub_->Relay(&context);
    ASSERT_TRUE(relay->Write(up));
    v1::RelayDown down;
    while (relay->Read(&down)) {
    }
    grpc::Status s = relay->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), HasSubstr("a node agent proves its node"));
  }
  // The trainer listener's service.
  TrainerService trainers(TrainerContext{&coordinator_, &delivery_, &streams_, &metrics_});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&trainers);
  trainers.AddQueues(builder, 1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  trainers.Start();
  auto stub = v1::TrainerService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    WithDeadline(&context);
    AsAgentOf("node-b", &context);
    auto relay = stub->Relay(&context);
    ASSERT_TRUE(relay->Write(up));
    v1::RelayDown down;
    while (relay->Read(&down)) {
    }
    grpc::Status s = relay->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("relays connect to sdcd's agent listener"));
  }
  EXPECT_EQ(coordinator_.AttachedRanks(), 0u);
  trainers.EndRelays(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stopping"));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  trainers.Stop();
}

TEST_F(TrainerServiceTest, TheCheckpointGateAnswersAndCountsItsDecisions) {
  v1::CheckpointRequest q;
  q.set_job_id("nope");
  q.set_step(5);
  v1::CheckpointDecision d;
  grpc::Status s = Gate(q, &d);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("unknown job nope"));
  EXPECT_THAT(Metrics(), HasSubstr("sdc_rejected_inputs_total{reason=\"not_found\"} 1\n"));

  grpc::ClientContext context;
  WithDeadline(&context);
  auto stream = stub_->Attach(&context);
  ASSERT_TRUE(stream->Write(HelloOf(0, /*world=*/1)));
  v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  q.set_job_id("job-t");
  ASSERT_TRUE(Gate(q, &d).ok());
  EXPECT_FALSE(d.allowed());
  EXPECT_TRUE(d.retryable());
  EXPECT_THAT(d.reason(), HasSubstr("not yet reported by ranks"));
  EXPECT_THAT(Metrics(), HasSubstr("sdc_checkpoint_decisions_total{decision=\"wait\"} 1\n"));
  q.set_status_only(true);  // A question, not a decision: not counted.
  ASSERT_TRUE(Gate(q, &d).ok());
  EXPECT_THAT(Metrics(), HasSubstr("sdc_checkpoint_decisions_total{decision=\"wait\"} 1\n"));
  stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(TrainerServiceTest, AnUndecodableCheckpointRequestIsInvalidArgument) {
  grpc::Status s = testing::SendRawFrame(channel_, "/sdc.v1.TrainerService/MayCheckpoint",
                                         std::string("\xff\xff\xff\xff", 4));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "the request is not a valid sdc.v1.CheckpointRequest");
  EXPECT_THAT(Metrics(), HasSubstr("sdc_rejected_inputs_total{reason=\"invalid_argument\"} 1\n"));
}

}  // namespace
}  // namespace sdc::daemon
