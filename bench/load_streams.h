#ifndef SDC_BENCH_LOAD_STREAMS_H_
#define SDC_BENCH_LOAD_STREAMS_H_

// The daemon bench's load generator, its side of the wire: what it knows of
// each simulated rank (RankLedger), and its streams to sdcd on completion
// queues (one Attach stream per rank, or one Relay stream per node as
// sdc-agent makes). One translation unit (bench/daemon_bench.cc) uses it.

#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/weight_elision.h"
#include "daemon/convert.h"
#include "grpcpp/grpcpp.h"
#include "kernels/model_digest.h"
#include "protocol/replay_plan.h"
#include "tests/testing/process.h"
#include "tests/testing/sdcd.h"
#include "trainer.grpc.pb.h"

namespace sdc::bench {

inline int Fail(const std::string& what) {
  std::fprintf(stderr, "daemon_bench: %s\n", what.c_str());
  return 1;
}

// The load generator's failures: its queue threads still run, so it ends
// without running destructors.
[[noreturn]] inline void Abandon(const std::string& what) {
  Fail(what);
  std::fflush(stderr);
  std::_Exit(1);
}

enum class ReportKind : uint8_t { kStep, kWeights, kAudit };

// What the load generator knows of one rank: its reports in flight, the
// acknowledgement latencies measured, its verdict. Thread-safe.
class RankLedger {
 public:
  void HandedOut(uint64_t sequence, uint32_t step_index, absl::Time intended, ReportKind kind) {
    absl::MutexLock lock(&mu_);
    sent_at_[sequence] = {absl::Now(), intended, step_index, kind};
  }

  // A message for this rank arrived at `now`.
  void Received(const v1::CoordinatorMessage& in, absl::Time now) {
    if (in.has_ack()) return AckedThrough(in.ack().acked_sequence(), now);
    absl::MutexLock lock(&mu_);
    if (in.has_welcome()) welcomed_ = true;
    if (in.has_audit_verdict() && in.audit_verdict().outcome() != v1::TIEBREAK_PENDING) {
      verdict_at_ = now;
      verdict_outcome_ = in.audit_verdict().outcome();
      (in.audit_verdict().outcome() == v1::PASS ? audits_passed_ : unexpected_) += 1;
    }
    if (in.has_weight_verdict()) (in.weight_verdict().pass() ? weights_passed_ : unexpected_) += 1;
    // A clean run asks no rank for a tie-break or a targeted audit.
    if (in.has_tiebreak() || in.has_audit_plan()) unexpected_ += 1;
  }

  // Everything up to `acked` is acknowledged, at `now`.
  void AckedThrough(uint64_t acked, absl::Time now) {
    absl::MutexLock lock(&mu_);
    for (uint64_t s = acked_ + 1; s <= acked; ++s) {
      auto it = sent_at_.find(s);
      if (it != sent_at_.end()) {
        acks_.push_back({it->second.step_index, it->second.kind,
                         absl::ToDoubleMilliseconds(now - it->second.sent),
                         absl::ToDoubleMilliseconds(now - it->second.intended)});
        sent_at_.erase(it);
      }
    }
    acked_ = std::max(acked_, acked);
    last_ack_ = now;
  }

  // The rank's stream (or relay session) ended; OK when it ended cleanly.
  void Ended(const std::string& error) {
    absl::MutexLock lock(&mu_);
    if (!error.empty() && !failed_) {
      failed_ = true;
      error_ = error;
    }
  }

  bool welcomed() const {
    absl::MutexLock lock(&mu_);
    return welcomed_;
  }
  uint64_t acked() const {
    absl::MutexLock lock(&mu_);
    return acked_;
  }
  bool failed(std::string* why) const {
    absl::MutexLock lock(&mu_);
    if (failed_) *why = error_;
    return failed_;
  }
  // One acknowledged report: its step's index in the run, its kind, and
  // its latency from the send and from its step's scheduled start.
  struct Acked {
    uint32_t step_index;
    ReportKind kind;
    double ms;
    double from_step_start_ms;
  };
  std::vector<Acked> TakeAcks() {
    absl::MutexLock lock(&mu_);
    return std::move(acks_);
  }
  std::pair<absl::Time, int> verdict() const {
    absl::MutexLock lock(&mu_);
    return {verdict_at_, verdict_outcome_};
  }
  absl::Time last_ack() const {
    absl::MutexLock lock(&mu_);
    return last_ack_;
  }
  // Passing audit and weight verdicts received, and anything a clean run
  // should never bring (a failed verdict, a tie-break, a targeted plan).
  struct Verdicts {
    int audits_passed = 0;
    int weights_passed = 0;
    int unexpected = 0;
  };
  Verdicts verdicts() const {
    absl::MutexLock lock(&mu_);
    return {audits_passed_, weights_passed_, unexpected_};
  }

