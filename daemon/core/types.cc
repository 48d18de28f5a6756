#include "daemon/core/types.h"

namespace sdc::core {

const char* AuditRoleName(AuditRole role) {
  switch (role) {
    case AuditRole::kOriginal:
      return "original";
    case AuditRole::kReplay:
      return "replay";
    case AuditRole::kTieBreak:
      return "tiebreak";
    case AuditRole::kConfirm:
      return "confirm";
  }
  return "unknown";
}

const char* CheckKindName(CheckKind kind) {
  switch (kind) {
    case CheckKind::kNonFinite:
      return "nonfinite";
    case CheckKind::kReducedGradients:
      return "reduced_gradients";
    case CheckKind::kReplay:
      return "replay";
    case CheckKind::kWeights:
      return "weights";
  }
  return "unknown";
}

const char* RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kPending:
      return "Pending";
    case RequestState::kApproved:
      return "Approved";
    case RequestState::kExecuting:
      return "Executing";
    case RequestState::kDone:
      return "Done";
    case RequestState::kFailed:
      return "Failed";
    case RequestState::kDenied:
      return "Denied";
    case RequestState::kExpired:
      return "Expired";
  }
  return "Unknown";
}

bool IsOpen(RequestState state) {
  return state == RequestState::kPending || state == RequestState::kApproved ||
         state == RequestState::kExecuting;
}

namespace {

bool OnlyFrom(absl::string_view s, absl::string_view punctuation) {
  for (char c : s) {
    const bool alnum =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && punctuation.find(c) == absl::string_view::npos) return false;
  }
  return true;
}

}  // namespace

bool IsSafeNodeName(absl::string_view node) {
  return !node.empty() && node.size() <= 253 && node[0] != '-' && OnlyFrom(node, "._-");
}

bool IsSafeGpuId(absl::string_view gpu) {
  return !gpu.empty() && gpu.size() <= kMaxGpuIdLength && gpu[0] != '-' &&
         OnlyFrom(gpu, "._:/-");
}

}  // namespace sdc::core
