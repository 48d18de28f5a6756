#ifndef SDC_DAEMON_TRAINER_SERVICE_H_
#define SDC_DAEMON_TRAINER_SERVICE_H_

// sdcd's gRPC services: thin adapters that translate messages, hand them to
// the coordinator core, and send the core's answers once the store says they
// are durable. No handler blocks (the core's calls are short and durability
// is awaited with NotifyDurable).
//
// Trainers' Attach streams use the asynchronous API over several completion
// queues, everything else the callback API. The reason is scale: Debian's
// libgrpc is built without NDEBUG, and then every completion scans its
// queue's list of outstanding operations; the callback API keeps all of a
// process's operations on one queue, so with 16,384 streams each read or
// write paid a scan of 16,384+ entries. Each of our queues scans its share.

#include <array>
#include <map>
#include <memory>
#include <string>
#include <list>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "admin.grpc.pb.h"
#include "common/version.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/store.h"
#include "common/metrics/registry.h"
#include "daemon/operators.h"
#include "grpcpp/grpcpp.h"
#include "trainer.grpc.pb.h"

namespace sdc::daemon {

// Largest message either side accepts: a weight report of 100,000 tensors is
// about 3 MiB.
inline constexpr int kMaxMessageBytes = 16 << 20;

// Converts at the edge; the codes are the same numbers. A message longer
// than 1 KiB is cut (saying how much), so the status always reaches the
// caller.
grpc::Status ToGrpc(const absl::Status& s);

// A request state as a metric label value: lower_snake ("pending").
std::string RequestStateLabel(core::RequestState state);

// The metrics sdcd exports (names per shared STYLE: sdc_ prefix, _total
// counters, _seconds durations, bounded labels).
//
// Per-GPU series, for joining with DCGM's (its UUID label holds the same NVML
// UUID trainers report): sdc_gpu_incidents_total{job,node,gpu,check} counts
// attributed incidents, sdc_suspect_gpus{job,node,gpu} is 1 while a GPU is
// under suspicion (the series goes when it is cleared), and
// sdc_node_replacement_requests{node,state} counts requests. Each of those
// families keeps at most `max_gpu_series` series: the incident counters
// most recently incremented, the newest suspects, the nodes with the newest
// requests. Thread-safe.
class ServiceMetrics {
 public:
  static constexpr size_t kDefaultMaxGpuSeries = 4096;

  explicit ServiceMetrics(metrics::Registry& registry,
                          size_t max_gpu_series = kDefaultMaxGpuSeries);

  enum class ReportKind { kStep, kAudit, kWeights };
  void Report(ReportKind kind, size_t bytes);
  void Rejected(const std::string& reason);
  // A frame on a stream that did not parse as its message type (also counted
  // as a rejected input, reason invalid_argument).
  void Malformed(const std::string& method);
  void Checkpoint(const std::string& decision);
  void Observe(const core::Effects& effects);
  void ActuatorRun(const std::string& actuator, const std::string& result);
  // Replaces sdc_suspect_gpus with `suspects` (newest first beyond the cap).
  void SetSuspects(const std::vector<core::Suspect>& suspects) ABSL_LOCKS_EXCLUDED(series_mu_);
  // Replaces sdc_node_replacement_requests with counts of `requests`.
  void SetRequests(const std::vector<core::ReplacementRequest>& requests)
      ABSL_LOCKS_EXCLUDED(series_mu_);

