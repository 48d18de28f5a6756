#include "client/coordinator_link.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/channel.h"
#include "protocol/convert.h"

namespace sdc::client {
namespace {

// A report that may wait for company: a clean step's (see report_linger).
bool CanWait(const decltype(protocol::Report::body)& body) {
  const auto* s = std::get_if<protocol::StepReport>(&body);
  return s != nullptr && s->applied && s->local_nonfinite == 0 && s->reduced_nonfinite == 0 &&
         !s->audit_unverified;
}

CoordinatorLink::Kind KindOf(const decltype(protocol::Report::body)& body) {
  if (std::holds_alternative<protocol::AuditResult>(body)) return CoordinatorLink::Kind::kAudit;
  if (std::holds_alternative<protocol::WeightReport>(body)) return CoordinatorLink::Kind::kWeights;
  return CoordinatorLink::Kind::kStep;
}

// What an incident is made of: never dropped. An audit's own results join
// once its step turns out skipped (Send).
bool IsEvidence(const decltype(protocol::Report::body)& body) {
  if (const auto* s = std::get_if<protocol::StepReport>(&body)) {
    return s->local_nonfinite > 0 || s->reduced_nonfinite > 0 || !s->applied ||
           !s->audits_off.empty();
  }
  if (const auto* a = std::get_if<protocol::AuditResult>(&body)) {
    return a->role == protocol::AuditRole::kTieBreak || a->role == protocol::AuditRole::kConfirm;
  }
  return false;
}

size_t BytesOf(const decltype(protocol::Report::body)& body) {
  size_t n = sizeof(protocol::Report) + 64;  // The entry and the deque's share.
  if (const auto* s = std::get_if<protocol::StepReport>(&body)) {
    n += s->skip_reason.capacity() + s->audits_off.capacity();
  } else if (const auto* a = std::get_if<protocol::AuditResult>(&body)) {
    n += a->gradients.capacity() * sizeof(kernels::Fingerprint);
  } else if (const auto* w = std::get_if<protocol::WeightReport>(&body)) {
    n += w->tensors.capacity() * sizeof(kernels::Fingerprint);
  }
  return n;
}

std::string Megabytes(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

// "30s", "2m0s": whole seconds are enough for an outage.
std::string Duration(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

// When the link logs that it is still down: after these, every 15 minutes.
constexpr absl::Duration kDownLogs[] = {absl::Seconds(30), absl::Minutes(1), absl::Minutes(2),
                                        absl::Minutes(4), absl::Minutes(8)};

}  // namespace

const char* CoordinatorLink::KindName(Kind kind) {
  switch (kind) {
    case Kind::kStep:
      return "step";
    case Kind::kAudit:
      return "audit";
    case Kind::kWeights:
      return "weights";
  }
  return "?";
}

const char* CoordinatorLink::DropName(Drop reason) {
  switch (reason) {
    case Drop::kOverflow:
      return "overflow";
    case Drop::kRefused:
      return "refused";
    case Drop::kExit:
      return "exit";
  }
  return "?";
}

std::shared_ptr<grpc::Channel> MakeChannel(const GuardOptions& options) {
  grpc::ChannelArguments args = common::KeepaliveArguments();
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(16 << 20);
  // The channel's own reconnect backoff (gRPC's default grows to 120 s)
  // is the link's: the link opens a stream as soon as the channel connects.
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as each connection
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

void CoordinatorLink::Log(const std::string& line) const {
  std::fprintf(stderr, "sdc-guard: rank %u: %s\n", hello_.placement.rank, line.c_str());
}

void CoordinatorLink::Start() {
  {
    absl::MutexLock lock(&mu_);
    started_ = absl::Now();
  }
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
  std::string lost;
  if (!buffer_.empty()) {
    lost = absl::StrCat("; ", buffer_.size(), " never acknowledged (steps ", buffer_.front().step,
                        " to ", buffer_.back().step,
                        "): ", stats_.last_error.empty() ? "no error recorded" : stats_.last_error);
  }
  while (!buffer_.empty()) DropAt(0, Drop::kExit);
  if (down_since_ != absl::InfiniteFuture()) stats_.down += absl::Now() - down_since_;
  std::vector<std::string> dropped;
  for (int k = 0; k < kKinds; ++k) {
    for (int d = 0; d < kDrops; ++d) {
      if (stats_.dropped_by[k][d] > 0) {
        dropped.push_back(absl::StrCat(stats_.dropped_by[k][d], " ", KindName(Kind(k)), " (",
                                       DropName(Drop(d)), ")"));
      }
    }
  }
  Log(absl::StrCat("link to sdcd at ", options_.coordinator, ": sent ", stats_.sent, " reports, ",
                   stats_.acked, " acknowledged, ", stats_.dropped, " dropped",
                   dropped.empty() ? "" : absl::StrCat(": ", absl::StrJoin(dropped, ", ")), lost,
                   "; ", stats_.reconnects, " reconnects, down ", Duration(stats_.down),
                   " in all"));
}

uint64_t CoordinatorLink::Send(protocol::Step step, decltype(protocol::Report::body) body) {
  absl::MutexLock lock(&mu_);
  if (const auto* s = std::get_if<protocol::StepReport>(&body); s != nullptr && !s->applied) {
    // The step was skipped in-band: its audit results are an incident's
    // evidence now.
    for (Pending& p : buffer_) {
      if (p.step == step && p.kind == Kind::kAudit) p.evidence = true;
    }
  }
  Pending p;
  p.step = step;
  p.queued = absl::Now();
  p.kind = KindOf(body);
  p.can_wait = CanWait(body);
  p.evidence = IsEvidence(body);
  p.bytes = BytesOf(body);
  p.body = std::move(body);
  stats_.held_bytes += p.bytes;
  ++stats_.held;
  ++stats_.sent;
  buffer_.push_back(std::move(p));
  Shed();
  return stats_.sent;
}

void CoordinatorLink::Shed() {
  auto over = [this] {
    return buffer_.size() > options_.report_buffer ||
           stats_.held_bytes > options_.report_buffer_bytes;
  };
  while (over()) {
    // Only reports never written go: a written one may be in sdcd already,
    // and its number is taken.
    size_t victim = buffer_.size();
    for (size_t i = numbered_; i < buffer_.size() && victim == buffer_.size(); ++i) {
      if (buffer_[i].kind == Kind::kStep && !buffer_[i].evidence) victim = i;
    }
    if (victim == buffer_.size()) {
      // A weight report a newer one of this rank supersedes.
      size_t newest = buffer_.size();
      for (size_t i = buffer_.size(); i-- > 0 && newest == buffer_.size();) {
        if (buffer_[i].kind == Kind::kWeights) newest = i;
      }
      for (size_t i = numbered_; i < newest && victim == buffer_.size(); ++i) {
        if (buffer_[i].kind == Kind::kWeights) victim = i;
      }
    }
    for (size_t i = numbered_; i < buffer_.size() && victim == buffer_.size(); ++i) {
      if (!buffer_[i].evidence) victim = i;
    }
    if (victim == buffer_.size()) {
      if (!over_bound_said_) {
        over_bound_said_ = true;
        Log(absl::StrCat("holding ", buffer_.size(), " reports (", Megabytes(stats_.held_bytes),
                         ") for sdcd, past the buffer's bound (SDC_REPORT_BUFFER ",
                         options_.report_buffer, ", SDC_REPORT_BUFFER_MB ",
                         options_.report_buffer_bytes >> 20,
                         "): what is left is on its way to sdcd or evidence of faults, which "
                         "is kept"));
      }
      return;
    }
    DropAt(victim, Drop::kOverflow);
  }
}

void CoordinatorLink::DropAt(size_t index, Drop reason) {
  const Pending& p = buffer_[index];
  ++stats_.dropped;
  ++stats_.dropped_by[static_cast<int>(p.kind)][static_cast<int>(reason)];
  if (reason == Drop::kRefused) ++stats_.rejected;
  --stats_.held;
  stats_.held_bytes -= p.bytes;
  if (index < numbered_) --numbered_;
  if (index < session_next_) --session_next_;
  buffer_.erase(buffer_.begin() + static_cast<std::ptrdiff_t>(index));
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
    if (!WaitConnected()) return;
    const absl::Time opened = absl::Now();
    const bool welcomed = Session();
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    if (welcomed && absl::Now() - opened > absl::Seconds(1)) {
      // sdcd was there: when it is gone, the channel's backoff paces the
      // next tries.
      backoff = options_.reconnect_min;
      continue;
    }
    // sdcd answered but ended the stream before its Welcome (a refused
    // Hello, or a shutdown) or right after: back off before asking again.
    // +-50% jitter so a restarted coordinator is not hit by every rank at
    // once.
    const double jitter = 0.5 + std::uniform_real_distribution<double>(0, 1)(rng);
    const bool flushing = flushing_ > 0;
    const absl::Time until = absl::Now() + (flushing ? options_.reconnect_min : backoff * jitter);
    backoff = std::min(options_.reconnect_max, backoff * 2);
    auto stopped_or_flushing = [this, flushing]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || (!flushing && flushing_ > 0);
    };
    while (!mu_.AwaitWithDeadline(absl::Condition(&stopped_or_flushing),
                                  std::min(until, absl::Now() + absl::Seconds(1))) &&
           absl::Now() < until) {
      MaybeLogStillDown();
    }
  }
}

bool CoordinatorLink::WaitConnected() {
  bool flushing = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
      // When a Flush begins, the channel's backoff starts over: a coordinator
      // back within the flush still gets the reports.
      if (flushing_ > 0 && !flushing) {
        grpc::experimental::ChannelResetConnectionBackoff(channel_.get());
      }
      flushing = flushing_ > 0;
    }
    const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return true;
    {
      absl::MutexLock lock(&mu_);
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE ||
          (down_since_ == absl::InfiniteFuture() && absl::Now() - started_ > absl::Seconds(5))) {
        WentDown(absl::StrCat("cannot connect to sdcd at ", options_.coordinator));
      }
      MaybeLogStillDown();
    }
    channel_->WaitForStateChange(state, absl::ToChronoTime(absl::Now() + absl::Milliseconds(250)));
  }
}

