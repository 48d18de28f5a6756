#include "daemon/service_metrics.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <set>

#include "absl/strings/ascii.h"
#include "daemon/grpc_edge.h"

namespace sdc::daemon {

std::string RequestStateLabel(core::RequestState state) {
  return absl::AsciiStrToLower(core::RequestStateName(state));
}

ServiceMetrics::ServiceMetrics(metrics::Collector& registry, size_t max_gpu_series)
    : max_gpu_series_(max_gpu_series),
      registry_(registry),
      reports_(metrics::BuildCounter()
                   .Name("sdc_reports_total")
                   .Help("Reports received from trainer ranks, by kind.")
                   .Register(registry)),
      report_bytes_(metrics::BuildCounter()
                        .Name("sdc_report_bytes_total")
                        .Help("Bytes of reports received from trainer ranks, by kind.")
                        .Register(registry)),
      rejected_(metrics::BuildCounter()
                    .Name("sdc_rejected_inputs_total")
                    .Help("Inputs refused, by reason (gRPC status code).")
                    .Register(registry)),
      malformed_(metrics::BuildCounter()
                     .Name("sdc_malformed_messages_total")
                     .Help("Stream frames that did not parse, by method; each ended its "
                           "stream with INVALID_ARGUMENT.")
                     .Register(registry)),
      checks_(metrics::BuildCounter()
                  .Name("sdc_checks_total")
                  .Help("Checks decided, by check and result.")
                  .Register(registry)),
      incidents_(metrics::BuildCounter()
                     .Name("sdc_incidents_total")
                     .Help("Incidents recorded, by check and whether attributed.")
                     .Register(registry)),
      skipped_(metrics::BuildCounter()
                   .Name("sdc_steps_skipped_total")
                   .Help("Training steps skipped (gradients zeroed, no optimizer step).")
                   .Register(registry)
                   .Add({})),
      checkpoints_(metrics::BuildCounter()
                       .Name("sdc_checkpoint_decisions_total")
                       .Help("Checkpoint gate answers, by decision.")
                       .Register(registry)),
      latency_(metrics::BuildHistogram()
                   .Name("sdc_verdict_latency_seconds")
                   .Help("From a step's first report to its verdict, by check.")
                   .Register(registry)),
      actuator_runs_(metrics::BuildCounter()
                         .Name("sdc_actuator_runs_total")
                         .Help("Replacement actions run, by actuator and result.")
                         .Register(registry)),
      gpu_incidents_(metrics::BuildCounter()
                         .Name("sdc_gpu_incidents_total")
                         .Help("Attributed incidents, by job, node, GPU (NVML UUID, DCGM's "
                               "UUID label) and check; at most 4096 series by default, the "
                               "least recently incremented dropped first.")
                         .Register(registry)),
      suspect_gpus_(metrics::BuildGauge()
                        .Name("sdc_suspect_gpus")
                        .Help("1 for each GPU under suspicion (by job, node, GPU); the series "
                              "goes when the suspicion is cleared.")
                        .Register(registry)),
      node_requests_(metrics::BuildGauge()
                         .Name("sdc_node_replacement_requests")
                         .Help("Replacement requests by node and state.")
                         .Register(registry)) {
  // Every label combination exists from the start, so a scrape sees zeros
  // instead of missing series.
  const char* const kinds[] = {"step", "audit", "weights"};  // In ReportKind order.
  for (size_t k = 0; k < reports_by_kind_.size(); ++k) {
    reports_by_kind_[k] = &reports_.Add({{"kind", kinds[k]}});
    report_bytes_by_kind_[k] = &report_bytes_.Add({{"kind", kinds[k]}});
  }
  for (const char* d : {"allowed", "denied", "wait"}) checkpoints_.Add({{"decision", d}});
  for (const char* m : {"attach", "relay", "agent_connect"}) malformed_.Add({{"method", m}});
  for (core::CheckKind check : {core::CheckKind::kNonFinite, core::CheckKind::kReducedGradients,
                                core::CheckKind::kReplay, core::CheckKind::kWeights}) {
    const char* name = core::CheckKindName(check);
    checks_.Add({{"check", name}, {"result", "pass"}});
    latency_by_check_[static_cast<size_t>(check)] = &latency_.Add(
        {{"check", name}},
        prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                1, 2.5, 5, 10, 30, 60, 120});
  }
}

void ServiceMetrics::Report(ReportKind kind, size_t bytes) {
  reports_by_kind_[static_cast<size_t>(kind)]->Increment();
  report_bytes_by_kind_[static_cast<size_t>(kind)]->Increment(static_cast<double>(bytes));
}

void ServiceMetrics::Rejected(const std::string& reason) {
  rejected_.Add({{"reason", reason}}).Increment();
}

void ServiceMetrics::Malformed(const std::string& method) {
  malformed_.Add({{"method", method}}).Increment();
  Rejected(RejectReason(absl::StatusCode::kInvalidArgument));
}

