#include "daemon/core/types.h"

namespace sdc::core {

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

}  // namespace sdc::core
