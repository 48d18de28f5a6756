#include "daemon/service.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/ack.h"
#include "common/stream.h"
#include "daemon/batch_scope.h"
#include "daemon/convert.h"
#include "grpc/grpc_security_constants.h"

namespace sdc::daemon {

using common::FoldAck;
using common::Outgoing;
using common::ParseFrame;
using common::WriteFrame;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // A message travels in the trailers, which a gRPC client takes up to 8 KiB
  // of by default: longer, the caller would see RESOURCE_EXHAUSTED instead
  // of the status. Messages that echo input are cut where they say so
  // (EchoJobId, ...); this holds for every other one.
  constexpr size_t kMaxMessage = 1024;
  std::string message(s.message());
  if (message.size() > kMaxMessage) {
    const size_t cut = message.size() - kMaxMessage;
    message.resize(kMaxMessage);
    absl::StrAppend(&message, "... (", cut, " more bytes)");
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::move(message));
}

namespace {

}  // namespace

std::string RequestStateLabel(core::RequestState state) {
  return absl::AsciiStrToLower(core::RequestStateName(state));
}

namespace {

// Lower-case status code name, the bounded `reason` label of rejections.
std::string ReasonOf(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

}  // namespace

// ---------------------------------------------------------------------------
// Metrics

ServiceMetrics::ServiceMetrics(metrics::Registry& registry, size_t max_gpu_series)
    : max_gpu_series_(max_gpu_series),
      registry_(registry),
      reports_(metrics::BuildCounter()
                   .Name("sdc_reports_total")
                   .Help("Reports received from trainer ranks, by kind.")
                   .Register(registry)),
      report_bytes_(metrics::BuildCounter()
                        .Name("sdc_report_bytes_total")
                        .Help("Bytes of reports received from trainer ranks, by kind.")
                        .Register(registry)),
      rejected_(metrics::BuildCounter()
                    .Name("sdc_rejected_inputs_total")
                    .Help("Inputs refused, by reason (gRPC status code).")
                    .Register(registry)),
      malformed_(metrics::BuildCounter()
                     .Name("sdc_malformed_messages_total")
                     .Help("Stream frames that did not parse, by method; each ended its "
                           "stream with INVALID_ARGUMENT.")
                     .Register(registry)),
      checks_(metrics::BuildCounter()
                  .Name("sdc_checks_total")
                  .Help("Checks decided, by check and result.")
                  .Register(registry)),
      incidents_(metrics::BuildCounter()
                     .Name("sdc_incidents_total")
                     .Help("Incidents recorded, by check and whether attributed.")
                     .Register(registry)),
      skipped_(metrics::BuildCounter()
                   .Name("sdc_steps_skipped_total")
                   .Help("Training steps skipped (gradients zeroed, no optimizer step).")
                   .Register(registry)
                   .Add({})),
      checkpoints_(metrics::BuildCounter()
                       .Name("sdc_checkpoint_decisions_total")
                       .Help("Checkpoint gate answers, by decision.")
                       .Register(registry)),
      latency_(metrics::BuildHistogram()
                   .Name("sdc_verdict_latency_seconds")
                   .Help("From a step's first report to its verdict, by check.")
                   .Register(registry)),
      actuator_runs_(metrics::BuildCounter()
                         .Name("sdc_actuator_runs_total")
                         .Help("Replacement actions run, by actuator and result.")
                         .Register(registry)),
      gpu_incidents_(metrics::BuildCounter()
                         .Name("sdc_gpu_incidents_total")
                         .Help("Attributed incidents, by job, node, GPU (NVML UUID, DCGM's "
                               "UUID label) and check; at most 4096 series by default, the "
                               "least recently incremented dropped first.")
                         .Register(registry)),
      suspect_gpus_(metrics::BuildGauge()
                        .Name("sdc_suspect_gpus")
                        .Help("1 for each GPU under suspicion (by job, node, GPU); the series "
                              "goes when the suspicion is cleared.")
                        .Register(registry)),
      node_requests_(metrics::BuildGauge()
                         .Name("sdc_node_replacement_requests")
                         .Help("Replacement requests by node and state.")
                         .Register(registry)) {
  // Every label combination exists from the start, so a scrape sees zeros
  // instead of missing series.
  const char* const kinds[] = {"step", "audit", "weights"};  // In ReportKind order.
  for (size_t k = 0; k < reports_by_kind_.size(); ++k) {
    reports_by_kind_[k] = &reports_.Add({{"kind", kinds[k]}});
    report_bytes_by_kind_[k] = &report_bytes_.Add({{"kind", kinds[k]}});
  }
  for (const char* d : {"allowed", "denied", "wait"}) checkpoints_.Add({{"decision", d}});
  for (const char* m : {"attach", "relay", "agent_connect"}) malformed_.Add({{"method", m}});
  for (const char* check : {"nonfinite", "reduced_gradients", "replay", "weights"}) {
    checks_.Add({{"check", check}, {"result", "pass"}});
    latency_.Add({{"check", check}}, metrics::Histogram::BucketBoundaries{
                                         0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                         2.5, 5, 10, 30, 60, 120});
  }
}

void ServiceMetrics::Report(ReportKind kind, size_t bytes) {
  reports_by_kind_[static_cast<size_t>(kind)]->Increment();
  report_bytes_by_kind_[static_cast<size_t>(kind)]->Increment(static_cast<double>(bytes));
}

void ServiceMetrics::Rejected(const std::string& reason) {
  rejected_.Add({{"reason", reason}}).Increment();
}

void ServiceMetrics::Malformed(const std::string& method) {
  malformed_.Add({{"method", method}}).Increment();
  Rejected(ReasonOf(absl::StatusCode::kInvalidArgument));
}

void ServiceMetrics::Checkpoint(const std::string& decision) {
  checkpoints_.Add({{"decision", decision}}).Increment();
}

void ServiceMetrics::ActuatorRun(const std::string& actuator, const std::string& result) {
  actuator_runs_.Add({{"actuator", actuator}, {"result", result}}).Increment();
}

void ServiceMetrics::Observe(const core::Effects& effects) {
  for (const core::CheckEvent& c : effects.checks) {
    checks_.Add({{"check", core::CheckKindName(c.check)}, {"result", c.result}}).Increment();
    if (c.result != "incomplete") {
      latency_
          .Add({{"check", core::CheckKindName(c.check)}},
               metrics::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5, 1, 2.5, 5, 10, 30, 60, 120})
          .Observe(absl::ToDoubleSeconds(c.latency));
    }
  }
  for (const core::Incident& i : effects.incidents) {
    incidents_
        .Add({{"check", core::CheckKindName(i.check)},
              {"attributed", i.confirmed ? "true" : "false"}})
        .Increment();
  }
  if (effects.skipped_steps > 0) skipped_.Increment(effects.skipped_steps);

