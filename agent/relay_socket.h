#ifndef SDC_AGENT_RELAY_SOCKET_H_
#define SDC_AGENT_RELAY_SOCKET_H_

// The relay's Unix socket (sdc-agent --relay_listen=unix:PATH), owned here
// rather than by gRPC so that only the users you configure reach it: the
// agent speaks for every rank it relays (sdcd places them on this agent's
// node), so a process of another user on the node must not. The socket
// file is not world-writable (mode 0660, optionally group --relay_group),
// and each connection's peer is read with SO_PEERCRED: a uid not in the
// allowed list is closed at once (logged, counted), before gRPC sees a
// byte; the others are handed to the gRPC server
// (grpc::AddInsecureChannelFromFd).

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace sdc::agent {

// Thread-safe.
class RelaySocket {
 public:
  // Binds `path` (a stale socket file there is replaced), mode 0660, owned
  // by `gid` when it is not -1. Internal naming the step that failed.
  static absl::StatusOr<std::unique_ptr<RelaySocket>> Listen(const std::string& path,
                                                             std::set<uid_t> allowed_uids,
                                                             gid_t gid);
  ~RelaySocket();  // Stop().

  // Accepts connections on its own thread, handing allowed ones to
  // `server` (built with no listening port; it must outlive Stop()).
  void Serve(grpc::Server* server);
  // Stops accepting and removes the socket file. Idempotent.
  void Stop();

  // Connections refused because of their peer's uid.
  uint64_t refused() const { return refused_.load(); }

 private:
  RelaySocket(std::string path, int fd, std::set<uid_t> allowed)
      : path_(std::move(path)), fd_(fd), allowed_(std::move(allowed)) {}
  void AcceptLoop(grpc::Server* server);

  const std::string path_;
  int fd_;
  const std::set<uid_t> allowed_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace sdc::agent

#endif  // SDC_AGENT_RELAY_SOCKET_H_
