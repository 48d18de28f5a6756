#include "demo/progress_line.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sdc::demo {
namespace {

using Json = nlohmann::json;
// Written lines keep their keys in the order given (step and rank first),
// as the Python trainer's json.dumps does, for people reading the files.
using OrderedJson = nlohmann::ordered_json;

// JSON has no NaN or infinity; null stands for them (the Python trainer's
// json.dumps(allow_nan=False) side does the same).
OrderedJson Number(double v) { return std::isfinite(v) ? OrderedJson(v) : OrderedJson(nullptr); }

template <typename J>
std::string Dump(const J& j) {
  // Replace, not throw, on invalid UTF-8: a reason is text from the guard
  // (tensor names included), and a progress line must always be written.
  return j.dump(-1, ' ', /*ensure_ascii=*/false, J::error_handler_t::replace);
}

// Typed access to one object's keys, remembering the first error.
class Fields {
 public:
  explicit Fields(const Json& object) : object_(object) {}

  const absl::Status& status() const { return status_; }

  int Int(const char* key) {
    const Json* v = Find(key);
    if (v == nullptr) return 0;
    constexpr int64_t kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
    const bool fits = v->is_number_unsigned()  ? v->get<uint64_t>() <= static_cast<uint64_t>(kMax)
                      : v->is_number_integer() ? v->get<int64_t>() >= kMin && v->get<int64_t>() <= kMax
                                               : false;
    if (!fits) {
      Wrong(key, "an integer", *v);
      return 0;
    }
    return static_cast<int>(v->get<int64_t>());
  }

  double Double(const char* key) {
    const Json* v = Find(key);
    if (v == nullptr) return 0;
    if (v->is_null()) return std::numeric_limits<double>::quiet_NaN();
    if (!v->is_number()) {
      Wrong(key, "a number or null", *v);
      return 0;
    }
    return v->get<double>();
  }

  bool Bool(const char* key) {
    const Json* v = Find(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      Wrong(key, "true or false", *v);
      return false;
    }
    return v->get<bool>();
  }

  std::string String(const char* key) {
    const Json* v = Find(key);
    if (v == nullptr) return "";
    if (!v->is_string()) {
      Wrong(key, "a string", *v);
      return "";
    }
    return v->get<std::string>();
  }

 private:
  const Json* Find(const char* key) {
    if (!status_.ok()) return nullptr;
    auto it = object_.find(key);
    if (it == object_.end()) {
      status_ = absl::InvalidArgumentError(absl::StrCat("no \"", key, "\""));
      return nullptr;
    }
    return &*it;
  }

  void Wrong(const char* key, const char* expected, const Json& got) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" must be ", expected, ", got ", Dump(got).substr(0, 80)));
  }

  const Json& object_;
  absl::Status status_;
};

absl::StatusOr<ProgressLine> ParseFinal(const Json& j) {
  Fields f(j);
  FinalRecord r;
  r.rank = f.Int("rank");
  r.weights_digest = f.String("weights_digest");
  if (!f.status().ok()) return f.status();
  if (auto guard = j.find("guard"); guard != j.end()) {
    if (!guard->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"guard\" must be an object, got ", Dump(*guard).substr(0, 80)));
    }
    for (const auto& [name, value] : guard->items()) {
      if (value.is_number_integer()) r.guard[name] = value.get<int64_t>();
    }
  }
  return r;
}

absl::StatusOr<ProgressLine> ParseStep(const Json& j) {
  Fields f(j);
  StepRecord r;
  r.step = f.Int("step");
  r.rank = f.Int("rank");
  r.loss = f.Double("loss");
  r.apply = f.Bool("apply");
  r.reason = f.String("reason");
  r.audited = f.Bool("audited");
  r.outcome = f.String("outcome");
  r.unverified = f.Bool("unverified");
  r.norm = f.Double("norm");
  r.repaired = f.Bool("repaired");
  r.checkpoint = f.String("checkpoint");
  r.ms = f.Double("ms");
  r.check1_ms = f.Double("check1_ms");
  r.agreement_ms = f.Double("agreement_ms");
  r.audit_ms = f.Double("audit_ms");
  r.weight_ms = f.Double("weight_ms");
  r.end_unix_ms = f.Double("end_unix_ms");
  if (j.contains("collectives")) r.collectives = f.Int("collectives");
  if (!f.status().ok()) return f.status();
  return r;
}

}  // namespace

std::string StepLine(const StepRecord& r) {
  OrderedJson j = {
      {"step", r.step},
      {"rank", r.rank},
      {"loss", Number(r.loss)},
      {"apply", r.apply},
      {"reason", r.reason},
      {"audited", r.audited},
      {"outcome", r.outcome},
      {"unverified", r.unverified},
      {"norm", Number(r.norm)},
      {"repaired", r.repaired},
      {"checkpoint", r.checkpoint},
      {"ms", Number(r.ms)},
      {"check1_ms", Number(r.check1_ms)},
      {"agreement_ms", Number(r.agreement_ms)},
      {"audit_ms", Number(r.audit_ms)},
      {"weight_ms", Number(r.weight_ms)},
      {"end_unix_ms", Number(r.end_unix_ms)},
  };
  if (r.collectives >= 0) j["collectives"] = r.collectives;
  return Dump(j);
}

std::string FinalLine(const FinalRecord& r) {
  OrderedJson guard = OrderedJson::object();
  for (const auto& [name, value] : r.guard) guard[name] = value;
  const OrderedJson j = {{"final", true},
                         {"rank", r.rank},
                         {"weights_digest", r.weights_digest},
                         {"guard", std::move(guard)}};
  return Dump(j);
}

absl::StatusOr<ProgressLine> ParseProgressLine(std::string_view line) {
  Json j;
  try {
    j = Json::parse(line.begin(), line.end());
  } catch (const Json::exception& e) {
    // Not only parse_error: a number too large for a double is out_of_range.
    // e.what() reads "[json.exception.parse_error.101] parse error at line 1,
    // column 7: syntax error while parsing value - ...": keep what follows the id.
    std::string what = e.what();
    if (const size_t at = what.find("] "); at != std::string::npos) what.erase(0, at + 2);
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", what));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a JSON object: ", Dump(j).substr(0, 80)));
  }
  auto final = j.find("final");
  if (final == j.end()) return ParseStep(j);
  if (*final != true) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"final\" must be true, got ", Dump(*final).substr(0, 80)));
  }
  return ParseFinal(j);
}

}  // namespace sdc::demo
