#include "common/metrics/exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics/registry.h"
#include "gtest/gtest.h"

namespace sdc::metrics {
namespace {

struct HttpResponse {
  std::string status_line;
  std::map<std::string, std::string> headers;  // Names lower-cased.
  std::string body;
};

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

class ExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Family<Counter>& checks =
        BuildCounter().Name("sdc_checks_total").Help("Checks run.").Register(registry_);
    checks.Add({{"check", "replay"}, {"result", "ok"}}).Increment(7);
    BuildGauge().Name("sdc_store_bytes").Help("Store size.").Register(registry_).Add({}).Set(0.25);
    BuildHistogram()
        .Name("sdc_replay_duration_seconds")
        .Help("Replay duration.")
        .Register(registry_)
        .Add({}, Histogram::BucketBoundaries{0.1, 1})
        .Observe(0.5);
    absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start("127.0.0.1:0", &registry_);
    ASSERT_TRUE(exposer.ok()) << exposer.status();
    exposer_ = *std::move(exposer);
    ASSERT_GT(exposer_->port(), 0);
  }

  Registry registry_;
  std::unique_ptr<Exposer> exposer_;
};

// The exposer answers in the request's HTTP version; these tests speak 1.0 so
// the server closes the connection after one response.
TEST_F(ExposerTest, ServesMetrics) {
  absl::StatusOr<HttpResponse> response = Get(exposer_->port(), "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_line, "HTTP/1.0 200 OK");
  EXPECT_EQ(response->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  const std::string expected = registry_.Serialize();
  EXPECT_EQ(response->body, expected);
  EXPECT_EQ(response->headers["content-length"], std::to_string(expected.size()));
  // The fixture's values, so an empty registry cannot pass by accident.
  EXPECT_NE(expected.find("sdc_checks_total{check=\"replay\",result=\"ok\"} 7\n"),
            std::string::npos);
}

TEST_F(ExposerTest, ScrapeRunsCollectHooks) {
  Gauge& scrapes = BuildGauge().Name("sdc_scrapes").Register(registry_).Add({});
  registry_.AddCollectHook([&scrapes] { scrapes.Increment(); });
  absl::StatusOr<HttpResponse> response = Get(exposer_->port(), "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_NE(response->body.find("\nsdc_scrapes 1\n"), std::string::npos) << response->body;
  EXPECT_EQ(scrapes.Value(), 1.0);
}

TEST_F(ExposerTest, AnswersHttp11) {
  absl::StatusOr<std::string> raw = Exchange(
      exposer_->port(), "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->substr(0, raw->find("\r\n")), "HTTP/1.1 200 OK");
  EXPECT_EQ(raw->substr(raw->size() - 3), "ok\n");
}

TEST_F(ExposerTest, ServesHealthz) {
  absl::StatusOr<HttpResponse> response = Get(exposer_->port(), "/healthz");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_line, "HTTP/1.0 200 OK");
  EXPECT_EQ(response->body, "ok\n");
}

TEST_F(ExposerTest, UnknownPathsAndMethodsAre404) {
  for (const char* path : {"/other", "/", "/metrics/extra", "/healthzz", "/metricsx"}) {
    absl::StatusOr<HttpResponse> response = Get(exposer_->port(), path);
    ASSERT_TRUE(response.ok()) << path << ": " << response.status();
    EXPECT_EQ(response->status_line, "HTTP/1.0 404 Not Found") << path;
    EXPECT_EQ(response->body, "Error 404: Not Found\n") << path;
  }
  absl::StatusOr<std::string> post =
      Exchange(exposer_->port(), "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
  ASSERT_TRUE(post.ok()) << post.status();
  EXPECT_EQ(post->substr(0, post->find("\r\n")), "HTTP/1.0 404 Not Found");
}

TEST_F(ExposerTest, SecondExposerOnSamePortIsUnavailable) {
  const std::string address = absl::StrCat("127.0.0.1:", exposer_->port());
  absl::StatusOr<std::unique_ptr<Exposer>> second = Exposer::Start(address, &registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find(address), absl::string_view::npos) << second.status();
  EXPECT_EQ(second.status().message().find('\n'), absl::string_view::npos) << second.status();
  EXPECT_NE(second.status().message().find("Address already in use"), absl::string_view::npos)
      << second.status();
  // The first one still serves.
  absl::StatusOr<HttpResponse> response = Get(exposer_->port(), "/healthz");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "ok\n");
}

TEST_F(ExposerTest, StopClosesThePort) {
  const int port = exposer_->port();
  exposer_->Stop();
  exposer_->Stop();  // Idempotent.
  absl::StatusOr<std::string> raw = Exchange(port, "GET /healthz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(raw.status().code(), absl::StatusCode::kUnavailable) << raw.status();
}

TEST(ExposerAddressTest, InvalidAddressesAreRejected) {
  Registry registry;
  for (const char* address :
       {"nonsense", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:80x",
        "example.com:80", "[::1]:80", "[::1:80", "1.2.3:80"}) {
    absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start(address, &registry);
    ASSERT_FALSE(exposer.ok()) << address;
    EXPECT_EQ(exposer.status().code(), absl::StatusCode::kInvalidArgument) << exposer.status();
    EXPECT_NE(exposer.status().message().find(absl::StrCat("\"", address, "\"")),
              absl::string_view::npos)
        << exposer.status();
  }
}

TEST(ExposerAddressTest, NonLocalAddressIsUnavailable) {
  Registry registry;
  // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never assigned to a host.
  absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start("192.0.2.1:0", &registry);
  ASSERT_FALSE(exposer.ok());
  EXPECT_EQ(exposer.status().code(), absl::StatusCode::kUnavailable) << exposer.status();
  EXPECT_NE(exposer.status().message().find("\"192.0.2.1:0\""), absl::string_view::npos)
      << exposer.status();
}

TEST(ExposerAddressTest, LocalhostAndEmptyHostAreAccepted) {
  Registry registry;
  for (const char* address : {"localhost:0", ":0"}) {
    absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start(address, &registry);
    ASSERT_TRUE(exposer.ok()) << address << ": " << exposer.status();
    absl::StatusOr<HttpResponse> response = Get((*exposer)->port(), "/healthz");
    ASSERT_TRUE(response.ok()) << address << ": " << response.status();
    EXPECT_EQ(response->body, "ok\n");
  }
}

TEST(ExposerHealthTest, HealthDetailFollowsOkOnEveryRequest) {
  Registry registry;
  int calls = 0;
  absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start(
      "127.0.0.1:0", &registry, [&calls] { return absl::StrCat("link: up ", ++calls, "\n"); });
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  for (int i = 1; i <= 2; ++i) {
    absl::StatusOr<HttpResponse> response = Get((*exposer)->port(), "/healthz");
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status_line, "HTTP/1.0 200 OK");
    EXPECT_EQ(response->body, absl::StrCat("ok\nlink: up ", i, "\n"));
  }
}

}  // namespace
}  // namespace sdc::metrics
