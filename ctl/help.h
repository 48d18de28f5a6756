#ifndef SDC_CTL_HELP_H_
#define SDC_CTL_HELP_H_

// sdcctl's help, derived from the tables of commands, flags and resources
// (ctl/command.h, ctl/resources.h): what `sdcctl --help`, `sdcctl help
// COMMAND` and `sdcctl COMMAND --help` print, and the usage line of errors.

#include <string>
#include <vector>

#include "ctl/command.h"

namespace sdc::sdcctl {

// One command's usage without "sdcctl ": its words, arguments and flags,
// optional ones in brackets: "approve ID --reason=TEXT [--dry-run] [--force]".
std::string Synopsis(const Command& command);

// The whole usage: every command, the labels -l matches, the global and
// command flags, the config file and the exit codes.
std::string Usage();

// The usage of the command `words` name ("approve", "get requests"), or of
// every command starting with the first word ("get", "operator"); Usage()
// when they name none.
std::string Help(const std::vector<std::string>& words);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_HELP_H_