  absl::MutexLock lock(&series_mu_);
  for (const core::Incident& i : effects.incidents) {
    if (!i.confirmed) continue;
    for (size_t r = 0; r < i.gpus.size() && r < i.nodes.size(); ++r) {
      const metrics::Labels labels = {{"job", i.job_id},
                                      {"node", i.nodes[r]},
                                      {"gpu", i.gpus[r]},
                                      {"check", core::CheckKindName(i.check)}};
      auto found = gpu_incident_index_.find(labels);
      if (found != gpu_incident_index_.end()) {
        gpu_incident_order_.splice(gpu_incident_order_.end(), gpu_incident_order_, found->second);
      } else {
        gpu_incident_order_.emplace_back(labels, &gpu_incidents_.Add(labels));
        gpu_incident_index_[labels] = std::prev(gpu_incident_order_.end());
      }
      gpu_incident_order_.back().second->Increment();
      while (gpu_incident_order_.size() > max_gpu_series_) {
        gpu_incidents_.Remove(gpu_incident_order_.front().second);
        gpu_incident_index_.erase(gpu_incident_order_.front().first);
        gpu_incident_order_.pop_front();
      }
    }
  }
}

void ServiceMetrics::SyncGauges(metrics::Family<metrics::Gauge>& family,
                                const std::map<metrics::Labels, double>& wanted,
                                std::map<metrics::Labels, metrics::Gauge*>* current) {
  for (auto it = current->begin(); it != current->end();) {
    if (wanted.count(it->first) == 0) {
      family.Remove(it->second);
      it = current->erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [labels, value] : wanted) {
    metrics::Gauge*& gauge = (*current)[labels];
    if (gauge == nullptr) gauge = &family.Add(labels);
    gauge->Set(value);
  }
}

void ServiceMetrics::SetSuspects(const std::vector<core::Suspect>& suspects) {
  std::vector<const core::Suspect*> newest;
  for (const core::Suspect& s : suspects) newest.push_back(&s);
  std::stable_sort(newest.begin(), newest.end(),
                   [](const core::Suspect* a, const core::Suspect* b) { return a->since > b->since; });
  std::map<metrics::Labels, double> wanted;
  for (const core::Suspect* s : newest) {
    if (wanted.size() >= max_gpu_series_) break;
    wanted[{{"job", s->job_id}, {"node", s->node}, {"gpu", s->gpu}}] = 1;
  }
  absl::MutexLock lock(&series_mu_);
  SyncGauges(suspect_gpus_, wanted, &suspect_series_);
}

void ServiceMetrics::SetRequests(const std::vector<core::ReplacementRequest>& requests) {
  // Nodes ordered by their newest request, newest first, for the cap.
  std::map<std::string, absl::Time> newest_by_node;
  for (const core::ReplacementRequest& r : requests) {
    absl::Time& t = newest_by_node.emplace(r.node, absl::InfinitePast()).first->second;
    t = std::max(t, r.created);
  }
  std::vector<std::pair<absl::Time, std::string>> nodes;
  for (const auto& [node, t] : newest_by_node) nodes.emplace_back(t, node);
  std::sort(nodes.begin(), nodes.end(), std::greater<>());
  std::set<std::string> kept;
  for (const auto& [t, node] : nodes) {
    if (kept.size() >= max_gpu_series_) break;
    kept.insert(node);
  }
  std::map<metrics::Labels, double> wanted;
  for (const core::ReplacementRequest& r : requests) {
    if (kept.count(r.node) == 0) continue;
    wanted[{{"node", r.node}, {"state", RequestStateLabel(r.state)}}] += 1;
  }
  absl::MutexLock lock(&series_mu_);
  SyncGauges(node_requests_, wanted, &request_series_);
}

// ---------------------------------------------------------------------------
// Streams

class RelayCall;

// One message for many ranks (a verdict): the sessions of each relay that
// takes shared replies are gathered, and each such relay gets one reply
// naming them all (RelayedReply.also_sessions) instead of a copy each.
class SharedPush {
 public:
  void Add(std::shared_ptr<RelayCall> call, uint64_t session);
  // Sends `message` to what was gathered.
  void Send(const v1::CoordinatorMessage& message);

 private:
  std::unordered_map<const RelayCall*, size_t> index_;
  std::vector<std::pair<std::shared_ptr<RelayCall>, std::vector<uint64_t>>> calls_;
};

// A rank's outgoing side (an Attach stream, or a session of a relay), shared
// with durability callbacks that may run after the stream ended (they then
// drop their message).
class Outbox {
 public:
  virtual ~Outbox() = default;
  virtual void Push(v1::CoordinatorMessage message) = 0;
  // `message` goes to many ranks, this one among them: a relay's session
  // may leave it to `shared`.
  virtual void PushShared(const v1::CoordinatorMessage& message, SharedPush& shared) {
    Push(message);
  }
  // Ends the rank's stream with `status` once what is queued is written.
  virtual void End(grpc::Status status) = 0;
};

// One rank's conversation, on an Attach stream or a relay session: a Hello,
// then reports. Not thread-safe: its stream's reader calls it.
class RankSession {
 public:
  RankSession(TrainerService* service, std::shared_ptr<Outbox> outbox)
      : service_(service), outbox_(std::move(outbox)) {}

  // Handles one message. Not OK: the session must end with that status.
  // With `acked`, a report's acknowledgement is the caller's to send once
  // its Delivery::Batch is durable: *acked is set to its sequence.
  grpc::Status Handle(const v1::TrainerMessage& in, uint64_t* acked = nullptr) {
    if (!attached_) {
      if (!in.has_hello()) {
        return {grpc::StatusCode::INVALID_ARGUMENT,
                "the first message of a stream must be a Hello"};
      }
      const core::Hello hello = FromProto(in.hello());
      absl::StatusOr<core::AttachResult> result = service_->coordinator_->Attach(hello);
      if (!result.ok()) return ToGrpc(result.status());
      attached_ = true;
      job_ = hello.job_id;
      rank_ = hello.placement.rank;
      incarnation_ = hello.incarnation;
      service_->streams_->Register(job_, rank_, outbox_);
      v1::CoordinatorMessage welcome;
      welcome.mutable_welcome()->set_acked_sequence(result->acked_sequence);
      welcome.mutable_welcome()->set_coordinator_version(kVersion);
      for (const core::PlanMessage& p : result->pending_plans) {
        *welcome.mutable_welcome()->add_pending_plans() = ToProto(p);
      }
      std::shared_ptr<Outbox> outbox = outbox_;
      service_->delivery_->Deliver(std::move(result->effects),
                                   [outbox, welcome](absl::Status s) {
                                     if (s.ok()) outbox->Push(welcome);
                                   });
      return grpc::Status::OK;
    }
    if (in.has_hello()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "a stream says Hello only once"};
    }
    if (!in.has_report()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "a message with neither a Hello nor a report"};
    }
    const v1::Report& report = in.report();
    if (report.job_id() != job_ || report.rank() != rank_) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("report for job ", report.job_id(), " rank ", report.rank(),
                           " on the stream of job ", job_, " rank ", rank_)};
    }
    using Kind = ServiceMetrics::ReportKind;
    const Kind kind = report.has_step_report() ? Kind::kStep
                      : report.has_audit()     ? Kind::kAudit
                                               : Kind::kWeights;
    service_->metrics_->Report(kind, report.ByteSizeLong());
    absl::StatusOr<core::Report> converted = FromProto(report);
    if (!converted.ok()) return ToGrpc(converted.status());
    absl::StatusOr<core::Effects> effects = service_->coordinator_->Ingest(*converted);
    if (!effects.ok()) {
      // A report that contradicts what the rank said or is malformed is
      // consumed: acknowledged with the refusal, so the rank drops it and
      // its later reports flow on (ending the stream made the rank resend
      // it, and everything behind it, forever). The refusal is logged.
      const absl::StatusCode code = effects.status().code();
      if (code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kAlreadyExists) {
        absl::StatusOr<core::Effects> consumed =
            service_->coordinator_->Consume(*converted, effects.status());
        if (consumed.ok()) {
          service_->metrics_->Rejected(ReasonOf(code));
          v1::CoordinatorMessage ack;
          ack.mutable_ack()->set_acked_sequence(consumed->acked_sequence);
          ack.mutable_ack()->set_refused_sequence(converted->sequence);
          ack.mutable_ack()->set_refused_reason(std::string(effects.status().message()));
          std::shared_ptr<Outbox> outbox = outbox_;
          service_->delivery_->Deliver(*std::move(consumed), [outbox, ack](absl::Status s) {
            if (s.ok()) outbox->Push(ack);
          });
          return grpc::Status::OK;
        }
      }
      return ToGrpc(effects.status());
    }
    if (acked != nullptr) {
      *acked = effects->acked_sequence;
      service_->delivery_->Deliver(*std::move(effects));
      return grpc::Status::OK;
    }
    v1::CoordinatorMessage ack;
    ack.mutable_ack()->set_acked_sequence(effects->acked_sequence);
    std::shared_ptr<Outbox> outbox = outbox_;
    // The acknowledgement goes out only once the report is durable.
    service_->delivery_->Deliver(*std::move(effects), [outbox, ack](absl::Status s) {
      if (s.ok()) outbox->Push(ack);
    });
    return grpc::Status::OK;
  }

  // The stream ended: the rank is no longer reachable here.
  // A stream that ends after the rank attached again elsewhere (a new
  // relay, a new Attach stream) detaches nothing.
  void Close() {
    if (!attached_) return;
    attached_ = false;
    if (service_->streams_->Unregister(job_, rank_, outbox_.get())) {
      service_->coordinator_->Detach(job_, rank_, incarnation_);
    }
  }

 private:
  TrainerService* const service_;
  const std::shared_ptr<Outbox> outbox_;
  bool attached_ = false;
  std::string job_;
  core::Rank rank_ = 0;
  uint64_t incarnation_ = 0;
};

