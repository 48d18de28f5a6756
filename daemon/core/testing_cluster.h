#ifndef SDC_DAEMON_CORE_TESTING_CLUSTER_H_
#define SDC_DAEMON_CORE_TESTING_CLUSTER_H_

// Tests of the coordinator core: a cluster of ranks talking to one
// Coordinator on a FakeClock and a MemoryStore, with the bookkeeping a
// trainer would do (sequence numbers per rank). Testonly.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/coordinator.h"
#include "gtest/gtest.h"
#include "kernels/model_digest.h"

namespace sdc::core::testing {

inline constexpr char kJob[] = "job-a";
inline const std::vector<std::string> kTensors = {"embed.weight", "layers.0.w", "layers.0.b",
                                           "norm.weight"};

// A caller proven to be the node its Hello names (a node certificate).
inline Caller Proven(const Hello& h) { return {h.placement.node, "certificate", {}}; }

// A cluster of `nodes` x `gpus` ranks talking to one coordinator, with the
// bookkeeping a trainer would do (sequence numbers per rank).
class Cluster {
 public:
  Cluster(int nodes, int gpus, uint32_t audit_every = 10, uint32_t weight_every = 10,
          CoordinatorOptions options = {})
      : nodes_(nodes), gpus_(gpus), audit_every_(audit_every), weight_every_(weight_every) {
    options_ = options;
    Reset();
  }

  // A fresh coordinator on the same store, as after a restart.
  void Reset() {
    coordinator_ = std::make_unique<Coordinator>(options_, &clock_, &store_);
  }

  uint32_t world() const { return nodes_ * gpus_; }
  std::string NodeOf(Rank r) const { return std::string("node-") + static_cast<char>('a' + r / gpus_); }
  std::string GpuOf(Rank r) const { return absl::StrCat("GPU-", r); }

  Hello HelloOf(Rank r, uint64_t incarnation = 1) const {
    Hello h;
    h.job_id = job_;
    h.placement = {r, NodeOf(r), r % static_cast<uint32_t>(gpus_), GpuOf(r), 0};
    h.world_size = world();
    h.incarnation = incarnation;
    h.weight_tensors = kTensors;
    h.parameter_count = 3;
    h.layout_digest = 77;
    h.deterministic = true;
    h.audit_every = audit_every_;
    h.weight_check_every = weight_every_;
    return h;
  }

  void AttachAll() {
    for (Rank r = 0; r < world(); ++r) {
      ASSERT_TRUE(coordinator_->Attach(HelloOf(r), Proven(HelloOf(r))).ok()) << r;
    }
  }

  // Every rank from a caller that proved nothing (no node certificate, no
  // agent relaying it).
  void AttachAllUnauthenticated() {
    for (Rank r = 0; r < world(); ++r) {
      ASSERT_TRUE(coordinator_->Attach(HelloOf(r), Caller{}).ok()) << r;
    }
  }

  // Hellos and reports from here on come from a job of `nodes` x `gpus`
  // ranks (an elastic restart changes the world size).
  void set_shape(int nodes, int gpus) {
    nodes_ = nodes;
    gpus_ = gpus;
  }

  // Hellos and reports from here on are job `job`'s (same nodes and GPUs).
  void set_job(std::string job) { job_ = std::move(job); }

  absl::StatusOr<Effects> Send(Rank r, Step step, decltype(Report::body) body,
                               uint64_t incarnation = 1) {
    Report rep;
    rep.job_id = job_;
    rep.rank = r;
    rep.incarnation = incarnation;
    rep.sequence = next_seq_[{job_, r, incarnation}] + 1;
    rep.step = step;
    rep.body = std::move(body);
    absl::StatusOr<Effects> e = coordinator_->Ingest(rep);
    if (e.ok() && !e->duplicate) next_seq_[{job_, r, incarnation}] = rep.sequence;
    if (e.ok()) Collect(*e);
    return e;
  }

  // Every rank reports a clean step (same reduced digest, applied).
  void CleanStep(Step step) {
    for (Rank r = 0; r < world(); ++r) {
      ASSERT_TRUE(Send(r, step, StepReport{0, 0, 1.0, 1234, true, "", false}).ok());
    }
  }

  static WeightReport Weights(uint64_t salt = 0) {
    WeightReport w;
    for (size_t t = 0; t < kTensors.size(); ++t) w.tensors.push_back({16, 100 + t, 200 + t + salt * (t == 1)});
    std::vector<kernels::NamedFingerprint> named;
    for (size_t t = 0; t < kTensors.size(); ++t) named.push_back({kTensors[t], w.tensors[t]});
    w.digest = kernels::ModelDigest(named);
    return w;
  }

