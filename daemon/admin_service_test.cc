// AdminService over real gRPC on loopback, with a real Coordinator (an
// in-memory store, a fake clock) and real operators: who may call what, the
// principal a call runs as, the refusals and what they count.

#include "daemon/admin_service.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/metrics/collector.h"
#include "common/version.h"
#include "daemon/core/clock.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/store.h"
#include "daemon/delivery.h"
#include "daemon/operators.h"
#include "daemon/service_metrics.h"
#include "daemon/stream_registry.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;

class AdminServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = Operators::Load(&operator_store_, "root-secret");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    operators_ = *std::move(loaded);
    service_ = std::make_unique<AdminService>(&coordinator_, &delivery_, &metrics_,
                                              AdminAuth{operators_.get(), false},
                                              operators_.get(), /*approvals_required=*/2,
                                              [] {});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::AdminService::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                          grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // A context carrying `token` (none when empty) and a 10 s deadline.
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  // Adds operator `name` as root; returns its token.
  std::string Add(const std::string& name, v1::OperatorRole role) {
    v1::AddOperatorRequest q;
    q.set_name(name);
    q.set_role(role);
    v1::AddOperatorResponse added;
    grpc::Status s = stub_->AddOperator(As("root-secret").get(), q, &added);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(added.operator_().created_by(), "root");
    return added.token();
  }

  double Rejected(const std::string& reason) {
    const std::string text = registry_.Serialize();
    const std::string key = absl::StrCat("sdc_rejected_inputs_total{reason=\"", reason, "\"} ");
    const size_t at = text.find(key);
    return at == std::string::npos ? 0 : std::stod(text.substr(at + key.size()));
  }

  core::FakeClock clock_;
  core::MemoryStore store_;
  core::Coordinator coordinator_{core::CoordinatorOptions{}, &clock_, &store_};
  metrics::Collector registry_;
  ServiceMetrics metrics_{registry_};
  StreamRegistry streams_;
  Delivery delivery_{&store_, &streams_, &metrics_};
  MemoryOperatorStore operator_store_;
  std::unique_ptr<Operators> operators_;
  std::unique_ptr<AdminService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::AdminService::Stub> stub_;
};

TEST_F(AdminServiceTest, WhoAmINamesTheCredentialsPrincipal) {
  v1::WhoAmIResponse who;
  ASSERT_TRUE(stub_->WhoAmI(As("root-secret").get(), {}, &who).ok());
  EXPECT_EQ(who.name(), "root");
  EXPECT_EQ(who.role(), v1::ROLE_ADMIN);
  EXPECT_EQ(who.server_version(), kVersion);
  EXPECT_EQ(who.approvals_required(), 2u);
  const std::string bob = Add("bob", v1::ROLE_VIEWER);
  ASSERT_TRUE(stub_->WhoAmI(As(bob).get(), {}, &who).ok());
  EXPECT_EQ(who.name(), "bob");
  EXPECT_EQ(who.role(), v1::ROLE_VIEWER);
}

TEST_F(AdminServiceTest, RolesGateTheCalls) {
  const std::string bob = Add("bob", v1::ROLE_VIEWER);
  v1::ListJobsResponse jobs;
  EXPECT_TRUE(stub_->ListJobs(As(bob).get(), {}, &jobs).ok());
  v1::ListOperatorsResponse listed;
  grpc::Status s = stub_->ListOperators(As(bob).get(), {}, &listed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "bob has role viewer; this call needs admin");
  v1::DecideRequest approve;
  approve.set_id(1);
  v1::ReplacementRequest decided;
  s = stub_->Approve(As(bob).get(), approve, &decided);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Rejected("permission_denied"), 2);
  ASSERT_TRUE(stub_->ListOperators(As("root-secret").get(), {}, &listed).ok());
  ASSERT_EQ(listed.operators_size(), 1);
  EXPECT_EQ(listed.operators(0).name(), "bob");
  EXPECT_EQ(listed.operators(0).role(), v1::ROLE_VIEWER);
}

TEST_F(AdminServiceTest, UnderTwoPersonApprovalRootMayNotApprove) {
  v1::DecideRequest approve;
  approve.set_id(1);
  approve.set_reason("r");
  v1::ReplacementRequest decided;
  grpc::Status s = stub_->Approve(As("root-secret").get(), approve, &decided);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("root is not a separately enrolled person, so it may not approve when 2 operators must"));
  // An operator's approval reaches the coordinator: there is no request 1.
  const std::string alice = Add("alice", v1::ROLE_OPERATOR);
  s = stub_->Approve(As(alice).get(), approve, &decided);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("no replacement request 1"));
  EXPECT_EQ(Rejected("not_found"), 1);
}

TEST_F(AdminServiceTest, BadRequestsAreRefusedInvalidArgument) {
  v1::HistoryResponse history;
  grpc::Status s = stub_->History(As("root-secret").get(), {}, &history);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "name a GPU UUID or a node");
  v1::AddOperatorRequest q;
  q.set_name("carol");
  q.set_role(static_cast<v1::OperatorRole>(42));
  v1::AddOperatorResponse added;
  s = stub_->AddOperator(As("root-secret").get(), q, &added);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "unknown role");
  EXPECT_EQ(Rejected("invalid_argument"), 2);
}

TEST_F(AdminServiceTest, ARemovedOperatorsTokenStopsWorking) {
  const std::string bob = Add("bob", v1::ROLE_VIEWER);
  v1::RemoveOperatorRequest q;
  q.set_name("bob");
  v1::Operator removed;
  ASSERT_TRUE(stub_->RemoveOperator(As("root-secret").get(), q, &removed).ok());
  EXPECT_EQ(removed.name(), "bob");
  v1::WhoAmIResponse who;
  grpc::Status s = stub_->WhoAmI(As(bob).get(), {}, &who);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(), "the admin token is not valid");
  s = stub_->WhoAmI(As("").get(), {}, &who);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Rejected("unauthenticated"), 2);
  EXPECT_EQ(Rejected("permission_denied"), 0);
}

}  // namespace
}  // namespace sdc::daemon
