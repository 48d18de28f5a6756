#ifndef SDC_CLIENT_COORDINATOR_LINK_H_
#define SDC_CLIENT_COORDINATOR_LINK_H_

// One rank's link to sdcd: one gRPC stream, owned by a background thread.
// Training never waits on it except where the step protocol asks for a
// bounded wait (an audit verdict, a checkpoint decision).
//
// Every report stays in a bounded buffer until sdcd acknowledges it (sdcd
// acknowledges only durable reports). A report gets its sequence number when
// it is first written to a stream; the reports held while sdcd is away
// (not started yet, restarted, cut off) get theirs when it is back, so
// dropping one of them never leaves a gap. After every (re)connection the
// Welcome says what sdcd holds and the rest is written again, in order,
// under the same numbers; only when sdcd holds less than it acknowledged
// (a database lost or restored from a backup) are they numbered again from
// its Welcome. A report sdcd refuses is acknowledged with the refusal
// (Ack.refused_sequence): it is counted and logged, and the stream goes on.
//
// The buffer holds at most options.report_buffer reports and
// options.report_buffer_bytes of memory. Past either bound the reports not
// yet written go, oldest first within each class: clean step reports, then
// weight reports a newer one of this rank supersedes (a corrupted replica
// stays corrupted in the next), then other weight reports and the results
// of audits that passed. The evidence of a fault (a step report with
// NaN/Inf or a skip, the results of an audit whose step was skipped,
// tie-breaks, confirmation replays) is never dropped: the buffer may pass
// its bound with evidence alone, and says so once.
//
// Never silent: the link logs (to stderr) once when sdcd cannot be reached
// or the link goes down, then how long it has been down (at 30 s, 1, 2, 4,
// 8 minutes, then every 15), once when it comes back with how many held
// reports it delivered, every report sdcd refused, and at Stop one summary
// line (sent, acknowledged, dropped by kind and reason).
//
// Reconnection: the channel retries with backoff from options.reconnect_min
// up to options.reconnect_max (jittered), and the link opens a stream as
// soon as the channel connects, so sdcd back is found within about
// reconnect_max; a stream sdcd ends (a refused Hello) waits the same backoff
// before the next.
//
// A clean step's report waits up to options.report_linger for company:
// anything else (a NaN, a skipped step, audit results, weights), a Flush, or
// the oldest waiting report's time running out sends every waiting report
// at once, in order, in one write to the socket. sdcd then reads, commits
// and acknowledges them together (in the overhead benchmark, with steps of
// about 300 ms, its CPU a step fell from 5.6 - 7.1 ms to 3.4 - 3.8 ms).
//
// Thread-safe.

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/options.h"
#include "protocol/types.h"
#include "grpcpp/grpcpp.h"
#include "trainer.grpc.pb.h"

namespace sdc::client {

class CoordinatorLink {
 public:
  // What a report is, for the dropped-reports counters.
  enum class Kind { kStep, kAudit, kWeights };
  static constexpr int kKinds = 3;
  static const char* KindName(Kind kind);  // "step", "audit", "weights"
  // Why a report was given up.
  enum class Drop {
    kOverflow,  // Past the buffer's bound (see the top of this file).
    kRefused,   // sdcd refused it (Ack.refused_sequence).
    kExit,      // Still unacknowledged when the link stopped.
  };
  static constexpr int kDrops = 3;
  static const char* DropName(Drop reason);  // "overflow", "refused", "exit"

  // Every report sent is acknowledged, dropped, or still held:
  // sent == acked + dropped + held.
  struct Stats {
    uint64_t sent = 0;     // Reports queued.
    uint64_t acked = 0;    // Reports sdcd acknowledged as taken.
    uint64_t dropped = 0;  // Reports given up, all kinds and reasons.
    std::array<std::array<uint64_t, kDrops>, kKinds> dropped_by{};  // [kind][reason]
    uint64_t rejected = 0;  // Refused by sdcd (in dropped, reason kRefused).
    uint64_t held = 0;      // In the buffer now.
    uint64_t held_bytes = 0;
    uint64_t reconnects = 0;  // Welcomes after the first.
    bool connected = false;   // A stream is open and welcomed.
    absl::Duration down;      // In all, while the link was not connected after start.
    std::string last_error;
  };

  // REQUIRES: !options.coordinator.empty().
  CoordinatorLink(const GuardOptions& options, protocol::Hello hello);
  ~CoordinatorLink();

  void Start();
  // Stops the background thread after trying to flush for up to `flush`
  // (reconnecting at options.reconnect_min meanwhile, whatever the backoff).
  // Reports still unacknowledged then are counted as dropped; one summary
  // line is logged.
  void Stop(absl::Duration flush = absl::Seconds(5));

  // Queues a report (never blocks on sdcd). Returns how many reports this
  // link queued so far, this one included.
  uint64_t Send(protocol::Step step, decltype(protocol::Report::body) body);

