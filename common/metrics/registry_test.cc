#include "common/metrics/registry.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sdc::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(RegistryTest, EmptyRegistrySerializesToNothing) {
  Registry registry;
  EXPECT_EQ(registry.Serialize(), "");
}

TEST(RegistryTest, GoldenTextForEveryMetricType) {
  Registry registry;
  Family<Counter>& checks = BuildCounter()
                                .Name("sdc_checks_total")
                                .Help("Checks run, by check and result.")
                                .Register(registry);
  checks.Add({{"check", "replay"}, {"result", "ok"}}).Increment(3);
  checks.Add({{"result", "mismatch"}, {"check", "replay"}}).Increment();

  Family<Gauge>& store_bytes = BuildGauge()
                                   .Name("sdc_store_bytes")
                                   .Help("Bytes in the store.")
                                   .Labels({{"node", "n1"}})
                                   .Register(registry);
  store_bytes.Add({{"gpu", "3"}}).Set(4096);

  Family<Histogram>& durations = BuildHistogram()
                                     .Name("sdc_replay_duration_seconds")
                                     .Help("Replay duration.")
                                     .Register(registry);
  Histogram& replay =
      durations.Add({{"check", "replay"}}, Histogram::BucketBoundaries{0.005, 0.1, 1});
  // Binary-exact values so the sum is exact: 0.00390625 = 2^-8.
  for (double v : {0.00390625, 0.0625, 0.5, 1.0, 2.0, 4.0}) replay.Observe(v);

  BuildGauge().Name("sdc_unused").Help("No children yet.").Register(registry);

  EXPECT_EQ(registry.Serialize(),
            "# HELP sdc_checks_total Checks run, by check and result.\n"
            "# TYPE sdc_checks_total counter\n"
            "sdc_checks_total{check=\"replay\",result=\"mismatch\"} 1\n"
            "sdc_checks_total{check=\"replay\",result=\"ok\"} 3\n"
            "# HELP sdc_store_bytes Bytes in the store.\n"
            "# TYPE sdc_store_bytes gauge\n"
            "sdc_store_bytes{gpu=\"3\",node=\"n1\"} 4096\n"
            "# HELP sdc_replay_duration_seconds Replay duration.\n"
            "# TYPE sdc_replay_duration_seconds histogram\n"
            "sdc_replay_duration_seconds_bucket{check=\"replay\",le=\"0.005\"} 1\n"
            "sdc_replay_duration_seconds_bucket{check=\"replay\",le=\"0.1\"} 2\n"
            "sdc_replay_duration_seconds_bucket{check=\"replay\",le=\"1\"} 4\n"
            "sdc_replay_duration_seconds_bucket{check=\"replay\",le=\"+Inf\"} 6\n"
            "sdc_replay_duration_seconds_sum{check=\"replay\"} 7.56640625\n"
            "sdc_replay_duration_seconds_count{check=\"replay\"} 6\n"
            "# HELP sdc_unused No children yet.\n"
            "# TYPE sdc_unused gauge\n");
}

TEST(RegistryTest, UnlabelledSamplesHaveNoBraces) {
  Registry registry;
  BuildCounter().Name("sdc_events_total").Register(registry).Add({}).Increment(2);
  BuildHistogram()
      .Name("sdc_wait_seconds")
      .Register(registry)
      .Add({}, Histogram::BucketBoundaries{1})
      .Observe(0.5);
  EXPECT_EQ(registry.Serialize(),
            "# HELP sdc_events_total \n"
            "# TYPE sdc_events_total counter\n"
            "sdc_events_total 2\n"
            "# HELP sdc_wait_seconds \n"
            "# TYPE sdc_wait_seconds histogram\n"
            "sdc_wait_seconds_bucket{le=\"1\"} 1\n"
            "sdc_wait_seconds_bucket{le=\"+Inf\"} 1\n"
            "sdc_wait_seconds_sum 0.5\n"
            "sdc_wait_seconds_count 1\n");
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  Registry registry;
  BuildGauge()
      .Name("sdc_escape")
      .Help("back\\slash, \"quotes\" stay,\nsecond line")
      .Labels({{"node", "a\\b"}})
      .Register(registry)
      .Add({{"gpu", "say \"hi\"\nbye"}})
      .Set(1);
  EXPECT_EQ(registry.Serialize(),
            "# HELP sdc_escape back\\\\slash, \"quotes\" stay,\\nsecond line\n"
            "# TYPE sdc_escape gauge\n"
            "sdc_escape{gpu=\"say \\\"hi\\\"\\nbye\",node=\"a\\\\b\"} 1\n");
}

