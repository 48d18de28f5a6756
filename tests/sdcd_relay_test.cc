// TrainerService.Relay against a real sdcd over loopback: one stream carries
// several ranks' sessions, each answered exactly as an Attach stream would
// be; a refused session ends alone (with its status, counted) while the
// others carry on; what a relay had acknowledged is durable for the rank's
// next stream.

#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kTensors = {"a", "b"};
constexpr uint32_t kWorld = 6;  // Three nodes of two.

// A relay client: one Relay stream, a reader thread collecting the replies.
class Relay {
 public:
  explicit Relay(const std::string& address)
      : stub_(v1::TrainerService::NewStub(Channel(address))) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub_->Relay(&context_);
    reader_ = std::thread([this] {
      v1::RelayDown down;
      while (stream_->Read(&down)) {
        absl::MutexLock lock(&mu_);
        for (const v1::RelayedReply& r : down.replies()) {
          replies_[r.session()].push_back(r);
          // A reply shared between sessions: kept as the copy each stands
          // for, and counted.
          for (uint64_t also : r.also_sessions()) replies_[also].push_back(r);
          if (r.also_sessions_size() > 0) ++shared_;
        }
        // Packed acknowledgements follow the message's replies; kept as
        // the replies they stand for, and counted.
        EXPECT_EQ(down.ack_sessions_size(), down.ack_sequences_size());
        for (int i = 0; i < down.ack_sessions_size(); ++i) {
          v1::RelayedReply r;
          r.set_session(down.ack_sessions(i));
          r.mutable_message()->mutable_ack()->set_acked_sequence(down.ack_sequences(i));
          replies_[r.session()].push_back(r);
          ++packed_[r.session()];
        }
      }
      absl::MutexLock lock(&mu_);
      done_ = true;
    });
  }

  ~Relay() {
    context_.TryCancel();
    reader_.join();
  }

  // `compact`: the relay reads compact replies (packed acknowledgements,
  // shared verdicts) for this message.
  bool Send(const std::vector<std::pair<uint64_t, v1::TrainerMessage>>& messages,
            bool compact = false) {
    v1::RelayUp up;
    up.set_compact_replies(compact);
    for (const auto& [session, m] : messages) {
      v1::RelayedMessage* r = up.add_messages();
      r->set_session(session);
      *r->mutable_message() = m;
    }
    return stream_->Write(up);
  }

  // Waits (up to 10 s) for a reply of `session` that `match` accepts.
  absl::StatusOr<v1::RelayedReply> WaitFor(
      uint64_t session, const std::function<bool(const v1::RelayedReply&)>& match) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        for (const v1::RelayedReply& r : replies_[session]) {
          if (match(r)) return r;
        }
        if (done_) return absl::UnavailableError("the relay stream ended");
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("no matching reply for session ", session));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  std::vector<v1::RelayedReply> Replies(uint64_t session) {
    absl::MutexLock lock(&mu_);
    return replies_[session];
  }

  // How many replies came shared between sessions.
  int Shared() {
    absl::MutexLock lock(&mu_);
    return shared_;
  }

  // How many of the session's acknowledgements came packed.
  int Packed(uint64_t session) {
    absl::MutexLock lock(&mu_);
    return packed_[session];
  }

  absl::StatusOr<uint64_t> WaitAcked(uint64_t session, uint64_t sequence) {
    absl::StatusOr<v1::RelayedReply> r = WaitFor(session, [&](const v1::RelayedReply& r) {
      return r.message().has_ack() && r.message().ack().acked_sequence() >= sequence;
    });
    if (!r.ok()) return r.status();
    return r->message().ack().acked_sequence();
  }

 private:
  std::unique_ptr<v1::TrainerService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RelayUp, v1::RelayDown>> stream_;
  std::thread reader_;
  absl::Mutex mu_;
  std::map<uint64_t, std::vector<v1::RelayedReply>> replies_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int> packed_ ABSL_GUARDED_BY(mu_);
  int shared_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