 private:
  // Makes `family`'s children exactly `wanted` (setting their values),
  // removing the ones in `*current` that are not wanted.
  void SyncGauges(metrics::Family<metrics::Gauge>& family,
                  const std::map<metrics::Labels, double>& wanted,
                  std::map<metrics::Labels, metrics::Gauge*>* current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(series_mu_);

  const size_t max_gpu_series_;
  metrics::Registry& registry_;
  metrics::Family<metrics::Counter>& reports_;
  metrics::Family<metrics::Counter>& report_bytes_;
  metrics::Family<metrics::Counter>& rejected_;
  metrics::Family<metrics::Counter>& malformed_;
  metrics::Family<metrics::Counter>& checks_;
  metrics::Family<metrics::Counter>& incidents_;
  metrics::Counter& skipped_;
  metrics::Family<metrics::Counter>& checkpoints_;
  metrics::Family<metrics::Histogram>& latency_;
  metrics::Family<metrics::Counter>& actuator_runs_;
  // reports_ and report_bytes_ by ReportKind, looked up once (every report
  // counts in both).
  std::array<metrics::Counter*, 3> reports_by_kind_;
  std::array<metrics::Counter*, 3> report_bytes_by_kind_;
  metrics::Family<metrics::Counter>& gpu_incidents_;
  metrics::Family<metrics::Gauge>& suspect_gpus_;
  metrics::Family<metrics::Gauge>& node_requests_;

  absl::Mutex series_mu_;
  // gpu_incidents_' children, least recently incremented first.
  std::list<std::pair<metrics::Labels, metrics::Counter*>> gpu_incident_order_
      ABSL_GUARDED_BY(series_mu_);
  std::map<metrics::Labels, std::list<std::pair<metrics::Labels, metrics::Counter*>>::iterator>
      gpu_incident_index_ ABSL_GUARDED_BY(series_mu_);
  std::map<metrics::Labels, metrics::Gauge*> suspect_series_ ABSL_GUARDED_BY(series_mu_);
  std::map<metrics::Labels, metrics::Gauge*> request_series_ ABSL_GUARDED_BY(series_mu_);
};

class Outbox;
class RankSession;
template <typename In, typename Out>
class StreamCall;
class AttachCall;
class RelayCall;

// Live trainer streams by (job, rank). Thread-safe.
class StreamRegistry {
 public:
  void Register(const std::string& job, core::Rank rank, std::shared_ptr<Outbox> outbox);
  // True if `outbox` was the rank's registered stream (a newer stream of
  // the rank may have replaced it).
  bool Unregister(const std::string& job, core::Rank rank, const Outbox* outbox);
  void Send(const std::string& job, const std::vector<core::Rank>& ranks,
            const v1::CoordinatorMessage& message);
  // Ends every stream with `status` once its queued messages are written
  // (at shutdown: trainers reconnect instead of holding the server open).
  void EndAll(const grpc::Status& status);
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, core::Rank>, std::shared_ptr<Outbox>> streams_
      ABSL_GUARDED_BY(mu_);
};

// Sends what the core decided, once durable: messages to their ranks, and
// metrics. Shared by both services and sdcd's background loops.
class Delivery {
 public:
  // `log` (may be empty) sees every delivered Effects once, after it is
  // durable: what the core decided (incidents, requests), whichever path
  // decided it (ingestion, the timer, operators, the actuator).
  Delivery(core::Store* store, StreamRegistry* streams, ServiceMetrics* metrics,
           std::function<void(const core::Effects&)> log = nullptr)
      : store_(store), streams_(streams), metrics_(metrics), log_(std::move(log)) {}
  // Runs `then` (if any) after the effects are durable and delivered.
  void Deliver(core::Effects effects, std::function<void(absl::Status)> then = nullptr);

  // While a Batch is open on a thread, that thread's deliveries wait for
  // one durability callback, at the batch's last ticket, instead of one
  // each; when it closes they are sent in the order they were delivered.
  // A relay's message carries many ranks' reports: one registration with
  // the store and one callback on its notifier thread instead of one per
  // report. Nothing is sent before it would have been (every ticket of the
  // batch is durable by then), and the batch's reports arrived together.
  class Batch {
   public:
    explicit Batch(Delivery* delivery) : delivery_(delivery), outer_(current_) {
      current_ = this;
    }
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    friend class Delivery;
    static inline thread_local Batch* current_ = nullptr;
    Delivery* const delivery_;
    Batch* const outer_;
    uint64_t ticket_ = 0;  // The highest of the batch; 0: nothing written.
    std::vector<std::function<void(absl::Status)>> sends_;
  };

