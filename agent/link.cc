#include "agent/link.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/log.h"
#include "common/channel.h"

namespace sdc::agent {
namespace {

std::function<double()> Jitter() {
  auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
  return [rng] { return std::uniform_real_distribution<double>(0, 1)(*rng); };
}

}  // namespace

std::string ReadToken(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

std::shared_ptr<grpc::Channel> MakeAgentChannel(const LinkOptions& options) {
  grpc::ChannelArguments args = common::KeepaliveArguments();
  // Reconnect attempts are paced by LinkMachine, not by gRPC's own backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1'000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5'000);
  args.SetUserAgentPrefix("sdc-agent");
  return common::MakeClientChannel(
      {options.coordinator, options.tls_ca, options.tls_cert, options.tls_key}, args);
}

std::shared_ptr<grpc::Channel> MakeRelayChannel(const LinkOptions& options) {
  grpc::ChannelArguments args = common::KeepaliveArguments();
  args.SetMaxReceiveMessageSize(16 << 20);
  args.SetMaxSendMessageSize(16 << 20);
  args.SetUserAgentPrefix("sdc-agent-relay");
  return common::MakeClientChannel(
      {options.coordinator, options.tls_ca, options.tls_cert, options.tls_key}, args);
}

AgentLink::AgentLink(LinkOptions options, v1::NodeIdentity identity,
                     DiagnosticHandler on_diagnostic, ActionHandler on_action,
                     HeartbeatFiller fill_heartbeat)
    : options_(std::move(options)),
      identity_(std::move(identity)),
      on_diagnostic_(std::move(on_diagnostic)),
      on_action_(std::move(on_action)),
      fill_heartbeat_(std::move(fill_heartbeat)),
      channel_(MakeAgentChannel(options_)),
      stub_(v1::AgentService::NewStub(channel_)),
      machine_(options_.timing, Jitter(), absl::Now()) {}

AgentLink::~AgentLink() { Stop(); }

void AgentLink::Start() { thread_ = std::thread([this] { Run(); }); }

void AgentLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void AgentLink::Send(uint64_t session, v1::AgentMessage message) {
  absl::MutexLock lock(&mu_);
  if (session == 0 || session != registered_session_) {
    Log(absl::StrCat("dropping a ", message.has_diagnostic_result() ? "diagnostic" : "action",
                     " result: the stream that asked for it has ended"));
    return;
  }
  outbox_.push_back(std::move(message));
  if (outbox_.size() > kMaxQueued) {
    outbox_.pop_front();
    Log("outgoing queue full: dropped the oldest message");
  }
}

LinkStats AgentLink::Stats() const {
  absl::MutexLock lock(&mu_);
  return {registered_session_ != 0, sessions_, heartbeats_sent_};
}

void AgentLink::Run() {
  while (true) {
    uint64_t session = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_) {
        const core::LinkMachine::Next next = machine_.Poll(absl::Now());
        if (next.action == core::LinkMachine::Action::kConnect) break;
        mu_.AwaitWithDeadline(absl::Condition(&stop_), next.wake);
      }
      if (stop_) return;
      machine_.OnConnecting(absl::Now());
      session = ++sessions_;
      reader_done_ = false;
      outbox_.clear();  // Answers for an ended stream; sdcd already failed them.
    }
    const std::string why = Session(session);
    absl::MutexLock lock(&mu_);
    registered_session_ = 0;
    machine_.OnStreamEnded(absl::Now());
    if (stop_) return;
    Log(absl::StrCat("stream to sdcd at ", options_.coordinator, " ended: ", why,
                     "; reconnecting in ",
                     absl::FormatDuration(absl::Trunc(machine_.next_attempt() - absl::Now(),
                                                      absl::Milliseconds(100)))));
  }
}

bool AgentLink::WaitConnected(absl::Time deadline) {
  // In slices, so Stop() is never kept waiting long.
  while (true) {
    const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(250));
    if (channel_->WaitForConnected(absl::ToChronoTime(slice))) return true;
    absl::MutexLock lock(&mu_);
    if (stop_ || absl::Now() >= deadline) return false;
  }
}

