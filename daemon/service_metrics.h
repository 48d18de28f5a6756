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
#include "common/metrics/registry.h"
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
// requests. Thread-safe.
class ServiceMetrics {
 public:
  static constexpr size_t kDefaultMaxGpuSeries = 4096;

  explicit ServiceMetrics(metrics::Registry& registry,
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
  // Makes `family`'s children exactly `wanted` (setting their values),
  // removing the ones in `*current` that are not wanted.
  void SyncGauges(metrics::Family<metrics::Gauge>& family,
                  const std::map<metrics::Labels, double>& wanted,
                  std::map<metrics::Labels, metrics::Gauge*>* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(series_mu_);

  const size_t max_gpu_series_;
  metrics::Registry& registry_;
  metrics::Family<metrics::Counter>& reports_;
  metrics::Family<metrics::Counter>& report_bytes_;
  metrics::Family<metrics::Counter>& rejected_;
  metrics::Family<metrics::Counter>& malformed_;
  metrics::Family<metrics::Counter>& checks_;
  metrics::Family<metrics::Counter>& incidents_;
  metrics::Counter& skipped_;
  metrics::Family<metrics::Counter>& checkpoints_;
  metrics::Family<metrics::Histogram>& latency_;
  metrics::Family<metrics::Counter>& actuator_runs_;
  // reports_ and report_bytes_ by ReportKind, looked up once (every report
  // counts in both).
  std::array<metrics::Counter*, 3> reports_by_kind_;
  std::array<metrics::Counter*, 3> report_bytes_by_kind_;
  metrics::Family<metrics::Counter>& gpu_incidents_;
  metrics::Family<metrics::Gauge>& suspect_gpus_;
  metrics::Family<metrics::Gauge>& node_requests_;

  absl::Mutex series_mu_;
  // gpu_incidents_' children, least recently incremented first.
  std::list<std::pair<metrics::Labels, metrics::Counter*>> gpu_incident_order_
      ABSL_GUARDED_BY(series_mu_);
  std::map<metrics::Labels, std::list<std::pair<metrics::Labels, metrics::Counter*>>::iterator>
      gpu_incident_index_ ABSL_GUARDED_BY(series_mu_);
  std::map<metrics::Labels, metrics::Gauge*> suspect_series_ ABSL_GUARDED_BY(series_mu_);
  std::map<metrics::Labels, metrics::Gauge*> request_series_ ABSL_GUARDED_BY(series_mu_);
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_SERVICE_METRICS_H_
