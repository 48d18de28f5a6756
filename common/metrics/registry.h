#ifndef SDC_COMMON_METRICS_REGISTRY_H_
#define SDC_COMMON_METRICS_REGISTRY_H_

// A small Prometheus metrics registry whose API mirrors prometheus-cpp
// (Registry, Family<T>, Counter, Gauge, Histogram, BuildCounter() and friends)
// so that prometheus-cpp can replace it with a change of namespace and
// includes. prometheus-cpp is not packaged in Debian; this is the subset sdcd
// needs.
//
//   Registry registry;
//   Family<Counter>& checks = BuildCounter()
//                                 .Name("sdc_checks_total")
//                                 .Help("Checks run, by check and result.")
//                                 .Register(registry);
//   Counter& ok = checks.Add({{"check", "replay"}, {"result", "ok"}});
//   ok.Increment();                       // hot path: lock-free
//   std::string text = registry.Serialize();  // exposition format 0.0.4
//
// Differences from prometheus-cpp: programming errors (invalid names, a name
// registered twice with different types or constant labels, a label that is
// both constant and per-child) abort the process with a message instead of
// throwing or asserting in debug builds only; Registry::Serialize() replaces
// Collect() plus a TextSerializer; AddCollectHook() refreshes on-demand
// values before each scrape.
//
// Naming (docs STYLE.md): prefix sdc_, counters end in _total, durations in
// _seconds, and only bounded label sets (check, result, node, gpu). The
// registry checks Prometheus syntax, not these conventions.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sdc::metrics {

// Label name -> label value. Values may hold any text; they are escaped on
// output.
using Labels = std::map<std::string, std::string>;

enum class MetricType { kCounter, kGauge, kHistogram };

// A monotonically increasing value (events, bytes). Thread-safe and
// lock-free.
class Counter {
 public:
  static constexpr MetricType kMetricType = MetricType::kCounter;

  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds 1.
  void Increment();
  // Adds `value`. A counter never decreases: negative or NaN values are
  // ignored.
  void Increment(double value);
  // The current total.
  double Value() const;

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue depth, bytes on disk). Thread-safe and
// lock-free.
class Gauge {
 public:
  static constexpr MetricType kMetricType = MetricType::kGauge;

  Gauge() = default;
  explicit Gauge(double value) : value_(value) {}
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value);
  // Adds 1, or `value` (which may be negative).
  void Increment();
  void Increment(double value);
  // Subtracts 1, or `value`.
  void Decrement();
  void Decrement(double value);
  double Value() const;

 private:
  std::atomic<double> value_{0.0};
};

// A distribution of observations in cumulative buckets, with their sum and
// count. Thread-safe and lock-free; a concurrent Snapshot() may see an
// observation in the counts but not yet in the sum.
class Histogram {
 public:
  static constexpr MetricType kMetricType = MetricType::kHistogram;

  // Upper bounds (inclusive: an observation equal to a bound lands in that
  // bucket), strictly increasing. The +Inf bucket is implicit; a trailing
  // +Inf bound is dropped.
  using BucketBoundaries = std::vector<double>;

  struct Snapshot {
    // cumulative_counts[i] counts observations <= boundaries()[i]; the last
    // element (one past the boundaries) is the +Inf bucket and equals count.
    std::vector<uint64_t> cumulative_counts;
    double sum = 0.0;
    uint64_t count = 0;
  };

