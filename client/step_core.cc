#include "client/step_core.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::client {
namespace {

int64_t Hi(uint64_t v) { return static_cast<int64_t>(v >> 32); }
int64_t Lo(uint64_t v) { return static_cast<int64_t>(v & 0xffffffffu); }

}  // namespace

std::vector<int64_t> EncodeAgreement(const LocalView& v, uint32_t rank) {
  return {
      v.local_nonfinite ? 1 : 0,
      v.local_nonfinite ? -1 : 0,  // MAX is -1 only if every rank had local NaN/Inf.
      v.local_nonfinite ? static_cast<int64_t>(rank) + 1 : 0,
      v.reduced_nonfinite ? 1 : 0,
      v.audit_mismatch ? 1 : 0,
      Hi(v.reduced_digest),
      -Hi(v.reduced_digest),
      Lo(v.reduced_digest),
      -Lo(v.reduced_digest),
      -static_cast<int64_t>(v.plans_held),
      -static_cast<int64_t>(v.repair_step),
      0,  // Reserved.
  };
}

Agreement DecodeAgreement(absl::Span<const int64_t> m) {
  Agreement a;
  a.any_local_nonfinite = m[0] != 0;
  a.all_local_nonfinite = m[1] == -1;
  a.highest_local_nonfinite_rank = m[2] - 1;
  a.any_reduced_nonfinite = m[3] != 0;
  a.audit_mismatch = m[4] != 0;
  a.reduced_digests_differ = m[5] != -m[6] || m[7] != -m[8];
  a.plans_held_by_all = static_cast<uint64_t>(-m[9]);
  a.repair_step_known_by_all = static_cast<uint64_t>(-m[10]);
  return a;
}

Decision Decide(const Agreement& a) {
  std::vector<std::string> reasons;
  if (a.any_local_nonfinite) {
    reasons.push_back(a.all_local_nonfinite
                          ? "NaN/Inf in every rank's local gradients"
                          : absl::StrCat("NaN/Inf in the local gradients of rank ",
                                         a.highest_local_nonfinite_rank));
  } else if (a.any_reduced_nonfinite) {
    reasons.push_back("NaN/Inf in the reduced gradients");
  }
  if (a.reduced_digests_differ) reasons.push_back("ranks received different reduced gradients");
  if (a.audit_mismatch) reasons.push_back("replay audit mismatch");
  Decision d;
  d.apply = reasons.empty();
  d.reason = absl::StrJoin(reasons, "; ");
  return d;
}

StepPlan PlanStep(uint64_t step, uint32_t audit_every, uint32_t weight_check_every,
                  uint64_t activated_plan) {
  StepPlan p;
  p.scheduled_audit = protocol::IsScheduledAuditStep(step, audit_every);
  if (!p.scheduled_audit) p.targeted_plan = activated_plan;
  p.weight_check = weight_check_every > 0 && step % weight_check_every == 0;
  return p;
}

std::vector<int64_t> EncodeAudit(const AuditExchange& a) {
  return {static_cast<int64_t>(a.original_loss_bits), static_cast<int64_t>(a.original_digest),
          a.replay_subject, static_cast<int64_t>(a.replay_loss_bits),
          static_cast<int64_t>(a.replay_digest), a.has_original ? 1 : 0};
}

std::vector<AuditExchange> DecodeAudits(absl::Span<const int64_t> g, uint32_t world) {
  std::vector<AuditExchange> out(world);
  for (uint32_t r = 0; r < world; ++r) {
    const int64_t* s = g.data() + kAuditSlots * r;
    out[r] = {static_cast<uint64_t>(s[0]), static_cast<uint64_t>(s[1]), s[2],
              static_cast<uint64_t>(s[3]), static_cast<uint64_t>(s[4]), s[5] != 0};
  }
  return out;
}

protocol::AuditVerdict InBandVerdict(const protocol::ReplayPlan& plan,
                                     const protocol::Topology& topology,
                                     const std::vector<AuditExchange>& audits, bool deterministic,
                                     uint64_t step) {
  absl::flat_hash_map<protocol::Rank, protocol::Evidence> originals, replays;
  for (uint32_t r = 0; r < audits.size(); ++r) {
    if (audits[r].has_original) {
      originals[r] = {audits[r].original_loss_bits, audits[r].original_digest, {}};
    }
    if (audits[r].replay_subject >= 0) {
      replays[r] = {audits[r].replay_loss_bits, audits[r].replay_digest, {}};
    }
  }
  protocol::AuditInput in;
  in.plan = &plan;
  in.topology = &topology;
  in.originals = &originals;
  in.replays = &replays;
  in.compare_gradients = deterministic;
  in.salt = step;  // The coordinator salts its tie-breaker choice with the step too.
  return protocol::Attribute(in);
}

}  // namespace sdc::client