 private:
  core::Store* store_;
  StreamRegistry* streams_;
  ServiceMetrics* metrics_;
  const std::function<void(const core::Effects&)> log_;
};

// Attach and Relay are raw: their streams parse their own frames, so that a
// malformed one ends the stream with INVALID_ARGUMENT, not OK.
using TrainerServiceBase = v1::TrainerService::WithRawMethod_Attach<
    v1::TrainerService::WithCallbackMethod_MayCheckpoint<
        v1::TrainerService::WithRawMethod_Relay<v1::TrainerService::Service>>>;

// Attach and Relay (asynchronous, see the top of this file) and
// MayCheckpoint (callback). Lifecycle: AddQueues before the server is built, Start after,
// Stop after the server's Shutdown returned.
class TrainerService final : public TrainerServiceBase {
 public:
  TrainerService(core::Coordinator* coordinator, Delivery* delivery, StreamRegistry* streams,
                 ServiceMetrics* metrics)
      : coordinator_(coordinator), delivery_(delivery), streams_(streams), metrics_(metrics) {}
  ~TrainerService() override;

  void AddQueues(grpc::ServerBuilder& builder, int queues);
  void Start();
  // Ends every relay stream and its sessions with `status`, and any relay
  // that arrives later (sdcd is stopping; call before StreamRegistry::EndAll
  // and the server's Shutdown). `status` must not be OK.
  void EndRelays(const grpc::Status& status);
  // Relay streams open now.
  size_t relays() const;
  void Stop();

  grpc::ServerUnaryReactor* MayCheckpoint(grpc::CallbackServerContext* context,
                                          const v1::CheckpointRequest* request,
                                          v1::CheckpointDecision* response) override;

 private:
  friend class RankSession;
  template <typename In, typename Out>
  friend class StreamCall;
  friend class AttachCall;
  friend class RelayCall;
  // Runs `post` (which starts one operation on a queue) unless Stop began;
  // false if it did not run. Queues refuse operations once shut down.
  template <typename Fn>
  bool Post(Fn post) {
    absl::ReaderMutexLock lock(&post_mu_);
    if (stopping_) return false;
    post();
    return true;
  }
  void Serve(grpc::ServerCompletionQueue* queue);
  // False (with the status to end it with) once EndRelays ran.
  bool AddRelay(std::weak_ptr<RelayCall> relay, grpc::Status* refused);

