#include "agent/worker.h"

#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace sdc::agent {
namespace {

TEST(SerialWorkerTest, RunsTasksOneAtATimeInOrder) {
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification release, done;
  SerialWorker worker;
  worker.Post([&] { release.WaitForNotification(); });
  for (int i = 0; i < 5; ++i) {
    worker.Post([&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    });
  }
  worker.Post([&] { done.Notify(); });
  EXPECT_EQ(worker.pending(), 7u);  // The blocked one runs; six wait behind it.
  release.Notify();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace sdc::agent