TEST(RegistryTest, FormatsNumbers) {
  struct Case {
    double value;
    const char* text;
  };
  const Case cases[] = {
      {0.0, "0"},
      {-0.0, "0"},
      {3.0, "3"},
      {-7.0, "-7"},
      {1e6, "1000000"},
      {0.25, "0.25"},
      {0.1, "0.1"},
      {-2.5, "-2.5"},
      {1.0 / 3.0, "0.3333333333333333"},
      {1e-9, "1e-09"},
      {1e21, "1e+21"},
      {9007199254740991.0, "9007199254740991"},  // 2^53 - 1: integral, printed in full.
      {9007199254740992.0, "9007199254740992"},  // 2^53: shortest form is the same.
      {kInf, "+Inf"},
      {-kInf, "-Inf"},
      {kNaN, "NaN"},
  };
  for (const Case& c : cases) {
    Registry registry;
    BuildGauge().Name("sdc_value").Register(registry).Add({}).Set(c.value);
    const std::string expected =
        std::string("# HELP sdc_value \n# TYPE sdc_value gauge\nsdc_value ") + c.text + "\n";
    EXPECT_EQ(registry.Serialize(), expected) << "value " << c.text;
  }
}

TEST(RegistryTest, SameLabelsReturnSameChild) {
  Registry registry;
  Family<Counter>& family = BuildCounter().Name("sdc_checks_total").Register(registry);
  Counter& a = family.Add({{"check", "replay"}});
  Counter& b = family.Add({{"check", "replay"}});
  Counter& c = family.Add({{"check", "weights"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  a.Increment();
  EXPECT_EQ(b.Value(), 1.0);
  EXPECT_EQ(c.Value(), 0.0);
  EXPECT_TRUE(family.Has({{"check", "replay"}}));
  EXPECT_FALSE(family.Has({{"check", "other"}}));
}

TEST(RegistryTest, SameNameAndTypeReturnsSameFamily) {
  Registry registry;
  Family<Gauge>& first = BuildGauge().Name("sdc_depth").Help("first").Register(registry);
  Family<Gauge>& second = BuildGauge().Name("sdc_depth").Help("second").Register(registry);
  EXPECT_EQ(&first, &second);
  EXPECT_EQ(second.GetHelp(), "first");
  EXPECT_EQ(registry.Serialize(), "# HELP sdc_depth first\n# TYPE sdc_depth gauge\n");
}

TEST(RegistryTest, RemoveDropsChildFromOutput) {
  Registry registry;
  Family<Gauge>& family = BuildGauge().Name("sdc_depth").Register(registry);
  Gauge& kept = family.Add({{"node", "a"}});
  Gauge& removed = family.Add({{"node", "b"}});
  kept.Set(1);
  removed.Set(2);
  family.Remove(&removed);
  Gauge unrelated;
  family.Remove(&unrelated);  // Not a child: no effect.
  EXPECT_FALSE(family.Has({{"node", "b"}}));
  EXPECT_EQ(registry.Serialize(),
            "# HELP sdc_depth \n# TYPE sdc_depth gauge\nsdc_depth{node=\"a\"} 1\n");
  EXPECT_EQ(family.Add({{"node", "b"}}).Value(), 0.0);  // A fresh child.
}

TEST(CounterTest, IgnoresNegativeAndNaNIncrements) {
  Counter counter;
  counter.Increment(2.5);
  counter.Increment(-1);
  counter.Increment(kNaN);
  counter.Increment();
  EXPECT_EQ(counter.Value(), 3.5);
}

TEST(GaugeTest, SetIncrementDecrement) {
  Gauge gauge(10);
  gauge.Increment();
  gauge.Increment(4.5);
  gauge.Decrement();
  gauge.Decrement(2);
  EXPECT_EQ(gauge.Value(), 12.5);
  gauge.Set(-3);
  EXPECT_EQ(gauge.Value(), -3.0);
}

TEST(HistogramTest, BucketsAreInclusiveAndCumulative) {
  Histogram histogram({1, 2, 4});
  for (double v : {-1.0, 1.0, 1.5, 2.0, 4.0, 4.5, kInf}) histogram.Observe(v);
  const Histogram::Snapshot s = histogram.Collect();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{2, 4, 5, 7}));
  EXPECT_EQ(s.count, 7u);
  EXPECT_EQ(s.sum, kInf);
}

TEST(HistogramTest, NaNLandsInInfBucketAndPoisonsSum) {
  Histogram histogram({1});
  histogram.Observe(kNaN);
  const Histogram::Snapshot s = histogram.Collect();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(HistogramTest, TrailingInfBoundIsDropped) {
  Histogram histogram({0.5, kInf});
  EXPECT_EQ(histogram.boundaries(), (Histogram::BucketBoundaries{0.5}));
  Histogram no_bounds({});
  no_bounds.Observe(3);
  EXPECT_EQ(no_bounds.Collect().cumulative_counts, (std::vector<uint64_t>{1}));
}

// Every update is an atomic read-modify-write, so none is lost.
TEST(RegistryTest, ConcurrentUpdatesSumExactly) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 100000;
  Registry registry;
  Family<Counter>& counters = BuildCounter().Name("sdc_events_total").Register(registry);
  Family<Gauge>& gauges = BuildGauge().Name("sdc_depth").Register(registry);
  Family<Histogram>& histograms = BuildHistogram().Name("sdc_wait_seconds").Register(registry);
  std::vector<Counter*> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& counter = counters.Add({{"node", "a"}});
      seen[t] = &counter;
      Gauge& gauge = gauges.Add({});
      Histogram& histogram = histograms.Add({}, Histogram::BucketBoundaries{1});
      for (int i = 0; i < kPerThread; ++i) {
        counter.Increment();
        gauge.Increment(t % 2 == 0 ? 2 : -1);
        histogram.Observe(i % 2 == 0 ? 0.5 : 1.5);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (Counter* counter : seen) EXPECT_EQ(counter, seen[0]);
  EXPECT_EQ(seen[0]->Value(), 400000.0);
  EXPECT_EQ(gauges.Add({}).Value(), 2.0 * 2 * kPerThread - 1.0 * 2 * kPerThread);
  const Histogram::Snapshot s = histograms.Add({}, Histogram::BucketBoundaries{1}).Collect();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{200000, 400000}));
  EXPECT_EQ(s.sum, 400000.0);  // 200000 * 0.5 + 200000 * 1.5, exact in binary.
}