  void AllWeights(Step step, Rank corrupt = UINT32_MAX) {
    for (Rank r = 0; r < world(); ++r) {
      ASSERT_TRUE(Send(r, step, Weights(r == corrupt ? 1 : 0)).ok());
    }
  }

  // The scheduled audit of `step`: `wrong_own` ranks compute their own batch
  // wrongly, `wrong_replay` ranks compute replays wrongly.
  void Audit(Step step, std::set<Rank> wrong_own, std::set<Rank> wrong_replay,
             uint64_t plan_id = 0, std::vector<Assignment> assignments = {},
             std::set<Rank> silent = {}, uint64_t incarnation = 1) {
    if (assignments.empty()) {
      Topology t(Members());
      assignments = PlanFullAudit(t, step / audit_every_).assignments;
    }
    std::set<Rank> subjects;
    for (const Assignment& a : assignments) subjects.insert(a.subject);
    for (Rank s : subjects) {
      if (silent.count(s)) continue;
      AuditResult o;
      o.role = AuditRole::kOriginal;
      o.plan_id = plan_id;
      o.subject = s;
      o.loss_bits = BatchValue(s) + (wrong_own.count(s) ? 1 : 0);
      o.gradient_digest = o.loss_bits;
      ASSERT_TRUE(Send(s, step, o, incarnation).ok()) << "original " << s;
    }
    for (const Assignment& a : assignments) {
      if (silent.count(a.replayer)) continue;
      AuditResult rp;
      rp.role = AuditRole::kReplay;
      rp.plan_id = plan_id;
      rp.subject = a.subject;
      rp.loss_bits = BatchValue(a.subject) + (wrong_replay.count(a.replayer) ? 7 + a.replayer : 0);
      rp.gradient_digest = rp.loss_bits;
      ASSERT_TRUE(Send(a.replayer, step, rp, incarnation).ok()) << "replay " << a.replayer;
    }
  }

  absl::StatusOr<Effects> TieBreakResult(Rank tiebreaker, Rank subject, Step step,
                                         bool wrong = false, uint64_t plan_id = 0) {
    AuditResult t;
    t.role = AuditRole::kTieBreak;
    t.plan_id = plan_id;
    t.subject = subject;
    t.loss_bits = BatchValue(subject) + (wrong ? 99 : 0);
    t.gradient_digest = t.loss_bits;
    return Send(tiebreaker, step, t);
  }

  // Answers every tie-break asked for `step` so far from healthy tie-breakers.
  void SettleTieBreaks(Step step, uint64_t plan_id = 0) {
    for (const TieBreakMessage& t : MessagesOf<TieBreakMessage>()) {
      if (t.step != step) continue;
      ASSERT_TRUE(TieBreakResult(t.replayer, t.subject, step, false, plan_id).ok());
    }
  }

  static uint64_t BatchValue(Rank r) { return 1000 + 10 * r; }

  std::vector<PlanMember> Members() const {
    std::vector<PlanMember> m;
    for (Rank r = 0; r < world(); ++r) m.push_back({r, NodeOf(r)});
    return m;
  }

  void Collect(const Effects& e) {
    for (const auto& m : e.messages) messages_.push_back(m);
    for (const auto& c : e.checks) checks_.push_back(c);
  }

  template <typename T>
  std::vector<T> MessagesOf() const {
    std::vector<T> out;
    for (const auto& m : messages_) {
      if (const T* t = std::get_if<T>(&m.body)) out.push_back(*t);
    }
    return out;
  }

  Coordinator& c() { return *coordinator_; }
  // Every message sent so far, with its recipients.
  const std::vector<OutMessage>& messages() const { return messages_; }
  FakeClock& clock() { return clock_; }
  MemoryStore& store() { return store_; }
  std::vector<CheckEvent>& checks() { return checks_; }

 private:
  int nodes_, gpus_;
  uint32_t audit_every_, weight_every_;
  CoordinatorOptions options_;
  FakeClock clock_;
  MemoryStore store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::string job_ = kJob;
  std::map<std::tuple<std::string, Rank, uint64_t>, uint64_t> next_seq_;
  std::vector<OutMessage> messages_;
  std::vector<CheckEvent> checks_;
};

}  // namespace sdc::core::testing

#endif  // SDC_DAEMON_CORE_TESTING_CLUSTER_H_
