#include "demo/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace sdc::demo {

std::string TestDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base ? base : "/tmp", "/", name);
  Run({"rm", "-rf", dir});
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string BinaryPath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && workspace != nullptr) {
    return absl::StrCat(srcdir, "/", workspace, "/", workspace_relative);
  }
  // A binary run from bazel-bin finds its siblings through its runfiles.
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    const std::string exe(self, n);
    const std::string runfiles = absl::StrCat(exe, ".runfiles/sdc_guard/", workspace_relative);
    if (access(runfiles.c_str(), X_OK) == 0) return runfiles;
  }
  return workspace_relative;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

namespace {

std::vector<std::string> Environment(const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : merged) out.push_back(k + "=" + v);
  return out;
}

pid_t Spawn(const std::vector<std::string>& argv, int out_fd,
            const std::map<std::string, std::string>& env, bool detached = false) {
  std::vector<std::string> envs = Environment(env);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    if (detached) {
      setsid();
    } else {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      setpgid(0, 0);
    }
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    execvpe(args[0], args.data(), envp.data());
    dprintf(2, "exec %s failed\n", args[0]);
    _exit(127);
  }
  return pid;
}

}  // namespace

absl::StatusOr<Process> Process::Start(const std::vector<std::string>& argv,
                                       const std::string& log_path,
                                       const std::map<std::string, std::string>& env,
                                       bool detached) {
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path));
  Process p;
  p.log_path_ = log_path;
  p.log_offset_ = ReadFile(log_path).size();
  p.pid_ = Spawn(argv, fd, env, detached);
  close(fd);
  if (p.pid_ < 0) return absl::InternalError("fork failed");
  return p;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0) Kill();
    pid_ = other.pid_;
    log_path_ = std::move(other.log_path_);
    log_offset_ = other.log_offset_;
    exit_status_ = other.exit_status_;
    cpu_seconds_ = other.cpu_seconds_;
    other.pid_ = -1;
  }
  return *this;
}

Process::~Process() {
  if (pid_ > 0) Kill();
}

bool Process::Reap(int options) {
  int status = 0;
  rusage usage{};
  if (wait4(pid_, &status, options, &usage) != pid_) return false;
  exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  cpu_seconds_ = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec * 1e-6;
  pid_ = -1;
  return true;
}

bool Process::running() {
  if (pid_ <= 0) return false;
  return !Reap(WNOHANG);
}

int Process::Stop(absl::Duration grace) {
  if (!running()) return exit_status_;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (!running()) return exit_status_;
    absl::SleepFor(absl::Milliseconds(20));
  }
  Kill();
  return exit_status_;
}

void Process::Kill() {
  if (pid_ <= 0) return;
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  Reap(0);
}

std::string Process::Log() const {
  const std::string all = ReadFile(log_path_);
  return all.size() >= log_offset_ ? all.substr(log_offset_) : all;
}

absl::StatusOr<std::string> Process::WaitForLog(const std::string& regex,
                                                absl::Duration timeout) {
  const std::regex re(regex);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::istringstream lines(Log());
    std::string line;
    while (std::getline(lines, line)) {
      std::smatch m;
      if (std::regex_search(line, m, re)) return m.size() > 1 ? m[1].str() : line;
    }
    if (!running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("process exited (", exit_status_, ") before logging /", regex,
                       "/; log:\n", Log()));
    }
    if (absl::Now() > deadline) {
      std::string log = Log();
      if (log.size() > 4000) log = log.substr(log.size() - 4000);
      return absl::DeadlineExceededError(
          absl::StrCat("no log line matched /", regex, "/; log tail:\n", log));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

RunResult Run(const std::vector<std::string>& argv,
              const std::map<std::string, std::string>& env, absl::Duration timeout) {
  char path[] = "/tmp/sdc-run-XXXXXX";
  const int fd = mkstemp(path);
  RunResult r;
  if (fd < 0) return r;
  const pid_t pid = Spawn(argv, fd, env);
  close(fd);
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (absl::Now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.output = "timed out\n";
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  r.output += ReadFile(path);
  unlink(path);
  return r;
}

void WriteRecordingStandIn(const std::string& path, const std::string& record_path,
                           const std::string& stdout_text, int exit_code) {
  std::ofstream out(path);
  out << "#!/bin/sh\n"
      << "# A recording stand-in: notes its arguments, answers like the real tool.\n"
      << "echo \"$(basename \"$0\") $*\" >> '" << record_path << "'\n";
  if (!stdout_text.empty()) out << "cat <<'SDC_EOF'\n" << stdout_text << "\nSDC_EOF\n";
  out << "exit " << exit_code << "\n";
  out.close();
  chmod(path.c_str(), 0755);
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to port ", port));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) return absl::DataLossError("no HTTP header");
  const std::string status = response.substr(0, response.find("\r\n"));
  if (status.find(" 200 ") == std::string::npos) return absl::UnavailableError(status);
  return response.substr(header_end + 4);
}

}  // namespace sdc::demo