// What the service's queue threads dispatch on.
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

// One bidirectional stream on one completion queue (asynchronous API).
// Every operation started holds a reference (self_) until its completion
// returns from the queue; outboxes hold weak ones. Reads run on the queue's
// thread, one at a time; writes start from any thread, one in flight, queued
// behind it; the finish waits for the queue of writes to empty.
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
  StreamCall(TrainerService* service, grpc::ServerCompletionQueue* queue)
      : service_(service), queue_(queue), stream_(&context_) {}

  // Waits for the call to arrive; `self` is this, owned.
  void Begin(std::shared_ptr<QueuedCall> self) {
    context_.AsyncNotifyWhenDone(&done_tag_);
    {
      absl::MutexLock lock(&mu_);
      self_ = std::move(self);
      pending_ = 1;
    }
    if (!service_->Post([&] { Request(); })) Completed();
  }

  // Asks the service for the next call of this method on queue_.
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

  TrainerService* const service_;
  grpc::ServerCompletionQueue* const queue_;
  grpc::ServerContext context_;
  // Raw frames, parsed and serialized here (see daemon/stream.h).
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  Tag request_tag_{this, Op::kRequest};
  In in_;  // The read path: the queue's thread, one read at a time.
  // The method, for the malformed-message metric.
  virtual const char* Method() const = 0;

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
    if (!service_->Post([&] { stream_.Read(&read_frame_, &read_tag_); })) Completed();
  }

  void OnReadDone(bool ok) {
    if (!ok) {
      // The client closed its side or the call broke: flush and finish.
      RequestFinish(grpc::Status::OK);
      return;
    }
    if (grpc::Status parsed = ParseFrame(&read_frame_, &in_); !parsed.ok()) {
      service_->metrics_->Malformed(Method());
      RequestFinish(std::move(parsed));
      return;
    }
    grpc::Status refused = Handle();
    if (!refused.ok()) {
      service_->metrics_->Rejected(ReasonOf(static_cast<absl::StatusCode>(refused.error_code())));
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
      case Outgoing<Out>::Start::kNothing:
        return;
      case Outgoing<Out>::Start::kWrite:
        ++pending_;
        // One write in flight at a time: its frame is free again.
        WriteFrame(*write, &write_frame_);
        posted = service_->Post([&] { stream_.Write(write_frame_, &write_tag_); });
        if (!posted) out_.WriteNotStarted();
        break;
      case Outgoing<Out>::Start::kFinish:
        ++pending_;
        posted = service_->Post([&] { stream_.Finish(status, &finish_tag_); });
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
  Outgoing<Out> out_ ABSL_GUARDED_BY(mu_);
};

// One trainer's Attach stream: one rank.
class AttachCall final : public StreamCall<v1::TrainerMessage, v1::CoordinatorMessage>,
                         public std::enable_shared_from_this<AttachCall> {
 public:
  AttachCall(TrainerService* service, grpc::ServerCompletionQueue* queue)
      : StreamCall(service, queue) {}

  // Waits for the next Attach on this queue.
  static void Arm(TrainerService* service, grpc::ServerCompletionQueue* queue) {
    auto call = std::make_shared<AttachCall>(service, queue);
    call->session_ = std::make_unique<RankSession>(
        service, std::make_shared<AttachOutbox>(std::weak_ptr<AttachCall>(call)));
    call->Begin(call);
  }

 private:
  // The stream's outgoing side as the registry sees it.
  class AttachOutbox final : public Outbox {
   public:
    explicit AttachOutbox(std::weak_ptr<AttachCall> call) : call_(std::move(call)) {}
    void Push(v1::CoordinatorMessage message) override {
      if (std::shared_ptr<AttachCall> call = call_.lock()) call->Enqueue(std::move(message));
    }
    void End(grpc::Status status) override {
      if (std::shared_ptr<AttachCall> call = call_.lock()) call->RequestFinish(std::move(status));
    }

   private:
    std::weak_ptr<AttachCall> call_;
  };

  const char* Method() const override { return "attach"; }

  void Request() override {
    service_->RequestAttach(&context_, &stream_, queue_, queue_, &request_tag_);
  }
  void Rearm() override { Arm(service_, queue_); }
  grpc::Status Handle() override { return session_->Handle(in_); }
  void OnDone() override { session_->Close(); }

  bool Absorb(v1::CoordinatorMessage& last, v1::CoordinatorMessage& next) override {
    return FoldAck(last, next);
  }

  std::unique_ptr<RankSession> session_;
};

// A relay's stream: many ranks' sessions, each handled as an Attach stream
// would be, their replies batched into as few writes as the relay can take.
class RelayCall final : public StreamCall<v1::RelayUp, v1::RelayDown>,
                        public std::enable_shared_from_this<RelayCall> {
 public:
  RelayCall(TrainerService* service, grpc::ServerCompletionQueue* queue)
      : StreamCall(service, queue) {}

  static void Arm(TrainerService* service, grpc::ServerCompletionQueue* queue) {
    auto call = std::make_shared<RelayCall>(service, queue);
    call->Begin(call);
  }

  // Ends the relay and every session on it (sdcd is stopping): the relay
  // ends its ranks' streams with `status`, and they reconnect.
  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&sessions_mu_);
      ended_ = true;
      for (auto& [id, s] : sessions_) CloseSession(s);
      sessions_.clear();
    }
    RequestFinish(status);
  }

 private:
  friend class SharedPush;  // EnqueueShared.
  // One session's outgoing side as the registry sees it. Once closed it
  // drops what durability callbacks still push: nothing follows a
  // session's end.
  class SessionOutbox final : public Outbox {
   public:
    SessionOutbox(std::weak_ptr<RelayCall> call, uint64_t session)
        : call_(std::move(call)), session_(session) {}
    void Push(v1::CoordinatorMessage message) override {
      std::shared_ptr<RelayCall> call = call_.lock();
      if (call == nullptr) return;
      v1::RelayDown down;
      v1::RelayedReply* reply = down.add_replies();
      reply->set_session(session_);
      *reply->mutable_message() = std::move(message);
      absl::MutexLock lock(&mu_);  // Held across Enqueue: no push after Close.
      if (!closed_) call->Enqueue(std::move(down));
    }
    void PushShared(const v1::CoordinatorMessage& message, SharedPush& shared) override {
      std::shared_ptr<RelayCall> call = call_.lock();
      if (call == nullptr) return;
      if (call->compact_.load(std::memory_order_relaxed)) {
        shared.Add(std::move(call), session_);  // RelayCall::EnqueueShared.
      } else {
        Push(message);
      }
    }
    void End(grpc::Status status) override {
      if (std::shared_ptr<RelayCall> call = call_.lock()) call->EndSession(session_, status);
    }
    void Close() {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }

   private:
    std::weak_ptr<RelayCall> call_;
    const uint64_t session_;
    absl::Mutex mu_;
    bool closed_ ABSL_GUARDED_BY(mu_) = false;
  };

  struct Session {
    std::unique_ptr<RankSession> rank;
    std::shared_ptr<SessionOutbox> outbox;
  };

  const char* Method() const override { return "relay"; }

  void Request() override {
    service_->RequestRelay(&context_, &stream_, queue_, queue_, &request_tag_);
  }
  // This call matched a relay: the service may end it, and the next waits.
  void Rearm() override {
    grpc::Status refused;
    if (!service_->AddRelay(weak_from_this(), &refused)) End(refused);
    Arm(service_, queue_);
  }

  // A refused message ends its session only; the relay carries on.
  grpc::Status Handle() override {
    if (in_.messages_size() > kMaxMessagesPerBatch) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("a relay message carries at most ", kMaxMessagesPerBatch,
                           " messages, not ", in_.messages_size())};
    }
    // The replies to this message's reports wait for one durability callback.
    Delivery::Batch replies(service_->delivery_);
    // (session, sequence): the acknowledgements, when the relay takes them
    // packed.
    std::vector<std::pair<uint64_t, uint64_t>> acks;
    const bool packed = in_.compact_replies();
    compact_.store(packed, std::memory_order_relaxed);
    for (const v1::RelayedMessage& m : in_.messages()) {
      grpc::Status refused;
      {
        absl::MutexLock lock(&sessions_mu_);
        if (ended_) return grpc::Status::OK;  // Ending: the relay resends elsewhere.
        auto it = sessions_.find(m.session());
        if (m.end()) {
          if (it != sessions_.end()) {
            CloseSession(it->second);
            sessions_.erase(it);
          }
          gone_.erase(m.session());  // The relay knows it ended.
          continue;
        }
        // What was already on its way for a session sdcd ended: dropped, as
        // an Attach stream that finished reads nothing more.
        if (gone_.count(m.session()) > 0) continue;
        if (it == sessions_.end()) {
          if (sessions_.size() >= kMaxSessions) {
            refused = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("a relay carries at most ", kMaxSessions, " sessions")};
          } else {
            Session fresh;
            fresh.outbox = std::make_shared<SessionOutbox>(weak_from_this(), m.session());
            fresh.rank = std::make_unique<RankSession>(service_, fresh.outbox);
            it = sessions_.emplace(m.session(), std::move(fresh)).first;
          }
        }
        if (refused.ok()) {
          uint64_t acked = 0;
          refused = it->second.rank->Handle(m.message(), packed ? &acked : nullptr);
          if (refused.ok()) {
            if (acked != 0) acks.emplace_back(m.session(), acked);
            continue;
          }
          CloseSession(it->second);
          sessions_.erase(it);
        }
        Forget(m.session());
      }
      service_->metrics_->Rejected(ReasonOf(static_cast<absl::StatusCode>(refused.error_code())));
      EnqueueEnd(m.session(), refused);
    }
    if (!acks.empty()) {
      // Last in the batch: after every other reply of this message.
      service_->delivery_->Deliver(
          core::Effects{}, [call = weak_from_this(), acks = std::move(acks)](absl::Status s) {
            if (!s.ok()) return;
            if (std::shared_ptr<RelayCall> c = call.lock()) c->EnqueueAcks(acks);
          });
    }
    return grpc::Status::OK;
  }

  // One reply for those of `sessions` still open.
  void EnqueueShared(const v1::CoordinatorMessage& message,
                     const std::vector<uint64_t>& sessions) {
    v1::RelayDown down;
    v1::RelayedReply* reply = nullptr;
    absl::MutexLock lock(&sessions_mu_);  // Held across Enqueue: nothing after a session's end.
    if (ended_) return;
    for (uint64_t session : sessions) {
      if (sessions_.count(session) == 0) continue;
      if (reply == nullptr) {
        reply = down.add_replies();
        reply->set_session(session);
        *reply->mutable_message() = message;
      } else {
        reply->add_also_sessions(session);
      }
    }
    if (reply != nullptr) Enqueue(std::move(down));
  }

  // One message's acknowledgements, packed, for the sessions still open.
  void EnqueueAcks(const std::vector<std::pair<uint64_t, uint64_t>>& acks) {
    v1::RelayDown down;
    down.mutable_ack_sessions()->Reserve(static_cast<int>(acks.size()));
    down.mutable_ack_sequences()->Reserve(static_cast<int>(acks.size()));
    absl::MutexLock lock(&sessions_mu_);  // Held across Enqueue: nothing after a session's end.
    if (ended_) return;
    for (const auto& [session, sequence] : acks) {
      if (sessions_.count(session) == 0) continue;
      down.add_ack_sessions(session);
      down.add_ack_sequences(sequence);
    }
    if (down.ack_sessions_size() > 0) Enqueue(std::move(down));
  }

  void OnDone() override {
    absl::MutexLock lock(&sessions_mu_);
    ended_ = true;
    for (auto& [id, s] : sessions_) CloseSession(s);
    sessions_.clear();
  }

  // From any thread (sdcd shutting down: StreamRegistry::EndAll).
  void EndSession(uint64_t session, const grpc::Status& status) {
    {
      absl::MutexLock lock(&sessions_mu_);
      auto it = sessions_.find(session);
      if (it == sessions_.end()) return;
      CloseSession(it->second);
      sessions_.erase(it);
      Forget(session);
    }
    EnqueueEnd(session, status);
  }

  static void CloseSession(Session& s) {
    s.outbox->Close();
    s.rank->Close();
  }

  // Remembers that sdcd ended `session`, until the relay says it has ended
  // too (the oldest are forgotten beyond a bound).
  void Forget(uint64_t session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sessions_mu_) {
    gone_.insert(session);
    if (gone_.size() > kMaxGone) gone_.erase(gone_.begin());
  }

  void EnqueueEnd(uint64_t session, const grpc::Status& status) {
    v1::RelayDown down;
    v1::RelayedReply* reply = down.add_replies();
    reply->set_session(session);
    reply->set_end(true);
    reply->set_status_code(status.error_code());
    reply->set_status_message(status.error_message());
    Enqueue(std::move(down));
  }

  // Replies waiting while a write is in flight go out together. Replies
  // are small (an ack, a plan, a verdict naming at most a few tensors), so
  // 1,024 stay far below the 16 MiB message limit. Packed acknowledgements
  // come after a message's replies: a reply never joins a message that
  // already holds some.
  bool Absorb(v1::RelayDown& last, v1::RelayDown& next) override {
    if (last.replies_size() >= kMaxRepliesPerBatch || last.ack_sessions_size() >= kMaxAcksPerBatch ||
        (last.ack_sessions_size() > 0 && next.replies_size() > 0)) {
      return false;
    }
    for (v1::RelayedReply& r : *next.mutable_replies()) *last.add_replies() = std::move(r);
    last.mutable_ack_sessions()->Add(next.ack_sessions().begin(), next.ack_sessions().end());
    last.mutable_ack_sequences()->Add(next.ack_sequences().begin(), next.ack_sequences().end());
    return true;
  }

  // A node's ranks, with room for a relay that carries several nodes.
  static constexpr size_t kMaxSessions = 4096;
  static constexpr int kMaxMessagesPerBatch = 4096;
  static constexpr int kMaxRepliesPerBatch = 1024;
  static constexpr int kMaxAcksPerBatch = 16384;  // At most 20 bytes each.
  static constexpr size_t kMaxGone = 65536;

  // The relay's latest message set compact_replies: verdicts may be shared.
  std::atomic<bool> compact_{false};
  absl::Mutex sessions_mu_;
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(sessions_mu_);
  std::set<uint64_t> gone_ ABSL_GUARDED_BY(sessions_mu_);  // Ended by sdcd.
  bool ended_ ABSL_GUARDED_BY(sessions_mu_) = false;
};

