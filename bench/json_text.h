#ifndef SDC_BENCH_JSON_TEXT_H_
#define SDC_BENCH_JSON_TEXT_H_

// The few pieces of JSON the benches' last lines are written with.

#include <optional>
#include <string>

namespace sdc::bench {

// A JSON string's contents: quotes, backslashes and control bytes escaped.
std::string JsonEscape(const std::string& s);

// `v` with three decimals, or null when absent or not finite.
std::string JsonNumberOrNull(std::optional<double> v);

}  // namespace sdc::bench

#endif  // SDC_BENCH_JSON_TEXT_H_