void CoordinatorLink::WentDown(const std::string& why) {
  if (down_since_ != absl::InfiniteFuture()) return;
  const absl::Time now = absl::Now();
  down_since_ = now;
  next_down_log_ = now + kDownLogs[0];
  const bool was_up = ever_up_;
  ever_down_ = true;
  backlog_reports_ = 0;
  Log(absl::StrCat(was_up ? "link to sdcd went down: " : "", why, "; holding reports for it (",
                   buffer_.size(), " now) and retrying"));
}

void CoordinatorLink::MaybeLogStillDown() {
  const absl::Time now = absl::Now();
  if (down_since_ == absl::InfiniteFuture() || now < next_down_log_) return;
  const absl::Duration down = now - down_since_;
  absl::Duration next = absl::Minutes(15) * (1 + down / absl::Minutes(15));
  for (absl::Duration at : kDownLogs) {
    if (at > down) {
      next = at;
      break;
    }
  }
  next_down_log_ = down_since_ + next;
  Log(absl::StrCat(
      "sdcd at ", options_.coordinator, " unreachable for ", Duration(down), ": holding ",
      buffer_.size(), " reports (", Megabytes(stats_.held_bytes), "), ", stats_.dropped,
      " dropped so far",
      stats_.last_error.empty() ? "" : absl::StrCat("; last error: ", stats_.last_error)));
}

