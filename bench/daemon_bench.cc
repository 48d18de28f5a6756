// ./sdc bench daemon: sdcd under a cluster's load, on loopback.
//
// This process starts sdcd (real binary, fresh database), then runs the load
// generator as a separate process (this binary with --role=loadgen): 16,384
// ranks of one job (2,048 nodes x 8 GPUs), 128 rank streams per gRPC
// connection, callback API. Every rank sends a StepReport every step, a
// WeightReport of 1,000 tensors every 10th step and, every 100th step, its
// replay-audit results (original and replay). Steps are paced at --rate.
// Measured: the step rate sustained (steps over the time from the first
// report to the last acknowledgement), acknowledgement latency of every
// report (p50, p99; and p99 apart for weight reports and the rest, since
// the weight step moves 24 KB per rank at once), audit verdict latency (p99 over ranks, from the step's
// start), sdcd's peak RSS and database size. Last line: JSON.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/convert.h"
#include "daemon/core/replay_plan.h"
#include "grpcpp/grpcpp.h"
#include "kernels/model_digest.h"
#include "tests/testing/process.h"
#include "tests/testing/sdcd.h"
#include "trainer.grpc.pb.h"

namespace sdc::bench {
namespace {

struct Args {
  std::string role = "bench";
  std::string target;
  uint32_t ranks = 16384;
  uint32_t per_connection = 128;
  uint32_t tensors = 1000;
  uint64_t first_step = 91;
  uint32_t steps = 30;
  double rate = 1.0;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "daemon_bench: %s\n", what.c_str());
  return 1;
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// One rank's stream; callback API, one write in flight.
class RankStream : public grpc::ClientBidiReactor<v1::TrainerMessage, v1::CoordinatorMessage> {
 public:
  RankStream(v1::TrainerService::Stub* stub, v1::TrainerMessage hello) {
    stub->async()->Attach(&context_, this);
    queue_.push_back({std::move(hello), absl::Now(), 0});
    Pump();
    StartRead(&in_);
    StartCall();
  }

  void Send(v1::TrainerMessage m, absl::Time intended, uint64_t sequence) {
    const bool weights = m.report().has_weights();
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back({std::move(m), intended, sequence});
      sent_at_[sequence] = {intended, weights};
    }
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        failed_ = true;
        return;
      }
    }
    Pump();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    const absl::Time now = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (in_.has_welcome()) welcomed_ = true;
      if (in_.has_ack()) {
        const uint64_t acked = in_.ack().acked_sequence();
        for (uint64_t s = acked_ + 1; s <= acked; ++s) {
          auto it = sent_at_.find(s);
          if (it != sent_at_.end()) {
            const double ms = absl::ToDoubleMilliseconds(now - it->second.first);
            (it->second.second ? weight_latencies_ms_ : latencies_ms_).push_back(ms);
            sent_at_.erase(it);
          }
        }
        acked_ = std::max(acked_, acked);
        last_ack_ = now;
      }
      if (in_.has_audit_verdict() && in_.audit_verdict().outcome() != v1::TIEBREAK_PENDING) {
        verdict_at_ = now;
        verdict_outcome_ = in_.audit_verdict().outcome();
      }
    }
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& s) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
    if (!s.ok()) {
      failed_ = true;
      error_ = s.error_message();
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
  // Acknowledgement latencies of (step and audit reports, weight reports).
  std::pair<std::vector<double>, std::vector<double>> TakeLatencies() {
    absl::MutexLock lock(&mu_);
    return {std::move(latencies_ms_), std::move(weight_latencies_ms_)};
  }
  std::pair<absl::Time, int> verdict() const {
    absl::MutexLock lock(&mu_);
    return {verdict_at_, verdict_outcome_};
  }
  absl::Time last_ack() const {
    absl::MutexLock lock(&mu_);
    return last_ack_;
  }
  void Close() {
    StartWritesDone();
    context_.TryCancel();
  }

 private:
  struct Out {
    v1::TrainerMessage message;
    absl::Time intended;
    uint64_t sequence;
  };

  void Pump() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || queue_.empty() || failed_) return;
      current_ = std::move(queue_.front().message);
      queue_.pop_front();
      writing_ = true;
    }
    StartWrite(&current_);
  }

  grpc::ClientContext context_;
  v1::CoordinatorMessage in_;
  v1::TrainerMessage current_;
  mutable absl::Mutex mu_;
  std::deque<Out> queue_ ABSL_GUARDED_BY(mu_);
  // Sequence -> (intended send time, is a weight report).
  std::map<uint64_t, std::pair<absl::Time, bool>> sent_at_ ABSL_GUARDED_BY(mu_);
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<double> weight_latencies_ms_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool welcomed_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  uint64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_ack_ ABSL_GUARDED_BY(mu_);
  absl::Time verdict_at_ ABSL_GUARDED_BY(mu_);
  int verdict_outcome_ ABSL_GUARDED_BY(mu_) = 0;
};

