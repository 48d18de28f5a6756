#include "client/trainer_metrics.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sdc::client {
namespace {

prometheus::Counter& CounterOf(metrics::Collector& registry, const prometheus::Labels& labels,
                            const std::string& name, const std::string& help) {
  return metrics::BuildCounter().Name(name).Help(help).Labels(labels).Register(registry).Add({});
}

}  // namespace

TrainerMetrics::TrainerMetrics(const std::string& job_id, uint32_t rank,
                               std::function<bool()> link_up)
    : link_up_(std::move(link_up)),
      steps_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                       "sdc_trainer_steps_checked_total", "Training steps through the checks.")),
      skipped_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                         "sdc_trainer_steps_skipped_total",
                         "Steps every rank skipped (gradients zeroed, no optimizer step).")),
      nonfinite_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                           "sdc_trainer_nonfinite_steps_total",
                           "Steps whose local gradients held a NaN or Inf on this rank.")),
      audits_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                        "sdc_trainer_audits_total", "Replay audits this rank took part in.")),
      audit_seconds_(metrics::BuildHistogram()
                         .Name("sdc_trainer_audit_seconds")
                         .Help("An audit step's audit work: batch exchange, replays, "
                               "comparison, verdict wait.")
                         .Labels({{"sdc_job", job_id}, {"rank", std::to_string(rank)}})
                         .Register(registry_)
                         .Add({}, prometheus::Histogram::BucketBoundaries{
                                      0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})),
      guard_seconds_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                               "sdc_trainer_guard_seconds_total",
                               "Seconds of the guard's own work (scans, agreement all-reduce, "
                               "audits, weight fingerprints); its rate is the share of wall "
                               "time.")),
      weight_checks_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                               "sdc_trainer_weight_checks_total", "Weight fingerprints sent.")),
      link_gauge_(metrics::BuildGauge()
                      .Name("sdc_trainer_link_up")
                      .Help("1 while the link to sdcd (or the node's relay) is up.")
                      .Labels({{"sdc_job", job_id}, {"rank", std::to_string(rank)}})
                      .Register(registry_)
                      .Add({})) {
  registry_.AddCollectHook([this] { link_gauge_.Set(link_up_ && link_up_() ? 1 : 0); });
}

TrainerMetrics::~TrainerMetrics() {
  if (exposer_ != nullptr) exposer_->Stop();
}

absl::StatusOr<std::unique_ptr<TrainerMetrics>> TrainerMetrics::Start(
    const std::string& address, const std::string& job_id, uint32_t rank,
    std::function<bool()> link_up) {
  std::unique_ptr<TrainerMetrics> m(new TrainerMetrics(job_id, rank, std::move(link_up)));
  absl::StatusOr<std::unique_ptr<metrics::Exposer>> exposer =
      metrics::Exposer::Start(address, &m->registry_);
  if (!exposer.ok()) {
    return absl::Status(exposer.status().code(),
                        absl::StrCat("SDC_METRICS_LISTEN: ", exposer.status().message()));
  }
  m->exposer_ = *std::move(exposer);
  return m;
}

void TrainerMetrics::StepChecked(bool skipped, bool local_nonfinite, bool audited,
                                 double audit_ms, double other_guard_ms) {
  steps_.Increment();
  if (skipped) skipped_.Increment();
  if (local_nonfinite) nonfinite_.Increment();
  if (audited) {
    audits_.Increment();
    audit_seconds_.Observe(audit_ms / 1000);
  }
  guard_seconds_.Increment((audit_ms + other_guard_ms) / 1000);
}

void TrainerMetrics::WeightsChecked(double ms) {
  if (ms <= 0) return;
  weight_checks_.Increment();
  guard_seconds_.Increment(ms / 1000);
}

}  // namespace sdc::client
