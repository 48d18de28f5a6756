#include "protocol/checkpoint_ledger.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace sdc::protocol {
namespace {

TEST(CheckpointLedgerTest, TheNextAllowedCheckpointConfirmsTheLastOne) {
  CheckpointLedger l;
  l.Allowed(10);
  EXPECT_EQ(l.Of(10), CheckpointLedger::Standing::kProvisional);
  EXPECT_EQ(l.confirmed_through(), 0u);
  l.Allowed(20);
  EXPECT_EQ(l.Of(10), CheckpointLedger::Standing::kFinal);
  EXPECT_EQ(l.Of(20), CheckpointLedger::Standing::kProvisional);
  l.Allowed(20);  // Asked again: nothing new.
  EXPECT_EQ(l.Of(20), CheckpointLedger::Standing::kProvisional);
  EXPECT_EQ(l.provisional(), std::optional<Step>(20));
}

TEST(CheckpointLedgerTest, ARevocationIsNeverUndoneAndNeverConfirmed) {
  CheckpointLedger l;
  l.Allowed(10);
  l.Allowed(20);
  const std::vector<Step> revoked = {20};
  l.Learn(10, revoked);
  EXPECT_EQ(l.Of(20), CheckpointLedger::Standing::kRevoked);
  EXPECT_FALSE(l.provisional().has_value());
  l.Allowed(30);  // After the replacement: 30 is provisional, 20 stays revoked.
  l.Allowed(40);
  EXPECT_EQ(l.Of(20), CheckpointLedger::Standing::kRevoked);
  EXPECT_EQ(l.Of(30), CheckpointLedger::Standing::kFinal);
  EXPECT_EQ(l.Of(40), CheckpointLedger::Standing::kProvisional);
  l.Learn(0, revoked);  // A stale answer lowers nothing and adds nothing.
  EXPECT_EQ(l.confirmed_through(), 30u);
  EXPECT_EQ(l.revoked(), revoked);
}

TEST(CheckpointLedgerTest, TheCoordinatorConfirmsWhatTheTrainerDidNotSee) {
  CheckpointLedger l;
  l.Allowed(10);
  // The in-band digest vote vetoed 20 locally; the coordinator allowed both
  // 20 and 30, so 20 is confirmed there.
  const std::vector<Step> none;
  l.Learn(20, none);
  EXPECT_EQ(l.Of(10), CheckpointLedger::Standing::kFinal);
  EXPECT_EQ(l.Of(25), CheckpointLedger::Standing::kProvisional);
}

TEST(CheckpointLedgerTest, TheCoordinatorRevokesTheProvisionalOne) {
  CheckpointLedger l;
  EXPECT_EQ(l.RevokeProvisional(), std::nullopt) << "nothing to revoke";
  l.Allowed(10);
  l.Allowed(20);
  EXPECT_EQ(l.RevokeProvisional(), std::optional<Step>(20));
  EXPECT_EQ(l.RevokeProvisional(), std::nullopt) << "revoked once";
  EXPECT_EQ(l.Of(10), CheckpointLedger::Standing::kFinal) << "confirmed stays confirmed";
  EXPECT_EQ(l.Of(20), CheckpointLedger::Standing::kRevoked);
  l.Allowed(20);  // Never revived.
  EXPECT_FALSE(l.provisional().has_value());
  EXPECT_EQ(l.Of(20), CheckpointLedger::Standing::kRevoked);
}

TEST(CheckpointLedgerTest, AnAbandonedProvisionalIsNeitherConfirmedNorRevoked) {
  CheckpointLedger l;
  EXPECT_EQ(l.AbandonProvisional(), std::nullopt) << "nothing to abandon";
  l.Allowed(10);
  l.Allowed(20);
  // A new attempt resumed from 10: 20's checkpoint belongs to the old one.
  EXPECT_EQ(l.AbandonProvisional(), std::optional<Step>(20));
  EXPECT_FALSE(l.provisional().has_value());
  EXPECT_TRUE(l.revoked().empty());
  l.Allowed(30);  // The new attempt's next checkpoint does not confirm 20.
  EXPECT_EQ(l.confirmed_through(), 10u);
  l.Allowed(20);  // Not revoked: step 20 can be checkpointed again...
  EXPECT_EQ(l.provisional(), std::optional<Step>(20));
  l.Allowed(40);  // ...and confirmed by the next one.
  EXPECT_EQ(l.Of(20), CheckpointLedger::Standing::kFinal);
}

}  // namespace
}  // namespace sdc::protocol
