#ifndef SDC_CTL_COMMAND_H_
#define SDC_CTL_COMMAND_H_

// sdcctl's command line as data: the table of commands (their words,
// arguments, flags, help text and what runs them) and the table of flags.
// Parsing (ctl/command_line.h), per-command help (ctl/help.h) and the shell
// completion scripts (ctl/completion.h) are all derived from these two
// tables; adding a command or a flag is adding an entry.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ctl/argument.h"

namespace sdc::sdcctl {

struct Config;
class Resource;
class Session;

// What a command does, given its resolved Config and connection. Returns
// the exit code.
using Handler = int (*)(Session& session);

// One flag. Global flags are accepted by every command; a command flag only
// by the commands whose entry lists it.
struct Flag {
  // As help writes it: "dry-run", "token_file". On the line "-" and "_" are
  // alike, and one or two leading dashes.
  std::string name;
  char short_name = 0;  // 'o' for -o X, -oX, -o=X; 0 for none.
  // The value's placeholder, "FORMAT"; "" for a boolean flag (bare: true;
  // also --flag=true|false).
  std::string value;
  std::vector<std::string> choices;  // Offered by completion; `set` checks.
  std::string help;                  // Lines after the first are indented.
  bool global = false;
  // Applies the value to the Config: InvalidArgument naming the flag for a
  // bad value.
  absl::Status (*set)(absl::string_view value, Config* config) = nullptr;

  bool is_bool() const { return value.empty(); }
  // "--name=VALUE", "--name", or with a short name "-o FORMAT", "-w".
  std::string Form() const;
};

// One word of a command's name, and the other spellings it accepts.
struct Word {
  std::string name;                  // "operator"
  std::vector<std::string> aliases;  // "operators"
  bool Is(absl::string_view word) const;
};

// A command flag a command takes.
struct FlagUse {
  std::string flag;  // A Flag's name.
  // Empty: optional. Otherwise the flag must be given with a non-blank
  // value, and this is the error when it is not.
  std::string required = "";
  // Taken only without the command's optional argument (get's list flags do
  // not apply to `get requests ID`).
  bool list_only = false;
};

// What the command needs before it runs.
enum class Needs {
  kNothing,  // No config file, no server (help, completion).
  kConfig,   // The config file; the handler connects if it wants (version).
  kServer,   // A credential and a connection to sdcd, made before it runs.
};

struct Command {
  std::vector<Word> path;      // The words that name it: "operator add".
  std::vector<Argument> args;  // After the path.
  std::vector<FlagUse> flags;  // The command flags it takes.
  std::string summary;         // One line, for sdcctl --help.
  std::string help;            // More, for sdcctl COMMAND --help ("" none).
  Handler run = nullptr;
  Needs needs = Needs::kServer;
  absl::Duration timeout = absl::Seconds(10);  // Deadline unless --timeout.
  const Resource* resource = nullptr;          // get and describe: the kind.

  // The path's canonical words: "operator add".
  std::string Name() const;
  // The entry for `flag` in `flags`; nullptr if the command does not take it.
  const FlagUse* Uses(absl::string_view flag) const;
};

// Every command, in the order help lists them (get and describe once per
// resource, from the table of resources). Built once; thread-safe.
const std::vector<Command>& Commands();

// Every flag, globals first, in the order help lists them.
const std::vector<Flag>& Flags();

// The flag `name` names ("dry_run", "dry-run", "o"); nullptr for none.
const Flag* FindFlag(absl::string_view name);

// Flags that no longer exist, and what to say when one is given.
const std::string* RemovedFlag(absl::string_view name);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_COMMAND_H_
