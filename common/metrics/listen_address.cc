#include "common/metrics/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sdc::metrics {

absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address) {
  const auto bad = [&address](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", address, "\": ", why,
                                                   " (expected host:port, e.g. 127.0.0.1:9464)"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  uint32_t port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return bad("port \"" + port_text + "\" is not a number in 0..65535");
  }
  ListenAddress parsed;
  parsed.port = static_cast<uint16_t>(port);
  if (host.empty()) {
    parsed.host = "0.0.0.0";
    return parsed;
  }
  if (host == "localhost") host = "127.0.0.1";
  if (host.front() == '[') return bad("IPv6 is not supported");
  in_addr ip;
  if (inet_pton(AF_INET, host.c_str(), &ip) != 1) {
    return bad("host \"" + host + "\" is not an IPv4 literal or localhost");
  }
  parsed.host = host;
  return parsed;
}

}  // namespace sdc::metrics
