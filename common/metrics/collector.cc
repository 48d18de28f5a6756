#include "common/metrics/collector.h"

#include <algorithm>
#include <map>
#include <utility>

#include "prometheus/text_serializer.h"

namespace sdc::metrics {
namespace {

// HELP text as the exposition format writes it: backslash and newline
// escaped.
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

bool LabelsBefore(const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) {
  return std::lexicographical_compare(a.label.begin(), a.label.end(), b.label.begin(),
                                      b.label.end());
}

}  // namespace

void Collector::AddCollectHook(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

void Collector::Declare(Declared declared) {
  absl::MutexLock lock(&mu_);
  for (const Declared& d : declared_) {
    if (d.name == declared.name) return;
  }
  declared_.push_back(std::move(declared));
}

std::vector<prometheus::MetricFamily> Collector::Collect() const {
  std::vector<std::function<void()>> hooks;
  {
    absl::MutexLock lock(&mu_);
    hooks = hooks_;
  }
  for (const auto& hook : hooks) hook();
  std::map<std::string, prometheus::MetricFamily> collected;
  for (prometheus::MetricFamily& f : registry_.Collect()) {
    std::string name = f.name;
    collected.emplace(std::move(name), std::move(f));
  }
  std::vector<prometheus::MetricFamily> out;
  absl::MutexLock lock(&mu_);
  out.reserve(declared_.size());
  for (const Declared& d : declared_) {
    auto it = collected.find(d.name);
    if (it == collected.end()) {
      out.push_back({d.name, d.help, d.type, {}});
    } else {
      out.push_back(std::move(it->second));
      std::sort(out.back().metric.begin(), out.back().metric.end(), LabelsBefore);
    }
    out.back().help = EscapeHelp(out.back().help);
  }
  return out;
}

std::string Collector::Serialize() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace sdc::metrics
