// sdcd's /metrics: the exposition passes `promtool check metrics`, and a real
// Prometheus server (Debian's prometheus package) scrapes it and answers
// queries with the expected series and values.

#include <fstream>
#include <memory>
#include <regex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs a little workload: 6 ranks, 20 clean steps, a weight check at step
// 10 where rank 4 differs.
// The ranks stay connected while the caller holds them.
std::vector<std::unique_ptr<ScriptedRank>> Workload(Sdcd& sdcd) {
  absl::StatusOr<testing::Ranks> connected =
      testing::ConnectRanks(sdcd.trainer_address(), "job-m", 6, 2, {"a", "b"});
  EXPECT_TRUE(connected.ok()) << connected.status();
  if (!connected.ok()) return {};
  std::vector<std::unique_ptr<ScriptedRank>> ranks = *std::move(connected);
  std::vector<uint64_t> last(6);
  for (core::Step s = 1; s <= 20; ++s) {
    for (core::Rank r = 0; r < 6; ++r) {
      last[r] = ranks[r]->Send(s, core::StepReport{0, 0, 1.0, 3, s != 7, s == 7 ? "test" : "", false});
    }
  }
  for (core::Rank r = 0; r < 6; ++r) {
    core::WeightReport w;
    w.tensors = {{8, 1, 1}, {8, 2, r == 4 ? 5u : 2u}};
    w.digest = r == 4 ? 2 : 1;
    last[r] = ranks[r]->Send(10, w);
  }
  for (core::Rank r = 0; r < 6; ++r) EXPECT_TRUE(ranks[r]->WaitAcked(last[r]).ok());
  return ranks;
}

TEST(SdcdMetricsTest, ExpositionPassesPromtool) {
  const std::string dir = TestDir("metrics-promtool");
  absl::StatusOr<std::unique_ptr<Sdcd>> sdcd = Sdcd::Start(dir);
  ASSERT_TRUE(sdcd.ok()) << sdcd.status();
  auto ranks = Workload(**sdcd);
  absl::StatusOr<std::string> body = HttpGet((*sdcd)->metrics_port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("sdc_reports_total{kind=\"step\"} 120"));
  EXPECT_THAT(*body, HasSubstr("sdc_reports_total{kind=\"weights\"} 6"));
  EXPECT_THAT(*body, HasSubstr("sdc_checks_total{check=\"weights\",result=\"minority\"} 1"));
  EXPECT_THAT(*body, HasSubstr("sdc_steps_skipped_total 1"));
  // Enum label values are lower_snake; every state and status is listed.
  EXPECT_THAT(*body, HasSubstr("sdc_replacement_requests{state=\"pending\"} 1"));
  EXPECT_THAT(*body, HasSubstr("sdc_replacement_requests{state=\"done\"} 0"));
  EXPECT_THAT(*body, HasSubstr("sdc_agent_nodes{status=\"disconnected\"} 0"));
  EXPECT_THAT(*body, HasSubstr("# TYPE sdc_store_commits_total counter\n"));
  EXPECT_THAT(*body, Not(HasSubstr("sdc_store_commits ")));
  // Rank 4 (node-c, GPU-4) is attributed by the weight check: per-GPU series
  // carry job, node and GPU UUID for joins with DCGM.
  EXPECT_THAT(*body, HasSubstr("# TYPE sdc_gpu_incidents_total counter\n"));
  EXPECT_THAT(*body, HasSubstr("sdc_gpu_incidents_total{check=\"weights\",gpu=\"GPU-4\","
                               "job=\"job-m\",node=\"node-c\"} 1\n"));
  EXPECT_THAT(*body, Not(HasSubstr("sdc_gpu_incidents_total{check=\"weights\",gpu=\"GPU-3\"")));
  EXPECT_THAT(*body,
              HasSubstr("sdc_node_replacement_requests{node=\"node-c\",state=\"pending\"} 1\n"));
  EXPECT_THAT(*body, HasSubstr("sdc_attached_ranks 6"));
  EXPECT_THAT(*body, HasSubstr("sdc_build_info{"));
  EXPECT_THAT(*body, HasSubstr("sdc_store_settling_reports "));
  // The decided checks' reports leave the database once sdcd is idle.
  {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    absl::StatusOr<std::string> now = body;
    while (now.ok() && !absl::StrContains(*now, "\nsdc_store_settling_reports 0\n") &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
      now = HttpGet((*sdcd)->metrics_port(), "/metrics");
    }
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_THAT(*now, HasSubstr("\nsdc_store_settling_reports 0\n"));
    // Every check of the workload is decided: nothing of it is left.
    RunResult rows = testing::Run(
        {"sqlite3", "-readonly", (*sdcd)->db(),
         "SELECT COUNT(*) FROM report_log; SELECT COUNT(*) FROM dropped_reports; "
         "SELECT COUNT(*) FROM pending_reports; SELECT COUNT(*) FROM decided_checks;"});
    EXPECT_EQ(rows.exit_code, 0) << rows.output;
    EXPECT_EQ(rows.output, "0\n0\n0\n0\n");
  }
  std::ofstream(dir + "/metrics.txt") << *body;
  RunResult check = testing::Run({"sh", "-c", absl::StrCat("promtool check metrics < ", dir, "/metrics.txt")});
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_EQ(check.output, "") << "promtool lint findings";
}

TEST(SdcdMetricsTest, RealPrometheusScrapesAndQueries) {
  const std::string dir = TestDir("metrics-prometheus");
  absl::StatusOr<std::unique_ptr<Sdcd>> sdcd = Sdcd::Start(dir);
  ASSERT_TRUE(sdcd.ok()) << sdcd.status();
  auto ranks = Workload(**sdcd);
  const int prom_port = demo::FreeLoopbackPort();
  std::ofstream(dir + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: sdcd\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << (*sdcd)->metrics_port() << "']\n";
  absl::StatusOr<Process> prom = Process::Start(
      {"prometheus", absl::StrCat("--config.file=", dir, "/prometheus.yml"),
       absl::StrCat("--storage.tsdb.path=", dir, "/tsdb"),
       absl::StrCat("--web.listen-address=127.0.0.1:", prom_port)},
      dir + "/prometheus.log");
  ASSERT_TRUE(prom.ok());
  auto query = [&](const std::string& q) -> std::string {
    absl::StatusOr<std::string> r = HttpGet(prom_port, "/api/v1/query?query=" + q);
    if (!r.ok()) return "";
    std::smatch m;
    static const std::regex kValue(R"re("value":\[[0-9.]+,"([^"]+)"\])re");
    return std::regex_search(*r, m, kValue) ? m[1].str() : "";
  };
  std::string steps;
  for (int i = 0; i < 300 && steps.empty(); ++i) {
    steps = query("sdc_reports_total%7Bkind%3D%22step%22%7D");
    if (steps.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(steps, "120") << prom->Log();
  EXPECT_EQ(query("sdc_checks_total%7Bcheck%3D%22weights%22%2Cresult%3D%22minority%22%7D"), "1");
  EXPECT_EQ(query("sdc_attached_ranks"), "6");
  EXPECT_EQ(query("up%7Bjob%3D%22sdcd%22%7D"), "1");
  EXPECT_EQ(query("sdc_build_info"), "1");
  prom->Stop();
}

}  // namespace
}  // namespace sdc::testing
