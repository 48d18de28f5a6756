#ifndef SDC_COMMON_METRICS_LISTEN_ADDRESS_H_
#define SDC_COMMON_METRICS_LISTEN_ADDRESS_H_

// Where a metrics exposer listens, as sdcd, sdc-agent and trainers spell
// it (--metrics_listen, SDC_METRICS_LISTEN): "host:port", host an IPv4
// literal, "localhost" (127.0.0.1) or empty for every IPv4 interface
// (":9464"); port 0 asks for a free one. IPv4 only.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace sdc::metrics {

struct ListenAddress {
  std::string host;  // Dotted IPv4: "127.0.0.1"; "0.0.0.0" for every interface.
  uint16_t port = 0;
};

// kInvalidArgument, naming `address` and what is wrong with it, unless it
// is as above.
absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address);

}  // namespace sdc::metrics

#endif  // SDC_COMMON_METRICS_LISTEN_ADDRESS_H_