  // REQUIRES: `boundaries` strictly increasing and free of NaN (aborts
  // otherwise).
  explicit Histogram(const BucketBoundaries& boundaries);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` in the first bucket whose bound is >= value and adds it to
  // the sum. NaN lands in the +Inf bucket and makes the sum NaN (as in the Go
  // client).
  void Observe(double value);

  const BucketBoundaries& boundaries() const { return boundaries_; }
  Snapshot Collect() const;

 private:
  const BucketBoundaries boundaries_;
  // boundaries_.size() + 1 per-bucket (not cumulative) counts; the last one
  // is the +Inf bucket.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

class Registry;
template <typename T>
class Family;

namespace internal {

// Aborts the process after printing "sdc::metrics: <message>" to stderr.
[[noreturn]] void Die(const std::string& message);

// Validates the child's label names against the family (syntax, reserved
// names, overlap with constant labels, "le" on histograms; aborts on error)
// and renders constant and child labels merged and sorted by name as
// `a="x",b="y"` (values escaped).
std::string RenderChildLabels(const std::string& family_name, MetricType type,
                              const Labels& constant_labels, const Labels& labels);

// Appends a child's sample lines. `labels` is the output of
// RenderChildLabels.
void AppendSamples(const std::string& name, const std::string& labels, const Counter& counter,
                   std::string* out);
void AppendSamples(const std::string& name, const std::string& labels, const Gauge& gauge,
                   std::string* out);
void AppendSamples(const std::string& name, const std::string& labels, const Histogram& histogram,
                   std::string* out);

// What the registry keeps of a family, whatever its type. Thread-safe.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;

  const std::string& GetName() const { return name_; }
  const std::string& GetHelp() const { return help_; }
  const Labels& GetConstantLabels() const { return constant_labels_; }
  MetricType type() const { return type_; }

  // Appends the family's HELP and TYPE lines and every child's samples.
  virtual void AppendTo(std::string* out) const = 0;

 protected:
  FamilyBase(std::string name, std::string help, Labels constant_labels, MetricType type)
      : name_(std::move(name)),
        help_(std::move(help)),
        constant_labels_(std::move(constant_labels)),
        type_(type) {}

  // Appends "# HELP ..." and "# TYPE ..." lines.
  void AppendHeader(std::string* out) const;

 private:
  const std::string name_;
  const std::string help_;
  const Labels constant_labels_;
  const MetricType type_;
};

// Configures a family; get one from BuildCounter(), BuildGauge() or
// BuildHistogram(). Not thread-safe (use one builder per thread).
template <typename T>
class Builder {
 public:
  // REQUIRES: matches [a-zA-Z_:][a-zA-Z0-9_:]*.
  Builder& Name(const std::string& name);
  // Default: empty. Any text; escaped on output.
  Builder& Help(const std::string& help);
  // Constant labels added to every child. Default: none.
  // REQUIRES: names match [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__".
  Builder& Labels(const std::map<std::string, std::string>& labels);

  // Returns the family registered under Name(), creating it if needed. The
  // family lives as long as `registry`. Aborts if the name or a label name is
  // invalid, or if the name is already registered with another type or other
  // constant labels. A second registration with the same type and constant
  // labels returns the first family (its help text is kept).
  Family<T>& Register(Registry& registry) const;

 private:
  std::string name_;
  std::string help_;
  std::map<std::string, std::string> labels_;
};

}  // namespace internal

// All children of one metric name, one per label set. Thread-safe: Add(),
// Remove() and Has() lock the family; the children they return are
// lock-free.
template <typename T>
class Family final : public internal::FamilyBase {
 public:
  // Returns the child for `labels`, creating it with T(args...) on first use;
  // later calls with the same labels return the same object and ignore
  // `args` (as in prometheus-cpp). The reference stays valid until Remove()
  // of that child or the registry's destruction. Cache it on hot paths: Add()
  // takes a lock and looks up a map.
  // REQUIRES: label names valid (see Builder::Labels), not also constant
  // labels, and not "le" for histograms. Aborts otherwise.
  template <typename... Args>
  T& Add(const Labels& labels, Args&&... args) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes `metric`, a child previously returned by Add(); does nothing if
  // it is not a child of this family. Invalidates references to it.
  void Remove(T* metric) ABSL_LOCKS_EXCLUDED(mu_);

  // True if a child with exactly `labels` exists.
  bool Has(const Labels& labels) const ABSL_LOCKS_EXCLUDED(mu_);

  // Children are written sorted by their label sets.
  void AppendTo(std::string* out) const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Registry;

  struct Child {
    std::string rendered_labels;
    std::unique_ptr<T> metric;
  };

  Family(std::string name, std::string help, Labels constant_labels)
      : FamilyBase(std::move(name), std::move(help), std::move(constant_labels), T::kMetricType) {}

  mutable absl::Mutex mu_;
  std::map<Labels, Child> children_ ABSL_GUARDED_BY(mu_);
};

// Owns families and writes them in the Prometheus text format. Thread-safe.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Runs every collect hook, in the order added and without holding any
  // registry lock (hooks may update metrics or register families), then
  // returns the text exposition format 0.0.4: families in registration
  // order, each with # HELP and # TYPE lines (also when it has no children),
  // then its samples. Empty when nothing is registered.
  std::string Serialize() const ABSL_LOCKS_EXCLUDED(mu_);

  // Adds `hook` to run at the start of every Serialize(), so gauges computed
  // on demand (database size, queue depth) are fresh at scrape time. Hooks
  // may run concurrently when scrapes overlap, so they must be thread-safe.
  void AddCollectHook(std::function<void()> hook) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  template <typename T>
  friend class internal::Builder;

  // See Builder::Register.
  template <typename T>
  Family<T>& Register(const std::string& name, const std::string& help, const Labels& labels)
      ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<internal::FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collect_hooks_ ABSL_GUARDED_BY(mu_);
};

internal::Builder<Counter> BuildCounter();
internal::Builder<Gauge> BuildGauge();
internal::Builder<Histogram> BuildHistogram();

// ---- Implementation of the Family template. ----

template <typename T>
template <typename... Args>
T& Family<T>::Add(const Labels& labels, Args&&... args) {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(labels);
  if (it != children_.end()) return *it->second.metric;
  // Only new label sets need checking: every stored one passed.
  Child child{internal::RenderChildLabels(GetName(), type(), GetConstantLabels(), labels),
              std::make_unique<T>(std::forward<Args>(args)...)};
  T& metric = *child.metric;
  children_.emplace(labels, std::move(child));
  return metric;
}

template <typename T>
void Family<T>::Remove(T* metric) {
  absl::MutexLock lock(&mu_);
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    if (it->second.metric.get() == metric) {
      children_.erase(it);
      return;
    }
  }
}

template <typename T>
bool Family<T>::Has(const Labels& labels) const {
  absl::MutexLock lock(&mu_);
  return children_.count(labels) > 0;
}

template <typename T>
void Family<T>::AppendTo(std::string* out) const {
  AppendHeader(out);
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, child] : children_) {
    internal::AppendSamples(GetName(), child.rendered_labels, *child.metric, out);
  }
}

}  // namespace sdc::metrics

#endif  // SDC_COMMON_METRICS_REGISTRY_H_
