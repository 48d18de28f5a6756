#include "tests/testing/scripted_rank.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/convert.h"
#include "protocol/attribution.h"
#include "protocol/replay_plan.h"
#include "tests/testing/process.h"

namespace sdc::testing {

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& ca,
                                          const std::string& cert, const std::string& key) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(ca);
  if (!cert.empty()) {
    ssl.pem_cert_chain = ReadFile(cert);
    ssl.pem_private_key = ReadFile(key);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetSslTargetNameOverride("localhost");
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

core::Hello TestHello(const std::string& job, core::Rank rank, uint32_t world,
                      uint32_t gpus_per_node, const std::vector<std::string>& tensors,
                      uint32_t audit_every, uint32_t weight_check_every) {
  core::Hello h;
  h.job_id = job;
  h.placement = {rank, std::string("node-") + static_cast<char>('a' + rank / gpus_per_node),
                 rank % gpus_per_node, absl::StrCat("GPU-", rank), 0};
  h.world_size = world;
  h.incarnation = 1;
  h.weight_tensors = tensors;
  h.parameter_count = static_cast<uint32_t>(tensors.size());
  h.layout_digest = 42;
  h.deterministic = true;
  h.audit_every = audit_every;
  h.weight_check_every = weight_check_every;
  return h;
}

ScriptedRank::ScriptedRank(std::shared_ptr<grpc::Channel> channel, core::Hello hello)
    : channel_(std::move(channel)),
      stub_(v1::TrainerService::NewStub(channel_)),
      hello_(std::move(hello)) {}

ScriptedRank::~ScriptedRank() {
  if (context_ != nullptr) context_->TryCancel();
  if (reader_.joinable()) reader_.join();
}

absl::Status ScriptedRank::Connect(absl::Duration timeout) {
  if (context_ != nullptr) {
    context_->TryCancel();
    if (reader_.joinable()) reader_.join();
  }
  {
    absl::MutexLock lock(&mu_);
    finished_ = false;
    messages_.clear();
  }
  context_ = std::make_unique<grpc::ClientContext>();
  stream_ = stub_->Attach(context_.get());
  v1::TrainerMessage hello;
  *hello.mutable_hello() = daemon::ToProto(hello_);
  if (!stream_->Write(hello)) return absl::UnavailableError("cannot send Hello");
  reader_ = std::thread([this] { ReadLoop(); });
  absl::StatusOr<v1::CoordinatorMessage> welcome = WaitFor(
      [](const v1::CoordinatorMessage& m) { return m.has_welcome(); }, timeout);
  if (!welcome.ok()) return welcome.status();
  welcome_acked_ = welcome->welcome().acked_sequence();
  next_sequence_ = welcome_acked_ + 1;
  absl::MutexLock lock(&mu_);
  acked_ = welcome_acked_;
  return absl::OkStatus();
}

void ScriptedRank::ReadLoop() {
  v1::CoordinatorMessage m;
  while (stream_->Read(&m)) {
    absl::MutexLock lock(&mu_);
    if (m.has_ack()) acked_ = std::max<uint64_t>(acked_, m.ack().acked_sequence());
    messages_.push_back(m);
  }
  grpc::Status s = stream_->Finish();
  absl::MutexLock lock(&mu_);
  finished_ = true;
  status_ = s;
}

uint64_t ScriptedRank::Send(core::Step step, decltype(core::Report::body) body) {
  core::Report r;
  r.job_id = hello_.job_id;
  r.rank = hello_.placement.rank;
  r.incarnation = hello_.incarnation;
  r.sequence = next_sequence_++;
  r.step = step;
  r.body = std::move(body);
  SendRaw(daemon::ToProto(r));
  return r.sequence;
}

bool ScriptedRank::SendRaw(const v1::Report& report) {
  v1::TrainerMessage m;
  *m.mutable_report() = report;
  return stream_->Write(m);
}

absl::Status ScriptedRank::WaitAcked(uint64_t sequence, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this, sequence]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return acked_ >= sequence || finished_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout) || acked_ < sequence) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", hello_.placement.rank, ": sequence ", sequence,
                     " not acknowledged (acked ", acked_, ")",
                     finished_ ? absl::StrCat("; stream ended: ", status_.error_message()) : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CoordinatorMessage> ScriptedRank::WaitFor(
    const std::function<bool(const v1::CoordinatorMessage&)>& match, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  size_t seen = 0;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    for (; seen < messages_.size(); ++seen) {
      if (match(messages_[seen])) return messages_[seen];
    }
    if (finished_) {
      return absl::FailedPreconditionError(
          absl::StrCat("stream ended: ", status_.error_message()));
    }
    auto more = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return messages_.size() > seen || finished_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&more), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", hello_.placement.rank, ": no matching message"));
    }
  }
}

