#include "agent/worker.h"

#include <utility>

namespace sdc::agent {

SerialWorker::SerialWorker() : thread_([this] { Main(); }) {}

SerialWorker::~SerialWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    tasks_.clear();
  }
  thread_.join();
}

void SerialWorker::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (!stop_) tasks_.push_back(std::move(task));
}

size_t SerialWorker::pending() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size() + (running_ ? 1 : 0);
}

void SerialWorker::Main() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !tasks_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
    }
    task();
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
}

}  // namespace sdc::agent