void SharedPush::Add(std::shared_ptr<RelayCall> call, uint64_t session) {
  auto [it, fresh] = index_.try_emplace(call.get(), calls_.size());
  if (fresh) calls_.emplace_back(std::move(call), std::vector<uint64_t>());
  calls_[it->second].second.push_back(session);
}

void SharedPush::Send(const v1::CoordinatorMessage& message) {
  for (const auto& [call, sessions] : calls_) call->EnqueueShared(message, sessions);
}

bool TrainerService::AddRelay(std::weak_ptr<RelayCall> relay, grpc::Status* refused) {
  absl::MutexLock lock(&relays_mu_);
  if (!relays_end_status_.ok()) {  // EndRelays ran: a relay back at once ends too.
    *refused = relays_end_status_;
    return false;
  }
  // Forget relays that are gone, now and then (amortized).
  if (relays_.size() >= 2 * relays_live_ + 64) {
    relays_.erase(std::remove_if(relays_.begin(), relays_.end(),
                                 [](const std::weak_ptr<RelayCall>& r) { return r.expired(); }),
                  relays_.end());
    relays_live_ = relays_.size();
  }
  relays_.push_back(std::move(relay));
  return true;
}

size_t TrainerService::relays() const {
  absl::MutexLock lock(&relays_mu_);
  return std::count_if(relays_.begin(), relays_.end(),
                       [](const std::weak_ptr<RelayCall>& r) { return !r.expired(); });
}

