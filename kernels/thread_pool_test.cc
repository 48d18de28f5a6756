#include "kernels/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sdc::kernels {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n
                                     << " i=" << i;
      }
    }
  }
}

TEST(ThreadPoolTest, UsesMoreThanOneThreadForLongLoops) {
  ThreadPool pool(3);
  std::vector<std::thread::id> ids(3000);
  pool.ParallelFor(3000, [&](int64_t i) {
    ids[i] = std::this_thread::get_id();
    // Long enough that one thread cannot take every index before the
    // workers wake up.
    volatile double x = 0;
    for (int k = 0; k < 2000; ++k) x = x + k;
  });
  std::sort(ids.begin(), ids.end());
  EXPECT_GT(std::unique(ids.begin(), ids.end()) - ids.begin(), 1);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerializedAndComplete) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.ParallelFor(100, [&](int64_t i) { total.fetch_add(i); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * (99 * 100 / 2));
}

}  // namespace
}  // namespace sdc::kernels
