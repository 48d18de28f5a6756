// ToGrpc keeps the code and cuts long messages where it says so;
// RejectReason names codes as the rejected-inputs metric labels them.

#include "daemon/grpc_edge.h"

#include <string>

#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

TEST(ToGrpcTest, KeepsTheCodeAndAShortMessage) {
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
  grpc::Status s = ToGrpc(absl::NotFoundError("no replacement request 7"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "no replacement request 7");
  EXPECT_EQ(ToGrpc(absl::UnauthenticatedError("x")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(ToGrpcTest, CutsAMessageBeyondOneKibSayingHowMuch) {
  const std::string exact(1024, 'a');
  EXPECT_EQ(ToGrpc(absl::InvalidArgumentError(exact)).error_message(), exact);
  const std::string longer = std::string(1024, 'b') + std::string(976, 'c');
  grpc::Status s = ToGrpc(absl::InvalidArgumentError(longer));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), std::string(1024, 'b') + "... (976 more bytes)");
}

TEST(RejectReasonTest, LowerSnakeCodeNames) {
  EXPECT_EQ(RejectReason(absl::StatusCode::kInvalidArgument), "invalid_argument");
  EXPECT_EQ(RejectReason(absl::StatusCode::kResourceExhausted), "resource_exhausted");
  EXPECT_EQ(RejectReason(grpc::StatusCode::UNAUTHENTICATED), "unauthenticated");
  EXPECT_EQ(RejectReason(grpc::StatusCode::PERMISSION_DENIED), "permission_denied");
}

}  // namespace
}  // namespace sdc::daemon
