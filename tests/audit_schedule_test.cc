// The audit schedule has one definition (protocol::ScheduledAudit); this
// walks it from both ends for 10,000 steps: the trainer's side as the engine
// derives it (client::PlanStep, then the scheduled plan), against what sdcd's
// real coordinator core expects, fed through its public API (a fake clock,
// the in-memory store). At every step the coordinator must take exactly the
// trainer's audit: every original and replay the trainer's plan gives, a
// verdict on the last of them and not before, no pair the plan does not
// give, and no scheduled audit at all on a step the trainer does not audit.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/step_core.h"
#include "daemon/core/clock.h"
#include "daemon/core/coordinator.h"
#include "daemon/core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/replay_plan.h"
#include "protocol/types.h"

namespace sdc {
namespace {

using ::testing::HasSubstr;
using protocol::Rank;
using protocol::Step;

constexpr char kJob[] = "schedule";
constexpr Step kSteps = 10'000;

// A job's layout, by rank: node, GPU index on the node, replica group.
struct Layout {
  std::string name;
  std::vector<std::string> nodes;
  std::vector<uint32_t> local_ranks;
  std::vector<uint32_t> groups;
};

// Ranks node after node; rank r in replica group r % replica_groups.
Layout Grid(const std::string& name, uint32_t nodes, uint32_t gpus, uint32_t replica_groups) {
  Layout l{name, {}, {}, {}};
  for (uint32_t n = 0; n < nodes; ++n) {
    for (uint32_t g = 0; g < gpus; ++g) {
      const Rank r = static_cast<Rank>(l.nodes.size());
      l.nodes.push_back(absl::StrCat("node-", n));
      l.local_ranks.push_back(g);
      l.groups.push_back(r % replica_groups);
    }
  }
  return l;
}

// What the trainer ranks of one replica group derive, as the engine does:
// the topology from every member's node name, and per step client::PlanStep
// and, for a scheduled audit, its plan.
class TrainerSide {
 public:
  TrainerSide(const Layout& layout, uint32_t group, uint32_t audit_every)
      : audit_every_(audit_every), topology_(Members(layout, group)) {}

  std::optional<protocol::ReplayPlan> PlanOf(Step step) const {
    const client::StepPlan sp = client::PlanStep(step, audit_every_, /*weight_check_every=*/0,
                                                 /*activated_plan=*/0);
    if (!sp.scheduled_audit) return std::nullopt;
    std::optional<protocol::ReplayPlan> plan =
        protocol::ScheduledAudit(step, audit_every_, topology_);
    EXPECT_TRUE(plan.has_value()) << "PlanStep scheduled step " << step << " but no plan";
    return plan;
  }

  const protocol::Topology& topology() const { return topology_; }

 private:
  static protocol::Topology Members(const Layout& layout, uint32_t group) {
    std::vector<protocol::PlanMember> members;
    for (Rank r = 0; r < layout.nodes.size(); ++r) {
      if (layout.groups[r] == group) members.push_back({r, layout.nodes[r]});
    }
    return protocol::Topology(std::move(members));
  }

  const uint32_t audit_every_;
  const protocol::Topology topology_;
};

// sdcd's coordinator core, with the sequence numbers a rank's link keeps.
class CoordinatorSide {
 public:
  CoordinatorSide(const Layout& layout, uint32_t audit_every)
      : coordinator_(core::CoordinatorOptions{}, &clock_, &store_) {
    for (Rank r = 0; r < layout.nodes.size(); ++r) {
      protocol::Hello h;
      h.job_id = kJob;
      h.placement = {r, layout.nodes[r], layout.local_ranks[r], absl::StrCat("GPU-", r),
                     layout.groups[r]};
      h.world_size = static_cast<uint32_t>(layout.nodes.size());
      h.incarnation = 1;
      h.weight_tensors = {"w"};
      h.parameter_count = 1;
      h.layout_digest = 1;
      h.deterministic = true;
      h.audit_every = audit_every;
      h.weight_check_every = 0;
      absl::StatusOr<core::AttachResult> attached = coordinator_.Attach(h, core::Caller{h.placement.node, "certificate", {}});
      EXPECT_TRUE(attached.ok()) << attached.status();
    }
    sequence_.assign(layout.nodes.size(), 0);
  }

  // One audit result of the scheduled audit (plan 0) of `step`; the rank's
  // sequence advances only when the coordinator took it.
  absl::StatusOr<core::Effects> Send(Rank from, Step step, protocol::AuditRole role,
                                     Rank subject) {
    protocol::AuditResult a;
    a.role = role;
    a.plan_id = 0;
    a.subject = subject;
    // Every result agrees: the audit passes whatever pairs it holds.
    a.loss_bits = 0x3ff0000000000000ull + subject;
    a.gradient_digest = 1000 + subject;
    protocol::Report r;
    r.job_id = kJob;
    r.rank = from;
    r.incarnation = 1;
    r.sequence = sequence_[from] + 1;
    r.step = step;
    r.body = a;
    absl::StatusOr<core::Effects> e = coordinator_.Ingest(r);
    if (e.ok()) sequence_[from] = r.sequence;
    return e;
  }

