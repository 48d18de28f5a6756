#include "common/metrics/exposer.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sdc::metrics {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

struct ListenAddress {
  std::string listening_ports;  // civetweb's syntax: "127.0.0.1:9464" or "9464".
  in_addr ip;                   // INADDR_ANY for every interface.
  uint16_t port;
};

// Parses "host:port" (see Exposer::Start).
absl::StatusOr<ListenAddress> ParseAddress(const std::string& address) {
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
  if (host.empty()) {  // Every IPv4 interface.
    parsed.listening_ports = port_text;
    parsed.ip.s_addr = htonl(INADDR_ANY);
    return parsed;
  }
  if (host == "localhost") host = "127.0.0.1";
  if (host.front() == '[') {
    // Debian's civetweb 1.15 is built without IPv6 (mg_check_feature(8) == 0).
    return bad("IPv6 is not supported by this civetweb build");
  }
  if (inet_pton(AF_INET, host.c_str(), &parsed.ip) != 1) {
    return bad("host \"" + host + "\" is not an IPv4 literal or localhost");
  }
  parsed.listening_ports = absl::StrCat(host, ":", port_text);
  return parsed;
}

// civetweb only says "Failed to setup server ports"; binding the same
// address ourselves recovers the reason ("Address already in use"). Empty if
// the probe binds (the cause was elsewhere, or the port was freed since).
std::string BindFailureReason(const ListenAddress& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // As civetweb does.
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr = address.ip;
  addr.sin_port = htons(address.port);
  std::string reason;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    reason = std::strerror(errno);
  }
  close(fd);
  return reason;
}

bool IsGet(struct mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  return info != nullptr && info->request_method != nullptr &&
         std::strcmp(info->request_method, "GET") == 0;
}

// True for a GET of exactly `path`; civetweb also routes "<path>/..." here.
bool IsGetOf(struct mg_connection* conn, const char* path) {
  const mg_request_info* info = mg_get_request_info(conn);
  return IsGet(conn) && info->local_uri != nullptr && std::strcmp(info->local_uri, path) == 0;
}

int SendOk(struct mg_connection* conn, const char* content_type, const std::string& body) {
  mg_send_http_ok(conn, content_type, static_cast<long long>(body.size()));
  mg_write(conn, body.data(), body.size());
  return 200;
}

int SendNotFound(struct mg_connection* conn) {
  // civetweb writes the body "Error 404: Not Found\n" plus this text.
  mg_send_http_error(conn, 404, "%s", "");
  return 404;
}

// cbdata: the Registry.
int HandleMetrics(struct mg_connection* conn, void* registry) {
  if (!IsGetOf(conn, "/metrics")) return SendNotFound(conn);
  return SendOk(conn, kMetricsContentType, static_cast<Registry*>(registry)->Serialize());
}

// cbdata: the health detail function (may be empty).
int HandleHealthz(struct mg_connection* conn, void* detail) {
  if (!IsGetOf(conn, "/healthz")) return SendNotFound(conn);
  const auto& health_detail = *static_cast<const std::function<std::string()>*>(detail);
  return SendOk(conn, "text/plain; charset=utf-8",
                health_detail ? "ok\n" + health_detail() : std::string("ok\n"));
}

int HandleNotFound(struct mg_connection* conn, void* unused) { return SendNotFound(conn); }

}  // namespace

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Start(
    const std::string& address, Registry* registry,
    std::function<std::string()> health_detail) {
  absl::StatusOr<ListenAddress> parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();

  // civetweb wants this once per process before mg_start; thread-safe static
  // initialization gives exactly once.
  static const unsigned kCivetwebFeatures = mg_init_library(0);
  (void)kCivetwebFeatures;

  // clang-format off
  const char* options[] = {
      "listening_ports", parsed->listening_ports.c_str(),
      "num_threads", "2",
      // A stalled client holds a worker thread at most this long.
      "request_timeout_ms", "10000",
      nullptr,
  };
  // clang-format on
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.configuration_options = options;
  unsigned error_code = 0;
  char error_text[256] = "";
  mg_error_data error;
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);

  auto exposer = std::unique_ptr<Exposer>(new Exposer());
  exposer->health_detail_ = std::move(health_detail);
  mg_context* context = mg_start2(&init, &error);
  if (context == nullptr) {
    const std::string reason = BindFailureReason(*parsed);
    return absl::UnavailableError(
        absl::StrCat("metrics address \"", address, "\": cannot listen: ", error_text,
                     reason.empty() ? "" : " (", reason, reason.empty() ? "" : ")"));
  }
  mg_server_port ports[4];
  std::memset(ports, 0, sizeof(ports));
  const int num_ports = mg_get_server_ports(context, 4, ports);
  if (num_ports < 1 || ports[0].port <= 0) {
    mg_stop(context);
    return absl::UnavailableError(
        absl::StrCat("metrics address \"", address, "\": civetweb reports no listening port"));
  }
  exposer->port_ = ports[0].port;
  // Exact paths and catch-all; a handler set after mg_start may miss a
  // request that raced with it, which is harmless before Start() returns.
  mg_set_request_handler(context, "/metrics", &HandleMetrics, registry);
  mg_set_request_handler(context, "/healthz", &HandleHealthz, &exposer->health_detail_);
  mg_set_request_handler(context, "**", &HandleNotFound, nullptr);
  {
    absl::MutexLock lock(&exposer->mu_);
    exposer->context_ = context;
  }
  return exposer;
}

Exposer::~Exposer() { Stop(); }

void Exposer::Stop() {
  absl::MutexLock lock(&mu_);
  if (context_ == nullptr) return;
  // Handlers never take mu_, so waiting for them here cannot deadlock.
  mg_stop(context_);
  context_ = nullptr;
}

}  // namespace sdc::metrics
