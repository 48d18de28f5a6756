#include "common/metrics/pull_exposer.h"

#include <CivetServer.h>
#include <civetweb.h>

#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/listen_address.h"

namespace sdc::metrics {
namespace {

// civetweb's log lines while this thread starts a server: why a bind failed.
thread_local std::string* start_log = nullptr;

int LogMessage(const mg_connection*, const char* message) {
  if (start_log == nullptr) return 0;  // Not starting: civetweb logs as usual.
  if (!start_log->empty()) start_log->append("; ");
  start_log->append(message);
  return 1;
}

// Runs before civetweb looks for a handler: answers /healthz and 404s
// everything but GET /metrics (civetweb would hand /metricsx, or a POST, to
// the /metrics handler's prefix).
int BeginRequest(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const bool get = request != nullptr && std::strcmp(request->request_method, "GET") == 0;
  if (get && std::strcmp(request->local_uri, "/metrics") == 0) return 0;  // prometheus-cpp's.
  if (get && std::strcmp(request->local_uri, "/healthz") == 0) {
    constexpr char kOk[] = "ok\n";
    mg_send_http_ok(connection, "text/plain; charset=utf-8", sizeof(kOk) - 1);
    mg_write(connection, kOk, sizeof(kOk) - 1);
    return 200;
  }
  mg_send_http_error(connection, 404, "Error 404: Not Found\n");
  return 404;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PullExposer>> PullExposer::Start(
    const std::string& address, std::shared_ptr<prometheus::Collectable> metrics) {
  absl::StatusOr<ListenAddress> parsed = ParseListenAddress(address);
  if (!parsed.ok()) return parsed.status();
  CivetCallbacks callbacks;
  callbacks.begin_request = BeginRequest;
  callbacks.log_message = LogMessage;
  std::string log;
  start_log = &log;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", absl::StrCat(parsed->host, ":", parsed->port),
                                 "num_threads", "2"},
        &callbacks);
  } catch (const std::exception& e) {
    start_log = nullptr;
    return absl::UnavailableError(absl::StrCat("metrics address \"", address,
                                               "\": cannot listen: ",
                                               log.empty() ? e.what() : log));
  }
  start_log = nullptr;
  exposer->RegisterCollectable(metrics);
  const std::vector<int> ports = exposer->GetListeningPorts();
  const int port = ports.empty() ? 0 : ports.front();
  return std::unique_ptr<PullExposer>(new PullExposer(std::move(exposer), port));
}

void PullExposer::Stop() { exposer_.reset(); }

}  // namespace sdc::metrics
