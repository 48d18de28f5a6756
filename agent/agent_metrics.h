#ifndef SDC_AGENT_AGENT_METRICS_H_
#define SDC_AGENT_AGENT_METRICS_H_

// sdc-agent's own Prometheus metrics (served by --metrics_listen):
//   sdc_agent_build_info{version}             gauge 1
//   sdc_agent_link_up                         gauge: 1 while sdcd has welcomed the stream
//   sdc_agent_link_reconnects_total           counter: connection attempts after the first
//   sdc_agent_heartbeats_sent_total           counter
//   sdc_agent_relay_streams                   gauge: rank streams relayed now
//   sdc_agent_relay_streams_total             counter: rank streams accepted
//   sdc_agent_diagnostics_total{result}       counter per device result: pass, fail, error
// Link and relay values are read at scrape time from the sources given to
// the constructor. Thread-safe.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/link.h"
#include "common/metrics/collector.h"

namespace sdc::agent {

struct RelayStats {
  uint64_t open = 0;    // Streams relayed now.
  uint64_t opened = 0;  // Streams accepted so far.
};

class AgentMetrics {
 public:
  // `link_stats` and `relay_stats` are called on each scrape (and
  // HealthDetail()), from the exposer's threads; either may be empty (no
  // link yet, no relay: zeros).
  // REQUIRES: `registry` outlives this object.
  AgentMetrics(metrics::Collector* registry, const std::string& version,
               std::function<LinkStats()> link_stats, std::function<RelayStats()> relay_stats);

  // Counts one device's diagnostic result.
  void DiagnosticDone(bool pass, bool error);

  // /healthz's text after "ok\n": "link: up\n" while registered with sdcd,
  // else "link: down\n".
  std::string HealthDetail() const;

 private:
  void Refresh() ABSL_LOCKS_EXCLUDED(refresh_mu_);

  const std::function<LinkStats()> link_stats_;
  const std::function<RelayStats()> relay_stats_;
  prometheus::Gauge& link_up_;
  prometheus::Counter& reconnects_;
  prometheus::Counter& heartbeats_;
  prometheus::Gauge& relay_open_;
  prometheus::Counter& relay_opened_;
  prometheus::Counter& diagnostics_pass_;
  prometheus::Counter& diagnostics_fail_;
  prometheus::Counter& diagnostics_error_;
  // Overlapping scrapes must not both advance the mirrored counters.
  absl::Mutex refresh_mu_;
};

}  // namespace sdc::agent

#endif  // SDC_AGENT_AGENT_METRICS_H_
