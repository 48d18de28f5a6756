#include "agent/node_action.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::agent {
namespace {

using ::testing::HasSubstr;

TEST(RunNodeActionTest, NoneConfiguredSaysSo) {
  const ActionOutcome out =
      RunNodeAction({}, "replace", 7, "kubectl label node node-b ...", "node-b", absl::Seconds(5));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.detail,
            "no node-local action configured (sdc-agent --action_command); sdcd asked to replace "
            "node node-b for request 7 (kubectl label node node-b ...)");
}

TEST(RunNodeActionTest, RunsTheCommandWithoutAShell) {
  const ActionOutcome out = RunNodeAction({"echo", "{action}", "{request};", "$HOME", "{node}"},
                                          "reboot", 12, "", "node-b", absl::Seconds(5));
  EXPECT_TRUE(out.ok) << out.detail;
  // No shell: ';' and '$HOME' reach the program as written.
  EXPECT_EQ(out.detail, "echo reboot 12; $HOME node-b: ok: reboot 12; $HOME node-b");
}

TEST(RunNodeActionTest, FailuresAreOutcomes) {
  ActionOutcome out = RunNodeAction({"false"}, "replace", 1, "", "n", absl::Seconds(5));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.detail, "false: exit 1");
  out = RunNodeAction({"sleep", "10"}, "replace", 1, "", "n", absl::Milliseconds(200));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.detail, "sleep 10: timed out after 200ms");
  out = RunNodeAction({"/nonexistent/prog"}, "replace", 1, "", "n", absl::Seconds(5));
  EXPECT_FALSE(out.ok);
  EXPECT_THAT(out.detail, HasSubstr("/nonexistent/prog: "));
  out = RunNodeAction({"echo"}, "format-disk", 1, "", "n", absl::Seconds(5));
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.detail, "refusing unknown action \"format-disk\" (want replace or reboot)");
}

}  // namespace
}  // namespace sdc::agent
