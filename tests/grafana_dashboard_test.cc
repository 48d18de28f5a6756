// deploy/grafana/sdc-guard.json queries only what sdc-guard exports: a real
// sdcd and a real sdc-agent are scraped (the trainer's families are read
// from client/trainer_metrics.cc), and tests/check_dashboard.py checks
// every panel's expressions against the families they declare, parses them
// (and docs/operations.md's PromQL) with promtool, and renders the
// dashboard's Kustomize Component.

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

TEST(GrafanaDashboardTest, PanelsQueryExportedMetricsAndParse) {
  const std::string dir = TestDir("grafana-dashboard");
  absl::StatusOr<std::unique_ptr<Sdcd>> sdcd = Sdcd::Start(dir);
  ASSERT_TRUE(sdcd.ok()) << sdcd.status();
  absl::StatusOr<Process> agent = Process::Start(
      {BinaryPath("agent/sdc-agent"), absl::StrCat("--coordinator=", (*sdcd)->trainer_address()),
       "--node_name=node-a", "--metrics_listen=127.0.0.1:0"},
      dir + "/agent.log");
  ASSERT_TRUE(agent.ok()) << agent.status();
  absl::StatusOr<std::string> port_text =
      agent->WaitForLog("serving /metrics and /healthz on port ([0-9]+)");
  ASSERT_TRUE(port_text.ok()) << port_text.status();
  int agent_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*port_text, &agent_port));

  absl::StatusOr<std::string> sdcd_metrics = HttpGet((*sdcd)->metrics_port(), "/metrics");
  ASSERT_TRUE(sdcd_metrics.ok()) << sdcd_metrics.status();
  absl::StatusOr<std::string> agent_metrics = HttpGet(agent_port, "/metrics");
  ASSERT_TRUE(agent_metrics.ok()) << agent_metrics.status();
  std::ofstream(dir + "/sdcd.txt") << *sdcd_metrics;
  std::ofstream(dir + "/agent.txt") << *agent_metrics;

  const std::string script = BinaryPath("tests/check_dashboard.py");
  const std::string deploy = script.substr(0, script.rfind("/tests/")) + "/deploy";
  RunResult check = sdc::testing::Run(
      {"python3", script, deploy, BinaryPath("docs/operations.md"),
       BinaryPath("client/trainer_metrics.cc"), dir + "/check", dir + "/sdcd.txt",
       dir + "/agent.txt"},
                        {{"HOME", dir}, {"KUBECONFIG", dir + "/no-kubeconfig"}});
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("\n0 failure(s)\n"), std::string::npos) << check.output;
}

}  // namespace
}  // namespace sdc::testing
