#ifndef SDC_CLIENT_TRAINER_METRICS_H_
#define SDC_CLIENT_TRAINER_METRICS_H_

// A trainer rank's own Prometheus metrics, served on SDC_METRICS_LISTEN
// (GuardOptions::metrics_listen) at /metrics and /healthz. Every series
// carries the constant labels sdc_job (SDC_JOB_ID; not `job`, which
// Prometheus gives the scrape job) and rank:
//   sdc_trainer_steps_checked_total      steps through the checks
//   sdc_trainer_steps_skipped_total      steps every rank skipped
//   sdc_trainer_nonfinite_steps_total    steps whose local gradients held NaN/Inf
//   sdc_trainer_audits_total             replay audits run
//   sdc_trainer_audit_seconds            histogram: an audit step's audit work
//                                        (batch exchange, replays, comparison)
//   sdc_trainer_guard_seconds_total      the guard's own work (scans, the
//                                        agreement all-reduce, audits, weight
//                                        fingerprints); its rate is the share
//                                        of the rank's wall time the guard takes
//   sdc_trainer_weight_checks_total      weight fingerprints sent
//   sdc_trainer_link_up                  1 while the link to sdcd (or the relay) is up
// Updated from the training thread; scraped from the exposer's threads.
// Thread-safe.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/exposer.h"
#include "common/metrics/collector.h"

namespace sdc::client {

class TrainerMetrics {
 public:
  // Serves on `address` (HOST:PORT). `link_up` (may be empty: 0) is read at
  // each scrape. Errors as metrics::Exposer::Start, prefixed with
  // "SDC_METRICS_LISTEN: ".
  static absl::StatusOr<std::unique_ptr<TrainerMetrics>> Start(const std::string& address,
                                                               const std::string& job_id,
                                                               uint32_t rank,
                                                               std::function<bool()> link_up);
  ~TrainerMetrics();

  // One step through the checks; the times are the guard's, in ms.
  void StepChecked(bool skipped, bool local_nonfinite, bool audited, double audit_ms,
                   double other_guard_ms);
  // Weight fingerprints of a step took `ms` (0: none this step).
  void WeightsChecked(double ms);

  int port() const { return exposer_->port(); }

 private:
  TrainerMetrics(const std::string& job_id, uint32_t rank, std::function<bool()> link_up);

  metrics::Collector registry_;
  const std::function<bool()> link_up_;
  prometheus::Counter& steps_;
  prometheus::Counter& skipped_;
  prometheus::Counter& nonfinite_;
  prometheus::Counter& audits_;
  prometheus::Histogram& audit_seconds_;
  prometheus::Counter& guard_seconds_;
  prometheus::Counter& weight_checks_;
  prometheus::Gauge& link_gauge_;
  std::unique_ptr<metrics::Exposer> exposer_;  // Last: stops before the metrics go.
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_TRAINER_METRICS_H_
