#include "common/metrics/exposer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics/listen_address.h"
#include "prometheus/text_serializer.h"

namespace sdc::metrics {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A request head larger than this is refused (scrapes and probes send a few
// hundred bytes).
constexpr size_t kMaxRequestBytes = 16 << 10;
// A client gets this long to send its request and take the response.
constexpr int kIoTimeoutSeconds = 10;
// Connections served at once; more are closed unanswered.
constexpr int kMaxConnections = 16;

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string Response(const std::string& version, const char* status, const char* content_type,
                     const std::string& body) {
  return absl::StrCat(version, " ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Start(
    const std::string& address, const prometheus::Collectable* metrics,
    std::function<std::string()> health_detail) {
  absl::StatusOr<ListenAddress> parsed = ParseListenAddress(address);
  if (!parsed.ok()) return parsed.status();
  const auto unavailable = [&address](const std::string& why) {
    return absl::UnavailableError(
        absl::StrCat("metrics address \"", address, "\": cannot listen: ", why));
  };
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return unavailable(std::strerror(errno));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, parsed->host.c_str(), &addr.sin_addr);  // Parsed: a valid literal.
  addr.sin_port = htons(parsed->port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return unavailable(why);
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return unavailable(why);
  }
  auto exposer = std::unique_ptr<Exposer>(new Exposer());
  exposer->port_ = ntohs(addr.sin_port);
  exposer->metrics_ = metrics;
  exposer->health_detail_ = std::move(health_detail);
  exposer->listen_fd_ = fd;
  exposer->wake_read_fd_ = wake[0];
  exposer->wake_write_fd_ = wake[1];
  Exposer* self = exposer.get();
  exposer->accept_thread_ = std::thread([self] { self->AcceptLoop(); });
  return exposer;
}

Exposer::~Exposer() { Stop(); }

void Exposer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  const char byte = 0;
  (void)!write(wake_write_fd_, &byte, 1);
  accept_thread_.join();
  // Connections in flight end within kIoTimeoutSeconds.
  for (Worker& w : workers_) w.thread.join();
  workers_.clear();
  close(listen_fd_);
  close(wake_read_fd_);
  close(wake_write_fd_);
}

void Exposer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    if (workers_.size() >= kMaxConnections) {
      close(conn);
      continue;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers_.push_back({std::thread([this, conn, done] {
                          Serve(conn);
                          close(conn);
                          done->store(true);
                        }),
                        done});
  }
}

void Exposer::Serve(int fd) {
  timeval timeout{kIoTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() > kMaxRequestBytes) return;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  // "GET /metrics HTTP/1.1"
  const std::string line = request.substr(0, request.find("\r\n"));
  const std::vector<std::string> words = absl::StrSplit(line, ' ');
  if (words.size() != 3 || !absl::StartsWith(words[2], "HTTP/1.")) {
    SendAll(fd, Response("HTTP/1.1", "400 Bad Request", "text/plain; charset=utf-8",
                         "Error 400: Bad Request\n"));
    return;
  }
  const std::string& version = words[2];
  // The path without a query string.
  const std::string path = words[1].substr(0, words[1].find('?'));
  if (words[0] == "GET" && path == "/metrics") {
    const std::string text = prometheus::TextSerializer().Serialize(metrics_->Collect());
    SendAll(fd, Response(version, "200 OK", kMetricsContentType, text));
  } else if (words[0] == "GET" && path == "/healthz") {
    SendAll(fd, Response(version, "200 OK", "text/plain; charset=utf-8",
                         health_detail_ ? "ok\n" + health_detail_() : std::string("ok\n")));
  } else {
    SendAll(fd, Response(version, "404 Not Found", "text/plain; charset=utf-8",
                         "Error 404: Not Found\n"));
  }
}

}  // namespace sdc::metrics
