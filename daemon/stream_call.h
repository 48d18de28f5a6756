#ifndef SDC_DAEMON_STREAM_CALL_H_
#define SDC_DAEMON_STREAM_CALL_H_

// The asynchronous gRPC engine under sdcd's trainer streams: completion
// queues with a thread each (CallQueues), and StreamCall, one bidirectional
// stream of raw frames on one queue. What a stream means (a rank's Attach,
// a relay) is a subclass's Handle; the engine only reads, writes and
// finishes.
//
// Why asynchronous: Debian's libgrpc is built without NDEBUG, and then
// every completion scans its queue's list of outstanding operations; the
// callback API keeps all of a process's operations on one queue, so with
// 16,384 streams each read or write paid a scan of 16,384+ entries. Each of
// our queues scans its share.

#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/stream.h"
#include "daemon/batch_scope.h"
#include "daemon/grpc_edge.h"
#include "daemon/service_metrics.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/async_stream.h"

namespace sdc::daemon {

// What the queues' threads dispatch on: each operation started on a queue
// carries a Tag naming its call and what it was.
class QueuedCall {
 public:
  enum class Op { kRequest, kRead, kWrite, kFinish, kDone };
  struct Tag {
    QueuedCall* call;
    Op op;
  };
  virtual ~QueuedCall() = default;
  // On the queue's thread.
  virtual void OnEvent(Op op, bool ok) = 0;
};

// Completion queues, one thread each, and the gate that refuses new
// operations once stopping (a queue refuses them once shut down).
// Lifecycle: Add before the server is built, Start after, Stop after the
// server's Shutdown returned. Thread-safe.
class CallQueues {
 public:
  CallQueues() = default;
  ~CallQueues();
  CallQueues(const CallQueues&) = delete;
  CallQueues& operator=(const CallQueues&) = delete;

  // Adds `queues` completion queues to the server being built.
  void Add(grpc::ServerBuilder& builder, int queues);
  // Runs arm(queue) for each queue (it waits for the first calls there),
  // then the queue's thread.
  void Start(const std::function<void(grpc::ServerCompletionQueue*)>& arm);
  // Runs `post` (which starts one operation on a queue) unless Stop began;
  // false if it did not run.
  template <typename Fn>
  bool Post(Fn post) ABSL_LOCKS_EXCLUDED(post_mu_) {
    absl::ReaderMutexLock lock(&post_mu_);
    if (stopping_) return false;
    post();
    return true;
  }
  // Refuses new operations, shuts the queues down and drains them (each
  // call lets go of itself as its operations return). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(post_mu_);

 private:
  static void Serve(grpc::ServerCompletionQueue* queue);

  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  absl::Mutex post_mu_;
  bool stopping_ ABSL_GUARDED_BY(post_mu_) = false;
};

// One bidirectional stream on one completion queue, its frames parsed as In
// and written from Out (raw frames: a malformed one ends the stream with
// INVALID_ARGUMENT, counted in sdc_malformed_messages_total{method}, where
// gRPC's typed reads would end it with OK).
//
// Every operation started holds a reference (self_) until its completion
// returns from the queue; outboxes hold weak ones. Reads run on the queue's
// thread, one at a time; writes start from any thread, one in flight,
// queued behind it; the finish waits for the queue of writes to empty.
// Enqueue and RequestFinish are thread-safe.
template <typename In, typename Out>
class StreamCall : public QueuedCall {
 public:
  void OnEvent(Op op, bool ok) override {
    switch (op) {
      case Op::kRequest:
        if (ok) {
          Rearm();  // The next caller.
          {
            absl::MutexLock lock(&mu_);
            ++pending_;  // The done tag is live once the call matched.
          }
          StartRead();
        }
        break;
      case Op::kRead:
        OnReadDone(ok);
        break;
      case Op::kWrite: {
        absl::MutexLock lock(&mu_);
        out_.WriteDone(ok);
        break;
      }
      case Op::kFinish:
        break;
      case Op::kDone:
        {
          absl::MutexLock lock(&mu_);
          out_.Closed();
        }
        OnDone();
        break;
    }
    Pump();
    Completed();
  }

  // Queues `m`, or folds it into the newest message waiting (Absorb). In a
  // BatchScope (the store's callbacks) the write starts when the batch ends,
  // with whatever else the batch queued here.
  void Enqueue(Out m) {
    std::function<void()> pump;
    {
      absl::MutexLock lock(&mu_);
      out_.Enqueue(std::move(m), [this](Out& last, Out& next) { return Absorb(last, next); });
      if (pump_deferred_) return;
      if (self_ != nullptr) {
        pump = [self = self_] { static_cast<StreamCall*>(self.get())->DeferredPump(); };
        pump_deferred_ = BatchScope::Defer(pump);
        if (pump_deferred_) return;
      }
    }
    Pump();
  }

