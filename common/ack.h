#ifndef SDC_COMMON_ACK_H_
#define SDC_COMMON_ACK_H_

// Acknowledgements are watermarks ("everything up to sequence N is
// durable"): one still waiting in a stream's queue absorbs the next, so a
// backlog costs one write, not one per report. Used by sdcd's Attach
// streams and by sdc-agent's relayed rank streams.

#include <algorithm>

#include "trainer.pb.h"

namespace sdc::common {

// True when `next` was folded into `waiting` (both acknowledgements). One
// that says a report was refused (Ack.refused_sequence) is never folded:
// the rank must read which.
inline bool FoldAck(v1::CoordinatorMessage& waiting, const v1::CoordinatorMessage& next) {
  if (!waiting.has_ack() || !next.has_ack()) return false;
  if (waiting.ack().refused_sequence() != 0 || next.ack().refused_sequence() != 0) return false;
  waiting.mutable_ack()->set_acked_sequence(
      std::max(waiting.ack().acked_sequence(), next.ack().acked_sequence()));
  return true;
}

}  // namespace sdc::common

#endif  // SDC_COMMON_ACK_H_
