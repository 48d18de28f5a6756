#include "agent/agent_metrics.h"

#include <utility>

namespace sdc::agent {
namespace {

// Counters mirror totals kept elsewhere: advance to `total` (never back).
void AdvanceTo(prometheus::Counter& counter, double total) {
  counter.Increment(total - counter.Value());
}

prometheus::Counter& Diagnostics(metrics::Collector& registry, const std::string& result) {
  return metrics::BuildCounter()
      .Name("sdc_agent_diagnostics_total")
      .Help("Confirmation diagnostics run on this node, one per device, by result (pass, fail, "
            "error: no verdict).")
      .Register(registry)
      .Add({{"result", result}});
}

}  // namespace

AgentMetrics::AgentMetrics(metrics::Collector* registry, const std::string& version,
                           std::function<LinkStats()> link_stats,
                           std::function<RelayStats()> relay_stats)
    : link_stats_(std::move(link_stats)),
      relay_stats_(std::move(relay_stats)),
      link_up_(metrics::BuildGauge()
                   .Name("sdc_agent_link_up")
                   .Help("1 while sdcd has welcomed this agent's stream, else 0.")
                   .Register(*registry)
                   .Add({})),
      reconnects_(metrics::BuildCounter()
                      .Name("sdc_agent_link_reconnects_total")
                      .Help("Connection attempts to sdcd after the first.")
                      .Register(*registry)
                      .Add({})),
      heartbeats_(metrics::BuildCounter()
                      .Name("sdc_agent_heartbeats_sent_total")
                      .Help("Heartbeats sent to sdcd.")
                      .Register(*registry)
                      .Add({})),
      relay_open_(metrics::BuildGauge()
                      .Name("sdc_agent_relay_streams")
                      .Help("Trainer rank streams the relay carries now (--relay_listen).")
                      .Register(*registry)
                      .Add({})),
      relay_opened_(metrics::BuildCounter()
                        .Name("sdc_agent_relay_streams_total")
                        .Help("Trainer rank streams the relay accepted.")
                        .Register(*registry)
                        .Add({})),
      diagnostics_pass_(Diagnostics(*registry, "pass")),
      diagnostics_fail_(Diagnostics(*registry, "fail")),
      diagnostics_error_(Diagnostics(*registry, "error")) {
  metrics::BuildGauge()
      .Name("sdc_agent_build_info")
      .Help("Always 1; the agent's version as a label.")
      .Register(*registry)
      .Add({{"version", version}})
      .Set(1);
  registry->AddCollectHook([this] { Refresh(); });
}

void AgentMetrics::DiagnosticDone(bool pass, bool error) {
  (error ? diagnostics_error_ : pass ? diagnostics_pass_ : diagnostics_fail_).Increment();
}

std::string AgentMetrics::HealthDetail() const {
  const bool up = link_stats_ && link_stats_().registered;
  return up ? "link: up\n" : "link: down\n";
}

void AgentMetrics::Refresh() {
  const LinkStats link = link_stats_ ? link_stats_() : LinkStats{};
  const RelayStats relay = relay_stats_ ? relay_stats_() : RelayStats{};
  absl::MutexLock lock(&refresh_mu_);
  link_up_.Set(link.registered ? 1 : 0);
  AdvanceTo(reconnects_, link.streams_started > 0 ? link.streams_started - 1.0 : 0.0);
  AdvanceTo(heartbeats_, static_cast<double>(link.heartbeats_sent));
  relay_open_.Set(static_cast<double>(relay.open));
  AdvanceTo(relay_opened_, static_cast<double>(relay.opened));
}

}  // namespace sdc::agent
