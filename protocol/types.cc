#include "protocol/types.h"

namespace sdc::protocol {

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

}  // namespace sdc::protocol
