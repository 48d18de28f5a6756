#ifndef SDC_AGENT_WORKER_H_
#define SDC_AGENT_WORKER_H_

// A thread that runs posted tasks one at a time, in order: diagnostics and
// node actions run here, never on the stream's threads. Thread-safe.

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sdc::agent {

class SerialWorker {
 public:
  SerialWorker();
  // Drops the tasks not yet started and waits for the running one.
  ~SerialWorker();

  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void Post(std::function<void()> task);
  // Tasks posted and not yet finished (the running one included).
  size_t pending() const;

 private:
  void Main();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sdc::agent

#endif  // SDC_AGENT_WORKER_H_