void TrainerService::EndRelays(const grpc::Status& status) {
  std::vector<std::weak_ptr<RelayCall>> relays;
  {
    absl::MutexLock lock(&relays_mu_);
    relays_end_status_ = status;
    relays.swap(relays_);
  }
  for (auto& r : relays) {
    if (std::shared_ptr<RelayCall> call = r.lock()) call->End(status);
  }
}

TrainerService::~TrainerService() { Stop(); }

void TrainerService::AddQueues(grpc::ServerBuilder& builder, int queues) {
  for (int i = 0; i < queues; ++i) queues_.push_back(builder.AddCompletionQueue());
}

void TrainerService::Start() {
  for (auto& q : queues_) {
    grpc::ServerCompletionQueue* queue = q.get();
    AttachCall::Arm(this, queue);
    RelayCall::Arm(this, queue);
    threads_.emplace_back([this, queue] {
      pthread_setname_np(pthread_self(), "sdc-streams");  // For top -H and perf.
      Serve(queue);
    });
  }
}

void TrainerService::Serve(grpc::ServerCompletionQueue* queue) {
  void* tag = nullptr;
  bool ok = false;
  while (queue->Next(&tag, &ok)) {
    auto* t = static_cast<QueuedCall::Tag*>(tag);
    t->call->OnEvent(t->op, ok);
  }
}