TEST(RegistryTest, CollectHooksRunInOrderBeforeSerialization) {
  Registry registry;
  Gauge& size = BuildGauge().Name("sdc_store_bytes").Register(registry).Add({});
  std::vector<int> calls;
  registry.AddCollectHook([&] {
    calls.push_back(1);
    size.Set(123);
  });
  registry.AddCollectHook([&] {
    calls.push_back(2);
    size.Increment();
    // Hooks run outside the registry's locks, so they may register.
    BuildGauge().Name("sdc_late").Register(registry);
  });
  EXPECT_EQ(registry.Serialize(),
            "# HELP sdc_store_bytes \n# TYPE sdc_store_bytes gauge\nsdc_store_bytes 124\n"
            "# HELP sdc_late \n# TYPE sdc_late gauge\n");
  EXPECT_EQ(calls, (std::vector<int>{1, 2}));
  registry.Serialize();
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
  Registry registry;
  Family<Counter>& checks = BuildCounter()
                                .Name("sdc_checks_total")
                                .Help("Checks run, by check and result.")
                                .Labels({{"node", "ip-10-0-0-1"}})
                                .Register(registry);
  checks.Add({{"check", "replay"}, {"result", "ok"}}).Increment(41);
  checks.Add({{"check", "replay"}, {"result", "mismatch"}}).Increment(0.5);
  Family<Gauge>& bytes = BuildGauge()
                             .Name("sdc_store_bytes")
                             .Help("Bytes in the store \\ with a\nnewline.")
                             .Register(registry);
  bytes.Add({}).Set(1e21);
  BuildGauge()
      .Name("sdc_odd_values")
      .Help("Escaped values and special numbers.")
      .Register(registry)
      .Add({{"gpu", "quote \" back \\ newline \n"}})
      .Set(kNaN);
  Family<Histogram>& durations = BuildHistogram()
                                     .Name("sdc_replay_duration_seconds")
                                     .Help("Replay duration.")
                                     .Register(registry);
  Histogram& replay =
      durations.Add({{"check", "replay"}}, Histogram::BucketBoundaries{0.005, 0.1, 1});
  for (double v : {0.001, 0.05, 0.5, 5.0}) replay.Observe(v);
  durations.Add({{"check", "weights"}}, Histogram::BucketBoundaries{0.005, 0.1, 1});
  BuildCounter().Name("sdc_empty_total").Help("Never incremented.").Register(registry);

  const CommandResult result = RunPromtool(registry.Serialize());
  EXPECT_EQ(result.exit_status, 0) << result.output;
  EXPECT_EQ(result.output, "");
}

