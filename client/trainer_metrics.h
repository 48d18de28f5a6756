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
//   sdc_trainer_reports_sent_total       reports queued for sdcd
//   sdc_trainer_reports_acked_total      reports sdcd acknowledged
//   sdc_trainer_reports_dropped_total    reports given up, by kind (step, audit,
//                                        weights) and reason (overflow, refused, exit)
//   sdc_trainer_reports_held             reports held for sdcd now (unacknowledged)
// Updated from the training thread; the link's series are read from the
// link at each scrape (from the exposer's threads). Thread-safe.

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/coordinator_link.h"
#include "common/metrics/exposer.h"
#include "common/metrics/collector.h"

namespace sdc::client {

class TrainerMetrics {
 public:
  // The link's numbers now; nullopt without a coordinator (link_up 0).
  using LinkStats = std::function<std::optional<CoordinatorLink::Stats>()>;

  // Serves on `address` (HOST:PORT). `link` (may be empty) is read at each
  // scrape. Errors as metrics::Exposer::Start, prefixed with
  // "SDC_METRICS_LISTEN: ".
  static absl::StatusOr<std::unique_ptr<TrainerMetrics>> Start(const std::string& address,
                                                               const std::string& job_id,
                                                               uint32_t rank, LinkStats link);
  ~TrainerMetrics();

  // One step through the checks; the times are the guard's, in ms.
  void StepChecked(bool skipped, bool local_nonfinite, bool audited, double audit_ms,
                   double other_guard_ms);
  // Weight fingerprints of a step took `ms` (0: none this step).
  void WeightsChecked(double ms);

  int port() const { return exposer_->port(); }

 private:
  TrainerMetrics(const std::string& job_id, uint32_t rank, LinkStats link);
  // Brings the link's series up to `stats` (at a scrape).
  void CollectLink();

  metrics::Collector registry_;
  const LinkStats link_;
  prometheus::Counter& steps_;
  prometheus::Counter& skipped_;
  prometheus::Counter& nonfinite_;
  prometheus::Counter& audits_;
  prometheus::Histogram& audit_seconds_;
  prometheus::Counter& guard_seconds_;
  prometheus::Counter& weight_checks_;
  prometheus::Gauge& link_gauge_;
  prometheus::Counter& reports_sent_;
  prometheus::Counter& reports_acked_;
  std::array<std::array<prometheus::Counter*, CoordinatorLink::kDrops>, CoordinatorLink::kKinds>
      reports_dropped_{};
  prometheus::Gauge& reports_held_;
  // What the counters above hold (they only grow: a scrape adds the
  // difference). Two scrapes may collect at once.
  absl::Mutex collect_mu_;
  CoordinatorLink::Stats counted_ ABSL_GUARDED_BY(collect_mu_);
  std::unique_ptr<metrics::Exposer> exposer_;  // Last: stops before the metrics go.
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_TRAINER_METRICS_H_
