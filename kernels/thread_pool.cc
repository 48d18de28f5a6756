#include "kernels/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace sdc::kernels {

struct ThreadPool::Loop {
  Loop(int64_t n, absl::FunctionRef<void(int64_t)> fn) : n(n), fn(fn) {}
  const int64_t n;
  absl::FunctionRef<void(int64_t)> fn;
  std::atomic<int64_t> next{0};
};

ThreadPool::ThreadPool(int threads) {
  const int workers = std::max(threads, 1) - 1;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) {
    workers_.emplace_back([this] { WorkerMain(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* const pool = new ThreadPool(
      std::max(1u, std::thread::hardware_concurrency()));
  return *pool;
}

void ThreadPool::RunLoop(Loop& loop) {
  for (int64_t i = loop.next.fetch_add(1, std::memory_order_relaxed);
       i < loop.n; i = loop.next.fetch_add(1, std::memory_order_relaxed)) {
    loop.fn(i);
  }
}

void ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  absl::MutexLock run_lock(&run_mu_);
  Loop loop(n, fn);
  {
    absl::MutexLock lock(&mu_);
    loop_ = &loop;
    ++generation_;
    busy_workers_ = static_cast<int>(workers_.size());
  }
  RunLoop(loop);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* busy) { return *busy == 0; }, &busy_workers_));
  loop_ = nullptr;
}

void ThreadPool::WorkerMain() {
  uint64_t seen = 0;
  while (true) {
    Loop* loop;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      seen = generation_;
      loop = loop_;
    }
    RunLoop(*loop);
    absl::MutexLock lock(&mu_);
    --busy_workers_;
  }
}

}  // namespace sdc::kernels