v1::TrainerMessage HelloOf(core::Rank rank) {
  v1::TrainerMessage m;
  *m.mutable_hello() = daemon::ToProto(TestHello("relay-job", rank, kWorld, 2, kTensors));
  return m;
}

// A report of relay-job's `rank`, incarnation 1, without its body.
v1::TrainerMessage ReportOf(core::Rank rank, uint64_t sequence, core::Step step) {
  v1::TrainerMessage m;
  v1::Report* r = m.mutable_report();
  r->set_job_id("relay-job");
  r->set_rank(rank);
  r->set_incarnation(1);
  r->set_sequence(sequence);
  r->set_step(step);
  return m;
}

v1::TrainerMessage StepReportOf(core::Rank rank, uint64_t sequence, core::Step step) {
  v1::TrainerMessage m = ReportOf(rank, sequence, step);
  v1::StepReport* s = m.mutable_report()->mutable_step_report();
  s->set_applied(true);
  s->set_reduced_digest(0xabc);
  s->set_reduced_sum_squares(1.0);
  return m;
}

// Every rank's weights alike: the same digest and fingerprints.
v1::TrainerMessage WeightReportOf(core::Rank rank, uint64_t sequence, core::Step step) {
  v1::TrainerMessage m = ReportOf(rank, sequence, step);
  v1::WeightReport* w = m.mutable_report()->mutable_weights();
  w->set_digest(0x5eed);
  for (size_t t = 0; t < kTensors.size(); ++t) {
    for (uint64_t x : {uint64_t{64}, 0x100 + t, 0x200 + t}) w->add_tensors(x);
  }
  return m;
}

// Sessions first_session + r carry rank r's Hello and step reports 1 and 2,
// the second one twice (a resend), for every rank: one relay message.
std::vector<std::pair<uint64_t, v1::TrainerMessage>> EveryRanksHelloAndSteps(
    uint64_t first_session) {
  std::vector<std::pair<uint64_t, v1::TrainerMessage>> batch;
  for (core::Rank r = 0; r < kWorld; ++r) {
    batch.push_back({first_session + r, HelloOf(r)});
    batch.push_back({first_session + r, StepReportOf(r, 1, 1)});
    batch.push_back({first_session + r, StepReportOf(r, 2, 2)});
    batch.push_back({first_session + r, StepReportOf(r, 2, 2)});  // A resend.
  }
  return batch;
}

// Waits for `session`'s acknowledgement of `through`; what it heard must be
// its Welcome, then acknowledgements that never go back, ending there.
void ExpectWelcomeThenAcksThrough(Relay& relay, uint64_t session, uint64_t through) {
  absl::StatusOr<uint64_t> acked = relay.WaitAcked(session, through);
  ASSERT_TRUE(acked.ok()) << acked.status();
  const std::vector<v1::RelayedReply> replies = relay.Replies(session);
  ASSERT_FALSE(replies.empty());
  EXPECT_TRUE(replies.front().message().has_welcome());
  uint64_t last = 0;
  for (size_t i = 1; i < replies.size(); ++i) {
    EXPECT_FALSE(replies[i].end()) << replies[i].status_message();
    ASSERT_TRUE(replies[i].message().has_ack()) << "reply " << i;
    EXPECT_GE(replies[i].message().ack().acked_sequence(), last);
    last = replies[i].message().ack().acked_sequence();
  }
  EXPECT_EQ(last, through);
}

class SdcdRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(TestDir("relay"));
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
  }
  std::unique_ptr<Sdcd> sdcd_;
};