std::string AgentLink::ConnectFailure() {
  // A stream without wait-for-ready fails at once on a channel in transient
  // failure, and its status carries the transport's last error (refused
  // connection, TLS handshake, certificate), which the channel's state alone
  // does not. Nothing is written: a stream that does reach sdcd ends as one
  // that never said who it is.
  grpc::ClientContext probe;
  probe.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  if (!options_.token_file.empty()) {
    probe.AddMetadata("authorization", absl::StrCat("Bearer ", ReadToken(options_.token_file)));
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorToAgent>> stream =
      stub_->Connect(&probe);
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

std::string AgentLink::Session(uint64_t session) {
  if (!WaitConnected(absl::Now() + options_.timing.welcome_timeout)) {
    return absl::StrCat("cannot connect within ",
                        absl::FormatDuration(options_.timing.welcome_timeout), ": ",
                        ConnectFailure());
  }
  grpc::ClientContext context;
  if (!options_.token_file.empty()) {
    // kubelet rotates the projected token: each stream reads the current one.
    context.AddMetadata("authorization", absl::StrCat("Bearer ", ReadToken(options_.token_file)));
  }
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return "stopping";
    context_ = &context;
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorToAgent>> stream =
      stub_->Connect(&context);
  v1::AgentMessage hello;
  *hello.mutable_identity() = identity_;
  bool ok = stream->Write(hello);

  std::thread reader([&] {
    v1::CoordinatorToAgent m;
    while (stream->Read(&m)) {
      if (m.has_welcome()) {
        absl::MutexLock lock(&mu_);
        machine_.OnWelcome(absl::Now());
        registered_session_ = session;
        ++events_;
        Log(absl::StrCat("registered with sdcd ", m.welcome().coordinator_version(), " at ",
                         options_.coordinator, " as node ", identity_.node_name(), " (",
                         identity_.gpus_size(), " GPUs)"));
      } else if (m.has_diagnostic()) {
        on_diagnostic_(session, m.diagnostic());
      } else if (m.has_action()) {
        on_action_(session, m.action());
      }
    }
    absl::MutexLock lock(&mu_);
    reader_done_ = true;
  });

  std::string why;
  uint64_t seen_events = 0;
  while (ok) {
    std::deque<v1::AgentMessage> batch;
    bool heartbeat = false;
    {
      absl::MutexLock lock(&mu_);
      const core::LinkMachine::Next next = machine_.Poll(absl::Now());
      if (next.action == core::LinkMachine::Action::kNone) {
        auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || reader_done_ || !outbox_.empty() || events_ != seen_events;
        };
        mu_.AwaitWithDeadline(absl::Condition(&woken), next.wake);
      }
      seen_events = events_;
      if (stop_) {
        why = "stopping";
        break;
      }
      if (reader_done_) break;
      const absl::Time now = absl::Now();
      switch (machine_.Poll(now).action) {
        case core::LinkMachine::Action::kAbandon:
          why = absl::StrCat("no welcome from sdcd within ",
                             absl::FormatDuration(options_.timing.welcome_timeout));
          break;
        case core::LinkMachine::Action::kSendHeartbeat:
          heartbeat = true;
          ++heartbeats_sent_;
          machine_.OnHeartbeatSent(now);
          break;
        default:
          break;
      }
      if (!why.empty()) break;
      batch.swap(outbox_);
    }
    if (heartbeat) {
      v1::AgentMessage m;
      v1::Heartbeat* h = m.mutable_heartbeat();
      h->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
      if (fill_heartbeat_) fill_heartbeat_(h);
      batch.push_front(std::move(m));
    }
    for (const v1::AgentMessage& m : batch) {
      if (!stream->Write(m)) {
        ok = false;
        break;
      }
    }
  }
  bool server_ended;
  {
    absl::MutexLock lock(&mu_);
    server_ended = reader_done_;
    registered_session_ = 0;  // Nothing more is sent on this stream.
  }
  // When sdcd ended the stream, Finish carries its reason; otherwise cancel
  // so the reader's Read returns.
  if (!server_ended) context.TryCancel();
  reader.join();
  const grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
  }
  if (!why.empty()) return why;
  if (status.ok()) return "sdcd closed it";
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

}  // namespace sdc::agent
