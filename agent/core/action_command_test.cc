#include "agent/core/action_command.h"

#include "gtest/gtest.h"

namespace sdc::agent::core {
namespace {

using Words = std::vector<std::string>;

TEST(ActionCommandTest, ParsesAndExpands) {
  absl::StatusOr<Words> words =
      ParseActionTemplate("  /usr/local/bin/node-action  --what={action}  {request} {node} ");
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(*words, (Words{"/usr/local/bin/node-action", "--what={action}", "{request}", "{node}"}));
  absl::StatusOr<Words> argv = ExpandAction(*words, "reboot", 12, "node-b");
  ASSERT_TRUE(argv.ok());
  EXPECT_EQ(*argv, (Words{"/usr/local/bin/node-action", "--what=reboot", "12", "node-b"}));
}

TEST(ActionCommandTest, EmptyTemplateMeansNone) {
  absl::StatusOr<Words> words = ParseActionTemplate("   ");
  ASSERT_TRUE(words.ok());
  EXPECT_TRUE(words->empty());
}

TEST(ActionCommandTest, RefusesUnknownPlaceholdersAndActions) {
  EXPECT_EQ(ParseActionTemplate("prog {acton}").status().message(),
            "unknown placeholder \"{acton}\" (known: {action}, {request}, {node})");
  EXPECT_EQ(ParseActionTemplate("prog {action").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Words> argv = ExpandAction({"prog", "{action}"}, "replace; rm -rf /", 1, "n");
  EXPECT_EQ(argv.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(argv.status().message(),
            "refusing unknown action \"replace; rm -rf /\" (want replace or reboot)");
}

}  // namespace
}  // namespace sdc::agent::core