void TrainerService::Stop() {
  {
    absl::WriterMutexLock lock(&post_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (auto& q : queues_) q->Shutdown();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void StreamRegistry::Register(const std::string& job, core::Rank rank,
                              std::shared_ptr<Outbox> outbox) {
  absl::MutexLock lock(&mu_);
  streams_[{job, rank}] = std::move(outbox);
}

bool StreamRegistry::Unregister(const std::string& job, core::Rank rank, const Outbox* outbox) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find({job, rank});
  if (it == streams_.end() || it->second.get() != outbox) return false;
  streams_.erase(it);
  return true;
}

void StreamRegistry::Send(const std::string& job, const std::vector<core::Rank>& ranks,
                          const v1::CoordinatorMessage& message) {
  std::vector<std::shared_ptr<Outbox>> targets;
  {
    absl::MutexLock lock(&mu_);
    for (core::Rank r : ranks) {
      auto it = streams_.find({job, r});
      if (it != streams_.end()) targets.push_back(it->second);
    }
  }
  SharedPush shared;
  for (auto& t : targets) t->PushShared(message, shared);
  shared.Send(message);
}

void StreamRegistry::EndAll(const grpc::Status& status) {
  std::vector<std::shared_ptr<Outbox>> all;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, outbox] : streams_) all.push_back(outbox);
  }
  for (auto& o : all) o->End(status);
}

size_t StreamRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

void Delivery::Deliver(core::Effects effects, std::function<void(absl::Status)> then) {
  const uint64_t ticket = effects.ticket;
  // Most reports' effects: nothing to send or count, only a ticket.
  if (!then && effects.messages.empty() && effects.checks.empty() && effects.incidents.empty() &&
      effects.requests.empty() && effects.skipped_steps == 0 && effects.expired_jobs.empty() &&
      effects.notes.empty()) {
    if (Batch* batch = Batch::current_; batch != nullptr && batch->delivery_ == this) {
      batch->ticket_ = std::max(batch->ticket_, ticket);
    }
    return;
  }
  auto send = [this, effects = std::move(effects), then = std::move(then)](absl::Status s) {
    if (s.ok()) {
      for (const core::OutMessage& m : effects.messages) {
        streams_->Send(m.job_id, m.ranks, ToProto(m));
      }
      metrics_->Observe(effects);
      if (log_) log_(effects);
    }
    if (then) then(s);
  };
  if (Batch* batch = Batch::current_; batch != nullptr && batch->delivery_ == this) {
    batch->ticket_ = std::max(batch->ticket_, ticket);
    batch->sends_.push_back(std::move(send));
  } else if (ticket == 0) {
    send(absl::OkStatus());
  } else {
    store_->NotifyDurable(ticket, std::move(send));
  }
}

Delivery::Batch::~Batch() {
  current_ = outer_;
  if (sends_.empty()) return;
  auto send_all = [sends = std::move(sends_)](absl::Status s) {
    for (const auto& send : sends) send(s);
  };
  if (ticket_ == 0) {
    send_all(absl::OkStatus());
  } else {
    delivery_->store_->NotifyDurable(ticket_, std::move(send_all));
  }
}

