#include "common/metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace sdc::metrics {
namespace {

// std::atomic<double>::fetch_add arrives in C++20.
void AtomicAdd(std::atomic<double>* target, double delta) {
  double current = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c));
    if (!ok) return false;
  }
  return true;
}

// [a-zA-Z_][a-zA-Z0-9_]*
bool IsValidLabelName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c));
    if (!ok) return false;
  }
  return true;
}

void CheckLabelName(const std::string& family_name, const std::string& label_name) {
  if (!IsValidLabelName(label_name)) {
    internal::Die("invalid label name \"" + label_name + "\" in metric family \"" + family_name +
                  "\": label names must match [a-zA-Z_][a-zA-Z0-9_]*");
  }
  if (label_name.rfind("__", 0) == 0) {
    internal::Die("invalid label name \"" + label_name + "\" in metric family \"" + family_name +
                  "\": names starting with __ are reserved for Prometheus");
  }
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Integral values below 2^53 print as integers ("3"), others as the shortest
// text that parses back to the same double ("0.25", "1e-09", "1e+21").
std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::to_chars_result result;
  constexpr double kTwoTo53 = 9007199254740992.0;
  if (std::fabs(value) < kTwoTo53 && std::trunc(value) == value) {
    result = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
  } else {
    result = std::to_chars(buf, buf + sizeof(buf), value);
  }
  return std::string(buf, result.ptr);
}

std::string FormatCount(uint64_t count) {
  char buf[32];
  auto result = std::to_chars(buf, buf + sizeof(buf), count);
  return std::string(buf, result.ptr);
}

// name{labels} value\n, without braces when there are no labels.
void AppendSample(const std::string& name, const char* suffix, const std::string& labels,
                  const std::string& value, std::string* out) {
  out->append(name).append(suffix);
  if (!labels.empty()) out->append("{").append(labels).append("}");
  out->append(" ").append(value).append("\n");
}

Histogram::BucketBoundaries CheckedBoundaries(Histogram::BucketBoundaries boundaries) {
  if (!boundaries.empty() && std::isinf(boundaries.back()) && boundaries.back() > 0) {
    boundaries.pop_back();
  }
  for (size_t i = 0; i < boundaries.size(); ++i) {
    if (std::isnan(boundaries[i])) internal::Die("histogram bucket boundary is NaN");
    if (i > 0 && !(boundaries[i - 1] < boundaries[i])) {
      internal::Die("histogram bucket boundaries must be strictly increasing, got " +
                    FormatValue(boundaries[i - 1]) + " then " + FormatValue(boundaries[i]));
    }
  }
  return boundaries;
}

}  // namespace

// ---- Counter, Gauge, Histogram ----

void Counter::Increment() { AtomicAdd(&value_, 1.0); }

void Counter::Increment(double value) {
  if (!(value >= 0.0)) return;  // Also rejects NaN.
  AtomicAdd(&value_, value);
}

double Counter::Value() const { return value_.load(std::memory_order_relaxed); }

void Gauge::Set(double value) { value_.store(value, std::memory_order_relaxed); }
void Gauge::Increment() { AtomicAdd(&value_, 1.0); }
void Gauge::Increment(double value) { AtomicAdd(&value_, value); }
void Gauge::Decrement() { AtomicAdd(&value_, -1.0); }
void Gauge::Decrement(double value) { AtomicAdd(&value_, -value); }
double Gauge::Value() const { return value_.load(std::memory_order_relaxed); }

