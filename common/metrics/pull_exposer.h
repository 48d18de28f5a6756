#ifndef SDC_COMMON_METRICS_PULL_EXPOSER_H_
#define SDC_COMMON_METRICS_PULL_EXPOSER_H_

// sdcd's metrics endpoint: prometheus-cpp's pull exposer (civetweb), with
// the /healthz probe beside /metrics.
//   GET /metrics  200, the collectables' families in the text format
//                 (gzip when the scraper accepts it), followed by
//                 prometheus-cpp's own exposer_* series (bytes sent, scrapes,
//                 request latencies)
//   GET /healthz  200, "ok\n": the process serves (kubelet's probe when the
//                 trainer port speaks TLS; it says nothing of the database,
//                 which the gRPC health service reports)
//   anything else 404 (other paths, and other methods on these paths)
//
// civetweb runs here, not in sdc-agent or trainers: its worker threads ask
// for 100 KiB stacks, too small for libtorch's static TLS, and sdcd loads
// no libtorch (see exposer.h for the server those processes use).
//
// Thread-safe. Serving stops with Stop() or the destructor.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace sdc::metrics {

class PullExposer {
 public:
  // Starts serving `metrics` on `address` (listen_address.h; port 0 picks a
  // free port, see port()) with two worker threads. kInvalidArgument if
  // `address` cannot be parsed; kUnavailable, with civetweb's reason
  // ("cannot bind to 127.0.0.1:9464: 98 (Address already in use)"), if it
  // cannot be listened on. Messages name the address. `metrics` is held
  // weakly, as prometheus-cpp does: it is served while the caller keeps it.
  static absl::StatusOr<std::unique_ptr<PullExposer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Collectable> metrics);

  ~PullExposer() = default;
  PullExposer(const PullExposer&) = delete;
  PullExposer& operator=(const PullExposer&) = delete;

  // The port listened on (the chosen one when started with port 0).
  int port() const { return port_; }

  // Stops serving and waits for the requests in flight. Idempotent; call it
  // before destroying what collect hooks read.
  void Stop();

 private:
  PullExposer(std::unique_ptr<prometheus::Exposer> exposer, int port)
      : exposer_(std::move(exposer)), port_(port) {}

  std::unique_ptr<prometheus::Exposer> exposer_;  // Null once stopped.
  const int port_;
};

}  // namespace sdc::metrics

#endif  // SDC_COMMON_METRICS_PULL_EXPOSER_H_