grpc::ServerUnaryReactor* TrainerService::MayCheckpoint(grpc::CallbackServerContext* context,
                                                        const v1::CheckpointRequest* request,
                                                        v1::CheckpointDecision* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<core::CheckpointResult> result =
      request->status_only() ? coordinator_->CheckpointStatus(request->job_id())
                             : coordinator_->MayCheckpoint(request->job_id(), request->step());
  if (!result.ok()) {
    metrics_->Rejected(ReasonOf(result.status().code()));
    reactor->Finish(ToGrpc(result.status()));
    return reactor;
  }
  response->set_allowed(result->allowed);
  response->set_reason(result->reason);
  response->set_retryable(result->retryable);
  response->set_confirmed_through_step(result->confirmed_through);
  for (core::Step s : result->revoked) response->add_revoked_steps(s);
  if (!request->status_only()) {
    metrics_->Checkpoint(result->allowed ? "allowed" : result->retryable ? "wait" : "denied");
  }
  delivery_->Deliver(std::move(result->effects),
                     [reactor](absl::Status s) { reactor->Finish(ToGrpc(s)); });
  return reactor;
}

// ---------------------------------------------------------------------------
// Admin

grpc::Status AuthorizeAdmin(const AdminAuth& auth, ServiceMetrics* metrics,
                            grpc::CallbackServerContext* c, Role needed, Principal* who) {
  std::optional<Principal> principal;
  const auto& md = c->client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    const absl::string_view presented(it->second.data(), it->second.size());
    if (absl::StartsWith(presented, "Bearer ") && auth.operators != nullptr) {
      principal = auth.operators->ByToken(presented.substr(7));
    }
    if (!principal.has_value()) {
      metrics->Rejected("permission_denied");
      return {grpc::StatusCode::PERMISSION_DENIED, "the admin token is not valid"};
    }
  } else if (auth.accept_client_certs && c->auth_context() != nullptr &&
             c->auth_context()->IsPeerAuthenticated()) {
    std::string cn;
    for (const grpc::string_ref& v :
         c->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      cn.assign(v.data(), v.size());
    }
    if (auth.operators != nullptr) principal = auth.operators->ByName(cn);
    if (!principal.has_value()) {
      metrics->Rejected("permission_denied");
      return {grpc::StatusCode::PERMISSION_DENIED,
              absl::StrCat("the client certificate's common name \"", absl::CHexEscape(cn),
                           "\" names no operator (an admin adds it: sdcctl operator add NAME)")};
    }
  } else {
    metrics->Rejected("unauthenticated");
    return {grpc::StatusCode::UNAUTHENTICATED,
            "admin calls need 'authorization: Bearer <token>' (sdcctl --token_file) or a "
            "TLS client certificate"};
  }
  if (principal->role < needed) {
    metrics->Rejected("permission_denied");
    return {grpc::StatusCode::PERMISSION_DENIED,
            absl::StrCat(principal->name, " has role ", RoleName(principal->role),
                         "; this call needs ", RoleName(needed))};
  }
  if (who != nullptr) *who = *std::move(principal);
  return grpc::Status::OK;
}

namespace {

v1::OperatorRole ToProto(Role role) {
  switch (role) {
    case Role::kViewer:
      return v1::ROLE_VIEWER;
    case Role::kOperator:
      return v1::ROLE_OPERATOR;
    case Role::kAdmin:
      return v1::ROLE_ADMIN;
  }
  return v1::OPERATOR_ROLE_UNSPECIFIED;
}

v1::Operator ToProto(const OperatorRecord& r) {
  v1::Operator out;
  out.set_name(r.name);
  out.set_role(ToProto(r.role));
  out.set_created_unix_ms(absl::ToUnixMillis(r.created));
  out.set_created_by(r.created_by);
  return out;
}

}  // namespace

