#include "client/coordinator_link.h"

#include <pthread.h>

#include <algorithm>
#include <random>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "protocol/convert.h"

namespace sdc::client {
namespace {

// Codes after which resending the same report cannot succeed.
bool Rejects(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT ||
         code == grpc::StatusCode::FAILED_PRECONDITION ||
         code == grpc::StatusCode::ALREADY_EXISTS || code == grpc::StatusCode::NOT_FOUND ||
         code == grpc::StatusCode::OUT_OF_RANGE;
}

// A report that may wait for company: a clean step's (see report_linger).
bool CanWait(const decltype(protocol::Report::body)& body) {
  const auto* s = std::get_if<protocol::StepReport>(&body);
  return s != nullptr && s->applied && s->local_nonfinite == 0 && s->reduced_nonfinite == 0 &&
         !s->audit_unverified;
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const GuardOptions& options) {
  grpc::ChannelArguments args = common::KeepaliveArguments();
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(16 << 20);
  // The channel's own reconnect backoff (gRPC's default grows to 120 s)
  // within the link's: the link decides when to try again. Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as each connection
  // attempt's deadline, and 100 ms is shorter than a TLS handshake (node
  // identities) on a busy node, which then never connected.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.reconnect_min)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.reconnect_max)));
  return common::MakeClientChannel(
      {options.coordinator, options.tls_ca, options.tls_cert, options.tls_key}, args);
}

CoordinatorLink::CoordinatorLink(const GuardOptions& options, protocol::Hello hello)
    : options_(options),
      hello_(std::move(hello)),
      channel_(MakeChannel(options)),
      stub_(v1::TrainerService::NewStub(channel_)) {}

CoordinatorLink::~CoordinatorLink() { Stop(absl::ZeroDuration()); }

void CoordinatorLink::Start() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "sdc-link");  // Visible in top -H and perf.
    Run();
  });
}

void CoordinatorLink::Stop(absl::Duration flush) {
  if (!thread_.joinable()) return;
  if (flush > absl::ZeroDuration()) Flush(flush);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  thread_.join();
  // What the coordinator never acknowledged is lost with this process:
  // counted and said, never silently.
  absl::MutexLock lock(&mu_);
  if (!buffer_.empty()) {
    std::fprintf(stderr,
                 "sdc-guard: rank %u: %zu report(s) never acknowledged by sdcd at exit (steps "
                 "%llu to %llu), dropped: %s\n",
                 hello_.placement.rank, buffer_.size(),
                 static_cast<unsigned long long>(buffer_.front().step),
                 static_cast<unsigned long long>(buffer_.back().step),
                 stats_.last_error.empty() ? "no error recorded" : stats_.last_error.c_str());
    stats_.dropped += buffer_.size();
    buffer_.clear();
  }
}

uint64_t CoordinatorLink::Send(protocol::Step step, decltype(protocol::Report::body) body) {
  absl::MutexLock lock(&mu_);
  const uint64_t sequence = next_sequence_++;
  const bool can_wait = CanWait(body);
  buffer_.push_back({step, std::move(body), sequence, absl::Now(), can_wait});
  ++stats_.sent;
  while (buffer_.size() > options_.report_buffer) {
    // Never block training: the oldest unacknowledged report goes.
    buffer_.pop_front();
    ++stats_.dropped;
  }
  return sequence;
}

v1::Report CoordinatorLink::Build(const Pending& p) const {
  protocol::Report r;
  r.job_id = hello_.job_id;
  r.rank = hello_.placement.rank;
  r.incarnation = hello_.incarnation;
  r.sequence = p.sequence;
  r.step = p.step;
  r.body = p.body;
  return protocol::ToProto(r);
}

