#include "demo/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace sdc::demo {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// Copies `from` to `to` until either end closes, then shuts both down so
// the other direction's pump ends too.
void Pump(int from, int to) {
  char buffer[64 << 10];
  while (true) {
    const ssize_t n = recv(from, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    ssize_t off = 0;
    while (off < n) {
      // MSG_NOSIGNAL: a peer gone must not raise SIGPIPE in the process.
      const ssize_t w = send(to, buffer + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
      if (w <= 0) break;
      off += w;
    }
    if (off < n) break;
  }
  shutdown(from, SHUT_RDWR);
  shutdown(to, SHUT_RDWR);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(int target_port) {
  std::unique_ptr<TcpProxy> p(new TcpProxy());
  p->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (p->listen_fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  const int one = 1;
  setsockopt(p->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = Loopback(0);
  if (bind(p->listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(p->listen_fd_, 128) != 0) {
    return absl::InternalError(absl::StrCat("bind/listen: ", strerror(errno)));
  }
  socklen_t n = sizeof(a);
  getsockname(p->listen_fd_, reinterpret_cast<sockaddr*>(&a), &n);
  p->port_ = ntohs(a.sin_port);
  {
    absl::MutexLock lock(&p->mu_);
    p->target_ = target_port;
  }
  TcpProxy* raw = p.get();
  p->acceptor_ = std::thread([raw] { raw->AcceptLoop(); });
  return p;
}

TcpProxy::~TcpProxy() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::unique_ptr<Pair>> pairs;
  {
    absl::MutexLock lock(&mu_);
    CloseAll();
    pairs.swap(pairs_);
  }
  for (auto& p : pairs) {
    if (p->up.joinable()) p->up.join();
    if (p->down.joinable()) p->down.join();
    close(p->client);
    close(p->server);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
}

void TcpProxy::AcceptLoop() {
  while (!stop_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    int target = 0;
    {
      absl::MutexLock lock(&mu_);
      target = cut_ ? 0 : target_;
    }
    int server = -1;
    if (target > 0) {
      server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a = Loopback(target);
      if (server >= 0 && connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(server);
        server = -1;
      }
    }
    if (server < 0) {
      close(client);  // Cut, or nothing listens there: as a refused connection.
      continue;
    }
    const int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto pair = std::make_unique<Pair>();
    pair->client = client;
    pair->server = server;
    Pair* raw = pair.get();
    pair->up = std::thread([raw] {
      Pump(raw->client, raw->server);
      ++raw->done;
    });
    pair->down = std::thread([raw] {
      Pump(raw->server, raw->client);
      ++raw->done;
    });
    ++forwarded_;
    absl::MutexLock lock(&mu_);
    Reap();
    pairs_.push_back(std::move(pair));
  }
}

void TcpProxy::Reap() {
  for (auto it = pairs_.begin(); it != pairs_.end();) {
    Pair& p = **it;
    if (p.done.load() < 2) {
      ++it;
      continue;
    }
    p.up.join();
    p.down.join();
    close(p.client);
    close(p.server);
    it = pairs_.erase(it);
  }
}

void TcpProxy::CloseAll() {
  for (auto& p : pairs_) {
    shutdown(p->client, SHUT_RDWR);
    shutdown(p->server, SHUT_RDWR);
  }
}

void TcpProxy::Retarget(int target_port) {
  absl::MutexLock lock(&mu_);
  target_ = target_port;
  CloseAll();
}

void TcpProxy::Cut() {
  absl::MutexLock lock(&mu_);
  cut_ = true;
  CloseAll();
}

void TcpProxy::Restore() {
  absl::MutexLock lock(&mu_);
  cut_ = false;
}

}  // namespace sdc::demo