bool CoordinatorLink::Session() {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
    context_ = &context;
    reader_done_ = false;
  }
  bool welcomed = false;
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
        welcomed = true;
        Welcomed(m.welcome());
      } else if (m.has_ack()) {
        Acknowledged(m.ack().acked_sequence(), m.ack().refused_sequence(),
                     m.ack().refused_reason());
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
  {
    // The stream's own end carries sdcd's status: cancelling it here would
    // read CANCELLED instead (and did: every refusal looked like a lost
    // connection, and the refused report was sent again forever).
    absl::MutexLock lock(&mu_);
    if (stop_) context.TryCancel();
  }
  reader.join();
  const grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  session_open_ = false;
  stats_.connected = false;
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    stats_.last_error = absl::StrCat(status.error_code(), ": ", status.error_message());
  }
  if (!stop_) {
    WentDown(status.ok() ? std::string("sdcd ended the stream")
             : welcomed  ? absl::StrCat("the stream ended: ", status.error_message())
                         : absl::StrCat("no Welcome from sdcd: ", status.error_message()));
  }
  return welcomed;
}

void CoordinatorLink::Welcomed(const v1::Welcome& welcome) {
  const uint64_t acked = welcome.acked_sequence();
  Acknowledged(acked, 0, "");
  if (numbered_ > 0 && buffer_.front().sequence != acked + 1) {
    // sdcd holds less than it acknowledged (its database was replaced or
    // restored from a backup): what it lost is gone; the rest is numbered
    // again from what it holds.
    Log(absl::StrCat("sdcd holds this rank's reports only through sequence ", acked,
                     " but had acknowledged through ", buffer_.front().sequence - 1,
                     ": those between are lost (sdcd's database was replaced?); the ", numbered_,
                     " written reports it lacks are numbered again from ", acked + 1));
    uint64_t s = acked + 1;
    for (size_t i = 0; i < numbered_; ++i) buffer_[i].sequence = s++;
  }
  next_sequence_ = acked + 1 + numbered_;
  acked_sequence_ = acked;
  session_next_ = 0;
  session_open_ = true;
  stats_.connected = true;
  if (ever_up_) ++stats_.reconnects;
  ever_up_ = true;
  if (!welcome.resume_warning().empty() && !resume_warned_) {
    resume_warned_ = true;
    Log(absl::StrCat("sdcd warns about attempt ", welcome.attempt(), " of this job: ",
                     welcome.resume_warning()));
  }
  for (const v1::AuditPlan& p : welcome.pending_plans()) {
    v1::CoordinatorMessage plan;
    *plan.mutable_audit_plan() = p;
    inbox_.push_back(std::move(plan));
  }
  if (down_since_ != absl::InfiniteFuture()) {
    const absl::Duration outage = absl::Now() - down_since_;
    stats_.down += outage;
    down_since_ = absl::InfiniteFuture();
    next_down_log_ = absl::InfiniteFuture();
    backlog_outage_ = outage;
    backlog_reports_ = buffer_.size();
    backlog_through_ = stats_.sent;  // Delivered once the reports sent so far are gone.
    if (backlog_reports_ == 0) {
      Log(absl::StrCat("link to sdcd at ", options_.coordinator, " back after ", Duration(outage),
                       ": no reports were held"));
    }
  }
}