void ServiceMetrics::Checkpoint(const std::string& decision) {
  checkpoints_.Add({{"decision", decision}}).Increment();
}

void ServiceMetrics::ActuatorRun(const std::string& actuator, const std::string& result) {
  actuator_runs_.Add({{"actuator", actuator}, {"result", result}}).Increment();
}

void ServiceMetrics::Observe(const core::Effects& effects) {
  for (const core::CheckEvent& c : effects.checks) {
    checks_.Add({{"check", core::CheckKindName(c.check)}, {"result", c.result}}).Increment();
    if (c.result != "incomplete") {
      latency_by_check_[static_cast<size_t>(c.check)]->Observe(absl::ToDoubleSeconds(c.latency));
    }
  }
  for (const core::Incident& i : effects.incidents) {
    incidents_
        .Add({{"check", core::CheckKindName(i.check)},
              {"attributed", i.confirmed ? "true" : "false"}})
        .Increment();
  }
  if (effects.skipped_steps > 0) skipped_.Increment(effects.skipped_steps);

  absl::MutexLock lock(&series_mu_);
  for (const core::Incident& i : effects.incidents) {
    if (!i.confirmed) continue;
    for (size_t r = 0; r < i.gpus.size() && r < i.nodes.size(); ++r) {
      const prometheus::Labels labels = {{"job", i.job_id},
                                      {"node", i.nodes[r]},
                                      {"gpu", i.gpus[r]},
                                      {"check", core::CheckKindName(i.check)}};
      auto found = gpu_incident_index_.find(labels);
      if (found != gpu_incident_index_.end()) {
        gpu_incident_order_.splice(gpu_incident_order_.end(), gpu_incident_order_, found->second);
      } else {
        gpu_incident_order_.emplace_back(labels, &gpu_incidents_.Add(labels));
        gpu_incident_index_[labels] = std::prev(gpu_incident_order_.end());
      }
      gpu_incident_order_.back().second->Increment();
      while (gpu_incident_order_.size() > max_gpu_series_) {
        gpu_incidents_.Remove(gpu_incident_order_.front().second);
        gpu_incident_index_.erase(gpu_incident_order_.front().first);
        gpu_incident_order_.pop_front();
      }
    }
  }
}

void ServiceMetrics::SyncGauges(prometheus::Family<prometheus::Gauge>& family,
                                const std::map<Labels, double>& wanted,
                                std::map<Labels, prometheus::Gauge*>* current) {
  for (auto it = current->begin(); it != current->end();) {
    if (wanted.count(it->first) == 0) {
      family.Remove(it->second);
      it = current->erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [labels, value] : wanted) {
    prometheus::Gauge*& gauge = (*current)[labels];
    if (gauge == nullptr) gauge = &family.Add(labels);
    gauge->Set(value);
  }
}

void ServiceMetrics::SetSuspects(const std::vector<core::Suspect>& suspects) {
  std::vector<const core::Suspect*> newest;
  for (const core::Suspect& s : suspects) newest.push_back(&s);
  std::stable_sort(newest.begin(), newest.end(),
                   [](const core::Suspect* a, const core::Suspect* b) { return a->since > b->since; });
  std::map<prometheus::Labels, double> wanted;
  for (const core::Suspect* s : newest) {
    if (wanted.size() >= max_gpu_series_) break;
    wanted[{{"job", s->job_id}, {"node", s->node}, {"gpu", s->gpu}}] = 1;
  }
  absl::MutexLock lock(&series_mu_);
  SyncGauges(suspect_gpus_, wanted, &suspect_series_);
}

void ServiceMetrics::SetRequests(const std::vector<core::ReplacementRequest>& requests) {
  // Nodes ordered by their newest request, newest first, for the cap.
  std::map<std::string, absl::Time> newest_by_node;
  for (const core::ReplacementRequest& r : requests) {
    absl::Time& t = newest_by_node.emplace(r.node, absl::InfinitePast()).first->second;
    t = std::max(t, r.created);
  }
  std::vector<std::pair<absl::Time, std::string>> nodes;
  for (const auto& [node, t] : newest_by_node) nodes.emplace_back(t, node);
  std::sort(nodes.begin(), nodes.end(), std::greater<>());
  std::set<std::string> kept;
  for (const auto& [t, node] : nodes) {
    if (kept.size() >= max_gpu_series_) break;
    kept.insert(node);
  }
  std::map<prometheus::Labels, double> wanted;
  for (const core::ReplacementRequest& r : requests) {
    if (kept.count(r.node) == 0) continue;
    wanted[{{"node", r.node}, {"state", RequestStateLabel(r.state)}}] += 1;
  }
  absl::MutexLock lock(&series_mu_);
  SyncGauges(node_requests_, wanted, &request_series_);
}

}  // namespace sdc::daemon