namespace {
// Finishes `reactor` with `s` after counting it as a rejected input.
template <typename Response>
void Refuse(ServiceMetrics* metrics, RawUnaryReactor<Response>* reactor, const absl::Status& s) {
  metrics->Rejected(ReasonOf(s.code()));
  reactor->Reply(ToGrpc(s));
}
}  // namespace

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* c,
                                                 const grpc::ByteBuffer* in,
                                                 grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListJobsRequest, v1::ListJobsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListJobsRequest&, auto* reactor) {
        for (const core::JobSummary& j : coordinator_->ListJobs()) {
          *reactor->response()->add_jobs() = ToProto(j);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListRanks(grpc::CallbackServerContext* c,
                                                  const grpc::ByteBuffer* in,
                                                  grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListRanksRequest, v1::ListRanksResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListRanksRequest& q, auto* reactor) {
        absl::StatusOr<std::vector<core::RankSummary>> ranks =
            coordinator_->ListRanks(q.job_id());
        if (!ranks.ok()) {
          reactor->Reply(ToGrpc(ranks.status()));
          return;
        }
        for (const core::RankSummary& s : *ranks) *reactor->response()->add_ranks() = ToProto(s);
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListIncidents(grpc::CallbackServerContext* c,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListIncidentsRequest, v1::ListIncidentsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListIncidentsRequest& q, auto* reactor) {
        for (const core::Incident& i : coordinator_->ListIncidents(q.job_id())) {
          *reactor->response()->add_incidents() = ToProto(i);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListSuspects(grpc::CallbackServerContext* c,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListSuspectsRequest, v1::ListSuspectsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListSuspectsRequest&, auto* reactor) {
        for (const core::Suspect& s : coordinator_->ListSuspects()) {
          *reactor->response()->add_suspects() = ToProto(s);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListRequests(grpc::CallbackServerContext* c,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListRequestsRequest, v1::ListRequestsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListRequestsRequest& q, auto* reactor) {
        for (const core::ReplacementRequest& req : coordinator_->ListRequests()) {
          if (q.state() != v1::REQUEST_STATE_UNSPECIFIED && ToProto(req.state) != q.state()) {
            continue;
          }
          *reactor->response()->add_requests() = ToProto(req);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

void AdminService::FillEvidence(v1::ReplacementRequest* r) {
  for (uint64_t id : r->incident_ids()) {
    absl::StatusOr<core::Incident> i = coordinator_->GetIncident(id);
    if (i.ok()) *r->add_evidence() = ToProto(*i);
  }
}

grpc::ServerUnaryReactor* AdminService::GetRequest(grpc::CallbackServerContext* c,
                                                   const grpc::ByteBuffer* in,
                                                   grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::GetRequestRequest, v1::ReplacementRequest>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::GetRequestRequest& q, auto* reactor) {
        absl::StatusOr<core::ReplacementRequest> req = coordinator_->GetRequest(q.id());
        if (!req.ok()) {
          Refuse(metrics_, reactor, req.status());
          return;
        }
        *reactor->response() = ToProto(*req);
        FillEvidence(reactor->response());
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::Decide(grpc::CallbackServerContext* c,
                                               const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out, bool approve) {
  return ServeAuthenticated<v1::DecideRequest, v1::ReplacementRequest>(
      auth_, metrics_, c, in, out, Role::kOperator,
      [this, approve](const Principal& who, const v1::DecideRequest& q, auto* reactor) {
        // Under two-person approval every approval names a person: the
        // shared bootstrap token would let one person supply the second.
        if (approve && who.name == kRootName && approvals_required_ > 1) {
          metrics_->Rejected("permission_denied");
          reactor->Reply({grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("root may not approve when ", approvals_required_,
                                       " operators must (sdcd --approvals_required): approve "
                                       "with your own token (sdcctl operator add NAME)")});
          return;
        }
        // Who decides is the credential's principal; the request's
        // (deprecated) operator field is ignored.
        auto result = approve ? coordinator_->Approve(q.id(), who.name, q.reason(), q.force(),
                                                      q.dry_run())
                              : coordinator_->Deny(q.id(), who.name, q.reason(), q.force(),
                                                   q.dry_run());
        if (!result.ok()) {
          Refuse(metrics_, reactor, result.status());
          return;
        }
        *reactor->response() = ToProto(result->first);
        FillEvidence(reactor->response());
        const bool wake = approve && !q.dry_run();
        delivery_->Deliver(std::move(result->second), [this, reactor, wake](absl::Status s) {
          if (s.ok() && wake && on_approved_) on_approved_();
          reactor->Reply(ToGrpc(s));
        });
      });
}

grpc::ServerUnaryReactor* AdminService::Approve(grpc::CallbackServerContext* c,
                                                const grpc::ByteBuffer* in,
                                                grpc::ByteBuffer* out) {
  return Decide(c, in, out, /*approve=*/true);
}

grpc::ServerUnaryReactor* AdminService::Deny(grpc::CallbackServerContext* c,
                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return Decide(c, in, out, /*approve=*/false);
}

grpc::ServerUnaryReactor* AdminService::ResolveIncident(grpc::CallbackServerContext* c,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ResolveIncidentRequest, v1::Incident>(
      auth_, metrics_, c, in, out, Role::kOperator,
      [this](const Principal& who, const v1::ResolveIncidentRequest& q, auto* reactor) {
        auto result = coordinator_->ResolveIncident(q.id(), who.name, q.reason());
        if (!result.ok()) {
          Refuse(metrics_, reactor, result.status());
          return;
        }
        *reactor->response() = ToProto(result->first);
        delivery_->Deliver(std::move(result->second),
                           [reactor](absl::Status s) { reactor->Reply(ToGrpc(s)); });
      });
}

grpc::ServerUnaryReactor* AdminService::History(grpc::CallbackServerContext* c,
                                                const grpc::ByteBuffer* in,
                                                grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::HistoryRequest, v1::HistoryResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::HistoryRequest& q, auto* reactor) {
        if (q.gpu_uuid().empty() && q.node_name().empty()) {
          Refuse(metrics_, reactor, absl::InvalidArgumentError("name a GPU UUID or a node"));
          return;
        }
        auto [incidents, requests] = coordinator_->History(q.gpu_uuid(), q.node_name());
        for (const core::Incident& i : incidents) *reactor->response()->add_incidents() = ToProto(i);
        for (const core::ReplacementRequest& req : requests) {
          *reactor->response()->add_requests() = ToProto(req);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::AddOperator(grpc::CallbackServerContext* c,
                                                    const grpc::ByteBuffer* in,
                                                    grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::AddOperatorRequest, v1::AddOperatorResponse>(
      auth_, metrics_, c, in, out, Role::kAdmin,
      [this](const Principal& who, const v1::AddOperatorRequest& q, auto* reactor) {
        Role role = Role::kOperator;
        switch (q.role()) {
          case v1::ROLE_VIEWER:
            role = Role::kViewer;
            break;
          case v1::ROLE_ADMIN:
            role = Role::kAdmin;
            break;
          case v1::ROLE_OPERATOR:
          case v1::OPERATOR_ROLE_UNSPECIFIED:
            break;
          default:
            Refuse(metrics_, reactor, absl::InvalidArgumentError("unknown role"));
            return;
        }
        auto added = operators_->Add(q.name(), role, who.name, absl::Now());
        if (!added.ok()) {
          Refuse(metrics_, reactor, added.status());
          return;
        }
        *reactor->response()->mutable_operator_() = ToProto(added->first);
        reactor->response()->set_token(added->second);
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListOperators(grpc::CallbackServerContext* c,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListOperatorsRequest, v1::ListOperatorsResponse>(
      auth_, metrics_, c, in, out, Role::kAdmin,
      [this](const Principal&, const v1::ListOperatorsRequest&, auto* reactor) {
        for (const OperatorRecord& r : operators_->List()) {
          *reactor->response()->add_operators() = ToProto(r);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::RemoveOperator(grpc::CallbackServerContext* c,
                                                       const grpc::ByteBuffer* in,
                                                       grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::RemoveOperatorRequest, v1::Operator>(
      auth_, metrics_, c, in, out, Role::kAdmin,
      [this](const Principal&, const v1::RemoveOperatorRequest& q, auto* reactor) {
        auto removed = operators_->Remove(q.name());
        if (!removed.ok()) {
          Refuse(metrics_, reactor, removed.status());
          return;
        }
        *reactor->response() = ToProto(*removed);
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::WhoAmI(grpc::CallbackServerContext* c,
                                               const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::WhoAmIRequest, v1::WhoAmIResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal& who, const v1::WhoAmIRequest&, auto* reactor) {
        reactor->response()->set_name(who.name);
        reactor->response()->set_role(ToProto(who.role));
        reactor->response()->set_server_version(kVersion);
        reactor->response()->set_approvals_required(approvals_required_);
        reactor->Reply(grpc::Status::OK);
      });
}

}  // namespace sdc::daemon
