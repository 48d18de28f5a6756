#ifndef SDC_COMMON_SUBPROCESS_H_
#define SDC_COMMON_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace sdc::common {

struct CommandResult {
  bool started = false;    // False: the program could not be run (see output).
  bool timed_out = false;  // Killed at the deadline.
  int exit_code = -1;      // When it exited normally.
  int signal = 0;          // The signal that ended it, when one did (not at a timeout).
  std::string output;      // stdout and stderr, interleaved, at most 64 KiB.
  bool ok() const { return started && !timed_out && exit_code == 0; }
};

// Runs argv[0] (searched on PATH) with `argv`, no shell, stdin from
// /dev/null, and kills its process group at `timeout`. Thread-safe.
CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout);

}  // namespace sdc::common

#endif  // SDC_COMMON_SUBPROCESS_H_
