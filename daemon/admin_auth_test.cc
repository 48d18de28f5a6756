// Authenticate, table-driven: each credential a caller may present, the
// principal it names or the code and message it is refused with.
// UNAUTHENTICATED when the credential names nobody, PERMISSION_DENIED only
// for a known principal whose role falls short.

#include "daemon/admin_auth.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "daemon/operators.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

const Principal kRootPrincipal{"root", Role::kAdmin, /*person=*/false, /*pending=*/false};

using ::testing::HasSubstr;

class AdminAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = Operators::Load(&store_, "root-secret");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    operators_ = *std::move(loaded);
    auto alice = operators_->Add("alice", Role::kOperator, kRootPrincipal, absl::FromUnixSeconds(1));
    ASSERT_TRUE(alice.ok());
    alice_token_ = alice->second;
    auto bob = operators_->Add("bob", Role::kViewer, kRootPrincipal, absl::FromUnixSeconds(1));
    ASSERT_TRUE(bob.ok());
    bob_token_ = bob->second;
    auth_.operators = operators_.get();
    auth_.accept_client_certs = true;
  }

  static AdminCredentials Bearer(const std::string& token) {
    AdminCredentials c;
    c.authorization = "Bearer " + token;
    return c;
  }
  // A certificate's subject alternative names.
  static AdminCredentials Certificate(std::vector<std::string> names) {
    AdminCredentials c;
    c.certificate_names = std::move(names);
    return c;
  }

  MemoryOperatorStore store_;
  std::unique_ptr<Operators> operators_;
  AdminAuth auth_;
  std::string alice_token_;
  std::string bob_token_;
};

TEST_F(AdminAuthTest, CredentialsNameTheirPrincipal) {
  struct Case {
    std::string name;
    AdminCredentials credentials;
    std::string principal;
    Role role;
  };
  const Case cases[] = {
      {"root token", Bearer("root-secret"), "root", Role::kAdmin},
      {"operator token", Bearer(alice_token_), "alice", Role::kOperator},
      {"viewer token", Bearer(bob_token_), "bob", Role::kViewer},
      {"certificate", Certificate({"alice"}), "alice", Role::kOperator},
      // Any of a certificate's names that is an operator's (DNS or email SAN).
      {"certificate with several names", Certificate({"laptop-17.example.com", "alice"}),
       "alice", Role::kOperator},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Principal> who = Authenticate(auth_, c.credentials, Role::kViewer);
    ASSERT_TRUE(who.ok()) << c.name << ": " << who.status();
    EXPECT_EQ(who->name, c.principal) << c.name;
    EXPECT_EQ(who->role, c.role) << c.name;
  }
}

TEST_F(AdminAuthTest, RefusalsCarryTheirCodeAndSayWhy) {
  AdminCredentials token_and_certificate = Bearer("wrong");
  token_and_certificate.certificate_names = std::vector<std::string>{"alice"};  // The token decides.
  AdminAuth no_operators;
  struct Case {
    std::string name;
    const AdminAuth* auth;
    AdminCredentials credentials;
    Role needed;
    absl::StatusCode code;
    std::string message;
  };
  const Case cases[] = {
      {"nothing presented", &auth_, AdminCredentials{}, Role::kViewer,
       absl::StatusCode::kUnauthenticated, "admin calls need 'authorization: Bearer <token>'"},
      {"wrong token", &auth_, Bearer("wrong"), Role::kViewer,
       absl::StatusCode::kUnauthenticated, "the admin token is not valid"},
      {"not a bearer token", &auth_, AdminCredentials{"Basic cm9vdA==", std::nullopt},
       Role::kViewer, absl::StatusCode::kUnauthenticated, "the admin token is not valid"},
      {"a wrong token beside a good certificate", &auth_, token_and_certificate, Role::kViewer,
       absl::StatusCode::kUnauthenticated, "the admin token is not valid"},
      {"no operators at all", &no_operators, Bearer("root-secret"), Role::kViewer,
       absl::StatusCode::kUnauthenticated, "the admin token is not valid"},
      {"certificate naming nobody", &auth_, Certificate({"mallory"}), Role::kViewer,
       absl::StatusCode::kUnauthenticated,
       "the client certificate's names (\"mallory\") name no operator"},
      {"viewer needing operator", &auth_, Bearer(bob_token_), Role::kOperator,
       absl::StatusCode::kPermissionDenied, "bob has role viewer; this call needs operator"},
      {"operator needing admin", &auth_, Certificate({"alice"}), Role::kAdmin,
       absl::StatusCode::kPermissionDenied, "alice has role operator; this call needs admin"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Principal> who = Authenticate(*c.auth, c.credentials, c.needed);
    ASSERT_FALSE(who.ok()) << c.name;
    EXPECT_EQ(who.status().code(), c.code) << c.name << ": " << who.status();
    EXPECT_THAT(std::string(who.status().message()), HasSubstr(c.message)) << c.name;
  }
}

}  // namespace
}  // namespace sdc::daemon