void CoordinatorLink::Acknowledged(uint64_t sequence, uint64_t refused, const std::string& reason) {
  for (size_t i = 0; i < numbered_ && refused != 0; ++i) {
    if (buffer_[i].sequence != refused) continue;
    buffer_[i].refused = true;
    // Each of the first ten, then the 100th, 1000th...: a client sdcd
    // refuses wholesale (mismatched versions) must not flood its log.
    const uint64_t n = stats_.rejected + 1;
    uint64_t power = 1;
    while (power * 10 <= n) power *= 10;
    if (n <= 10 || n == power) {
      Log(absl::StrCat("sdcd refused report ", refused, " (", KindName(buffer_[i].kind), ", step ",
                       buffer_[i].step, "): ", reason,
                       "; it is dropped and the reports after it go on", n > 1 ? " (" : "",
                       n > 1 ? absl::StrCat(n, " refused so far)") : ""));
    }
  }
  while (numbered_ > 0 && buffer_.front().sequence <= sequence) {
    if (buffer_.front().refused) {
      DropAt(0, Drop::kRefused);
      continue;
    }
    ++stats_.acked;
    --stats_.held;
    stats_.held_bytes -= buffer_.front().bytes;
    --numbered_;
    if (session_next_ > 0) --session_next_;
    buffer_.pop_front();
  }
  acked_sequence_ = std::max(acked_sequence_, sequence);
  if (backlog_reports_ > 0 && stats_.sent - buffer_.size() >= backlog_through_) {
    // Every report held while sdcd was away is acknowledged (or dropped).
    Log(absl::StrCat("link to sdcd at ", options_.coordinator, " back after ",
                     Duration(backlog_outage_), ": delivered the ", backlog_reports_,
                     " reports held while it was away"));
    backlog_reports_ = 0;
  }
}