 private:
  core::FakeClock clock_;
  core::MemoryStore store_;
  core::Coordinator coordinator_;
  std::vector<uint64_t> sequence_;
};

// The verdict of `step` among `effects`' messages, if one was sent.
std::optional<protocol::AuditVerdictMessage> VerdictOf(const core::Effects& effects, Step step) {
  for (const core::OutMessage& m : effects.messages) {
    const auto* v = std::get_if<protocol::AuditVerdictMessage>(&m.body);
    if (v != nullptr && v->step == step) return *v;
  }
  return std::nullopt;
}

struct Walk {
  uint64_t audits = 0;  // Scheduled audits the coordinator decided.
  uint64_t refused = 0;  // Steps without one, whose probe was refused.
};

// Walks steps 0 .. kSteps-1 of every replica group at `audit_every`.
Walk WalkSchedule(const Layout& layout, uint32_t audit_every) {
  CoordinatorSide sdcd(layout, audit_every);
  const std::set<uint32_t> groups(layout.groups.begin(), layout.groups.end());
  std::map<uint32_t, TrainerSide> trainers;
  for (uint32_t g : groups) trainers.emplace(g, TrainerSide(layout, g, audit_every));
  Walk walk;
  for (Step step = 0; step < kSteps; ++step) {
    for (auto& [group, trainer] : trainers) {
      SCOPED_TRACE(absl::StrCat(layout.name, ", audit_every ", audit_every, ", step ", step,
                                ", replica group ", group));
      const std::vector<protocol::PlanMember>& members = trainer.topology().members();
      const std::optional<protocol::ReplayPlan> plan = trainer.PlanOf(step);
      if (!plan.has_value()) {
        // The trainers run no scheduled audit: sdcd must not expect one.
        absl::StatusOr<core::Effects> e =
            sdcd.Send(members[0].rank, step, protocol::AuditRole::kOriginal, members[0].rank);
        EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(e.status().message(), HasSubstr("not a scheduled audit step"));
        if (e.status().code() != absl::StatusCode::kInvalidArgument) return walk;
        ++walk.refused;
        continue;
      }
      if (plan->assignments.empty()) {
        ADD_FAILURE() << "a scheduled audit with no pairs";
        return walk;
      }
      // A pair the trainers' plan does not give is refused.
      const protocol::Assignment& first = plan->assignments[0];
      Rank stranger = first.replayer;
      for (const protocol::PlanMember& m : members) {
        if (m.rank != first.subject && m.rank != first.replayer) stranger = m.rank;
      }
      absl::StatusOr<core::Effects> wrong =
          sdcd.Send(first.replayer, step, protocol::AuditRole::kReplay, stranger);
      EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(wrong.status().message(), HasSubstr("does not assign that pair"));

      // Every original and replay the trainers' plan gives is taken, and the
      // audit is decided on the last one: sdcd expected no more and no fewer.
      std::vector<std::pair<Rank, std::pair<protocol::AuditRole, Rank>>> results;
      std::set<Rank> subjects;
      for (const protocol::Assignment& a : plan->assignments) subjects.insert(a.subject);
      for (Rank s : subjects) results.push_back({s, {protocol::AuditRole::kOriginal, s}});
      for (const protocol::Assignment& a : plan->assignments) {
        results.push_back({a.replayer, {protocol::AuditRole::kReplay, a.subject}});
      }
      for (size_t i = 0; i < results.size(); ++i) {
        const auto& [from, what] = results[i];
        absl::StatusOr<core::Effects> e = sdcd.Send(from, step, what.first, what.second);
        if (!e.ok()) {
          ADD_FAILURE() << "sdcd refused rank " << from << "'s "
                        << protocol::AuditRoleName(what.first) << " of rank " << what.second
                        << ": " << e.status();
          return walk;
        }
        const std::optional<protocol::AuditVerdictMessage> verdict = VerdictOf(*e, step);
        if (i + 1 < results.size()) {
          if (verdict.has_value()) {
            ADD_FAILURE() << "sdcd decided the audit after " << i + 1 << " of "
                          << results.size() << " results";
            return walk;
          }
          continue;
        }
        if (!verdict.has_value()) {
          ADD_FAILURE() << "sdcd still waits after every result of the trainers' plan";
          return walk;
        }
        EXPECT_EQ(verdict->outcome, protocol::AuditOutcome::kPass) << verdict->explanation;
        ++walk.audits;
      }
    }
  }
  return walk;
}

class AuditScheduleTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(AuditScheduleTest, SdcdExpectsExactlyTheTrainersAudits) {
  const uint32_t audit_every = GetParam();
  for (const Layout& layout : {Grid("3 nodes x 2 GPUs", 3, 2, 1),
                               Grid("1 node x 4 GPUs", 1, 4, 1),
                               Grid("4 nodes x 2 GPUs, 2 replica groups", 4, 2, 2)}) {
    const uint64_t groups = std::set<uint32_t>(layout.groups.begin(), layout.groups.end()).size();
    const Walk walk = WalkSchedule(layout, audit_every);
    // Steps 0, N, 2N, ... below kSteps: ceil(kSteps / N) audits per group.
    const uint64_t scheduled = audit_every == 0 ? 0 : (kSteps + audit_every - 1) / audit_every;
    EXPECT_EQ(walk.audits, scheduled * groups) << layout.name;
    EXPECT_EQ(walk.refused, (kSteps - scheduled) * groups) << layout.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cadences, AuditScheduleTest, ::testing::Values(1u, 7u, 100u, 0u),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return info.param == 0 ? std::string("AuditsOff")
                                                  : absl::StrCat("Every", info.param);
                         });

}  // namespace
}  // namespace sdc
