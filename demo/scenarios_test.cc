#include "demo/scenarios.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace sdc::demo {
namespace {

Scenario Named(const std::string& name) {
  const std::optional<Scenario> s = FindScenario(name);
  EXPECT_TRUE(s.has_value()) << name;
  return s.value_or(Scenario{});
}

TEST(ScenarioOnLayoutTest, DdpRunsEveryScenarioButTheBuddyChecksFault) {
  for (const Scenario& s : Scenarios()) {
    const absl::StatusOr<Scenario> r = ScenarioOnLayout("ddp", s);
    if (s.name == "shard-update") {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(r.ok()) << s.name << ": " << r.status();
      EXPECT_EQ(r->name, s.name);
    }
  }
}

TEST(ScenarioOnLayoutTest, ShardUpdateRunsWhereThereIsABuddyCheck) {
  EXPECT_TRUE(ScenarioOnLayout("fsdp", Named("shard-update")).ok());
  EXPECT_TRUE(ScenarioOnLayout("zero", Named("shard-update")).ok());
  for (const char* layout : {"hsdp", "tp"}) {  // Every shard has replicas: the vote's.
    const absl::StatusOr<Scenario> r = ScenarioOnLayout(layout, Named("shard-update"));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << layout;
    EXPECT_NE(r.status().message().find("fsdp or zero"), std::string::npos) << layout;
  }
}

TEST(ScenarioOnLayoutTest, ShardedLayoutsRefuseTheEnginesOwnReplaysWithTheList) {
  for (const char* layout : {"fsdp", "hsdp", "zero", "tp"}) {
    for (const char* name : {"nan-gradient", "weight-corruption", "activation-x10000",
                             "mantissa-bitflip", "intermittent", "clean"}) {
      EXPECT_TRUE(ScenarioOnLayout(layout, Named(name)).ok()) << layout << " " << name;
    }
    const absl::StatusOr<Scenario> r = ScenarioOnLayout(layout, Named("faulty-replayer"));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << layout;
    EXPECT_NE(r.status().message().find("runs on --layout=ddp"), std::string::npos);
    EXPECT_NE(r.status().message().find("activation-x10000"), std::string::npos);
  }
}

}  // namespace
}  // namespace sdc::demo