TEST_F(SdcdRelayTest, SessionsAreAnsweredAsAttachStreamsAndDurable) {
  {
    Relay relay(sdcd_->agent_address());
    // Session ids are the relay's own: not the ranks.
    std::vector<std::pair<uint64_t, v1::TrainerMessage>> hellos;
    for (core::Rank r = 0; r < kWorld; ++r) hellos.push_back({100 + r, HelloOf(r)});
    ASSERT_TRUE(relay.Send(hellos));
    for (core::Rank r = 0; r < kWorld; ++r) {
      absl::StatusOr<v1::RelayedReply> welcome =
          relay.WaitFor(100 + r, [](const v1::RelayedReply& x) { return x.message().has_welcome(); });
      ASSERT_TRUE(welcome.ok()) << welcome.status();
      EXPECT_EQ(welcome->message().welcome().acked_sequence(), 0u);
    }
    // Two steps of every rank in one message each; each session gets its own
    // acknowledgements.
    for (uint64_t step = 1; step <= 2; ++step) {
      std::vector<std::pair<uint64_t, v1::TrainerMessage>> reports;
      for (core::Rank r = 0; r < kWorld; ++r) reports.push_back({100 + r, StepReportOf(r, step, step)});
      ASSERT_TRUE(relay.Send(reports));
    }
    for (core::Rank r = 0; r < kWorld; ++r) {
      absl::StatusOr<uint64_t> acked = relay.WaitAcked(100 + r, 2);
      ASSERT_TRUE(acked.ok()) << acked.status();
      EXPECT_EQ(*acked, 2u);
    }
  }
  // The relay is gone; rank 3 comes back on its own Attach stream, and sdcd
  // remembers what it acknowledged through the relay.
  ScriptedRank rank(Channel(sdcd_->trainer_address()), TestHello("relay-job", 3, kWorld, 2, kTensors));
  ASSERT_TRUE(rank.Connect().ok());
  EXPECT_EQ(rank.welcome_acked(), 2u);
}

// One relay message's replies wait for one durability callback (sdcd
// batches them); each session still hears them in its own order: the
// Welcome, then acknowledgements that never go back, a resent duplicate
// (nothing written for it) included.
TEST_F(SdcdRelayTest, OneMessagesRepliesKeepEachSessionsOrder) {
  Relay relay(sdcd_->agent_address());
  std::vector<std::pair<uint64_t, v1::TrainerMessage>> batch = EveryRanksHelloAndSteps(10);
  ASSERT_TRUE(relay.Send(batch));
  for (core::Rank r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ExpectWelcomeThenAcksThrough(relay, 10 + r, 2);
    EXPECT_EQ(relay.Packed(10 + r), 0) << "the relay did not ask for packed";
  }
}

// A relay that asks for packed acknowledgements gets them as two arrays
// after the message's other replies: each session still hears its Welcome
// first, then acknowledgements that never go back. A session sdcd ends in
// the same message hears nothing after its end, though its earlier reports
// were written.
TEST_F(SdcdRelayTest, PackedAcknowledgementsKeepEachSessionsOrder) {
  Relay relay(sdcd_->agent_address());
  std::vector<std::pair<uint64_t, v1::TrainerMessage>> batch = EveryRanksHelloAndSteps(10);
  batch.push_back({10, StepReportOf(1, 3, 3)});  // Rank 1's report on rank 0's session.
  ASSERT_TRUE(relay.Send(batch, /*compact=*/true));
  for (core::Rank r = 1; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ExpectWelcomeThenAcksThrough(relay, 10 + r, 2);
    EXPECT_EQ(relay.Packed(10 + r), static_cast<int>(relay.Replies(10 + r).size()) - 1);
  }
  absl::StatusOr<v1::RelayedReply> ended =
      relay.WaitFor(10, [](const v1::RelayedReply& x) { return x.end(); });
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->status_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The end goes out at once; the session's Welcome and acknowledgements
  // would have waited for the batch's durability, as every other
  // session's did (they came): nothing follows the end, as nothing follows
  // an Attach stream's finish.
  const std::vector<v1::RelayedReply> replies = relay.Replies(10);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies.front().end());
  EXPECT_EQ(relay.Packed(10), 0);
  // Its reports before the refusal are durable: rank 0 resumes after them.
  ScriptedRank rank(Channel(sdcd_->trainer_address()), TestHello("relay-job", 0, kWorld, 2, kTensors));
  ASSERT_TRUE(rank.Connect().ok());
  EXPECT_EQ(rank.welcome_acked(), 2u);
}

