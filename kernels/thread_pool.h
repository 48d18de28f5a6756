#ifndef SDC_KERNELS_THREAD_POOL_H_
#define SDC_KERNELS_THREAD_POOL_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace sdc::kernels {

// A fixed set of worker threads that runs one parallel loop at a time; the
// calling thread takes part in the loop. The kernels split work into chunks
// and hand the chunk indices out through ParallelFor.
//
// Thread-safe: ParallelFor may be called from any thread; concurrent calls
// run one after the other.
class ThreadPool {
 public:
  // REQUIRES: threads >= 1. Starts threads - 1 workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Number of threads a loop runs on, the caller included.
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n) and returns when all calls returned.
  // REQUIRES: fn does not call ParallelFor on the same pool.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn);

  // A process-wide pool with one thread per hardware thread, created on first
  // use and never destroyed (kernels may run during static destruction).
  static ThreadPool& Default();

 private:
  struct Loop;

  void WorkerMain();
  static void RunLoop(Loop& loop);

  absl::Mutex run_mu_;  // Serializes ParallelFor calls.
  absl::Mutex mu_;
  Loop* loop_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int busy_workers_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_THREAD_POOL_H_