  // Plans, verdicts and tie-break requests received since the last call.
  std::vector<v1::CoordinatorMessage> TakeMessages();

  // The final audit verdict of `step` (not a tie-break-pending interim one),
  // or nullopt after `timeout`.
  std::optional<v1::AuditVerdict> WaitAuditVerdict(protocol::Step step, absl::Duration timeout);

  // The checkpoint gate, asked again while the answer is retryable, until
  // `timeout`. A call sdcd could not answer (it went away) is asked again
  // once it is back, and a reconnection in progress is waited for (until 10
  // s, or twice reconnect_max, after the link went down: a restart of sdcd;
  // an older outage is not waited for, so training does not stall at every
  // checkpoint); Unavailable when the coordinator cannot be reached in time.
  absl::StatusOr<v1::CheckpointDecision> MayCheckpoint(protocol::Step step, absl::Duration timeout);
  // Which checkpoints are confirmed and revoked, deciding nothing.
  absl::StatusOr<v1::CheckpointDecision> CheckpointStatus(absl::Duration timeout);

  // Waits until every queued report is acknowledged (or dropped).
  bool Flush(absl::Duration timeout);

  Stats stats() const;

 private:
  struct Pending {
    protocol::Step step = 0;
    decltype(protocol::Report::body) body;
    uint64_t sequence = 0;  // 0 until first written.
    absl::Time queued;
    Kind kind = Kind::kStep;
    bool can_wait = false;  // A clean step's report (see report_linger).
    bool evidence = false;  // Never dropped (see the top of this file).
    bool refused = false;   // sdcd refused it; its acknowledgement drops it.
    size_t bytes = 0;       // What it holds in memory, about.
  };

  void Run();
  // Waits until the channel is connected; false once the link stops.
  bool WaitConnected();
  // For the checkpoint gate: OK once the channel is connected, waiting for a
  // reconnection in progress (see MayCheckpoint) but not past `deadline`.
  absl::Status WaitForGate(absl::Time deadline);
  // One connection's life; returns when the stream ends. True when sdcd
  // welcomed it.
  bool Session();
  // Blocks until reports are due (see the top of this file) and returns
  // them; empty once the session ends or the link stops.
  std::vector<Pending> NextWrites();
  v1::Report Build(const Pending& p) const;
  // The Welcome: what sdcd holds of this incarnation.
  void Welcomed(const v1::Welcome& welcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reports up to `sequence` are acknowledged; `refused` (0: none) was
  // refused for `reason`.
  void Acknowledged(uint64_t sequence, uint64_t refused, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops unwritten reports, by class, until the buffer is within bounds.
  void Shed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropAt(size_t index, Drop reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The link is down from now (once; `why` is logged).
  void WentDown(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs how long the link has been down, at the intervals the top of
  // this file gives.
  void MaybeLogStillDown() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const;

  const GuardOptions options_;
  const protocol::Hello hello_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  // Unacknowledged reports in the order sent: those written at least once
  // (sequence > 0, contiguous from acked_sequence_ + 1) first.
  std::deque<Pending> buffer_ ABSL_GUARDED_BY(mu_);
  size_t numbered_ ABSL_GUARDED_BY(mu_) = 0;  // Entries of buffer_ with a sequence.
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t acked_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  size_t session_next_ ABSL_GUARDED_BY(mu_) = 0;    // Index of the next write this session.
  bool session_open_ ABSL_GUARDED_BY(mu_) = false;  // Welcome received, stream alive.
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;   // The session's stream ended.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int flushing_ ABSL_GUARDED_BY(mu_) = 0;  // Callers in Flush(): nothing waits.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<v1::CoordinatorMessage> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::AuditVerdict> verdicts_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Down since (InfiniteFuture while up or before the first try failed).
  absl::Time down_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time next_down_log_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool resume_warned_ ABSL_GUARDED_BY(mu_) = false;  // sdcd's resume warning, said once.
  bool ever_down_ ABSL_GUARDED_BY(mu_) = false;
  bool ever_up_ ABSL_GUARDED_BY(mu_) = false;
  // After an outage: the last sequence of the backlog to deliver, how many
  // reports, and how long sdcd was away (logged once all are acknowledged).
  uint64_t backlog_through_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t backlog_reports_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration backlog_outage_ ABSL_GUARDED_BY(mu_);
  bool over_bound_said_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time started_ ABSL_GUARDED_BY(mu_);
};

// A channel with sdcd's agreed keepalive (30 s pings; sdcd accepts pings
// every 10 s or more) and message limits; TLS when options.tls_ca is set.
std::shared_ptr<grpc::Channel> MakeChannel(const GuardOptions& options);

}  // namespace sdc::client

#endif  // SDC_CLIENT_COORDINATOR_LINK_H_
