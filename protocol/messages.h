#ifndef SDC_PROTOCOL_MESSAGES_H_
#define SDC_PROTOCOL_MESSAGES_H_

// What the coordinator tells trainer ranks (proto/trainer.proto's
// CoordinatorMessage), as plain data: sdcd's core decides these and
// protocol/convert.h puts them on the wire. Trainers read the wire form.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "protocol/attribution.h"
#include "protocol/replay_plan.h"
#include "protocol/types.h"

namespace sdc::protocol {

// A targeted audit plan (scheduled plans are computed, never sent: see
// ScheduledAudit in replay_plan.h).
struct PlanMessage {
  uint64_t plan_id = 0;
  std::vector<Assignment> assignments;
  std::string reason;
  bool watch = false;  // A standing watch (v1::AuditPlan::watch).
  uint32_t group = 0;  // The replica group it assigns (v1::AuditPlan::group).
};
struct AuditVerdictMessage {
  Step step = 0;
  AuditOutcome outcome = AuditOutcome::kPass;
  std::vector<Rank> faulty;
  std::vector<Rank> suspects;
  std::vector<std::string> differing_tensors;
  std::string explanation;
};
struct TieBreakMessage {
  Step step = 0;
  Rank subject = 0;
  Rank replayer = 0;
};
struct WeightVerdictMessage {
  Step step = 0;
  bool pass = true;
  std::vector<Rank> minority;
  std::vector<std::string> differing_tensors;
  Rank majority_source = 0;
  std::string explanation;
};

using CoordinatorMessage =
    std::variant<PlanMessage, AuditVerdictMessage, TieBreakMessage, WeightVerdictMessage>;

}  // namespace sdc::protocol

#endif  // SDC_PROTOCOL_MESSAGES_H_
