#include "agent/core/link_machine.h"

#include <algorithm>
#include <utility>

namespace sdc::agent::core {

LinkMachine::LinkMachine(const LinkTiming& timing, std::function<double()> uniform01,
                         absl::Time now)
    : timing_(timing),
      uniform01_(std::move(uniform01)),
      next_attempt_(now),
      backoff_(timing.backoff_min) {}

LinkMachine::Next LinkMachine::Poll(absl::Time now) const {
  switch (phase_) {
    case Phase::kBackoff:
      if (now >= next_attempt_) return {Action::kConnect, now};
      return {Action::kNone, next_attempt_};
    case Phase::kConnecting: {
      const absl::Time deadline = attempt_started_ + timing_.welcome_timeout;
      if (now >= deadline) return {Action::kAbandon, now};
      return {Action::kNone, deadline};
    }
    case Phase::kRegistered:
      if (now >= next_heartbeat_) return {Action::kSendHeartbeat, now};
      return {Action::kNone, next_heartbeat_};
  }
  return {Action::kNone, now};
}

void LinkMachine::OnConnecting(absl::Time now) {
  phase_ = Phase::kConnecting;
  attempt_started_ = now;
  registered_at_ = absl::InfinitePast();
}

void LinkMachine::OnWelcome(absl::Time now) {
  phase_ = Phase::kRegistered;
  registered_at_ = now;
  // Registering tells sdcd the node is alive: the first heartbeat is one
  // period later.
  next_heartbeat_ = now + timing_.heartbeat;
}

void LinkMachine::OnHeartbeatSent(absl::Time now) { next_heartbeat_ = now + timing_.heartbeat; }

void LinkMachine::OnStreamEnded(absl::Time now) {
  const bool stable =
      phase_ == Phase::kRegistered && now - registered_at_ >= timing_.stable_after;
  if (stable) {
    backoff_ = timing_.backoff_min;
    failures_ = 0;
  } else {
    ++failures_;
  }
  phase_ = Phase::kBackoff;
  // Jitter in [0.5, 1.5).
  const double jitter = 0.5 + std::clamp(uniform01_(), 0.0, 1.0);
  next_attempt_ = now + backoff_ * jitter;
  backoff_ = std::min(timing_.backoff_max, backoff_ * 2);
}

}  // namespace sdc::agent::core