void CoordinatorLink::Run() {
  std::mt19937_64 rng(hello_.placement.rank * 7919 + hello_.incarnation);
  absl::Duration backoff = options_.reconnect_min;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    const absl::Time started = absl::Now();
    Session();
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    ++stats_.reconnects;
    // A session that lasted resets the backoff; a failing one doubles it.
    backoff = absl::Now() - started > absl::Seconds(10)
                  ? options_.reconnect_min
                  : std::min(options_.reconnect_max, backoff * 2);
    // +-50% jitter so a restarted coordinator is not hit by every rank at once.
    const double jitter = 0.5 + std::uniform_real_distribution<double>(0, 1)(rng);
    // While a Flush waits (the exit flush among them), retry at the
    // shortest interval until its deadline: a coordinator back within it
    // still gets the reports, however long the backoff had grown. A Flush
    // that starts during a long wait ends it.
    const bool flushing = flushing_ > 0;
    const absl::Time until = absl::Now() + (flushing ? options_.reconnect_min : backoff * jitter);
    auto stopped_or_flushing = [this, flushing]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || (!flushing && flushing_ > 0);
    };
    mu_.AwaitWithDeadline(absl::Condition(&stopped_or_flushing), until);
    // When a Flush begins, the channel's own backoff starts over too.
    if (flushing_ > 0 && !flushing) grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
  }
}

void CoordinatorLink::Session() {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    context_ = &context;
    reader_done_ = false;
    if (flushing_ > 0) {
      // A flush waits for the coordinator until its deadline: the stream
      // waits for the channel to connect rather than fail at once (and
      // cancel the connection attempt it started).
      context.set_wait_for_ready(true);
      context.set_deadline(absl::ToChronoTime(flush_deadline_));
    }
  }
  auto stream = stub_->Attach(&context);
  v1::TrainerMessage hello;
  *hello.mutable_hello() = protocol::ToProto(hello_);
  bool ok = stream->Write(hello);
  // The reader: acks, the welcome, and everything else into the inbox.
  std::thread reader([&] {
    pthread_setname_np(pthread_self(), "sdc-link-read");
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
      absl::MutexLock lock(&mu_);
      if (m.has_welcome()) {
        const uint64_t acked = m.welcome().acked_sequence();
        while (!buffer_.empty() && buffer_.front().sequence <= acked) buffer_.pop_front();
        stats_.acked = std::max(stats_.acked, acked);
        next_to_write_ = acked + 1;
        session_open_ = true;
        stats_.connected = true;
        for (const v1::AuditPlan& p : m.welcome().pending_plans()) {
          v1::CoordinatorMessage plan;
          *plan.mutable_audit_plan() = p;
          inbox_.push_back(std::move(plan));
        }
      } else if (m.has_ack()) {
        const uint64_t acked = m.ack().acked_sequence();
        while (!buffer_.empty() && buffer_.front().sequence <= acked) buffer_.pop_front();
        stats_.acked = std::max(stats_.acked, acked);
      } else {
        if (m.has_audit_verdict()) verdicts_.push_back(m.audit_verdict());
        inbox_.push_back(m);
      }
    }
    absl::MutexLock lock(&mu_);
    session_open_ = false;
    reader_done_ = true;
  });
  // The writer: sends buffered reports in order, those that came together
  // in one write to the socket (every message but the last is buffered).
  while (ok) {
    const std::vector<Pending> due = NextWrites();
    if (due.empty()) break;
    for (size_t i = 0; i < due.size() && ok; ++i) {
      v1::TrainerMessage m;
      *m.mutable_report() = Build(due[i]);
      grpc::WriteOptions options;
      if (i + 1 < due.size()) options.set_buffer_hint();
      ok = stream->Write(m, options);
    }
  }
  context.TryCancel();
  reader.join();
  const grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  session_open_ = false;
  stats_.connected = false;
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    stats_.last_error = absl::StrCat(status.error_code(), ": ", status.error_message());
  }
  if (Rejects(status.error_code()) && !buffer_.empty()) {
    // The coordinator processed everything before the refused report (its
    // Welcome will say so); the refused one is the first unacknowledged.
    // Drop it and renumber the rest: none of them was accepted.
    const Pending refused = buffer_.front();
    std::fprintf(stderr, "sdc-guard: rank %u: sdcd refused report %llu (step %llu): %s\n",
                 hello_.placement.rank, static_cast<unsigned long long>(refused.sequence),
                 static_cast<unsigned long long>(refused.step), status.error_message().c_str());
    ++stats_.rejected;
    buffer_.pop_front();
    uint64_t s = refused.sequence;
    for (Pending& p : buffer_) p.sequence = s++;
    next_sequence_ = s;
  }
}

