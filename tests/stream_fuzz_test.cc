// A protocol fuzzer for sdcd's stream handlers (Attach, Relay, Connect), run
// against the real daemon over loopback: each iteration opens one stream and
// sends a few frames, each a valid message (a Hello, a report, a relay
// message, an agent identity) or one mutated from it (bytes flipped,
// truncated, extended, replaced by noise), then closes its side. Invariants:
//   - a stream that carried a frame which does not parse never ends OK: it
//     ends INVALID_ARGUMENT ("malformed message"), or earlier for a reason
//     of its own (a refused Hello, say);
//   - sdcd keeps serving (its health service answers, a fresh rank is
//     acknowledged) and counts every malformed frame it saw.
// ./sdc test runs 300 iterations from a fixed seed; ./sdc fuzz runs it for
// SDC_STREAM_FUZZ_SECONDS with a fresh seed (printed, to replay a failure
// with SDC_STREAM_FUZZ_SEED).

#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent.pb.h"
#include "daemon/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"
#include "trainer.pb.h"

namespace sdc::testing {
namespace {

const std::vector<std::string> kTensors = {"a", "b"};

struct Method {
  const char* path;
  std::vector<std::string> seeds;  // Serialized valid messages, first one first.
  // True when `frame` parses as this method's message type.
  bool (*parses)(const std::string& frame);
};

template <typename Message>
bool Parses(const std::string& frame) {
  Message m;
  return m.ParseFromString(frame);
}

std::vector<Method> Methods() {
  v1::TrainerMessage hello;
  *hello.mutable_hello() = daemon::ToProto(TestHello("fuzz", 1, 4, 2, kTensors));
  v1::TrainerMessage report;
  v1::Report* r = report.mutable_report();
  r->set_job_id("fuzz");
  r->set_rank(1);
  r->set_incarnation(1);
  r->set_sequence(1);
  r->set_step(3);
  r->mutable_step_report()->set_reduced_sum_squares(2.5);
  v1::RelayUp relayed;
  v1::RelayedMessage* m = relayed.add_messages();
  m->set_session(7);
  *m->mutable_message() = hello;
  v1::RelayUp relayed_report;
  m = relayed_report.add_messages();
  m->set_session(7);
  *m->mutable_message() = report;
  v1::AgentMessage identity;
  identity.mutable_identity()->set_node_name("node-f");
  identity.mutable_identity()->set_heartbeat_interval_ms(1000);
  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat();
  return {
      {"/sdc.v1.TrainerService/Attach",
       {hello.SerializeAsString(), report.SerializeAsString()},
       &Parses<v1::TrainerMessage>},
      {"/sdc.v1.TrainerService/Relay",
       {relayed.SerializeAsString(), relayed_report.SerializeAsString()},
       &Parses<v1::RelayUp>},
      {"/sdc.v1.AgentService/Connect",
       {identity.SerializeAsString(), heartbeat.SerializeAsString()},
       &Parses<v1::AgentMessage>},
  };
}

std::string Mutate(std::string s, std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0:  // Flip a few bytes.
      for (int k = 0, n = 1 + rng() % 4; k < n && !s.empty(); ++k) s[rng() % s.size()] ^= 1 + rng() % 255;
      return s;
    case 1:  // Truncate.
      return s.substr(0, s.empty() ? 0 : rng() % s.size());
    case 2:  // Extend with noise.
      for (int k = 0, n = 1 + rng() % 16; k < n; ++k) s.push_back(static_cast<char>(rng()));
      return s;
    case 3: {  // Noise only.
      std::string noise(rng() % 64, '\0');
      for (char& c : noise) c = static_cast<char>(rng());
      return noise;
    }
    default:  // A varint that never ends.
      return s + std::string(11, '\xff');
  }
}

TEST(StreamFuzzTest, MalformedFramesNeverEndAStreamOkAndSdcdKeepsServing) {
  uint64_t seed = 20261204;
  double seconds = 0;
  if (const char* v = std::getenv("SDC_STREAM_FUZZ_SEED")) ASSERT_TRUE(absl::SimpleAtoi(v, &seed));
  if (const char* v = std::getenv("SDC_STREAM_FUZZ_SECONDS")) {
    ASSERT_TRUE(absl::SimpleAtod(v, &seconds));
  }
  const int iterations = seconds > 0 ? INT32_MAX : 300;
  std::printf("stream fuzz: seed %llu, %s\n", static_cast<unsigned long long>(seed),
              seconds > 0 ? absl::StrCat(seconds, " s").c_str() : "300 iterations");
  absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(TestDir("stream-fuzz"));
  ASSERT_TRUE(d.ok()) << d.status();
  std::unique_ptr<Sdcd> sdcd = *std::move(d);
  const std::vector<Method> methods = Methods();
  std::mt19937_64 rng(seed);
  std::map<std::string, int> outcomes;
  std::map<std::string, int> malformed_sent;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  int run = 0;
  for (; run < iterations && (seconds == 0 || absl::Now() < end); ++run) {
    const Method& method = methods[rng() % methods.size()];
    std::vector<std::string> frames;
    bool any_malformed = false;
    for (int k = 0, n = 1 + rng() % 3; k < n; ++k) {
      const std::string& seed_frame = method.seeds[std::min<size_t>(k, method.seeds.size() - 1)];
      std::string frame = rng() % 3 == 0 ? seed_frame : Mutate(seed_frame, rng);
      any_malformed = any_malformed || !method.parses(frame);
      frames.push_back(std::move(frame));
    }
    const grpc::Status s = SendRawFrames(Channel(sdcd->trainer_address()), method.path, frames);
    ++outcomes[absl::StrCat(method.path, " ", s.error_code())];
    if (any_malformed) {
      ++malformed_sent[method.path];
      ASSERT_FALSE(s.ok()) << "run " << run << " (seed " << seed << "): " << method.path
                           << " carried a malformed frame and ended OK";
      ASSERT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
          << "run " << run << ": " << method.path << " hung on a malformed frame";
    }
    if (run % 50 == 49) {
      ASSERT_TRUE(sdcd->process().running()) << "sdcd died at run " << run;
    }
  }
  for (const auto& [what, n] : outcomes) std::printf("  %6d  %s (status code)\n", n, what.c_str());
  std::printf("stream fuzz: %d streams\n", run);
  // Still serving, and every malformed stream was counted at most once.
  ASSERT_TRUE(sdcd->process().running());
  ScriptedRank fresh(Channel(sdcd->trainer_address()), TestHello("after", 0, 1, 1, kTensors));
  ASSERT_TRUE(fresh.Connect().ok());
  EXPECT_TRUE(fresh.WaitAcked(fresh.Send(1, core::StepReport{})).ok());
  double counted = 0;
  for (const char* label : {"attach", "relay", "agent_connect"}) {
    counted += sdcd->Counter("sdc_malformed_messages_total", "method", label);
  }
  int sent = 0;
  for (const auto& [path, n] : malformed_sent) sent += n;
  EXPECT_GT(counted, 0);
  EXPECT_LE(counted, sent);
}

}  // namespace
}  // namespace sdc::testing
