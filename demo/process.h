#ifndef SDC_DEMO_PROCESS_H_
#define SDC_DEMO_PROCESS_H_

// Real processes: start a binary with arguments and a log file, wait for a
// line in its log, kill it (politely or with SIGKILL). Used by the demo
// launcher and the integration tests. Children die with their parent
// (PR_SET_PDEATHSIG) and in the destructor, unless released.

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sdc::demo {

// A directory for this test's files: $TEST_TMPDIR/<name>, created empty.
std::string TestDir(const std::string& name);

// Path of a binary built by Bazel: from runfiles when TEST_SRCDIR is set (e.g.
// "daemon/sdcd"), else next to this program's runfiles or bazel-bin.
std::string BinaryPath(const std::string& workspace_relative);

class Process {
 public:
  // Starts `argv` with stdout and stderr appended to `log_path`. `env` entries
  // are added to (or replace) the test's environment.
  // With `detached`, the child does not die with its parent.
  static absl::StatusOr<Process> Start(const std::vector<std::string>& argv,
                                       const std::string& log_path,
                                       const std::map<std::string, std::string>& env = {},
                                       bool detached = false);
  Process() = default;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  ~Process();

  pid_t pid() const { return pid_; }
  bool running();
  // SIGTERM, then SIGKILL after `grace`; returns the exit status (or -signal).
  int Stop(absl::Duration grace = absl::Seconds(10));
  // SIGKILL: a crash, as far as the process can tell.
  void Kill();
  // Lets the process outlive this object (and, if started with
  // `detached`, this program).
  void Release() { pid_ = -1; }
  // Waits until the log holds a line matching `regex` (ECMAScript) and
  // returns its first capture group (or the whole line). DeadlineExceeded
  // with the log's tail otherwise; FailedPrecondition if the process exited.
  absl::StatusOr<std::string> WaitForLog(const std::string& regex,
                                         absl::Duration timeout = absl::Seconds(30));
  // What the process wrote to its log (not what was there before it started).
  std::string Log() const;
  const std::string& log_path() const { return log_path_; }
  // User plus system CPU seconds the process used, once it has been reaped
  // (after running() said false, Stop or Kill); 0 before.
  double cpu_seconds() const { return cpu_seconds_; }

 private:
  // wait4 with `options`; true once the process has been reaped.
  bool Reap(int options);

  pid_t pid_ = -1;
  std::string log_path_;
  size_t log_offset_ = 0;
  int exit_status_ = 0;
  double cpu_seconds_ = 0;
};

// Runs a command to completion; returns exit code and combined output.
struct RunResult {
  int exit_code = -1;
  std::string output;
};
RunResult Run(const std::vector<std::string>& argv,
              const std::map<std::string, std::string>& env = {},
              absl::Duration timeout = absl::Seconds(60));

// Writes an executable shell script that appends its argv (one line, words
// separated by single spaces) to `record_path` and prints `stdout_text`.
void WriteRecordingStandIn(const std::string& path, const std::string& record_path,
                           const std::string& stdout_text = "", int exit_code = 0);

std::string ReadFile(const std::string& path);

// A minimal HTTP/1.0 GET against 127.0.0.1:port; returns the body, or an
// error with the status line.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// A loopback TCP port that was free a moment ago (bound to port 0, read,
// released): for a server that must be told its port.
int FreeLoopbackPort();

}  // namespace sdc::demo

#endif  // SDC_DEMO_PROCESS_H_