Histogram::Histogram(const BucketBoundaries& boundaries)
    : boundaries_(CheckedBoundaries(boundaries)),
      counts_(new std::atomic<uint64_t>[boundaries_.size() + 1]) {
  for (size_t i = 0; i <= boundaries_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  // lower_bound finds the first bound >= value; NaN compares false with
  // everything, so it is sent to the +Inf bucket explicitly.
  const size_t bucket =
      std::isnan(value)
          ? boundaries_.size()
          : static_cast<size_t>(std::lower_bound(boundaries_.begin(), boundaries_.end(), value) -
                                boundaries_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, value);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot snapshot;
  snapshot.cumulative_counts.resize(boundaries_.size() + 1);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= boundaries_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts[i] = cumulative;
  }
  snapshot.count = cumulative;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

// ---- internal ----

namespace internal {

void Die(const std::string& message) {
  std::fprintf(stderr, "sdc::metrics: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string RenderChildLabels(const std::string& family_name, MetricType type,
                              const Labels& constant_labels, const Labels& labels) {
  Labels merged = constant_labels;
  for (const auto& [name, value] : labels) {
    CheckLabelName(family_name, name);
    if (type == MetricType::kHistogram && name == "le") {
      Die("label name \"le\" in histogram \"" + family_name + "\" is reserved for bucket bounds");
    }
    if (!merged.emplace(name, value).second) {
      Die("label \"" + name + "\" of a child of metric family \"" + family_name +
          "\" is already a constant label of the family");
    }
  }
  std::string out;
  for (const auto& [name, value] : merged) {
    if (!out.empty()) out += ',';
    out.append(name).append("=\"").append(EscapeLabelValue(value)).append("\"");
  }
  return out;
}

void AppendSamples(const std::string& name, const std::string& labels, const Counter& counter,
                   std::string* out) {
  AppendSample(name, "", labels, FormatValue(counter.Value()), out);
}

void AppendSamples(const std::string& name, const std::string& labels, const Gauge& gauge,
                   std::string* out) {
  AppendSample(name, "", labels, FormatValue(gauge.Value()), out);
}

void AppendSamples(const std::string& name, const std::string& labels, const Histogram& histogram,
                   std::string* out) {
  const Histogram::Snapshot snapshot = histogram.Collect();
  const std::string prefix = labels.empty() ? "" : labels + ",";
  const auto& bounds = histogram.boundaries();
  for (size_t i = 0; i <= bounds.size(); ++i) {
    const std::string le = i < bounds.size() ? FormatValue(bounds[i]) : "+Inf";
    AppendSample(name, "_bucket", prefix + "le=\"" + le + "\"",
                 FormatCount(snapshot.cumulative_counts[i]), out);
  }
  AppendSample(name, "_sum", labels, FormatValue(snapshot.sum), out);
  AppendSample(name, "_count", labels, FormatCount(snapshot.count), out);
}

void FamilyBase::AppendHeader(std::string* out) const {
  out->append("# HELP ").append(name_).append(" ").append(EscapeHelp(help_)).append("\n");
  out->append("# TYPE ").append(name_).append(" ").append(TypeName(type_)).append("\n");
}

template <typename T>
Builder<T>& Builder<T>::Name(const std::string& name) {
  name_ = name;
  return *this;
}

template <typename T>
Builder<T>& Builder<T>::Help(const std::string& help) {
  help_ = help;
  return *this;
}

template <typename T>
Builder<T>& Builder<T>::Labels(const std::map<std::string, std::string>& labels) {
  labels_ = labels;
  return *this;
}

template <typename T>
Family<T>& Builder<T>::Register(Registry& registry) const {
  return registry.Register<T>(name_, help_, labels_);
}

}  // namespace internal

// ---- Registry ----

Registry::Registry() = default;
Registry::~Registry() = default;

template <typename T>
Family<T>& Registry::Register(const std::string& name, const std::string& help,
                              const Labels& labels) {
  if (!IsValidMetricName(name)) {
    internal::Die("invalid metric name \"" + name +
                  "\": metric names must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  for (const auto& [label_name, value] : labels) {
    CheckLabelName(name, label_name);
    if (T::kMetricType == MetricType::kHistogram && label_name == "le") {
      internal::Die("label name \"le\" in histogram \"" + name +
                    "\" is reserved for bucket bounds");
    }
  }
  absl::MutexLock lock(&mu_);
  for (const auto& family : families_) {
    if (family->GetName() != name) continue;
    if (family->type() != T::kMetricType) {
      internal::Die("metric family \"" + name + "\" is already registered as a " +
                    TypeName(family->type()) + "; cannot register it as a " +
                    TypeName(T::kMetricType));
    }
    if (family->GetConstantLabels() != labels) {
      internal::Die("metric family \"" + name +
                    "\" is already registered with other constant labels");
    }
    return static_cast<Family<T>&>(*family);
  }
  families_.push_back(std::unique_ptr<Family<T>>(new Family<T>(name, help, labels)));
  return static_cast<Family<T>&>(*families_.back());
}

std::string Registry::Serialize() const {
  std::vector<std::function<void()>> hooks;
  {
    absl::MutexLock lock(&mu_);
    hooks = collect_hooks_;
  }
  for (const auto& hook : hooks) hook();

  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& family : families_) family->AppendTo(&out);
  return out;
}

void Registry::AddCollectHook(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  collect_hooks_.push_back(std::move(hook));
}

namespace internal {
// After Registry::Register, which these instantiate.
template class Builder<Counter>;
template class Builder<Gauge>;
template class Builder<Histogram>;
}  // namespace internal

internal::Builder<Counter> BuildCounter() { return {}; }
internal::Builder<Gauge> BuildGauge() { return {}; }
internal::Builder<Histogram> BuildHistogram() { return {}; }

}  // namespace sdc::metrics
