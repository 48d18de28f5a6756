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

TrainerMetrics::TrainerMetrics(const std::string& job_id, uint32_t rank, LinkStats link)
    : link_(std::move(link)),
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
                      .Add({})),
      reports_sent_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                              "sdc_trainer_reports_sent_total", "Reports queued for sdcd.")),
      reports_acked_(CounterOf(registry_, {{"sdc_job", job_id}, {"rank", std::to_string(rank)}},
                               "sdc_trainer_reports_acked_total",
                               "Reports sdcd acknowledged (durable there).")),
      reports_held_(metrics::BuildGauge()
                        .Name("sdc_trainer_reports_held")
                        .Help("Reports held for sdcd now: sent and not yet acknowledged.")
                        .Labels({{"sdc_job", job_id}, {"rank", std::to_string(rank)}})
                        .Register(registry_)
                        .Add({})) {
  prometheus::Family<prometheus::Counter>& dropped =
      metrics::BuildCounter()
          .Name("sdc_trainer_reports_dropped_total")
          .Help("Reports given up: past the buffer's bound (overflow; never an incident's "
                "evidence), refused by sdcd (refused), or unacknowledged at exit (exit); by "
                "kind.")
          .Labels({{"sdc_job", job_id}, {"rank", std::to_string(rank)}})
          .Register(registry_);
  for (int k = 0; k < CoordinatorLink::kKinds; ++k) {
    for (int d = 0; d < CoordinatorLink::kDrops; ++d) {
      reports_dropped_[k][d] = &dropped.Add(
          {{"kind", CoordinatorLink::KindName(CoordinatorLink::Kind(k))},
           {"reason", CoordinatorLink::DropName(CoordinatorLink::Drop(d))}});
    }
  }
  registry_.AddCollectHook([this] { CollectLink(); });
}

void TrainerMetrics::CollectLink() {
  const std::optional<CoordinatorLink::Stats> now =
      link_ ? link_() : std::optional<CoordinatorLink::Stats>();
  link_gauge_.Set(now.has_value() && now->connected ? 1 : 0);
  if (!now.has_value()) return;
  absl::MutexLock lock(&collect_mu_);
  reports_sent_.Increment(static_cast<double>(now->sent - counted_.sent));
  reports_acked_.Increment(static_cast<double>(now->acked - counted_.acked));
  for (int k = 0; k < CoordinatorLink::kKinds; ++k) {
    for (int d = 0; d < CoordinatorLink::kDrops; ++d) {
      reports_dropped_[k][d]->Increment(
          static_cast<double>(now->dropped_by[k][d] - counted_.dropped_by[k][d]));
    }
  }
  reports_held_.Set(static_cast<double>(now->held));
  counted_ = *now;
}

TrainerMetrics::~TrainerMetrics() {
  if (exposer_ != nullptr) exposer_->Stop();
}

absl::StatusOr<std::unique_ptr<TrainerMetrics>> TrainerMetrics::Start(
    const std::string& address, const std::string& job_id, uint32_t rank, LinkStats link) {
  std::unique_ptr<TrainerMetrics> m(new TrainerMetrics(job_id, rank, std::move(link)));
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
