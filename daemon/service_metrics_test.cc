// ServiceMetrics' per-GPU series: exact expositions for crafted incidents,
// suspects and requests, including the cap on series and the removal of a
// cleared suspect's series.

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics/collector.h"
#include "daemon/service_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

core::Incident Attributed(const std::string& job, const std::string& node,
                          const std::string& gpu) {
  core::Incident i;
  i.job_id = job;
  i.check = core::CheckKind::kReplay;
  i.ranks = {0};
  i.nodes = {node};
  i.gpus = {gpu};
  i.confirmed = true;
  return i;
}

core::Suspect SuspectOf(const std::string& gpu, const std::string& node, int64_t since_s) {
  core::Suspect s;
  s.gpu = gpu;
  s.node = node;
  s.job_id = "job";
  s.since = absl::FromUnixSeconds(since_s);
  return s;
}

TEST(ServiceMetricsTest, AttributedIncidentsCountPerGpuAndTheOldestSeriesGoesBeyondTheCap) {
  metrics::Collector registry;
  ServiceMetrics m(registry, /*max_gpu_series=*/2);
  core::Effects e;
  e.incidents = {Attributed("job", "n1", "GPU-a"), Attributed("job", "n1", "GPU-a"),
                 Attributed("job", "n2", "GPU-b")};
  core::Incident suspected = Attributed("job", "n3", "GPU-c");
  suspected.confirmed = false;  // Not attributed: no per-GPU series.
  e.incidents.push_back(suspected);
  m.Observe(e);
  std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("sdc_gpu_incidents_total{check=\"replay\",gpu=\"GPU-a\",job=\"job\","
                              "node=\"n1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sdc_gpu_incidents_total{check=\"replay\",gpu=\"GPU-b\",job=\"job\","
                              "node=\"n2\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("gpu=\"GPU-c\"")));

  // GPU-a was incremented less recently than GPU-b: a third GPU evicts it.
  core::Effects more;
  more.incidents = {Attributed("job", "n2", "GPU-b"), Attributed("job", "n4", "GPU-d")};
  m.Observe(more);
  text = registry.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("gpu=\"GPU-a\"")));
  EXPECT_THAT(text, HasSubstr("gpu=\"GPU-b\",job=\"job\",node=\"n2\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("gpu=\"GPU-d\",job=\"job\",node=\"n4\"} 1\n"));
}

TEST(ServiceMetricsTest, SuspectSeriesFollowTheSuspectsNewestFirstWithinTheCap) {
  metrics::Collector registry;
  ServiceMetrics m(registry, /*max_gpu_series=*/2);
  m.SetSuspects({SuspectOf("GPU-old", "n1", 100), SuspectOf("GPU-new", "n2", 300),
                 SuspectOf("GPU-mid", "n3", 200)});
  std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("sdc_suspect_gpus{gpu=\"GPU-new\",job=\"job\",node=\"n2\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("sdc_suspect_gpus{gpu=\"GPU-mid\",job=\"job\",node=\"n3\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("GPU-old")));
  // Cleared: the series goes.
  m.SetSuspects({SuspectOf("GPU-mid", "n3", 200)});
  text = registry.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("GPU-new")));
  EXPECT_THAT(text, HasSubstr("sdc_suspect_gpus{gpu=\"GPU-mid\",job=\"job\",node=\"n3\"} 1\n"));
  m.SetSuspects({});
  EXPECT_THAT(registry.Serialize(), Not(HasSubstr("sdc_suspect_gpus{")));
}

TEST(ServiceMetricsTest, NodeRequestsCountByLowerSnakeState) {
  metrics::Collector registry;
  ServiceMetrics m(registry);
  std::vector<core::ReplacementRequest> requests(3);
  requests[0].node = "n1";
  requests[1].node = "n1";
  requests[1].state = core::RequestState::kDone;
  requests[2].node = "n1";
  m.SetRequests(requests);
  std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("sdc_node_replacement_requests{node=\"n1\",state=\"pending\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sdc_node_replacement_requests{node=\"n1\",state=\"done\"} 1\n"));
  requests.resize(1);
  m.SetRequests(requests);
  text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("sdc_node_replacement_requests{node=\"n1\",state=\"pending\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("state=\"done\"")));
}

}  // namespace
}  // namespace sdc::daemon
