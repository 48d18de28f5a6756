#ifndef SDC_DAEMON_BATCH_SCOPE_H_
#define SDC_DAEMON_BATCH_SCOPE_H_

// Work a thread puts off until it has run a whole batch of callbacks.
//
// sdcd's store runs the callbacks of each commit on one thread, one after
// another: at 16,384 ranks that is thousands of acknowledgements, many for
// the same stream (a relay carries a node's ranks). Each would start its
// own gRPC write. Inside a BatchScope a stream queues its message and
// defers one pump to the end of the batch, so that the batch's messages
// for one stream leave in as few writes as the stream allows.

#include <functional>
#include <utility>
#include <vector>

namespace sdc::daemon {

class BatchScope {
 public:
  BatchScope() : outer_(current_) { current_ = this; }
  ~BatchScope() {
    current_ = outer_;
    // Deferred work may defer more (to the enclosing scope, or none: then
    // it runs at once).
    for (auto& fn : deferred_) fn();
  }
  BatchScope(const BatchScope&) = delete;
  BatchScope& operator=(const BatchScope&) = delete;

  // Runs `fn` when this thread's innermost scope ends; false (and `fn` not
  // taken) when the thread is in no scope.
  static bool Defer(std::function<void()>& fn) {
    if (current_ == nullptr) return false;
    current_->deferred_.push_back(std::move(fn));
    return true;
  }

 private:
  static inline thread_local BatchScope* current_ = nullptr;
  BatchScope* const outer_;
  std::vector<std::function<void()>> deferred_;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_BATCH_SCOPE_H_
