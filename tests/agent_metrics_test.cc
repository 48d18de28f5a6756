// sdc-agent --metrics_listen: a real agent (relaying on a unix socket, CPU
// diagnostics) and a real sdcd; /metrics and /healthz scraped over HTTP as
// Prometheus and the kubelet's probes do, and their values follow what the
// agent does: registration, heartbeats, relayed rank streams, a diagnostic,
// and the loss of sdcd.

#include <stdlib.h>

#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::HasSubstr;

// The value of the sample named exactly `series` (name plus rendered labels)
// in an exposition; -1 when absent.
double Sample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

class AgentMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir_);
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
    char socket_dir[] = "/tmp/sdc-agent-metrics-XXXXXX";  // Unix paths: <= 107 characters.
    ASSERT_NE(mkdtemp(socket_dir), nullptr);
    socket_dir_ = socket_dir;
    absl::StatusOr<Process> agent = Process::Start(
        {BinaryPath("agent/sdc-agent"), absl::StrCat("--coordinator=", sdcd_->agent_address()),
         "--node_name=node-a", "--heartbeat=1s", "--metrics_listen=127.0.0.1:0",
         absl::StrCat("--relay_listen=", relay())},
        dir_ + "/agent.log");
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::make_unique<Process>(*std::move(agent));
    absl::StatusOr<std::string> port = agent_->WaitForLog("serving /metrics and /healthz on port ([0-9]+)");
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_TRUE(absl::SimpleAtoi(*port, &port_));
    ASSERT_TRUE(agent_->WaitForLog("registered with sdcd .*").ok()) << agent_->Log();
  }

  void TearDown() override {
    agent_.reset();
    sdc::testing::Run({"rm", "-rf", socket_dir_});
  }

  std::string relay() const { return "unix:" + socket_dir_ + "/relay.sock"; }

  std::string Scrape() {
    absl::StatusOr<std::string> body = HttpGet(port_, "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    return body.ok() ? *body : "";
  }

  // Scrapes until `series` has `value` (bounded: 15 s); returns the last value.
  double WaitFor(const std::string& series, double value) {
    double seen = -1;
    for (int i = 0; i < 150; ++i) {
      seen = Sample(Scrape(), series);
      if (seen == value) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return seen;
  }

  std::string dir_, socket_dir_;
  int port_ = 0;
  std::unique_ptr<Sdcd> sdcd_;
  std::unique_ptr<Process> agent_;
};

TEST_F(AgentMetricsTest, MetricsFollowTheLinkTheRelayAndDiagnostics) {
  std::string body = Scrape();
  EXPECT_THAT(body, HasSubstr("# TYPE sdc_agent_link_up gauge\n"));
  EXPECT_THAT(body, HasSubstr("# TYPE sdc_agent_heartbeats_sent_total counter\n"));
  EXPECT_THAT(body, HasSubstr("sdc_agent_build_info{version=\""));
  EXPECT_EQ(Sample(body, "sdc_agent_link_up"), 1);
  EXPECT_EQ(Sample(body, "sdc_agent_link_reconnects_total"), 0);
  EXPECT_EQ(Sample(body, "sdc_agent_relay_streams"), 0);
  EXPECT_EQ(Sample(body, "sdc_agent_relay_streams_total"), 0);
  EXPECT_EQ(Sample(body, "sdc_agent_diagnostics_total{result=\"pass\"}"), 0);
  const double heartbeats = Sample(body, "sdc_agent_heartbeats_sent_total");
  EXPECT_GE(heartbeats, 0);

  absl::StatusOr<std::string> health = HttpGet(port_, "/healthz");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "ok\nlink: up\n");

  // Six ranks on three nodes, all through this agent's relay.
  absl::StatusOr<Ranks> ranks = ConnectRanks(relay(), "job-agent-metrics", 6, 2, {"w"});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  body = Scrape();
  EXPECT_EQ(Sample(body, "sdc_agent_relay_streams"), 6);
  EXPECT_EQ(Sample(body, "sdc_agent_relay_streams_total"), 6);
  // Heartbeats every second.
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_GE(Sample(Scrape(), "sdc_agent_heartbeats_sent_total"), heartbeats + 2);

  // A CPU diagnostic on this node: one device, one pass.
  RunResult diagnose = sdcd_->Sdcctl({"diagnose", "node", "node-a", "--size", "64"});
  ASSERT_EQ(diagnose.exit_code, 0) << diagnose.output;
  EXPECT_EQ(WaitFor("sdc_agent_diagnostics_total{result=\"pass\"}", 1), 1);
  body = Scrape();
  EXPECT_EQ(Sample(body, "sdc_agent_diagnostics_total{result=\"fail\"}"), 0);
  EXPECT_EQ(Sample(body, "sdc_agent_diagnostics_total{result=\"error\"}"), 0);

  ranks->clear();
  EXPECT_EQ(WaitFor("sdc_agent_relay_streams", 0), 0);
  EXPECT_EQ(Sample(Scrape(), "sdc_agent_relay_streams_total"), 6);

  // sdcd goes away: the agent still runs (200) and says its link is down.
  sdcd_->process().Kill();
  EXPECT_EQ(WaitFor("sdc_agent_link_up", 0), 0);
  health = HttpGet(port_, "/healthz");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "ok\nlink: down\n");
  bool reconnected = false;
  for (int i = 0; i < 100 && !reconnected; ++i) {
    reconnected = Sample(Scrape(), "sdc_agent_link_reconnects_total") >= 1;
    if (!reconnected) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(reconnected) << Scrape();
}

TEST(AgentMetricsFlagTest, AnUnusableAddressStopsTheAgentWithTheFlagNamed) {
  RunResult r = sdc::testing::Run({BinaryPath("agent/sdc-agent"), "--coordinator=127.0.0.1:1",
                                   "--node_name=n", "--metrics_listen=nonsense"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--metrics_listen: metrics address \"nonsense\": no port"));
}

}  // namespace
}  // namespace sdc::testing
