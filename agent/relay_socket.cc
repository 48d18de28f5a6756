#include "agent/relay_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/log.h"
#include "grpcpp/server_posix.h"

namespace sdc::agent {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RelaySocket>> RelaySocket::Listen(const std::string& path,
                                                                 std::set<uid_t> allowed_uids,
                                                                 gid_t gid) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad socket path '", path, "'"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket for", path);
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket"));
    }
    unlink(path.c_str());  // A previous agent's.
  }
  // Created 0660 from the start: no moment in which anyone else may connect.
  const mode_t before = umask(0117);
  const int bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(before);
  if (bound != 0) {
    const absl::Status s = Errno("bind", path);
    close(fd);
    return s;
  }
  if (gid != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    const absl::Status s = Errno(absl::StrCat("chown to group ", gid), path);
    close(fd);
    unlink(path.c_str());
    return s;
  }
  if (chmod(path.c_str(), 0660) != 0 || listen(fd, 256) != 0) {
    const absl::Status s = Errno("listen on", path);
    close(fd);
    unlink(path.c_str());
    return s;
  }
  return std::unique_ptr<RelaySocket>(new RelaySocket(path, fd, std::move(allowed_uids)));
}

RelaySocket::~RelaySocket() { Stop(); }

void RelaySocket::Serve(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void RelaySocket::AcceptLoop(grpc::Server* server) {
  while (!stopping_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;  // Looks at stopping_ five times a second.
    // Non-blocking: gRPC's poller reads it (a blocking fd stalls the server).
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) continue;
    ucred peer{};
    socklen_t len = sizeof(peer);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 ||
        allowed_.count(peer.uid) == 0) {
      ++refused_;
      Log(absl::StrCat("relay: refused a connection from uid ", peer.uid, " (pid ", peer.pid,
                       "): not in --relay_allowed_uids (", absl::StrJoin(allowed_, ","), ")"));
      close(conn);
      continue;
    }
    grpc::AddInsecureChannelFromFd(server, conn);  // gRPC owns it now.
  }
}

void RelaySocket::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  close(fd_);
  unlink(path_.c_str());
}

}  // namespace sdc::agent
