#include "daemon/operators.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

const Principal kRootPrincipal{"root", Role::kAdmin, /*person=*/false, /*pending=*/false};

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TEST(Sha256Test, KnownVector) {
  EXPECT_EQ(absl::BytesToHexString(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(RoleTest, NamesRoundTripAndUnknownIsAnError) {
  for (Role r : {Role::kViewer, Role::kOperator, Role::kAdmin}) {
    EXPECT_EQ(*ParseRole(RoleName(r)), r);
  }
  absl::StatusOr<Role> bad = ParseRole("root");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("viewer, operator or admin"));
}

TEST(OperatorsTest, RootTokenAndOperatorTokensNameTheirPrincipal) {
  MemoryOperatorStore store;
  auto ops = Operators::Load(&store, "root-secret");
  ASSERT_TRUE(ops.ok()) << ops.status();
  auto alice = (*ops)->Add("alice", Role::kOperator, kRootPrincipal, kT0);
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->second.size(), 64u);
  EXPECT_EQ(alice->first.token_sha256, Sha256(alice->second));
  auto bob = (*ops)->Add("bob", Role::kViewer, kRootPrincipal, kT0);
  ASSERT_TRUE(bob.ok());
  EXPECT_NE(alice->second, bob->second);

  std::optional<Principal> root = (*ops)->ByToken("root-secret");
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(root->name, "root");
  EXPECT_EQ(root->role, Role::kAdmin);
  std::optional<Principal> a = (*ops)->ByToken(alice->second);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->name, "alice");
  EXPECT_EQ(a->role, Role::kOperator);
  EXPECT_EQ((*ops)->ByToken(bob->second)->role, Role::kViewer);
  EXPECT_FALSE((*ops)->ByToken("root-secreT").has_value());
  EXPECT_FALSE((*ops)->ByToken(alice->second + "0").has_value());
  EXPECT_FALSE((*ops)->ByToken("").has_value());
  // The store holds digests, never tokens.
  absl::StatusOr<std::vector<OperatorRecord>> stored = store.LoadOperators();
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 2u);
  for (const OperatorRecord& r : *stored) {
    EXPECT_NE(r.token_sha256, alice->second);
    EXPECT_EQ(r.token_sha256.size(), 32u);
  }
}

TEST(OperatorsTest, AnEmptyRootTokenAcceptsNoToken) {
  MemoryOperatorStore store;
  auto ops = Operators::Load(&store, "");
  ASSERT_TRUE(ops.ok());
  EXPECT_FALSE((*ops)->ByToken("").has_value());
}

TEST(OperatorsTest, NamesAreValidatedAndUnique) {
  MemoryOperatorStore store;
  auto ops = *Operators::Load(&store, "t");
  ASSERT_TRUE(ops->Add("alice@example.com", Role::kAdmin, kRootPrincipal, kT0).ok());
  struct Case {
    std::string name;
    absl::StatusCode code;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"", absl::StatusCode::kInvalidArgument, "bad operator name"},
           {"a b", absl::StatusCode::kInvalidArgument, "bad operator name"},
           {std::string(65, 'a'), absl::StatusCode::kInvalidArgument, "1 to 64"},
           {"root", absl::StatusCode::kAlreadyExists, "bootstrap token"},
           {"alice@example.com", absl::StatusCode::kAlreadyExists, "already exists"}}) {
    auto r = ops->Add(c.name, Role::kViewer, kRootPrincipal, kT0);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), c.code) << c.name;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
}

