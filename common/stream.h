#ifndef SDC_COMMON_STREAM_H_
#define SDC_COMMON_STREAM_H_

// The outgoing side of long-lived server streams (sdcd's: trainers' Attach on
// the asynchronous API, agents' Connect on the callback API; sdc-agent's
// relayed trainer streams), which any thread may write to.
//
// gRPC allows one write in flight per stream. Outgoing keeps the queue and
// decides what starts next for both APIs. The callback API may run a
// reaction inline inside StartWrite or Finish, even OnDone, so QueuedStream
// starts the next write from OnWriteDone, holds no lock across those calls,
// and finishes only once the queue is empty. StreamHandle is what
// other threads keep: messages pushed after the stream ended are dropped,
// and a reactor whose OnDone runs while a push is in progress is deleted by
// that push when it returns.
//
// The streams carry raw frames (grpc::ByteBuffer) and parse them here: gRPC's
// typed reads report a frame that fails to parse exactly like the client's
// clean close, so a malformed message would end the stream with OK. A
// stream that parses its own frames answers INVALID_ARGUMENT with the reason.

#include <deque>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace sdc::common {

// Parses one received frame into `out`: OK, or INVALID_ARGUMENT naming the
// message type. Consumes the frame.
template <typename Message>
grpc::Status ParseFrame(grpc::ByteBuffer* frame, Message* out) {
  const grpc::Status s = grpc::SerializationTraits<Message>::Deserialize(frame, out);
  if (s.ok()) return s;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("malformed message: not a ", Message::descriptor()->full_name(),
                                   " (", s.error_message(), ")"));
}

// Serializes `m` into `frame` for a raw write.
template <typename Message>
void WriteFrame(const Message& m, grpc::ByteBuffer* frame) {
  frame->Clear();  // The previous write's frame; gRPC holds its own reference.
  bool own = false;
  // Serializing a message the server built cannot fail short of memory.
  (void)grpc::SerializationTraits<Message>::Serialize(m, frame, &own);
}

// The outgoing side's state, for any stream API: messages waiting, at most
// one write in flight, a finish once the queue is empty. Not thread-safe:
// its owner locks around every call.
template <typename Out>
class Outgoing {
 public:
  // Queues `m`, or folds it into the newest queued message when `absorb`
  // (last, m) does; it may move from `m`. Dropped once finishing.
  template <typename Absorb>
  void Enqueue(Out m, Absorb absorb) {
    if (finish_requested_) return;
    if (!queue_.empty() && absorb(queue_.back(), m)) return;
    queue_.push_back(std::move(m));
  }

  // The first request wins.
  void RequestFinish(grpc::Status status) {
    if (finish_requested_) return;
    finish_requested_ = true;
    finish_status_ = std::move(status);
  }

  void WriteDone(bool ok) {
    writing_ = false;
    if (!ok) {  // The call broke: nothing more can be written.
      queue_.clear();
      finish_requested_ = true;
    }
  }

  // The call is over: nothing more starts.
  void Closed() {
    queue_.clear();
    finish_requested_ = true;
    finished_ = true;
  }

  // What to start now: a write of *write (the message stays valid until
  // WriteDone), the finish with *status, or nothing.
  enum class Start { kNothing, kWrite, kFinish };
  Start Next(const Out** write, grpc::Status* status) {
    if (writing_ || finished_) return Start::kNothing;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      *write = &current_;
      return Start::kWrite;
    }
    if (!finish_requested_) return Start::kNothing;
    finished_ = true;
    *status = finish_status_;
    return Start::kFinish;
  }

  // A write that could not start after all (the owner is stopping).
  void WriteNotStarted() { writing_ = false; }

 private:
  std::deque<Out> queue_;
  Out current_;  // The write in flight.
  bool writing_ = false;
  bool finish_requested_ = false;
  bool finished_ = false;
  grpc::Status finish_status_;
};

template <typename In, typename Out>
class QueuedStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Reads the next message into `into` (which stays valid until OnRead).
  void StartRead(In* into) {
    into_ = into;
    ServerBidiReactor::StartRead(&read_frame_);
  }

  void OnReadDone(bool ok) final {
    if (!ok) {
      OnRead(false);
      return;
    }
    grpc::Status parsed = ParseFrame(&read_frame_, into_);
    if (!parsed.ok()) {
      OnMalformed(std::move(parsed));
      return;
    }
    OnRead(true);
  }

  // Queues `m` (or folds it into the newest queued message, see Absorb).
  // Dropped once the stream is finishing.
  void Enqueue(Out m) {
    {
      absl::MutexLock lock(&mu_);
      out_.Enqueue(std::move(m), [this](Out& last, Out& next) { return Absorb(last, next); });
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

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      out_.WriteDone(ok);
    }
    Pump();
  }

 protected:
  // True when `next` was folded into `last`, the newest message still
  // queued, and needs no write of its own. Called with the queue locked.
  virtual bool Absorb(Out& last, Out& next) { return false; }
  // A message arrived in the StartRead target (ok), or the client closed its
  // side or the call broke (not ok).
  virtual void OnRead(bool ok) = 0;
  // A frame that is not an In: by default the stream ends with `status`
  // (INVALID_ARGUMENT and the reason).
  virtual void OnMalformed(grpc::Status status) { RequestFinish(std::move(status)); }

 private:
  // Starts the next write, or the finish once nothing is left to write.
  // No lock is held across StartWrite or Finish: gRPC may react inline.
  void Pump() {
    const Out* write = nullptr;
    grpc::Status finish;
    typename Outgoing<Out>::Start start;
    {
      absl::MutexLock lock(&mu_);
      start = out_.Next(&write, &finish);
    }
    if (start == Outgoing<Out>::Start::kWrite) {
      // One write in flight at a time: its frame is free again.
      WriteFrame(*write, &write_frame_);
      this->StartWrite(&write_frame_);
    } else if (start == Outgoing<Out>::Start::kFinish) {
      this->Finish(finish);
    }
  }

  absl::Mutex mu_;
  Outgoing<Out> out_ ABSL_GUARDED_BY(mu_);
  In* into_ = nullptr;             // The read path only.
  grpc::ByteBuffer read_frame_;    // The read path only.
  grpc::ByteBuffer write_frame_;   // The write in flight.
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

}  // namespace sdc::common

#endif  // SDC_COMMON_STREAM_H_
