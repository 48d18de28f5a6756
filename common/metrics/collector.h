#ifndef SDC_COMMON_METRICS_COLLECTOR_H_
#define SDC_COMMON_METRICS_COLLECTOR_H_

// A process's Prometheus metrics on prometheus-cpp (Debian's
// prometheus-cpp-dev): its Registry, Family, Counter, Gauge and Histogram,
// and its TextSerializer. What this file adds is what sdc-guard's scrapes
// promise beyond them:
//   - every family registered through BuildCounter() / BuildGauge() /
//     BuildHistogram() is declared (# HELP, # TYPE) from the first scrape,
//     before its first series (prometheus-cpp leaves an empty family out):
//     dashboards and alert checks see the names a process exports;
//   - collect hooks refresh values computed on demand (database size, link
//     state) before each scrape;
//   - families come in the order they were first registered, each one's
//     series sorted by their labels, so two scrapes of the same values read
//     the same;
//   - help text is escaped as the exposition format asks (prometheus-cpp
//     1.0.1's TextSerializer writes it verbatim).
//
//   auto metrics = std::make_shared<Collector>();
//   prometheus::Family<prometheus::Counter>& checks =
//       BuildCounter().Name("sdc_checks_total").Help("Checks, by result.").Register(*metrics);
//   checks.Add({{"result", "pass"}}).Increment();  // Lock-free.
//   std::string text = metrics->Serialize();       // Exposition format 0.0.4.
//
// Programming errors (an invalid metric or label name, a name registered
// again with another type or other constant labels, histogram bounds not
// strictly increasing) throw std::invalid_argument from prometheus-cpp; sdc
// code never catches it, so the process ends with the message.
//
// Naming (STYLE.md): prefix sdc_, counters end in _total, durations in
// _seconds, bounded label sets only.

#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/labels.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace sdc::metrics {

template <typename T>
class Builder;

// Thread-safe. Share it (std::shared_ptr) with the exposers that serve it.
class Collector final : public prometheus::Collectable {
 public:
  Collector() = default;
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  // Runs every collect hook, in the order added and without holding a lock
  // of this collector (a hook may register families or add series), then
  // returns the families (see the top of this file).
  std::vector<prometheus::MetricFamily> Collect() const override ABSL_LOCKS_EXCLUDED(mu_);

  // Collect() in the text exposition format 0.0.4; empty when nothing is
  // registered.
  std::string Serialize() const;

  // Adds `hook` to run at the start of every Collect(). Scrapes may
  // overlap, so hooks must be thread-safe.
  void AddCollectHook(std::function<void()> hook) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  template <typename T>
  friend class Builder;

  struct Declared {
    std::string name;
    std::string help;
    prometheus::MetricType type;
  };

  // Remembers a family's name, help and type (once per name).
  void Declare(Declared declared) ABSL_LOCKS_EXCLUDED(mu_);

  prometheus::Registry registry_;
  mutable absl::Mutex mu_;
  std::vector<Declared> declared_ ABSL_GUARDED_BY(mu_);  // In registration order.
  std::vector<std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
};

// prometheus-cpp's builder, registering into a Collector. Not thread-safe
// (one builder per use).
template <typename T>
class Builder {
 public:
  // REQUIRES: matches [a-zA-Z_:][a-zA-Z0-9_:]*.
  Builder& Name(const std::string& name) {
    name_ = name;
    return *this;
  }
  // Default: empty (no # HELP line).
  Builder& Help(const std::string& help) {
    help_ = help;
    return *this;
  }
  // Constant labels on every series of the family. Default: none.
  Builder& Labels(const prometheus::Labels& labels) {
    labels_ = labels;
    return *this;
  }
  // The family registered under Name() in `collector`, created on first
  // use; the same name, type and constant labels again return the same
  // family (its first help text stays). Lives as long as `collector`.
  prometheus::Family<T>& Register(Collector& collector) const {
    prometheus::Family<T>& family = prometheus::detail::Builder<T>()
                                        .Name(name_)
                                        .Help(help_)
                                        .Labels(labels_)
                                        .Register(collector.registry_);
    collector.Declare({name_, help_, T::metric_type});
    return family;
  }

 private:
  std::string name_;
  std::string help_;
  prometheus::Labels labels_;
};

inline Builder<prometheus::Counter> BuildCounter() { return {}; }
inline Builder<prometheus::Gauge> BuildGauge() { return {}; }
inline Builder<prometheus::Histogram> BuildHistogram() { return {}; }

}  // namespace sdc::metrics

#endif  // SDC_COMMON_METRICS_COLLECTOR_H_