TEST(OperatorsTest, RemovedTokensStopWorkingAndReloadKeepsTheRest) {
  MemoryOperatorStore store;
  std::string alice_token, bob_token;
  {
    auto ops = *Operators::Load(&store, "t");
    alice_token = ops->Add("alice", Role::kOperator, kRootPrincipal, kT0)->second;
    bob_token = ops->Add("bob", Role::kAdmin, kRootPrincipal, kT0)->second;
    auto removed = ops->Remove("alice", kRootPrincipal);
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(removed->name, "alice");
    EXPECT_FALSE(ops->ByToken(alice_token).has_value());
    EXPECT_EQ(ops->Remove("alice", kRootPrincipal).status().code(), absl::StatusCode::kNotFound);
  }
  auto reloaded = *Operators::Load(&store, "t");
  EXPECT_FALSE(reloaded->ByToken(alice_token).has_value());
  ASSERT_TRUE(reloaded->ByToken(bob_token).has_value());
  EXPECT_EQ(reloaded->ByToken(bob_token)->name, "bob");
  ASSERT_EQ(reloaded->List().size(), 1u);
  EXPECT_EQ(reloaded->List()[0].created_by, "root");
  EXPECT_EQ(reloaded->ByName("bob")->role, Role::kAdmin);
  EXPECT_FALSE(reloaded->ByName("alice").has_value());
}

// Two-person mode: root enrolls the first two admins and nothing else; an
// admin's enrollment works only after a second admin consents (never the
// same one, never root); a certificate (an external identity) needs no
// consent; an admin whose removal would reopen the bootstrap stays. The
// consent survives a reload.
TEST(OperatorsTest, TwoPersonModeNeedsASecondAdminsConsent) {
  MemoryOperatorStore store;
  auto ops = *Operators::Load(&store, "t", /*approvals_required=*/2);
  ASSERT_TRUE(ops->two_person());
  EXPECT_EQ(ops->Add("olga", Role::kOperator, kRootPrincipal, kT0).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto alice = ops->Add("alice", Role::kAdmin, kRootPrincipal, kT0);
  auto bob = ops->Add("bob", Role::kAdmin, kRootPrincipal, kT0);
  ASSERT_TRUE(alice.ok() && bob.ok());
  EXPECT_EQ(alice->first.approved_by, kBootstrapConsent);
  auto third = ops->Add("carl", Role::kAdmin, kRootPrincipal, kT0);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kPermissionDenied) << "bootstrap is over";
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("only the first 2 admins"));

  const Principal as_alice = *ops->ByToken(alice->second);
  EXPECT_TRUE(as_alice.person);
  EXPECT_FALSE(as_alice.pending);
  auto mallory = ops->Add("mallory", Role::kOperator, as_alice, kT0);
  ASSERT_TRUE(mallory.ok());
  std::optional<Principal> pending = ops->ByToken(mallory->second);
  ASSERT_TRUE(pending.has_value());
  EXPECT_TRUE(pending->pending);
  EXPECT_FALSE(ops->Active(mallory->first));
  // alice cannot vouch twice, root cannot vouch at all.
  EXPECT_EQ(ops->Approve("mallory", as_alice).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ops->Approve("mallory", kRootPrincipal).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(ops->ByToken(mallory->second)->pending);
  // A certificate naming mallory is a person already.
  EXPECT_FALSE(ops->ByName("mallory")->pending);
  EXPECT_TRUE(ops->ByName("mallory")->person);
  // bob consents.
  auto approved = ops->Approve("mallory", *ops->ByToken(bob->second));
  ASSERT_TRUE(approved.ok()) << approved.status();
  EXPECT_EQ(approved->approved_by, "bob");
  EXPECT_FALSE(ops->ByToken(mallory->second)->pending);
  EXPECT_EQ(ops->Approve("mallory", *ops->ByToken(bob->second)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Removing an admin would leave one: refused; root manages nothing now.
  EXPECT_EQ(ops->Remove("bob", as_alice).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ops->Remove("mallory", kRootPrincipal).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto reloaded = *Operators::Load(&store, "t", 2);
  EXPECT_FALSE(reloaded->ByToken(mallory->second)->pending);
  // One-person enrollments wait for a second admin once two-person mode is on.
  MemoryOperatorStore single;
  auto one = *Operators::Load(&single, "t");
  auto dave = one->Add("dave", Role::kOperator, kRootPrincipal, kT0);
  ASSERT_TRUE(dave.ok());
  EXPECT_FALSE(one->ByToken(dave->second)->pending);
  EXPECT_TRUE((*Operators::Load(&single, "t", 2))->ByToken(dave->second)->pending);
}

}  // namespace
}  // namespace sdc::daemon
