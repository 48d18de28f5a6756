#include "common/metrics/test_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sdc::metrics::testing {

// Sends `request` verbatim to 127.0.0.1:`port` and reads until the server
// closes. Every socket call is bounded by a 5 s timeout.
absl::StatusOr<std::string> Exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int error = errno;
    close(fd);
    return error == ECONNREFUSED
               ? absl::UnavailableError("connection refused")
               : absl::InternalError(absl::StrCat("connect: ", std::strerror(error)));
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return absl::InternalError(absl::StrCat("send: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      close(fd);
      return absl::InternalError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

absl::StatusOr<HttpResponse> Get(int port, const std::string& path) {
  absl::StatusOr<std::string> raw = Exchange(port, "GET " + path + " HTTP/1.0\r\n\r\n");
  if (!raw.ok()) return raw.status();
  const size_t end_of_head = raw->find("\r\n\r\n");
  if (end_of_head == std::string::npos) {
    return absl::InternalError("response without a blank line: " + *raw);
  }
  HttpResponse response;
  response.body = raw->substr(end_of_head + 4);
  bool first = true;
  for (absl::string_view line : absl::StrSplit(raw->substr(0, end_of_head), "\r\n")) {
    if (first) {
      response.status_line = std::string(line);
      first = false;
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) return absl::InternalError("bad header line");
    response.headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return response;
}

}  // namespace sdc::metrics::testing
