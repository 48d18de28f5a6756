#ifndef SDC_PROTOCOL_CHECKPOINT_LEDGER_H_
#define SDC_PROTOCOL_CHECKPOINT_LEDGER_H_

// Where a job's checkpoints stand. A checkpoint the gate allowed is
// provisional: a finite fault on a step no audit saw may be in it. The next
// allowed checkpoint confirms it (the job passed one more interval of
// checks); an incident that points at hardware first revokes it, and a
// revoked step stays revoked.
//
// The coordinator keeps one per job (it allows and revokes); each trainer
// keeps one too, learning confirmations and revocations from the
// coordinator's answers and applying the same confirmation rule to what the
// in-band vote allowed while the coordinator was unreachable.

#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "protocol/types.h"

namespace sdc::protocol {

class CheckpointLedger {
 public:
  enum class Standing { kFinal, kProvisional, kRevoked };

  // A checkpoint of `step` was allowed: the provisional one before it is
  // confirmed, and `step` becomes provisional (unless it was revoked). The
  // same step again changes nothing.
  void Allowed(Step step);
  // Revokes the provisional checkpoint; returns its step, or nullopt when
  // none was provisional.
  std::optional<Step> RevokeProvisional();
  // Forgets the provisional checkpoint without revoking it: a new attempt
  // of the job resumed from an earlier step, so its later checkpoints do
  // not confirm it and its step may be checkpointed again. Returns its step,
  // or nullopt when none was provisional.
  std::optional<Step> AbandonProvisional();
  // Forgets that `step` was revoked: a new attempt resumed from an earlier
  // step, so a checkpoint it takes of `step` holds other weights (the
  // revocation stays in the job's history, not in this ledger). Returns
  // whether `step` was revoked.
  bool ForgetRevocation(Step step);
  // What the coordinator said (confirmed_through_step, revoked_steps). Never
  // lowers what is confirmed.
  void Learn(Step confirmed_through, absl::Span<const Step> revoked);

  // What a checkpoint of `step`, allowed earlier, is now.
  Standing Of(Step step) const;
  Step confirmed_through() const { return confirmed_through_; }  // 0: none.
  std::optional<Step> provisional() const { return provisional_; }
  const std::vector<Step>& revoked() const { return revoked_; }  // Ascending.

 private:
  bool IsRevoked(Step step) const;
  void Revoke(Step step);

  Step confirmed_through_ = 0;
  std::optional<Step> provisional_;
  std::vector<Step> revoked_;
};

}  // namespace sdc::protocol

#endif  // SDC_PROTOCOL_CHECKPOINT_LEDGER_H_
