#ifndef SDC_DEMO_TCP_PROXY_H_
#define SDC_DEMO_TCP_PROXY_H_

// A loopback TCP proxy for fault injection (tests, the demo): clients dial
// its port and every connection is forwarded to 127.0.0.1:<target>. It plays
// the name trainers dial (a Kubernetes Service, a DNS name) in front of
// sdcd: Retarget moves it to sdcd restarted on a new port; Cut closes every
// connection through it and refuses new ones (accepted, then closed at
// once: a network that drops a node's traffic) until Restore.
//
// Thread-safe. One thread accepts; each connection is pumped by two threads.

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace sdc::demo {

class TcpProxy {
 public:
  // Listens on 127.0.0.1 (a free port) and forwards to `target_port`
  // (0: refuse until Retarget).
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(int target_port);
  ~TcpProxy();  // Closes everything and joins its threads.

  int port() const { return port_; }
  // New connections go to `target_port`; those open now are closed (their
  // server is the old one).
  void Retarget(int target_port);
  // Closes every connection and refuses new ones until Restore.
  void Cut();
  void Restore();
  // Connections forwarded since the start.
  uint64_t forwarded() const { return forwarded_.load(); }

 private:
  struct Pair {
    int client = -1;
    int server = -1;
    std::thread up, down;
    std::atomic<int> done{0};  // Pumps that ended.
  };

  TcpProxy() = default;
  void AcceptLoop();
  // Closes both ends of every open connection.
  void CloseAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins and closes the connections whose pumps both ended.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> forwarded_{0};

  absl::Mutex mu_;
  int target_ ABSL_GUARDED_BY(mu_) = 0;
  bool cut_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Pair>> pairs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::demo

#endif  // SDC_DEMO_TCP_PROXY_H_
