#ifndef SDC_COMMON_METRICS_EXPOSER_H_
#define SDC_COMMON_METRICS_EXPOSER_H_

// Serves a Registry over HTTP for Prometheus to scrape (civetweb, two worker
// threads):
//   GET /metrics  200, Content-Type: text/plain; version=0.0.4; charset=utf-8,
//                 body Registry::Serialize()
//   GET /healthz  200, "ok\n", or "ok\n" followed by the health detail
//                 function's text when one is given (sdc-agent: link state)
//   anything else 404 (other paths, and other methods on these paths)
//
// Thread-safe. The exposer stops serving (and waits for in-flight requests)
// in Stop() or its destructor, which take up to about 2 s: civetweb's accept
// loop polls with a fixed 2 s quantum.

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/registry.h"

struct mg_context;

namespace sdc::metrics {

class Exposer {
 public:
  // Starts serving `registry` on `address`, "host:port": host is an IPv4
  // literal, "localhost" (127.0.0.1), or empty for every IPv4 interface
  // (":9464"); port 0 picks a free port (see port()). No IPv6: Debian's
  // civetweb is built without it.
  // Returns kInvalidArgument if `address` cannot be parsed, kUnavailable if
  // it cannot be listened on (port in use, address not local); messages name
  // the address.
  // REQUIRES: `registry` outlives the exposer.
  // `health_detail`, when set, is called on each GET /healthz (on a civetweb
  // thread, so it must be thread-safe) and its text follows "ok\n".
  static absl::StatusOr<std::unique_ptr<Exposer>> Start(
      const std::string& address, Registry* registry,
      std::function<std::string()> health_detail = nullptr);

  ~Exposer();
  Exposer(const Exposer&) = delete;
  Exposer& operator=(const Exposer&) = delete;

  // The port actually listened on (the chosen one when started with port 0).
  int port() const { return port_; }

  // Stops serving and waits for requests in flight (up to about 2 s).
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Exposer() = default;

  int port_ = 0;
  std::function<std::string()> health_detail_;  // Set before serving; may be empty.
  absl::Mutex mu_;
  mg_context* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace sdc::metrics

#endif  // SDC_COMMON_METRICS_EXPOSER_H_
