#ifndef SDC_COMMON_METRICS_EXPOSER_H_
#define SDC_COMMON_METRICS_EXPOSER_H_

// Serves a process's metrics over HTTP on plain sockets, for Prometheus to
// scrape and for probes, inside the processes that load libtorch (sdc-agent
// and trainers); sdcd serves prometheus-cpp's own exposer (pull_exposer.h).
//   GET /metrics  200, Content-Type: text/plain; version=0.0.4; charset=utf-8,
//                 body the collectable's families in the text format
//   GET /healthz  200, "ok\n", or "ok\n" followed by the health detail
//                 function's text when one is given (sdc-agent: link state)
//   anything else 404 (other paths, and other methods on these paths); a
//                 request line that is not HTTP/1.x: 400
// One response per connection (Connection: close), in the request's HTTP
// version. One accept thread, and a short-lived thread per connection (at
// most 16 at once; more are closed unanswered); a client gets 10 s to send
// its request and take the answer.
//
// Why not prometheus-cpp's exposer here: it serves through civetweb, whose
// worker threads ask for 100 KiB stacks; libtorch's static TLS (about 170
// KiB) is carved out of every thread's stack, so glibc refuses to start
// them in a process that loaded libtorch. These threads take the default
// stack size.
//
// Thread-safe. Stop() or the destructor stops accepting and waits for the
// connections in flight (each bounded by the 10 s timeout).

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"

namespace sdc::metrics {

class Exposer {
 public:
  // Starts serving `metrics` (a metrics::Collector, or any prometheus
  // Collectable) on `address` (listen_address.h; port 0 picks a free port,
  // see port()). Returns kInvalidArgument if `address` cannot be parsed,
  // kUnavailable if it cannot be listened on (port in use, address not
  // local); messages name the address and the reason.
  // REQUIRES: `metrics` outlives the exposer.
  // `health_detail`, when set, is called on each GET /healthz (on a
  // connection's thread, so it must be thread-safe) and its text follows "ok\n".
  static absl::StatusOr<std::unique_ptr<Exposer>> Start(
      const std::string& address, const prometheus::Collectable* metrics,
      std::function<std::string()> health_detail = nullptr);

  ~Exposer();
  Exposer(const Exposer&) = delete;
  Exposer& operator=(const Exposer&) = delete;

  // The port actually listened on (the chosen one when started with port 0).
  int port() const { return port_; }

  // Stops accepting and waits for the connections in flight. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Exposer() = default;
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Answers one request on `fd` (the caller closes it).
  void Serve(int fd);

  // Set before the accept thread starts, then read-only.
  int port_ = 0;
  const prometheus::Collectable* metrics_ = nullptr;
  std::function<std::string()> health_detail_;  // May be empty.
  int listen_fd_ = -1;
  int wake_read_fd_ = -1;   // Readable once Stop() was called.
  int wake_write_fd_ = -1;
  std::thread accept_thread_;

  // One connection's thread; done once it has answered and closed.
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  // Touched by the accept thread only, then by Stop() after joining it.
  std::list<Worker> workers_;

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sdc::metrics

#endif  // SDC_COMMON_METRICS_EXPOSER_H_