std::vector<CoordinatorLink::Pending> CoordinatorLink::NextWrites() {
  absl::MutexLock lock(&mu_);
  while (!stop_ && !reader_done_) {
    const absl::Time now = absl::Now();
    absl::Time wake = now + absl::Seconds(1);
    if (session_open_ && session_next_ < buffer_.size()) {
      const absl::Time due = buffer_[session_next_].queued + options_.report_linger;
      bool must = flushing_ > 0 || now >= due;
      for (size_t i = session_next_; i < buffer_.size() && !must; ++i) {
        must = !buffer_[i].can_wait;
      }
      if (must) {
        for (size_t i = numbered_; i < buffer_.size(); ++i) {
          buffer_[i].sequence = next_sequence_++;
        }
        numbered_ = buffer_.size();
        std::vector<Pending> out(buffer_.begin() + static_cast<std::ptrdiff_t>(session_next_),
                                 buffer_.end());
        session_next_ = buffer_.size();
        return out;
      }
      wake = std::min(wake, due);
    }
    // Until the deadline, or until something that may change the answer.
    const bool open = session_open_;
    const uint64_t sent = stats_.sent;
    const int flushing = flushing_;
    auto changed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || reader_done_ || session_open_ != open || stats_.sent != sent ||
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
    if (absl::Status up = WaitForGate(deadline); !up.ok()) {
      return absl::UnavailableError(absl::StrCat("checkpoint gate: ", up.message()));
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::CheckpointDecision d;
    grpc::Status s = stub_->MayCheckpoint(&context, q, &d);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && absl::Now() + pause < deadline) {
      absl::SleepFor(pause);  // sdcd went away while asked: ask again once it is back.
      continue;
    }
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("checkpoint gate: ", s.error_message()));
    }
    if (!d.retryable() || absl::Now() + pause >= deadline) return d;
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(1));
  }
}

absl::Status CoordinatorLink::WaitForGate(absl::Time deadline) {
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return absl::OkStatus();
  absl::Time until = deadline;
  {
    // A reconnection in progress (sdcd restarting, a rank back from a cut)
    // is waited for; an outage older than a reconnection is not: training
    // would stall for the whole checkpoint wait at every checkpoint.
    absl::MutexLock lock(&mu_);
    const absl::Duration grace = std::max(absl::Seconds(10), 2 * options_.reconnect_max);
    if (down_since_ != absl::InfiniteFuture()) {
      until = std::min(until, std::max(absl::Now(), down_since_ + grace));
    } else {
      until = std::min(until, absl::Now() + grace);
    }
  }
  while (absl::Now() < until) {
    const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
    channel_->WaitForStateChange(state, absl::ToChronoTime(until));
  }
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("sdcd at ", options_.coordinator, " unreachable"));
}

absl::StatusOr<v1::CheckpointDecision> CoordinatorLink::CheckpointStatus(absl::Duration timeout) {
  v1::CheckpointRequest q;
  q.set_job_id(hello_.job_id);
  q.set_status_only(true);
  const absl::Time deadline = absl::Now() + timeout;
  if (absl::Status up = WaitForGate(deadline); !up.ok()) {
    return absl::UnavailableError(absl::StrCat("checkpoint status: ", up.message()));
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
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
