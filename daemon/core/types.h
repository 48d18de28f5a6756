#ifndef SDC_DAEMON_CORE_TYPES_H_
#define SDC_DAEMON_CORE_TYPES_H_

// The coordinator core's vocabulary: the protocol's names it decides on
// (protocol/, shared with the trainers), and the kinds of its own records.
//
// The protocol's names are imported one by one, so that core::Report IS
// protocol::Report: the core speaks the protocol on every line, and code that
// talks to the core (sdcd's services, tests, benchmarks) keeps one spelling.
// Code outside daemon/ writes protocol::.

#include "common/identity.h"
#include "protocol/attribution.h"
#include "protocol/checkpoint_ledger.h"
#include "protocol/messages.h"
#include "protocol/replay_plan.h"
#include "protocol/types.h"

namespace sdc::core {

// protocol/types.h: what ranks report.
using protocol::AuditResult;
using protocol::AuditRole;
using protocol::AuditRoleName;
using protocol::Fingerprint;
using protocol::Hello;
using protocol::Placement;
using protocol::Rank;
using protocol::Report;
using protocol::ShardCoordinates;
using protocol::Step;
using protocol::StepReport;
using protocol::WeightReport;

// protocol/messages.h: what the coordinator tells ranks.
using protocol::AuditVerdictMessage;
using protocol::CoordinatorMessage;
using protocol::PlanMessage;
using protocol::TieBreakMessage;
using protocol::WeightVerdictMessage;

// protocol/replay_plan.h: who replays whom.
using protocol::Assignment;
using protocol::AttributionCapability;
using protocol::AttributionCapabilityName;
using protocol::ChooseConfirmer;
using protocol::ChooseTieBreaker;
using protocol::IsScheduledAuditStep;
using protocol::PlanFullAudit;
using protocol::PlanMember;
using protocol::PlanTargetedAudit;
using protocol::PlanWatch;
using protocol::ReplayPlan;
using protocol::ScheduledAudit;
using protocol::Topology;

// protocol/attribution.h: what a mismatch means.
using protocol::Attribute;
using protocol::AuditInput;
using protocol::AuditOutcome;
using protocol::AuditOutcomeName;
using protocol::AuditVerdict;
using protocol::Comparison;
using protocol::Evidence;
using protocol::IsFailure;
using protocol::kMaxNamedParameters;
using protocol::ResolveTieBreak;
using protocol::SameResult;
using protocol::TieBreak;
using protocol::TieBreakOutcome;
using protocol::TieBreakOutcomeName;

// protocol/checkpoint_ledger.h.
using protocol::CheckpointLedger;

enum class CheckKind {
  kNonFinite,
  kReducedGradients,
  kReplay,
  kWeights,
};

const char* CheckKindName(CheckKind kind);

enum class RequestState {
  kPending,
  kApproved,
  kExecuting,
  kDone,
  kFailed,
  kDenied,
  kExpired,
};

const char* RequestStateName(RequestState state);

// Open requests still count against the blast-radius cap.
bool IsOpen(RequestState state);

// Identities that trainers and agents send, and that reach actuators, logs
// and the database: the rules sdc-agent applies too (common/identity.h).
using common::IsSafeGpuId;
using common::IsSafeNodeName;
using common::kMaxGpuIdLength;

}  // namespace sdc::core

#endif  // SDC_DAEMON_CORE_TYPES_H_