TEST_F(SdcdRelayTest, ARefusedSessionEndsAloneWithItsStatus) {
  Relay relay(sdcd_->agent_address());
  ASSERT_TRUE(relay.Send({{1, HelloOf(0)}, {2, HelloOf(1)}}));
  for (uint64_t s : {1, 2}) {
    ASSERT_TRUE(relay.WaitFor(s, [](const v1::RelayedReply& x) { return x.message().has_welcome(); }).ok());
  }
  const double refused_before = sdcd_->Rejected("invalid_argument");

  // Session 1 (rank 0) sends rank 1's report; session 3 starts without a Hello.
  ASSERT_TRUE(relay.Send({{1, StepReportOf(1, 1, 1)}, {3, StepReportOf(2, 1, 1)}}));
  absl::StatusOr<v1::RelayedReply> ended =
      relay.WaitFor(1, [](const v1::RelayedReply& x) { return x.end(); });
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->status_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ended->status_message(), HasSubstr("report for job relay-job rank 1 on the stream of job relay-job rank 0"));
  ended = relay.WaitFor(3, [](const v1::RelayedReply& x) { return x.end(); });
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->status_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ended->status_message(), HasSubstr("first message of a stream must be a Hello"));
  EXPECT_EQ(sdcd_->Rejected("invalid_argument"), refused_before + 2);

  // Session 2 carries on on the same relay.
  ASSERT_TRUE(relay.Send({{2, StepReportOf(1, 1, 1)}}));
  absl::StatusOr<uint64_t> acked = relay.WaitAcked(2, 1);
  ASSERT_TRUE(acked.ok()) << acked.status();

  // Rank 0 may attach again on a fresh session of the same relay.
  ASSERT_TRUE(relay.Send({{4, HelloOf(0)}, {4, StepReportOf(0, 1, 1)}}));
  acked = relay.WaitAcked(4, 1);
  ASSERT_TRUE(acked.ok()) << acked.status();
}

// A verdict for many ranks goes to a relay that reads compact replies as
// one reply naming its sessions; a relay that does not gets a copy per
// session. Either way every rank holds it, after its Welcome.
TEST_F(SdcdRelayTest, AVerdictForARelaysRanksIsOneReply) {
  Relay relay(sdcd_->agent_address());
  std::vector<std::pair<uint64_t, v1::TrainerMessage>> batch;
  for (core::Rank r = 0; r < kWorld; ++r) {
    batch.push_back({20 + r, HelloOf(r)});
    batch.push_back({20 + r, WeightReportOf(r, 1, 10)});
  }
  ASSERT_TRUE(relay.Send(batch, /*compact=*/true));
  auto verdict_of = [](core::Step step) {
    return [step](const v1::RelayedReply& x) {
      return x.message().has_weight_verdict() && x.message().weight_verdict().step() == step;
    };
  };
  for (core::Rank r = 0; r < kWorld; ++r) {
    absl::StatusOr<v1::RelayedReply> v = relay.WaitFor(20 + r, verdict_of(10));
    ASSERT_TRUE(v.ok()) << "rank " << r << ": " << v.status();
    EXPECT_TRUE(v->message().weight_verdict().pass());
    EXPECT_TRUE(relay.Replies(20 + r).front().message().has_welcome()) << "rank " << r;
  }
  EXPECT_EQ(relay.Shared(), 1);

  batch.clear();
  for (core::Rank r = 0; r < kWorld; ++r) batch.push_back({20 + r, WeightReportOf(r, 2, 20)});
  ASSERT_TRUE(relay.Send(batch, /*compact=*/false));
  for (core::Rank r = 0; r < kWorld; ++r) {
    absl::StatusOr<v1::RelayedReply> v = relay.WaitFor(20 + r, verdict_of(20));
    ASSERT_TRUE(v.ok()) << "rank " << r << ": " << v.status();
    EXPECT_EQ(v->also_sessions_size(), 0);
  }
  EXPECT_EQ(relay.Shared(), 1);
}

}  // namespace
}  // namespace sdc::testing
