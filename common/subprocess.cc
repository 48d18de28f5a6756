#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sdc::common {

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  CommandResult result;
  if (argv.empty()) {
    result.output = "empty command";
    return result;
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    result.output = absl::StrCat("pipe: ", strerror(errno));
    return result;
  }
  // The exec error, if any, comes back through this pipe.
  int err_fds[2];
  if (pipe2(err_fds, O_CLOEXEC) != 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    result.output = absl::StrCat("pipe: ", strerror(errno));
    return result;
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    result.output = absl::StrCat("fork: ", strerror(errno));
    return result;
  }
  if (pid == 0) {
    setpgid(0, 0);
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(pipe_fds[1], 1);
    dup2(pipe_fds[1], 2);
    execvp(args[0], args.data());
    const int e = errno;
    (void)!write(err_fds[1], &e, sizeof(e));
    _exit(127);
  }
  close(pipe_fds[1]);
  close(err_fds[1]);
  int exec_errno = 0;
  if (read(err_fds[0], &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno)) {
    close(err_fds[0]);
    close(pipe_fds[0]);
    waitpid(pid, nullptr, 0);
    result.output = absl::StrCat("cannot run ", argv[0], ": ", strerror(exec_errno));
    return result;
  }
  close(err_fds[0]);
  result.started = true;
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (true) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    const ssize_t got = read(pipe_fds[0], buf, sizeof(buf));
    if (got <= 0) break;  // EOF: the program closed its output.
    if (result.output.size() < (64u << 10)) result.output.append(buf, got);
  }
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!result.timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (!result.timed_out && WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

}  // namespace sdc::common
