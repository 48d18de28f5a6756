#ifndef SDC_AGENT_LOG_H_
#define SDC_AGENT_LOG_H_

#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sdc::agent {

// One line on stderr, "TIME sdc-agent: LINE", as sdcd logs. Thread-safe
// (one fprintf per line).
inline void Log(const std::string& line) {
  std::fprintf(stderr, "%s sdc-agent: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%S", absl::Now(), absl::LocalTimeZone()).c_str(),
               line.c_str());
}

}  // namespace sdc::agent

#endif  // SDC_AGENT_LOG_H_