grpc::Status ScriptedRank::WaitFinished(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
  if (!finished_) return {grpc::StatusCode::DEADLINE_EXCEEDED, "stream still open"};
  return status_;
}

grpc::Status ScriptedRank::Close() {
  stream_->WritesDone();
  return WaitFinished();
}

uint64_t ScriptedRank::acked() const {
  absl::MutexLock lock(&mu_);
  return acked_;
}

std::vector<v1::CoordinatorMessage> ScriptedRank::Messages() const {
  absl::MutexLock lock(&mu_);
  return messages_;
}

absl::StatusOr<Ranks> ConnectRanks(const std::string& address, const std::string& job,
                                   uint32_t world, uint32_t gpus_per_node,
                                   const std::vector<std::string>& tensors) {
  return ConnectRanks([&](const std::string&) { return Channel(address); }, job, world,
                      gpus_per_node, tensors);
}

absl::StatusOr<Ranks> ConnectRanks(const ChannelFor& channel_for, const std::string& job,
                                   uint32_t world, uint32_t gpus_per_node,
                                   const std::vector<std::string>& tensors) {
  Ranks ranks;
  for (core::Rank r = 0; r < world; ++r) {
    core::Hello hello = TestHello(job, r, world, gpus_per_node, tensors);
    const std::string node = hello.placement.node;
    ranks.push_back(std::make_unique<ScriptedRank>(channel_for(node), std::move(hello)));
    const absl::Status connected = ranks.back()->Connect();
    if (!connected.ok()) {
      return absl::Status(connected.code(),
                          absl::StrCat("rank ", r, " did not connect: ", connected.message()));
    }
  }
  return ranks;
}

absl::Status SendScheduledAudit(const std::vector<std::unique_ptr<ScriptedRank>>& ranks,
                                core::Step step, std::optional<core::Rank> faulty) {
  const core::Rank world = static_cast<core::Rank>(ranks.size());
  std::vector<core::PlanMember> members;
  for (core::Rank r = 0; r < world; ++r) members.push_back({r, ranks[r]->hello().placement.node});
  const std::optional<core::ReplayPlan> scheduled =
      core::ScheduledAudit(step, ranks[0]->hello().audit_every, core::Topology(members));
  if (!scheduled.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " has no scheduled audit"));
  }
  const core::ReplayPlan& plan = *scheduled;
  auto value = [](core::Rank subject) { return 0x3ff0000000000000ull + subject; };
  std::vector<uint64_t> last(world);
  absl::flat_hash_map<core::Rank, core::Evidence> originals, replays;
  auto send = [&](core::Rank from, core::AuditRole role, core::Rank subject, uint64_t bits) {
    core::AuditResult a;
    a.role = role;
    a.subject = subject;
    a.loss_bits = bits;
    a.gradient_digest = bits;
    last[from] = ranks[from]->Send(step, a);
    core::Evidence e;
    e.loss_bits = e.gradient_digest = bits;
    if (role == core::AuditRole::kOriginal) originals[from] = e;
    if (role == core::AuditRole::kReplay) replays[from] = e;
  };
  for (core::Rank r = 0; r < world; ++r) {
    send(r, core::AuditRole::kOriginal, r, value(r) + (r == faulty ? 1 : 0));
  }
  for (const core::Assignment& x : plan.assignments) {
    send(x.replayer, core::AuditRole::kReplay, x.subject,
         value(x.subject) + (x.replayer == faulty ? 2 : 0));
  }
  // The tie-breaks every rank derives in-band from the same results.
  const core::Topology topology(members);
  core::AuditInput in;
  in.plan = &plan;
  in.topology = &topology;
  in.originals = &originals;
  in.replays = &replays;
  in.compare_gradients = true;
  in.salt = step;
  for (const core::TieBreak& t : core::Attribute(in).tiebreaks) {
    send(t.tiebreaker, core::AuditRole::kTieBreak, t.subject,
         value(t.subject) + (t.tiebreaker == faulty ? 3 : 0));
  }
  for (core::Rank r = 0; r < world; ++r) {
    if (absl::Status s = ranks[r]->WaitAcked(last[r]); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace sdc::testing
