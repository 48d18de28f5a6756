// sdcd's exposer (prometheus-cpp's, on civetweb) over real loopback
// connections: /metrics carries the collector's families (hooks run at
// scrape time), /healthz answers ok, other paths 404, and listening errors
// carry civetweb's reason.

#include "common/metrics/pull_exposer.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/collector.h"
#include "common/metrics/test_http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::metrics {
namespace {

using ::testing::HasSubstr;
using testing::Exchange;
using testing::Get;
using testing::HttpResponse;

class PullExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BuildCounter()
        .Name("sdc_checks_total")
        .Help("Checks run.")
        .Register(*metrics_)
        .Add({{"check", "replay"}, {"result", "pass"}})
        .Increment(7);
    BuildCounter().Name("sdc_incidents_total").Help("No series yet.").Register(*metrics_);
    prometheus::Gauge& scrapes = BuildGauge().Name("sdc_scrapes").Register(*metrics_).Add({});
    metrics_->AddCollectHook([&scrapes] { scrapes.Increment(); });
    absl::StatusOr<std::unique_ptr<PullExposer>> exposer =
        PullExposer::Start("127.0.0.1:0", metrics_);
    ASSERT_TRUE(exposer.ok()) << exposer.status();
    exposer_ = *std::move(exposer);
    ASSERT_GT(exposer_->port(), 0);
  }

  std::shared_ptr<Collector> metrics_ = std::make_shared<Collector>();
  std::unique_ptr<PullExposer> exposer_;
};

TEST_F(PullExposerTest, ServesTheCollectorsFamiliesDeclaredOrNot) {
  for (int scrape = 1; scrape <= 2; ++scrape) {
    absl::StatusOr<HttpResponse> response = Get(exposer_->port(), "/metrics");
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_THAT(response->status_line, HasSubstr(" 200 OK"));
    EXPECT_THAT(response->headers["content-type"], HasSubstr("text/plain"));
    EXPECT_THAT(response->body,
                HasSubstr("# HELP sdc_checks_total Checks run.\n"
                          "# TYPE sdc_checks_total counter\n"
                          "sdc_checks_total{check=\"replay\",result=\"pass\"} 7\n"));
    EXPECT_THAT(response->body, HasSubstr("# HELP sdc_incidents_total No series yet.\n"
                                          "# TYPE sdc_incidents_total counter\n"));
    EXPECT_THAT(response->body, HasSubstr(absl::StrCat("\nsdc_scrapes ", scrape, "\n")));
    // prometheus-cpp's own series about the endpoint.
    EXPECT_THAT(response->body, HasSubstr("# TYPE exposer_scrapes_total counter\n"));
  }
}

TEST_F(PullExposerTest, HealthzIsOkAndOtherPathsAre404) {
  absl::StatusOr<HttpResponse> health = Get(exposer_->port(), "/healthz");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_THAT(health->status_line, HasSubstr(" 200 OK"));
  EXPECT_EQ(health->body, "ok\n");
  absl::StatusOr<std::string> http11 = Exchange(
      exposer_->port(), "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  ASSERT_TRUE(http11.ok()) << http11.status();
  EXPECT_EQ(http11->substr(0, http11->find("\r\n")), "HTTP/1.1 200 OK");
  EXPECT_EQ(http11->substr(http11->size() - 3), "ok\n");
  for (const char* path : {"/other", "/", "/healthzz", "/metricsx"}) {
    absl::StatusOr<HttpResponse> response = Get(exposer_->port(), path);
    ASSERT_TRUE(response.ok()) << path << ": " << response.status();
    EXPECT_THAT(response->status_line, HasSubstr(" 404 ")) << path;
  }
  absl::StatusOr<std::string> post =
      Exchange(exposer_->port(), "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
  ASSERT_TRUE(post.ok()) << post.status();
  EXPECT_NE(post->substr(0, post->find("\r\n")).find(" 404 "), std::string::npos) << *post;
}

TEST_F(PullExposerTest, ASecondExposerOnThePortIsUnavailableSayingWhy) {
  const std::string address = absl::StrCat("127.0.0.1:", exposer_->port());
  absl::StatusOr<std::unique_ptr<PullExposer>> second = PullExposer::Start(address, metrics_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(absl::StrCat("metrics address \"", address, "\": cannot listen: ")));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("Address already in use"));
  absl::StatusOr<HttpResponse> still = Get(exposer_->port(), "/healthz");
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->body, "ok\n");
}

TEST_F(PullExposerTest, StopClosesThePort) {
  const int port = exposer_->port();
  exposer_->Stop();
  exposer_->Stop();  // Idempotent.
  absl::StatusOr<std::string> raw = Exchange(port, "GET /healthz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(raw.status().code(), absl::StatusCode::kUnavailable) << raw.status();
}

TEST(PullExposerAddressTest, BadAndNonLocalAddresses) {
  auto metrics = std::make_shared<Collector>();
  absl::StatusOr<std::unique_ptr<PullExposer>> bad = PullExposer::Start("[::1]:80", metrics);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never assigned to a host.
  absl::StatusOr<std::unique_ptr<PullExposer>> remote = PullExposer::Start("192.0.2.1:0", metrics);
  ASSERT_FALSE(remote.ok());
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kUnavailable) << remote.status();
  EXPECT_THAT(std::string(remote.status().message()), HasSubstr("\"192.0.2.1:0\""));
  EXPECT_THAT(std::string(remote.status().message()), HasSubstr("Cannot assign requested address"));
}

TEST(PullExposerAddressTest, EveryInterfaceAndLocalhost) {
  auto metrics = std::make_shared<Collector>();
  for (const char* address : {"localhost:0", ":0"}) {
    absl::StatusOr<std::unique_ptr<PullExposer>> exposer = PullExposer::Start(address, metrics);
    ASSERT_TRUE(exposer.ok()) << address << ": " << exposer.status();
    absl::StatusOr<HttpResponse> response = Get((*exposer)->port(), "/healthz");
    ASSERT_TRUE(response.ok()) << address << ": " << response.status();
    EXPECT_EQ(response->body, "ok\n");
  }
}

}  // namespace
}  // namespace sdc::metrics
