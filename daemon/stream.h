#ifndef SDC_DAEMON_STREAM_H_
#define SDC_DAEMON_STREAM_H_

// The outgoing side of sdcd's long-lived server streams (trainers' Attach,
// agents' Connect), which any thread may write to.
//
// gRPC allows one write in flight per stream and may run a reaction inline
// inside StartWrite or Finish, even OnDone. So QueuedStream queues messages
// and starts the next write from OnWriteDone, holds no lock across those
// calls, and finishes only once the queue is empty. StreamHandle is what
// other threads keep: messages pushed after the stream ended are dropped,
// and a reactor whose OnDone runs while a push is in progress is deleted by
// that push when it returns.

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace sdc::daemon {

template <typename In, typename Out>
class QueuedStream : public grpc::ServerBidiReactor<In, Out> {
 public:
  // Queues `m` (or folds it into the newest queued message, see Absorb).
  // Dropped once the stream is finishing.
  void Enqueue(Out m) {
    {
      absl::MutexLock lock(&mu_);
      if (finish_requested_) return;
      if (!queue_.empty() && Absorb(queue_.back(), m)) return;
      queue_.push_back(std::move(m));
    }
    Pump();
  }

  // Finishes with `status` once every queued message is written. The first
  // request wins.
  void RequestFinish(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finish_requested_) return;
      finish_requested_ = true;
      finish_status_ = std::move(status);
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {  // The call broke: nothing more can be written.
        queue_.clear();
        finish_requested_ = true;
      }
    }
    Pump();
  }

 protected:
  // True when `next` was folded into `last`, the newest message still
  // queued, and needs no write of its own. Called with the queue locked.
  virtual bool Absorb(Out& last, const Out& next) { return false; }

 private:
  // Starts the next write, or the finish once nothing is left to write.
  void Pump() {
    bool write = false;
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        write = true;
      } else if (finish_requested_) {
        finished_ = true;
        finish = finish_status_;
      } else {
        return;
      }
    }
    if (write) {
      this->StartWrite(&current_);
    } else {
      this->Finish(finish);
    }
  }

  absl::Mutex mu_;
  std::deque<Out> queue_ ABSL_GUARDED_BY(mu_);
  Out current_;  // The write in flight; owned by gRPC while writing_.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

// Shared (by shared_ptr) between a reactor and whoever writes to it later.
// The reactor calls Close from OnDone and deletes itself when it returns
// true; otherwise the push in progress deletes it.
template <typename Reactor>
class StreamHandle {
 public:
  explicit StreamHandle(Reactor* reactor) : reactor_(reactor) {}

  // From OnDone: true if the reactor may be deleted now.
  bool Close() {
    absl::MutexLock lock(&mu_);
    done_ = true;
    if (pushing_ > 0) return false;
    reactor_ = nullptr;
    return true;
  }

 protected:
  // Runs fn(reactor) unless the stream is done.
  template <typename Fn>
  void WithReactor(Fn fn) {
    Reactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || done_) return;
      reactor = reactor_;
      ++pushing_;
    }
    fn(reactor);
    bool last = false;
    {
      absl::MutexLock lock(&mu_);
      last = --pushing_ == 0 && done_ && reactor_ != nullptr;
      if (last) reactor_ = nullptr;
    }
    if (last) delete reactor;
  }

 private:
  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);
  int pushing_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_STREAM_H_
