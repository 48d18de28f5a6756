#ifndef SDC_CTL_COMMAND_LINE_H_
#define SDC_CTL_COMMAND_LINE_H_

// argv into words and flags, and words into a command of the table
// (ctl/command.h). Nothing here knows a particular command or flag.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ctl/command.h"

namespace sdc::sdcctl {

// argv once flags are taken out.
struct CommandLine {
  std::vector<std::string> words;  // Everything not a flag, in order.
  // The flags, in order (a later one wins), with their values as given
  // ("true" for a bare boolean flag).
  std::vector<std::pair<const Flag*, std::string>> flags;
  bool help = false;     // -h, --help.
  bool version = false;  // --version.

  // The value the line gives `flag` (the last one); nullptr if not named.
  const std::string* Value(absl::string_view flag) const;
};

// Takes every flag on the line, wherever it is: "--name=V", "--name V",
// "-name=V" and for short names "-o V", "-oV", "-o=V"; "--" ends the flags.
// InvalidArgument for an unknown or removed flag, a value missing, or a
// boolean flag's value that is not true or false. argv[0] is the program.
absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& argv);

// The command the words name, and its arguments.
struct Match {
  const Command* command = nullptr;
  std::vector<std::string> args;  // Parsed by the command's Arguments.
};

// The longest command path the words start with; the path's last word may
// be written "WORD/ARG" ("describe node/node-b", as -o name prints).
// InvalidArgument with the usage for unknown words or the wrong number or
// kind of arguments.
absl::StatusOr<Match> MatchCommand(const std::vector<std::string>& words);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_COMMAND_LINE_H_
