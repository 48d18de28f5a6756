#include "common/subprocess.h"

#include <signal.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::common {
namespace {

using ::testing::HasSubstr;

TEST(RunCommandTest, ExitCodeAndBothStreams) {
  const CommandResult r =
      RunCommand({"sh", "-c", "echo out; echo err >&2; exit 3"}, absl::Seconds(10));
  EXPECT_TRUE(r.started);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_THAT(r.output, HasSubstr("out\n"));
  EXPECT_THAT(r.output, HasSubstr("err\n"));
  EXPECT_FALSE(r.ok());
}

TEST(RunCommandTest, SuccessReadsNoStdin) {
  // stdin is /dev/null: cat ends at once instead of waiting for input.
  const CommandResult r = RunCommand({"cat"}, absl::Seconds(10));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "");
}

TEST(RunCommandTest, NoShellExpansion) {
  const CommandResult r = RunCommand({"echo", "$HOME", "a;b"}, absl::Seconds(10));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.output, "$HOME a;b\n");
}

TEST(RunCommandTest, ProgramThatCannotRun) {
  const CommandResult missing = RunCommand({"/nonexistent/sdc-program"}, absl::Seconds(10));
  EXPECT_FALSE(missing.started);
  EXPECT_FALSE(missing.ok());
  EXPECT_EQ(missing.output, "cannot run /nonexistent/sdc-program: No such file or directory");
  const CommandResult empty = RunCommand({}, absl::Seconds(10));
  EXPECT_FALSE(empty.started);
  EXPECT_EQ(empty.output, "empty command");
}

TEST(RunCommandTest, EndedBySignal) {
  const CommandResult r = RunCommand({"sh", "-c", "kill -TERM $$"}, absl::Seconds(10));
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_FALSE(r.ok());
}

TEST(RunCommandTest, KilledWithItsChildrenAtTheDeadline) {
  // The background sleep holds the output pipe open: only killing the whole
  // process group lets RunCommand return.
  const absl::Time start = absl::Now();
  const CommandResult r =
      RunCommand({"sh", "-c", "sleep 30 & sleep 30"}, absl::Milliseconds(200));
  EXPECT_TRUE(r.started);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.signal, 0);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace sdc::common
