// The plain-socket exposer over real loopback connections: what each path
// answers, collect hooks at scrape time, the listening errors.

#include "common/metrics/exposer.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/collector.h"
#include "common/metrics/test_http_client.h"
#include "gtest/gtest.h"

namespace sdc::metrics {
namespace {

using testing::Exchange;
using testing::Get;
using testing::HttpResponse;

class ExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus::Family<prometheus::Counter>& checks =
        BuildCounter().Name("sdc_checks_total").Help("Checks run.").Register(registry_);
    checks.Add({{"check", "replay"}, {"result", "ok"}}).Increment(7);
    BuildGauge().Name("sdc_store_bytes").Help("Store size.").Register(registry_).Add({}).Set(0.25);
    BuildHistogram()
        .Name("sdc_replay_duration_seconds")
        .Help("Replay duration.")
        .Register(registry_)
        .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 1})
        .Observe(0.5);
    absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start("127.0.0.1:0", &registry_);
    ASSERT_TRUE(exposer.ok()) << exposer.status();
    exposer_ = *std::move(exposer);
    ASSERT_GT(exposer_->port(), 0);
  }

  Collector registry_;
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
  prometheus::Gauge& scrapes = BuildGauge().Name("sdc_scrapes").Register(registry_).Add({});
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

TEST(ExposerAddressTest, AnAddressThatDoesNotParseIsInvalidArgument) {
  Collector registry;
  absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start("example.com:80", &registry);
  ASSERT_FALSE(exposer.ok());
  EXPECT_EQ(exposer.status().code(), absl::StatusCode::kInvalidArgument) << exposer.status();
  EXPECT_NE(exposer.status().message().find("\"example.com:80\""), absl::string_view::npos)
      << exposer.status();
}

TEST(ExposerAddressTest, NonLocalAddressIsUnavailable) {
  Collector registry;
  // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never assigned to a host.
  absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start("192.0.2.1:0", &registry);
  ASSERT_FALSE(exposer.ok());
  EXPECT_EQ(exposer.status().code(), absl::StatusCode::kUnavailable) << exposer.status();
  EXPECT_NE(exposer.status().message().find("\"192.0.2.1:0\""), absl::string_view::npos)
      << exposer.status();
}

TEST(ExposerAddressTest, LocalhostAndEmptyHostAreAccepted) {
  Collector registry;
  for (const char* address : {"localhost:0", ":0"}) {
    absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start(address, &registry);
    ASSERT_TRUE(exposer.ok()) << address << ": " << exposer.status();
    absl::StatusOr<HttpResponse> response = Get((*exposer)->port(), "/healthz");
    ASSERT_TRUE(response.ok()) << address << ": " << response.status();
    EXPECT_EQ(response->body, "ok\n");
  }
}

TEST(ExposerHealthTest, HealthDetailFollowsOkOnEveryRequest) {
  Collector registry;
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
