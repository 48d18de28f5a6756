#ifndef SDC_DAEMON_DELIVERY_H_
#define SDC_DAEMON_DELIVERY_H_

// Sends what the core decided once the store says it is durable: messages
// to their ranks' streams, metrics, the operator's log. Shared by sdcd's
// services and its background loops (the ticker, the actuator).

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/store.h"
#include "daemon/service_metrics.h"
#include "daemon/stream_registry.h"

namespace sdc::daemon {

// Thread-safe.
class Delivery {
 public:
  // `log` (may be empty) sees every delivered Effects once, after it is
  // durable: what the core decided (incidents, requests), whichever path
  // decided it (ingestion, the timer, operators, the actuator).
  Delivery(core::Store* store, StreamRegistry* streams, ServiceMetrics* metrics,
           std::function<void(const core::Effects&)> log = nullptr)
      : store_(store), streams_(streams), metrics_(metrics), log_(std::move(log)) {}
  // Runs `then` (if any) after the effects are durable and delivered, with
  // the store's status (not OK: the effects were not delivered). Effects
  // without a ticket are delivered at once.
  void Deliver(core::Effects effects, std::function<void(absl::Status)> then = nullptr);

  // While a Batch is open on a thread, that thread's deliveries wait for
  // one durability callback, at the batch's last ticket, instead of one
  // each; when it closes they are sent in the order they were delivered.
  // A relay's message carries many ranks' reports: one registration with
  // the store and one callback on its notifier thread instead of one per
  // report. Nothing is sent before it would have been (every ticket of the
  // batch is durable by then), and the batch's reports arrived together.
  class Batch {
   public:
    explicit Batch(Delivery* delivery) : delivery_(delivery), outer_(current_) {
      current_ = this;
    }
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    friend class Delivery;
    static inline thread_local Batch* current_ = nullptr;
    Delivery* const delivery_;
    Batch* const outer_;
    uint64_t ticket_ = 0;  // The highest of the batch; 0: nothing written.
    std::vector<std::function<void(absl::Status)>> sends_;
  };

 private:
  core::Store* store_;
  StreamRegistry* streams_;
  ServiceMetrics* metrics_;
  const std::function<void(const core::Effects&)> log_;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_DELIVERY_H_
