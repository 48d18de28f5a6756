#ifndef SDC_AGENT_CORE_LINK_MACHINE_H_
#define SDC_AGENT_CORE_LINK_MACHINE_H_

// When the agent connects to sdcd, heartbeats, and gives up on an attempt
// that does not get a welcome; how long it backs off after a stream ends.
// Pure: every call takes the time; jitter comes from an injected source of
// uniform numbers, so tests pin every instant. The gRPC adapter
// (agent/link.cc) asks Poll() what to do and reports what happened.
//
// Not thread-safe: one owner (the link's thread, under its mutex).

#include <functional>

#include "absl/time/time.h"

namespace sdc::agent::core {

struct LinkTiming {
  // Between heartbeats once registered. Default: --heartbeat's default.
  absl::Duration heartbeat = absl::Seconds(30);
  // First wait after a failed attempt; doubles per consecutive failure up to
  // backoff_max. Each wait is scaled by a jitter factor in [0.5, 1.5), so a
  // restarted sdcd is not hit by every agent in the same instant.
  absl::Duration backoff_min = absl::Seconds(1);
  absl::Duration backoff_max = absl::Seconds(60);
  // From the start of an attempt to sdcd's welcome. Default: 10 s.
  absl::Duration welcome_timeout = absl::Seconds(10);
  // A registered stream that lived this long resets the backoff. Default: 30 s.
  absl::Duration stable_after = absl::Seconds(30);
};

class LinkMachine {
 public:
  enum class Phase {
    kBackoff,     // Waiting to (re)connect.
    kConnecting,  // Attempt started; no welcome yet.
    kRegistered,  // Welcome received; heartbeating.
  };
  enum class Action {
    kNone,           // Nothing due before `wake`.
    kConnect,        // Start an attempt now (then call OnConnecting).
    kSendHeartbeat,  // Send a heartbeat now (then call OnHeartbeatSent).
    kAbandon,        // The attempt took too long: cancel it (then OnStreamEnded).
  };
  struct Next {
    Action action = Action::kNone;
    absl::Time wake;  // When to ask again if nothing else happens.
  };

  // `uniform01` returns numbers in [0, 1). The first attempt is due at `now`.
  // REQUIRES: timing's durations are positive, backoff_min <= backoff_max.
  LinkMachine(const LinkTiming& timing, std::function<double()> uniform01, absl::Time now);

  // What is due at `now`. Does not change the state.
  Next Poll(absl::Time now) const;

  void OnConnecting(absl::Time now);
  void OnWelcome(absl::Time now);
  void OnHeartbeatSent(absl::Time now);
  // The stream ended (or the attempt failed or was abandoned): schedules the
  // next attempt after the backoff.
  void OnStreamEnded(absl::Time now);

  Phase phase() const { return phase_; }
  // When the next attempt is due (meaningful in kBackoff).
  absl::Time next_attempt() const { return next_attempt_; }
  // The base of the next backoff wait, before jitter.
  absl::Duration backoff() const { return backoff_; }
  // Attempts that ended without a stable session, in a row.
  int consecutive_failures() const { return failures_; }

 private:
  const LinkTiming timing_;
  const std::function<double()> uniform01_;
  Phase phase_ = Phase::kBackoff;
  absl::Time next_attempt_;
  absl::Time attempt_started_;
  absl::Time registered_at_ = absl::InfinitePast();
  absl::Time next_heartbeat_;
  absl::Duration backoff_;
  int failures_ = 0;
};

}  // namespace sdc::agent::core

#endif  // SDC_AGENT_CORE_LINK_MACHINE_H_