  // Finishes with `status` once every queued message is written. The first
  // request wins.
  void RequestFinish(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      out_.RequestFinish(std::move(status));
    }
    Pump();
  }

 protected:
  // `metrics` counts malformed frames and refusals.
  StreamCall(CallQueues* queues, ServiceMetrics* metrics, grpc::ServerCompletionQueue* queue)
      : queues_(queues), metrics_(metrics), queue_(queue), stream_(&context_) {}

  // Waits for the call to arrive; `self` is this, owned.
  void Begin(std::shared_ptr<QueuedCall> self) {
    context_.AsyncNotifyWhenDone(&done_tag_);
    {
      absl::MutexLock lock(&mu_);
      self_ = std::move(self);
      pending_ = 1;
    }
    if (!queues_->Post([&] { Request(); })) Completed();
  }

  // Asks the service for the next call of this method on queue_, tagged
  // request_tag_.
  virtual void Request() = 0;
  // Arms a fresh call of the same method on the same queue.
  virtual void Rearm() = 0;
  // Handles in_; not OK ends the call with that status.
  virtual grpc::Status Handle() = 0;
  // The call is over (on the queue's thread).
  virtual void OnDone() = 0;
  // True when `next` was folded (moved) into `last`, the newest message
  // waiting.
  virtual bool Absorb(Out& last, Out& next) = 0;
  // The method, for the malformed-message metric ("attach").
  virtual const char* Method() const = 0;

  CallQueues* const queues_;
  ServiceMetrics* const metrics_;
  grpc::ServerCompletionQueue* const queue_;
  grpc::ServerContext context_;
  // Raw frames, parsed and serialized here (see common/stream.h).
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  Tag request_tag_{this, Op::kRequest};
  In in_;  // The read path: the queue's thread, one read at a time.

 private:
  void DeferredPump() {
    {
      absl::MutexLock lock(&mu_);
      pump_deferred_ = false;
    }
    Pump();
  }

  // An operation returned (or never started): the last one lets go.
  void Completed() {
    std::shared_ptr<QueuedCall> last;
    absl::MutexLock lock(&mu_);
    if (--pending_ == 0) last = std::move(self_);
  }

  void StartRead() {
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
    }
    if (!queues_->Post([&] { stream_.Read(&read_frame_, &read_tag_); })) Completed();
  }

  void OnReadDone(bool ok) {
    if (!ok) {
      // The client closed its side or the call broke: flush and finish.
      RequestFinish(grpc::Status::OK);
      return;
    }
    if (grpc::Status parsed = common::ParseFrame(&read_frame_, &in_); !parsed.ok()) {
      metrics_->Malformed(Method());
      RequestFinish(std::move(parsed));
      return;
    }
    grpc::Status refused = Handle();
    if (!refused.ok()) {
      metrics_->Rejected(RejectReason(refused.error_code()));
      RequestFinish(refused);
      return;
    }
    // A parsed message keeps what it allocated for the next one, strings
    // included: a Hello's tensor names (1,000 strings) would stay in every
    // stream for good, a weight report's 24 KB until the next. Let go of
    // anything large; small messages reuse what they have.
    if (in_.ByteSizeLong() > kKeepParsedBytes) In().Swap(&in_);
    StartRead();
  }

  // Starts the next write, or the finish once nothing is left to write.
  // Both start under mu_ (the asynchronous API never completes inline), so
  // they start one at a time and in order.
  void Pump() {
    std::shared_ptr<QueuedCall> last;
    absl::MutexLock lock(&mu_);
    const Out* write = nullptr;
    grpc::Status status;
    bool posted = true;
    switch (out_.Next(&write, &status)) {
      case common::Outgoing<Out>::Start::kNothing:
        return;
      case common::Outgoing<Out>::Start::kWrite:
        ++pending_;
        // One write in flight at a time: its frame is free again.
        common::WriteFrame(*write, &write_frame_);
        posted = queues_->Post([&] { stream_.Write(write_frame_, &write_tag_); });
        if (!posted) out_.WriteNotStarted();
        break;
      case common::Outgoing<Out>::Start::kFinish:
        ++pending_;
        posted = queues_->Post([&] { stream_.Finish(status, &finish_tag_); });
        break;
    }
    // Stopping: the operation never started; maybe it was the last reference.
    if (!posted && --pending_ == 0) last = std::move(self_);
  }

  static constexpr size_t kKeepParsedBytes = 4096;

  grpc::ByteBuffer read_frame_;   // The read path.
  grpc::ByteBuffer write_frame_;  // The write in flight (under mu_).
  Tag read_tag_{this, Op::kRead};
  Tag write_tag_{this, Op::kWrite};
  Tag finish_tag_{this, Op::kFinish};
  Tag done_tag_{this, Op::kDone};

  absl::Mutex mu_;
  std::shared_ptr<QueuedCall> self_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool pump_deferred_ ABSL_GUARDED_BY(mu_) = false;
  common::Outgoing<Out> out_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_STREAM_CALL_H_