 private:
  mutable absl::Mutex mu_;
  struct Sent {
    absl::Time sent;      // Handed to the stream (queued behind its write in flight).
    absl::Time intended;  // Its step's scheduled start.
    uint32_t step_index;
    ReportKind kind;
  };
  std::map<uint64_t, Sent> sent_at_ ABSL_GUARDED_BY(mu_);
  std::vector<Acked> acks_ ABSL_GUARDED_BY(mu_);
  bool welcomed_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  uint64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_ack_ ABSL_GUARDED_BY(mu_);
  absl::Time verdict_at_ ABSL_GUARDED_BY(mu_);
  int verdict_outcome_ ABSL_GUARDED_BY(mu_) = 0;
  int audits_passed_ ABSL_GUARDED_BY(mu_) = 0;
  int weights_passed_ ABSL_GUARDED_BY(mu_) = 0;
  int unexpected_ ABSL_GUARDED_BY(mu_) = 0;
};

// A client stream on one of the load generator's completion queues
// (asynchronous API, for the reason given in daemon/stream_call.h: the callback
// API would put all 16,384 streams' operations on one queue, and Debian's
// libgrpc scans that queue on every completion). One write in flight; what
// is sent meanwhile waits, and Batch() may fold it into fewer writes.
// What the queue threads dispatch on.
class QueuedStream {
 public:
  enum class Op { kStart, kRead, kWrite, kFinish };
  struct Tag {
    QueuedStream* stream;
    Op op;
  };
  virtual ~QueuedStream() = default;
  // On the queue's thread.
  virtual void OnEvent(Op op, bool ok) = 0;
};

template <typename Out, typename In>
class ClientStream : public QueuedStream {
 public:
  using Call = grpc::ClientAsyncReaderWriter<Out, In>;

  void OnEvent(Op op, bool ok) override {
    switch (op) {
      case Op::kStart:
        if (!ok) return Finish();
        {
          absl::MutexLock lock(&mu_);
          started_ = true;
        }
        call_->Read(&in_, &read_tag_);
        Pump();
        return;
      case Op::kRead:
        if (!ok) return Finish();
        OnRead(in_, absl::Now());
        call_->Read(&in_, &read_tag_);
        return;
      case Op::kWrite: {
        {
          absl::MutexLock lock(&mu_);
          writing_ = false;
          if (!ok) return;  // The read side finishes the call.
        }
        Pump();
        return;
      }
      case Op::kFinish:
        {
          absl::MutexLock lock(&mu_);
          done_ = true;
        }
        OnFinished(status_.ok() ? "" : status_.error_message());
        return;
    }
  }

  void Close() { context_.TryCancel(); }

 protected:
  // Starts the call with `start`, which prepares it on `queue`.
  template <typename Prepare>
  void Start(Prepare prepare, grpc::CompletionQueue* queue) {
    call_ = prepare(&context_, queue);
    call_->StartCall(&start_tag_);
  }

  void Queue(Out m) {
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(m));
    }
    Pump();
  }

  // Folds waiting messages into `first`, the next to write; true if it took
  // `next` (which then needs no write of its own).
  virtual bool Batch(Out& first, Out& next) { return false; }
  virtual void OnRead(const In& in, absl::Time now) = 0;
  virtual void OnFinished(const std::string& error) = 0;

 private:
  void Finish() { call_->Finish(&status_, &finish_tag_); }

  void Pump() {
    absl::MutexLock lock(&mu_);
    if (writing_ || !started_ || queue_.empty() || done_) return;
    current_ = std::move(queue_.front());
    queue_.pop_front();
    while (!queue_.empty() && Batch(current_, queue_.front())) queue_.pop_front();
    writing_ = true;
    call_->Write(current_, &write_tag_);  // Under mu_: one write at a time.
  }

  grpc::ClientContext context_;
  std::unique_ptr<Call> call_;
  Tag start_tag_{this, Op::kStart};
  Tag read_tag_{this, Op::kRead};
  Tag write_tag_{this, Op::kWrite};
  Tag finish_tag_{this, Op::kFinish};
  grpc::Status status_;
  In in_;  // The read path only.
  Out current_;
  absl::Mutex mu_;
  std::deque<Out> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// How the load generator hands a rank's messages to sdcd: one Attach stream