int LoadGen(const Args& a) {
  const uint32_t gpus = 8;
  std::vector<std::string> names;
  for (uint32_t t = 0; t < a.tensors; ++t) names.push_back(absl::StrCat("layers.", t, ".weight"));
  // One weight report body for every healthy rank.
  v1::WeightReport weights;
  {
    kernels::ModelDigestBuilder digest;
    for (uint32_t t = 0; t < a.tensors; ++t) {
      weights.add_tensors(1 << 20);
      weights.add_tensors(0x1234 + t);
      weights.add_tensors(0x5678 + t);
      digest.Add(names[t], {1u << 20, 0x1234u + t, 0x5678u + t});
    }
    weights.set_digest(digest.Finish());
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::TrainerService::Stub>> stubs;
  const uint32_t connections = (a.ranks + a.per_connection - 1) / a.per_connection;
  for (uint32_t c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("sdc.bench.connection", static_cast<int>(c));  // Distinct connections.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxSendMessageSize(16 << 20);
    channels.push_back(grpc::CreateCustomChannel(a.target, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(v1::TrainerService::NewStub(channels.back()));
  }
  std::fprintf(stderr, "loadgen: %u ranks on %u connections, attaching...\n", a.ranks, connections);
  std::vector<std::unique_ptr<RankStream>> streams;
  std::vector<core::PlanMember> members;
  for (core::Rank r = 0; r < a.ranks; ++r) {
    core::Hello h;
    h.job_id = "bench";
    h.placement = {r, absl::StrCat("node-", r / gpus), r % gpus, absl::StrCat("GPU-", r), 0};
    h.world_size = a.ranks;
    h.incarnation = 1;
    h.weight_tensors = names;
    h.parameter_count = a.tensors;
    h.layout_digest = 7;
    h.audit_every = 100;
    h.weight_check_every = 10;
    members.push_back({r, h.placement.node});
    v1::TrainerMessage hello;
    *hello.mutable_hello() = daemon::ToProto(h);
    streams.push_back(std::make_unique<RankStream>(stubs[r / a.per_connection].get(), hello));
  }
  const absl::Time attach_deadline = absl::Now() + absl::Minutes(5);
  for (auto& s : streams) {
    std::string why;
    while (!s->welcomed()) {
      if (s->failed(&why)) return Fail(absl::StrCat("a stream failed while attaching: ", why));
      if (absl::Now() > attach_deadline) return Fail("attach timed out");
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  std::fprintf(stderr, "loadgen: attached; %u steps at %.2f steps/s\n", a.steps, a.rate);
  const core::Topology topology(members);
  std::vector<uint64_t> sequence(a.ranks, 0);
  auto send = [&](core::Rank r, core::Step step, auto fill, absl::Time intended) {
    v1::TrainerMessage m;
    v1::Report* rep = m.mutable_report();
    rep->set_job_id("bench");
    rep->set_rank(r);
    rep->set_incarnation(1);
    rep->set_sequence(++sequence[r]);
    rep->set_step(step);
    fill(rep);
    streams[r]->Send(std::move(m), intended, sequence[r]);
  };
  const absl::Time start = absl::Now();
  std::vector<absl::Time> audit_started;
  for (uint32_t i = 0; i < a.steps; ++i) {
    const core::Step step = a.first_step + i;
    const absl::Time intended = start + absl::Seconds(i / a.rate);
    absl::SleepFor(intended - absl::Now());
    const absl::Time now = absl::Now();
    for (core::Rank r = 0; r < a.ranks; ++r) {
      send(r, step, [](v1::Report* rep) {
        v1::StepReport* s = rep->mutable_step_report();
        s->set_reduced_digest(0xabc);
        s->set_applied(true);
        s->set_reduced_sum_squares(1.0);
      }, now);
    }
    if (step % 10 == 0) {
      for (core::Rank r = 0; r < a.ranks; ++r) {
        send(r, step, [&](v1::Report* rep) { *rep->mutable_weights() = weights; }, now);
      }
    }
    if (step % 100 == 0) {
      audit_started.push_back(now);
      const core::ReplayPlan plan = core::PlanFullAudit(topology, step / 100);
      for (core::Rank r = 0; r < a.ranks; ++r) {
        send(r, step, [&](v1::Report* rep) {
          v1::AuditResult* x = rep->mutable_audit();
          x->set_role(v1::ORIGINAL);
          x->set_subject(r);
          x->set_loss_bits(0x3ff0000000000000ull + r);
          x->set_gradient_digest(r * 31 + 7);
        }, now);
      }
      for (const core::Assignment& as : plan.assignments) {
        send(as.replayer, step, [&](v1::Report* rep) {
          v1::AuditResult* x = rep->mutable_audit();
          x->set_role(v1::REPLAY);
          x->set_subject(as.subject);
          x->set_loss_bits(0x3ff0000000000000ull + as.subject);
          x->set_gradient_digest(as.subject * 31 + 7);
        }, now);
      }
    }
  }
  // Wait for every acknowledgement.
  const absl::Time drain_deadline = absl::Now() + absl::Minutes(5);
  for (core::Rank r = 0; r < a.ranks; ++r) {
    std::string why;
    while (streams[r]->acked() < sequence[r]) {
      if (streams[r]->failed(&why)) return Fail(absl::StrCat("rank ", r, " stream failed: ", why));
      if (absl::Now() > drain_deadline) return Fail("acknowledgements never completed");
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  absl::Time last_ack = start;
  std::vector<double> latencies, others, weight_acks, verdicts;
  int passed = 0;
  for (auto& s : streams) {
    last_ack = std::max(last_ack, s->last_ack());
    auto [o, w] = s->TakeLatencies();
    others.insert(others.end(), o.begin(), o.end());
    weight_acks.insert(weight_acks.end(), w.begin(), w.end());
  }
  latencies = others;
  latencies.insert(latencies.end(), weight_acks.begin(), weight_acks.end());
  // Verdicts arrive after the acks of the last audit result; wait briefly.
  absl::SleepFor(absl::Seconds(2));
  for (auto& s : streams) {
    auto [at, outcome] = s->verdict();
    if (!audit_started.empty() && at > audit_started.back()) {
      verdicts.push_back(absl::ToDoubleMilliseconds(at - audit_started.back()));
      passed += outcome == v1::PASS ? 1 : 0;
    }
  }
  const double seconds = absl::ToDoubleSeconds(last_ack - start);
  const size_t reports = latencies.size();
  std::printf("{\"ranks\":%u,\"connections\":%u,\"steps\":%u,\"reports\":%zu,"
              "\"steps_per_s_sustained\":%.3f,\"report_p50_ms\":%.1f,\"report_p99_ms\":%.1f,"
              "\"step_report_p99_ms\":%.1f,\"weight_report_p99_ms\":%.1f,"
              "\"audit_verdict_p99_ms\":%.1f,\"audit_verdicts\":%zu,\"audit_pass\":%d}\n",
              a.ranks, connections, a.steps, reports, a.steps / seconds,
              Percentile(latencies, 0.5), Percentile(latencies, 0.99),
              Percentile(others, 0.99), Percentile(weight_acks, 0.99),
              Percentile(verdicts, 0.99), verdicts.size(), passed);
  std::fflush(stdout);
  for (auto& s : streams) s->Close();
  absl::SleepFor(absl::Seconds(1));
  std::_Exit(0);  // Skip tearing down 16,384 reactors one by one.
}

double PeakRssMib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

double FileMib(const std::string& path) {
  double total = 0;
  for (const std::string& p : {path, path + "-wal"}) {
    struct stat st;
    if (stat(p.c_str(), &st) == 0) total += st.st_size;
  }
  return total / 1048576.0;
}

int Bench(const Args& a, const char* self) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/sdc-daemon-bench-", getpid());
  testing::Run({"rm", "-rf", dir});
  testing::Run({"mkdir", "-p", dir});
  absl::StatusOr<std::unique_ptr<testing::Sdcd>> sdcd = testing::Sdcd::Start(dir);
  if (!sdcd.ok()) return Fail(std::string(sdcd.status().message()));
  std::fprintf(stderr, "sdcd pid %d on %s, database %s\n", (*sdcd)->process().pid(),
               (*sdcd)->trainer_address().c_str(), (*sdcd)->db().c_str());
  std::vector<std::string> argv = {self,
                                   "--role=loadgen",
                                   absl::StrCat("--target=", (*sdcd)->trainer_address()),
                                   absl::StrCat("--ranks=", a.ranks),
                                   absl::StrCat("--per_connection=", a.per_connection),
                                   absl::StrCat("--tensors=", a.tensors),
                                   absl::StrCat("--steps=", a.steps),
                                   absl::StrCat("--first_step=", a.first_step),
                                   absl::StrCat("--rate=", a.rate)};
  testing::RunResult load = testing::Run(argv, {}, absl::Minutes(20));
  const double rss = PeakRssMib((*sdcd)->process().pid());
  const double db = FileMib((*sdcd)->db());
  (*sdcd)->process().Stop();
  const size_t json_at = load.output.rfind("{\"ranks\"");
  if (load.exit_code != 0 || json_at == std::string::npos) {
    return Fail(absl::StrCat("load generator failed (exit ", load.exit_code, "):\n", load.output,
                             "\nsdcd log:\n", testing::ReadFile(dir + "/sdcd.log")));
  }
  std::string json = load.output.substr(json_at);
  json = json.substr(0, json.find('\n'));
  json.pop_back();  // The closing brace; sdcd's figures follow.
  std::fprintf(stderr, "%s", load.output.substr(0, json_at).c_str());
  std::printf("sdcd under %u ranks: see the JSON line below (sdcd peak RSS %.0f MiB, database %.1f MiB)\n",
              a.ranks, rss, db);
  std::printf("%s,\"daemon_peak_rss_mib\":%.0f,\"db_mib\":%.1f}\n", json.c_str(), rss, db);
  testing::Run({"rm", "-rf", dir});
  return 0;
}

int Main(int argc, char** argv) {
  // Abseil here is built with mutex deadlock detection on: a graph walk on
  // every lock. Production code does not pay for a debugging aid.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = absl::StrCat("--", name, "=");
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    bool ok = true;
    if (const char* v = value("role")) a.role = v;
    else if (const char* v = value("target")) a.target = v;
    else if (const char* v = value("ranks")) ok = absl::SimpleAtoi(v, &a.ranks);
    else if (const char* v = value("per_connection")) ok = absl::SimpleAtoi(v, &a.per_connection);
    else if (const char* v = value("tensors")) ok = absl::SimpleAtoi(v, &a.tensors);
    else if (const char* v = value("steps")) ok = absl::SimpleAtoi(v, &a.steps);
    else if (const char* v = value("first_step")) ok = absl::SimpleAtoi(v, &a.first_step);
    else if (const char* v = value("rate")) ok = absl::SimpleAtod(v, &a.rate) && a.rate > 0;
    else return Fail(absl::StrCat("unknown flag '", arg, "' (known: --ranks --per_connection --tensors --steps --first_step --rate)"));
    if (!ok) return Fail(absl::StrCat("bad value in '", arg, "'"));
  }
  if (a.ranks < 24 || a.per_connection == 0 || a.steps == 0) return Fail("need --ranks >= 24, --per_connection > 0, --steps > 0");
  return a.role == "loadgen" ? LoadGen(a) : Bench(a, argv[0]);
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) { return sdc::bench::Main(argc, argv); }