// Guards the harness above: promtool must reject what Prometheus' lint
// rejects, or the passing test proves nothing.
TEST(PromtoolTest, HarnessSeesLintProblems) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/promtool is missing (Debian package prometheus)";
  }
  Registry registry;
  BuildCounter().Name("sdc_checks").Help("Lacks the _total suffix.").Register(registry).Add({});
  const CommandResult result = RunPromtool(registry.Serialize());
  EXPECT_NE(result.exit_status, 0);
  EXPECT_NE(result.output.find("_total"), std::string::npos) << result.output;
}

// ---- Programming errors abort with a message. ----

class RegistryDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(RegistryDeathTest, InvalidMetricNames) {
  for (const char* name : {"", "1sdc", "sdc-checks", "sdc checks", "sdc_é"}) {
    Registry registry;
    EXPECT_DEATH(BuildCounter().Name(name).Register(registry), "invalid metric name")
        << "name \"" << name << "\"";
  }
  Registry registry;
  BuildGauge().Name("sdc:recorded_1").Register(registry);  // Colons and digits are valid.
}

TEST_F(RegistryDeathTest, InvalidLabelNames) {
  Registry registry;
  EXPECT_DEATH(BuildGauge().Name("sdc_a").Labels({{"1node", "x"}}).Register(registry),
               "invalid label name \"1node\"");
  EXPECT_DEATH(BuildGauge().Name("sdc_b").Labels({{"no:colon", "x"}}).Register(registry),
               "invalid label name \"no:colon\"");
  EXPECT_DEATH(BuildGauge().Name("sdc_c").Labels({{"__reserved", "x"}}).Register(registry),
               "reserved");
  Family<Gauge>& family = BuildGauge().Name("sdc_d").Register(registry);
  EXPECT_DEATH(family.Add({{"gpu-id", "0"}}), "invalid label name \"gpu-id\"");
  EXPECT_DEATH(family.Add({{"__name__", "x"}}), "reserved");
  EXPECT_DEATH(family.Add({{"", "x"}}), "invalid label name \"\"");
}

TEST_F(RegistryDeathTest, HistogramLabelLe) {
  Registry registry;
  EXPECT_DEATH(BuildHistogram().Name("sdc_a_seconds").Labels({{"le", "1"}}).Register(registry),
               "\"le\" in histogram");
  Family<Histogram>& family = BuildHistogram().Name("sdc_b_seconds").Register(registry);
  EXPECT_DEATH(family.Add({{"le", "1"}}, Histogram::BucketBoundaries{1}), "\"le\" in histogram");
}

TEST_F(RegistryDeathTest, TypeConflict) {
  Registry registry;
  BuildCounter().Name("sdc_checks_total").Register(registry);
  EXPECT_DEATH(BuildGauge().Name("sdc_checks_total").Register(registry),
               "\"sdc_checks_total\" is already registered as a counter; cannot register it as "
               "a gauge");
  EXPECT_DEATH(BuildHistogram().Name("sdc_checks_total").Register(registry),
               "already registered as a counter; cannot register it as a histogram");
}

TEST_F(RegistryDeathTest, ConstantLabelConflicts) {
  Registry registry;
  Family<Gauge>& family = BuildGauge().Name("sdc_depth").Labels({{"node", "a"}}).Register(registry);
  EXPECT_DEATH(BuildGauge().Name("sdc_depth").Labels({{"node", "b"}}).Register(registry),
               "already registered with other constant labels");
  EXPECT_DEATH(family.Add({{"node", "c"}}), "\"node\" .* is already a constant label");
}

TEST_F(RegistryDeathTest, BadBucketBoundaries) {
  EXPECT_DEATH({ Histogram h({1, 1}); }, "strictly increasing, got 1 then 1");
  EXPECT_DEATH({ Histogram h({2, 1}); }, "strictly increasing, got 2 then 1");
  EXPECT_DEATH({ Histogram h({kNaN}); }, "NaN");
}

}  // namespace
}  // namespace sdc::metrics