// per rank, or a relay carrying several ranks (a node agent's).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual void Send(core::Rank rank, v1::TrainerMessage m) = 0;
  virtual void Close() = 0;
};

// One rank's Attach stream.
class AttachStream final : public Transport,
                           public ClientStream<v1::TrainerMessage, v1::CoordinatorMessage> {
 public:
  AttachStream(v1::TrainerService::Stub* stub, grpc::CompletionQueue* queue, RankLedger* ledger)
      : ledger_(ledger) {
    Start([stub](grpc::ClientContext* c, grpc::CompletionQueue* q) {
      return stub->PrepareAsyncAttach(c, q);
    }, queue);
  }
  void Send(core::Rank, v1::TrainerMessage m) override { Queue(std::move(m)); }
  void Close() override { ClientStream::Close(); }

 private:
  void OnRead(const v1::CoordinatorMessage& in, absl::Time now) override {
    ledger_->Received(in, now);
  }
  void OnFinished(const std::string& error) override {
    ledger_->Ended(error.empty() ? "the stream ended" : error);
  }
  RankLedger* const ledger_;
};

// A relay's stream: the sessions of `first`..`first + count - 1`, session
// id = rank. Messages waiting while a write is in flight go out as one.
class RelayStream final : public Transport, public ClientStream<v1::RelayUp, v1::RelayDown> {
 public:
  RelayStream(v1::TrainerService::Stub* stub, grpc::CompletionQueue* queue, core::Rank first,
              uint32_t count, RankLedger* ledgers)
      : first_(first), count_(count), ledgers_(ledgers) {
    Start([stub](grpc::ClientContext* c, grpc::CompletionQueue* q) {
      return stub->PrepareAsyncRelay(c, q);
    }, queue);
  }
  void Send(core::Rank rank, v1::TrainerMessage m) override {
    v1::RelayUp up;
    up.set_compact_replies(true);  // As sdc-agent's relay asks.
    v1::RelayedMessage* relayed = up.add_messages();
    relayed->set_session(rank);
    *relayed->mutable_message() = std::move(m);
    // As sdc-agent's relay does, in the order of the stream.
    absl::MutexLock lock(&order_mu_);
    elision_.Apply(rank, relayed->mutable_message());
    Queue(std::move(up));
  }
  void Close() override { ClientStream::Close(); }

 private:
  bool Batch(v1::RelayUp& first, v1::RelayUp& next) override {
    if (first.messages_size() >= kMaxBatch) return false;
    for (v1::RelayedMessage& m : *next.mutable_messages()) {
      first.mutable_messages()->Add(std::move(m));
    }
    return true;
  }
  void OnRead(const v1::RelayDown& in, absl::Time now) override {
    for (const v1::RelayedReply& r : in.replies()) {
      RankLedger* ledger = Ledger(r.session());
      if (ledger == nullptr) continue;
      if (r.end()) {
        ledger->Ended(absl::StrCat("sdcd ended the session: ", r.status_message()));
        continue;
      }
      ledger->Received(r.message(), now);
      for (uint64_t also : r.also_sessions()) {
        if (RankLedger* l = Ledger(also)) l->Received(r.message(), now);
      }
    }
    for (int i = 0; i < in.ack_sessions_size() && i < in.ack_sequences_size(); ++i) {
      if (RankLedger* l = Ledger(in.ack_sessions(i))) l->AckedThrough(in.ack_sequences(i), now);
    }
  }
  // The ledger of `session` (= its rank), if it is one of this relay's.
  RankLedger* Ledger(uint64_t session) {
    if (session < first_ || session - first_ >= count_) return nullptr;
    return &ledgers_[session - first_];
  }
  void OnFinished(const std::string& error) override {
    for (uint32_t i = 0; i < count_; ++i) ledgers_[i].Ended(error.empty() ? "the relay ended" : error);
  }
  static constexpr int kMaxBatch = 256;
  absl::Mutex order_mu_;
  agent::WeightElision elision_ ABSL_GUARDED_BY(order_mu_);
  const core::Rank first_;
  const uint32_t count_;
  RankLedger* const ledgers_;
};

}  // namespace sdc::bench

#endif  // SDC_BENCH_LOAD_STREAMS_H_