std::vector<CoordinatorLink::Pending> CoordinatorLink::NextWrites() {
  absl::MutexLock lock(&mu_);
  while (!stop_ && !reader_done_) {
    const absl::Time now = absl::Now();
    absl::Time wake = now + absl::Seconds(1);
    // The buffer is ordered: the first report not yet written this session.
    auto first = std::lower_bound(buffer_.begin(), buffer_.end(), next_to_write_,
                                  [](const Pending& p, uint64_t s) { return p.sequence < s; });
    if (session_open_ && first != buffer_.end()) {
      const absl::Time due = first->queued + options_.report_linger;
      if (flushing_ > 0 || now >= due ||
          std::any_of(first, buffer_.end(), [](const Pending& p) { return !p.can_wait; })) {
        std::vector<Pending> out(first, buffer_.end());
        next_to_write_ = out.back().sequence + 1;
        return out;
      }
      wake = std::min(wake, due);
    }
    // Until the deadline, or until something that may change the answer.
    const bool open = session_open_;
    const uint64_t queued = next_sequence_;
    const int flushing = flushing_;
    auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || reader_done_ || session_open_ != open || next_sequence_ != queued ||
             flushing_ != flushing;
    };
    mu_.AwaitWithDeadline(absl::Condition(&changed), wake);
  }
  return {};
}

std::vector<v1::CoordinatorMessage> CoordinatorLink::TakeMessages() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::CoordinatorMessage> out;
  out.swap(inbox_);
  return out;
}

std::optional<v1::AuditVerdict> CoordinatorLink::WaitAuditVerdict(protocol::Step step,
                                                                  absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::optional<v1::AuditVerdict> found;
  auto have = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const v1::AuditVerdict& v : verdicts_) {
      if (v.step() == step && v.outcome() != v1::TIEBREAK_PENDING) {
        found = v;
        return true;
      }
    }
    return false;
  };
  mu_.AwaitWithTimeout(absl::Condition(&have), timeout);
  // Verdicts older than this step are of no further use.
  verdicts_.erase(std::remove_if(verdicts_.begin(), verdicts_.end(),
                                 [&](const v1::AuditVerdict& v) { return v.step() <= step; }),
                  verdicts_.end());
  return found;
}

absl::StatusOr<v1::CheckpointDecision> CoordinatorLink::MayCheckpoint(protocol::Step step,
                                                                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::CheckpointRequest q;
  q.set_job_id(hello_.job_id);
  q.set_step(step);
  absl::Duration pause = absl::Milliseconds(50);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::CheckpointDecision d;
    grpc::Status s = stub_->MayCheckpoint(&context, q, &d);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("checkpoint gate: ", s.error_message()));
    }
    if (!d.retryable() || absl::Now() + pause >= deadline) return d;
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(1));
  }
}

absl::StatusOr<v1::CheckpointDecision> CoordinatorLink::CheckpointStatus(absl::Duration timeout) {
  v1::CheckpointRequest q;
  q.set_job_id(hello_.job_id);
  q.set_status_only(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::CheckpointDecision d;
  grpc::Status s = stub_->MayCheckpoint(&context, q, &d);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("checkpoint status: ", s.error_message()));
  }
  return d;
}

bool CoordinatorLink::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  ++flushing_;  // Reports waiting for company go now.
  flush_deadline_ = std::max(flushing_ > 1 ? flush_deadline_ : absl::InfinitePast(),
                             absl::Now() + timeout);
  auto empty = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return buffer_.empty(); };
  const bool flushed = mu_.AwaitWithTimeout(absl::Condition(&empty), timeout);
  --flushing_;
  return flushed;
}

CoordinatorLink::Stats CoordinatorLink::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace sdc::client