  core::Coordinator* coordinator_;
  Delivery* delivery_;
  StreamRegistry* streams_;
  ServiceMetrics* metrics_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  absl::Mutex post_mu_;
  bool stopping_ ABSL_GUARDED_BY(post_mu_) = false;
  mutable absl::Mutex relays_mu_;
  std::vector<std::weak_ptr<RelayCall>> relays_ ABSL_GUARDED_BY(relays_mu_);
  size_t relays_live_ ABSL_GUARDED_BY(relays_mu_) = 0;
  grpc::Status relays_end_status_ ABSL_GUARDED_BY(relays_mu_);  // Not OK after EndRelays.
};

struct AdminAuth {
  // The root token and per-operator tokens; must outlive the services.
  const Operators* operators = nullptr;
  // A verified TLS client certificate whose common name names a registered
  // operator authenticates as that operator (when no bearer token is sent).
  bool accept_client_certs = false;
};

// The rule of every admin-side service: the bearer token when one is sent,
// else a verified TLS client certificate when accepted; the principal must
// hold at least `needed`. OK (with *who set, if given), or UNAUTHENTICATED /
// PERMISSION_DENIED with a reason, counted in `metrics`.
grpc::Status AuthorizeAdmin(const AdminAuth& auth, ServiceMetrics* metrics,
                            grpc::CallbackServerContext* c, Role needed = Role::kViewer,
                            Principal* who = nullptr);

// The reactor of a raw unary call: Reply serializes the response (when the
// status is OK) into the call's response buffer and finishes the call. It
// deletes itself when the call is done. Reply once, from any thread.
template <typename Response>
class RawUnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit RawUnaryReactor(grpc::ByteBuffer* out) : out_(out) {}
  Response* response() { return &response_; }
  void Reply(grpc::Status status) {
    if (status.ok()) {
      bool own_buffer = false;
      status = grpc::SerializationTraits<Response>::Serialize(response_, out_, &own_buffer);
    }
    Finish(std::move(status));
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer* const out_;
  Response response_;
};

// Serves a raw unary admin call: authenticates (needing `role`) before a
// byte of `in` is parsed, so an unauthenticated caller's message, however
// large or malformed, is never deserialized; then parses it as Request
// (INVALID_ARGUMENT if it is not one) and runs handler(principal, request,
// reactor), which must Reply.
template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* ServeAuthenticated(const AdminAuth& auth, ServiceMetrics* metrics,
                                             grpc::CallbackServerContext* c,
                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                             Role role, Handler handler) {
  auto* reactor = new RawUnaryReactor<Response>(out);
  Principal who;
  if (grpc::Status s = AuthorizeAdmin(auth, metrics, c, role, &who); !s.ok()) {
    reactor->Reply(std::move(s));
    return reactor;
  }
  Request request;
  grpc::ByteBuffer bytes(*in);  // Deserialize consumes its buffer.
  if (!grpc::SerializationTraits<Request>::Deserialize(&bytes, &request).ok()) {
    metrics->Rejected("invalid_argument");
    reactor->Reply({grpc::StatusCode::INVALID_ARGUMENT,
                    "the request is not a valid " + Request::descriptor()->full_name()});
    return reactor;
  }
  handler(who, request, reactor);
  return reactor;
}

// Every method raw: authentication precedes parsing (ServeAuthenticated).
using AdminServiceBase = v1::AdminService::WithRawCallbackMethod_ListJobs<
    v1::AdminService::WithRawCallbackMethod_ListRanks<
    v1::AdminService::WithRawCallbackMethod_ListIncidents<
    v1::AdminService::WithRawCallbackMethod_ListSuspects<
    v1::AdminService::WithRawCallbackMethod_ListRequests<
    v1::AdminService::WithRawCallbackMethod_GetRequest<
    v1::AdminService::WithRawCallbackMethod_Approve<
    v1::AdminService::WithRawCallbackMethod_Deny<
    v1::AdminService::WithRawCallbackMethod_History<
    v1::AdminService::WithRawCallbackMethod_ResolveIncident<
    v1::AdminService::WithRawCallbackMethod_AddOperator<
    v1::AdminService::WithRawCallbackMethod_ListOperators<
    v1::AdminService::WithRawCallbackMethod_RemoveOperator<
    v1::AdminService::WithRawCallbackMethod_WhoAmI<
    v1::AdminService::Service>>>>>>>>>>>>>>;

// Thread-safe. Roles per method: see proto/admin.proto.
class AdminService final : public AdminServiceBase {
 public:
  // `operators` is the same registry `auth` reads (AddOperator and
  // RemoveOperator change it). `approvals_required` is reported by WhoAmI.
  AdminService(core::Coordinator* coordinator, Delivery* delivery, ServiceMetrics* metrics,
               AdminAuth auth, Operators* operators, int approvals_required,
               std::function<void()> on_approved)
      : coordinator_(coordinator),
        delivery_(delivery),
        metrics_(metrics),
        auth_(std::move(auth)),
        operators_(operators),
        approvals_required_(approvals_required),
        on_approved_(std::move(on_approved)) {}

#define SDC_ADMIN_RAW_METHOD(Method)                                          \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* c,           \
                                   const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  SDC_ADMIN_RAW_METHOD(ListJobs)
  SDC_ADMIN_RAW_METHOD(ListRanks)
  SDC_ADMIN_RAW_METHOD(ListIncidents)
  SDC_ADMIN_RAW_METHOD(ListSuspects)
  SDC_ADMIN_RAW_METHOD(ListRequests)
  SDC_ADMIN_RAW_METHOD(GetRequest)
  SDC_ADMIN_RAW_METHOD(Approve)
  SDC_ADMIN_RAW_METHOD(Deny)
  SDC_ADMIN_RAW_METHOD(History)
  SDC_ADMIN_RAW_METHOD(ResolveIncident)
  SDC_ADMIN_RAW_METHOD(AddOperator)
  SDC_ADMIN_RAW_METHOD(ListOperators)
  SDC_ADMIN_RAW_METHOD(RemoveOperator)
  SDC_ADMIN_RAW_METHOD(WhoAmI)
#undef SDC_ADMIN_RAW_METHOD

 private:
  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* c, const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out, bool approve);
  void FillEvidence(v1::ReplacementRequest* r);

  core::Coordinator* coordinator_;
  Delivery* delivery_;
  ServiceMetrics* metrics_;
  const AdminAuth auth_;
  Operators* const operators_;
  const int approvals_required_;
  std::function<void()> on_approved_;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_TRAINER_SERVICE_H_
