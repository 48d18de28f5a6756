#ifndef SDC_DAEMON_SERVICE_METRICS_H_
#define SDC_DAEMON_SERVICE_METRICS_H_

// What sdcd's services count: reports, refusals, checks, incidents,
// checkpoint answers, verdict latency, actuator runs, and the per-GPU
// series operators join with DCGM's.

#include <array>
#include <list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/collector.h"
#include "daemon/core/coordinator.h"

namespace sdc::daemon {

// A request state as a metric label value: lower_snake ("pending").
std::string RequestStateLabel(core::RequestState state);

// The metrics sdcd exports (names per shared STYLE: sdc_ prefix, _total
// counters, _seconds durations, bounded labels).
//
// Per-GPU series, for joining with DCGM's (its UUID label holds the same NVML
// UUID trainers report): sdc_gpu_incidents_total{job,node,gpu,check} counts
// attributed incidents, sdc_suspect_gpus{job,node,gpu} is 1 while a GPU is
// under suspicion (the series goes when it is cleared), and
// sdc_node_replacement_requests{node,state} counts requests. Each of those
// families keeps at most `max_gpu_series` series: the incident counters
// most recently incremented, the newest suspects, the nodes with the newest
// requests (the cap is kept here, on prometheus-cpp's families: a series
// beyond it is removed from its family). Thread-safe.
class ServiceMetrics {
 public:
  static constexpr size_t kDefaultMaxGpuSeries = 4096;

  // Registers sdcd's families in `registry`, which must outlive this.
  explicit ServiceMetrics(metrics::Collector& registry,
                          size_t max_gpu_series = kDefaultMaxGpuSeries);

  enum class ReportKind { kStep, kAudit, kWeights };
  void Report(ReportKind kind, size_t bytes);
  void Rejected(const std::string& reason);
  // A frame on a stream that did not parse as its message type (also counted
  // as a rejected input, reason invalid_argument).
  void Malformed(const std::string& method);
  void Checkpoint(const std::string& decision);
  void Observe(const core::Effects& effects);
  void ActuatorRun(const std::string& actuator, const std::string& result);
  // Replaces sdc_suspect_gpus with `suspects` (newest first beyond the cap).
  void SetSuspects(const std::vector<core::Suspect>& suspects) ABSL_LOCKS_EXCLUDED(series_mu_);
  // Replaces sdc_node_replacement_requests with counts of `requests`.
  void SetRequests(const std::vector<core::ReplacementRequest>& requests)
      ABSL_LOCKS_EXCLUDED(series_mu_);

 private:
  using Labels = prometheus::Labels;
  // gpu_incidents_' series, least recently incremented first.
  using IncidentOrder = std::list<std::pair<Labels, prometheus::Counter*>>;

  // Makes `family`'s series exactly `wanted` (setting their values),
  // removing the ones in `*current` that are not wanted.
  void SyncGauges(prometheus::Family<prometheus::Gauge>& family,
                  const std::map<Labels, double>& wanted,
                  std::map<Labels, prometheus::Gauge*>* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(series_mu_);

  const size_t max_gpu_series_;
  metrics::Collector& registry_;
  prometheus::Family<prometheus::Counter>& reports_;
  prometheus::Family<prometheus::Counter>& report_bytes_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& malformed_;
  prometheus::Family<prometheus::Counter>& checks_;
  prometheus::Family<prometheus::Counter>& incidents_;
  prometheus::Counter& skipped_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& actuator_runs_;
  // reports_ and report_bytes_ by ReportKind, looked up once (every report
  // counts in both).
  std::array<prometheus::Counter*, 3> reports_by_kind_;
  std::array<prometheus::Counter*, 3> report_bytes_by_kind_;
  // latency_ by core::CheckKind (prometheus-cpp's Add builds a histogram
  // before it looks the series up, so it is called once per check).
  std::array<prometheus::Histogram*, 4> latency_by_check_;
  prometheus::Family<prometheus::Counter>& gpu_incidents_;
  prometheus::Family<prometheus::Gauge>& suspect_gpus_;
  prometheus::Family<prometheus::Gauge>& node_requests_;

  absl::Mutex series_mu_;
  IncidentOrder gpu_incident_order_ ABSL_GUARDED_BY(series_mu_);
  std::map<Labels, IncidentOrder::iterator> gpu_incident_index_ ABSL_GUARDED_BY(series_mu_);
  std::map<Labels, prometheus::Gauge*> suspect_series_ ABSL_GUARDED_BY(series_mu_);
  std::map<Labels, prometheus::Gauge*> request_series_ ABSL_GUARDED_BY(series_mu_);
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_SERVICE_METRICS_H_
