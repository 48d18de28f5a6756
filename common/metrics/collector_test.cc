// What Collector adds to prometheus-cpp, on exact expositions: families in
// registration order with their series sorted, declared families before
// their first series, collect hooks, help escaping; and the whole output
// through Prometheus' own parser and lint (promtool check metrics).

#include "common/metrics/collector.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sdc::metrics {
namespace {

TEST(CollectorTest, NothingRegisteredSerializesToNothing) {
  Collector collector;
  EXPECT_EQ(collector.Serialize(), "");
}

TEST(CollectorTest, GoldenTextInRegistrationOrderWithSortedSeries) {
  Collector collector;
  BuildGauge().Name("sdc_unused").Help("No series yet.").Register(collector);
  prometheus::Family<prometheus::Counter>& checks = BuildCounter()
                                                        .Name("sdc_checks_total")
                                                        .Help("Checks run, by check and result.")
                                                        .Register(collector);
  checks.Add({{"check", "weights"}, {"result", "pass"}}).Increment(2);
  checks.Add({{"check", "replay"}, {"result", "pass"}}).Increment(3);
  checks.Add({{"result", "faulty"}, {"check", "replay"}}).Increment();
  prometheus::Family<prometheus::Histogram>& durations = BuildHistogram()
                                                              .Name("sdc_replay_seconds")
                                                              .Help("Replay duration.")
                                                              .Labels({{"node", "n1"}})
                                                              .Register(collector);
  prometheus::Histogram& replay =
      durations.Add({{"check", "replay"}}, prometheus::Histogram::BucketBoundaries{0.005, 0.1, 1});
  // Binary-exact values so the sum is exact: 0.00390625 = 2^-8.
  for (double v : {0.00390625, 0.0625, 0.5, 1.0, 2.0, 4.0}) replay.Observe(v);

  EXPECT_EQ(collector.Serialize(),
            "# HELP sdc_unused No series yet.\n"
            "# TYPE sdc_unused gauge\n"
            "# HELP sdc_checks_total Checks run, by check and result.\n"
            "# TYPE sdc_checks_total counter\n"
            "sdc_checks_total{check=\"replay\",result=\"faulty\"} 1\n"
            "sdc_checks_total{check=\"replay\",result=\"pass\"} 3\n"
            "sdc_checks_total{check=\"weights\",result=\"pass\"} 2\n"
            "# HELP sdc_replay_seconds Replay duration.\n"
            "# TYPE sdc_replay_seconds histogram\n"
            "sdc_replay_seconds_count{node=\"n1\",check=\"replay\"} 6\n"
            "sdc_replay_seconds_sum{node=\"n1\",check=\"replay\"} 7.56640625\n"
            "sdc_replay_seconds_bucket{node=\"n1\",check=\"replay\",le=\"0.005\"} 1\n"
            "sdc_replay_seconds_bucket{node=\"n1\",check=\"replay\",le=\"0.1\"} 2\n"
            "sdc_replay_seconds_bucket{node=\"n1\",check=\"replay\",le=\"1\"} 4\n"
            "sdc_replay_seconds_bucket{node=\"n1\",check=\"replay\",le=\"+Inf\"} 6\n");
}

TEST(CollectorTest, ARemovedSeriesGoesAndItsFamilyStaysDeclared) {
  Collector collector;
  prometheus::Family<prometheus::Gauge>& suspects =
      BuildGauge().Name("sdc_suspect_gpus").Help("Suspects.").Register(collector);
  prometheus::Gauge& a = suspects.Add({{"gpu", "GPU-a"}});
  a.Set(1);
  EXPECT_EQ(collector.Serialize(),
            "# HELP sdc_suspect_gpus Suspects.\n# TYPE sdc_suspect_gpus gauge\n"
            "sdc_suspect_gpus{gpu=\"GPU-a\"} 1\n");
  suspects.Remove(&a);
  EXPECT_EQ(collector.Serialize(),
            "# HELP sdc_suspect_gpus Suspects.\n# TYPE sdc_suspect_gpus gauge\n");
}

TEST(CollectorTest, TheSameNameAgainIsTheSameFamilyDeclaredOnce) {
  Collector collector;
  auto& first = BuildGauge().Name("sdc_depth").Help("first").Register(collector);
  auto& second = BuildGauge().Name("sdc_depth").Help("second").Register(collector);
  EXPECT_EQ(&first, &second);
  EXPECT_EQ(collector.Serialize(), "# HELP sdc_depth first\n# TYPE sdc_depth gauge\n");
  // Another type under the name is a programming error, from prometheus-cpp.
  EXPECT_THROW(BuildCounter().Name("sdc_depth").Register(collector), std::invalid_argument);
  EXPECT_THROW(BuildCounter().Name("0bad").Register(collector), std::invalid_argument);
}

TEST(CollectorTest, EscapesHelpAndLabelValues) {
  Collector collector;
  BuildGauge()
      .Name("sdc_escape")
      .Help("back\\slash, \"quotes\" stay,\nsecond line")
      .Labels({{"node", "a\\b"}})
      .Register(collector)
      .Add({{"gpu", "say \"hi\"\nbye"}})
      .Set(1);
  EXPECT_EQ(collector.Serialize(),
            "# HELP sdc_escape back\\\\slash, \"quotes\" stay,\\nsecond line\n"
            "# TYPE sdc_escape gauge\n"
            "sdc_escape{node=\"a\\\\b\",gpu=\"say \\\"hi\\\"\\nbye\"} 1\n");
}

TEST(CollectorTest, CollectHooksRunInOrderBeforeEachCollection) {
  Collector collector;
  prometheus::Gauge& size = BuildGauge().Name("sdc_store_bytes").Register(collector).Add({});
  std::vector<int> calls;
  collector.AddCollectHook([&] {
    calls.push_back(1);
    size.Set(123);
  });
  collector.AddCollectHook([&] {
    calls.push_back(2);
    size.Increment();
    // Hooks run outside the collector's lock, so they may register.
    BuildGauge().Name("sdc_late").Help("Registered by a hook.").Register(collector);
  });
  EXPECT_EQ(collector.Serialize(),
            "# TYPE sdc_store_bytes gauge\nsdc_store_bytes 124\n"
            "# HELP sdc_late Registered by a hook.\n# TYPE sdc_late gauge\n");
  EXPECT_EQ(calls, (std::vector<int>{1, 2}));
  collector.Collect();
  EXPECT_EQ(calls, (std::vector<int>{1, 2, 1, 2}));
}

// ---- promtool: the exposition must parse and pass Prometheus' lint. ----

struct CommandResult {
  int exit_status = -1;
  std::string output;
};

// Runs `promtool check metrics` with `exposition` on stdin.
CommandResult RunPromtool(const std::string& exposition) {
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmpdir != nullptr ? tmpdir : "/tmp") + "/exposition.txt";
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file << exposition;
  }
  const std::string command = "/usr/bin/promtool check metrics < '" + path + "' 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TEST(PromtoolTest, EveryMetricTypePassesCheckMetrics) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/promtool is missing (Debian package prometheus); "
                    "cannot check the exposition with Prometheus' own parser";
  }
  Collector collector;
  auto& checks = BuildCounter()
                     .Name("sdc_checks_total")
                     .Help("Checks run, by check and result.")
                     .Labels({{"node", "ip-10-0-0-1"}})
                     .Register(collector);
  checks.Add({{"check", "replay"}, {"result", "ok"}}).Increment(41);
  checks.Add({{"check", "replay"}, {"result", "mismatch"}}).Increment(0.5);
  BuildGauge()
      .Name("sdc_store_bytes")
      .Help("Bytes in the store \\ with a\nnewline.")
      .Register(collector)
      .Add({})
      .Set(1e21);
  BuildGauge()
      .Name("sdc_odd_values")
      .Help("Escaped values and special numbers.")
      .Register(collector)
      .Add({{"gpu", "quote \" back \\ newline \n"}})
      .Set(std::numeric_limits<double>::quiet_NaN());
  auto& durations = BuildHistogram()
                        .Name("sdc_replay_duration_seconds")
                        .Help("Replay duration.")
                        .Register(collector);
  prometheus::Histogram& replay =
      durations.Add({{"check", "replay"}}, prometheus::Histogram::BucketBoundaries{0.005, 0.1, 1});
  for (double v : {0.001, 0.05, 0.5, 5.0}) replay.Observe(v);
  durations.Add({{"check", "weights"}}, prometheus::Histogram::BucketBoundaries{0.005, 0.1, 1});
  BuildCounter().Name("sdc_empty_total").Help("Never incremented.").Register(collector);

  const CommandResult result = RunPromtool(collector.Serialize());
  EXPECT_EQ(result.exit_status, 0) << result.output;
  EXPECT_EQ(result.output, "");
}

// Guards the harness above: promtool must reject what Prometheus' lint
// rejects, or the passing test proves nothing.
TEST(PromtoolTest, HarnessSeesLintProblems) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/promtool is missing (Debian package prometheus)";
  }
  Collector collector;
  BuildCounter().Name("sdc_checks").Help("Lacks the _total suffix.").Register(collector).Add({});
  const CommandResult result = RunPromtool(collector.Serialize());
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.output.find("_total"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace sdc::metrics
