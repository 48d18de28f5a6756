#ifndef SDC_COMMON_METRICS_TEST_HTTP_CLIENT_H_
#define SDC_COMMON_METRICS_TEST_HTTP_CLIENT_H_

// The exposer tests' HTTP client: requests written verbatim to a loopback
// port, the answer read until the server closes. Every socket call is
// bounded by a 5 s timeout.

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace sdc::metrics::testing {

struct HttpResponse {
  std::string status_line;
  std::map<std::string, std::string> headers;  // Names lower-cased.
  std::string body;
};

// Sends `request` verbatim to 127.0.0.1:`port` and reads until the server
// closes. kUnavailable when the connection is refused.
absl::StatusOr<std::string> Exchange(int port, const std::string& request);

// GET `path` over HTTP/1.0 (the server closes after one answer), split
// into status line, headers and body.
absl::StatusOr<HttpResponse> Get(int port, const std::string& path);

}  // namespace sdc::metrics::testing

#endif  // SDC_COMMON_METRICS_TEST_HTTP_CLIENT_H_
