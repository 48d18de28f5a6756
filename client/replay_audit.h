#ifndef SDC_CLIENT_REPLAY_AUDIT_H_
#define SDC_CLIENT_REPLAY_AUDIT_H_

// Check 2, the replay audit, as one rank takes part in it:
//   - which plan a step runs: the schedule (every options.audit_every steps,
//     the full plan of protocol::PlanFullAudit) and the targeted plans sdcd
//     sends, each run at the first unscheduled step once every rank holds
//     it (the agreement carries plans_held), and sdcd's watch of a rank
//     named faulty whose replacement is pending, run on every step that
//     runs no other audit;
//   - the subject's record of what it trained on: the first micro-batch's
//     loss bits, its local gradients' fingerprints (RecordOriginalGradients,
//     possibly from autograd's threads) and the buffers its forward left;
//   - Preflight: at the first audit, a replay of this rank's own
//     micro-batch compared with what it trained on, so a loss function that
//     does not reproduce training (autocast outside it, a token-weighted
//     loss, a term added outside) stops the job with the reason instead of
//     making every audit systemic; after a first difference the engine
//     re-arms it (RetryPreflight) for the next audit step, as a transient
//     fault on that step looks the same in one try;
//   - Run: the exchange and replays (PeerReplay), every rank's results
//     all-gathered and judged in-band with the coordinator's own rules
//     (InBandVerdict, step_core.h: what happens when a replay mismatches),
//     the tie-breaks that verdict names, the results sent to sdcd and its
//     verdict taken when already here;
//   - the confirmation replay of a lone rank's NaN/Inf.
//
// Thread-safe for WantsOriginalGradients, RecordOriginalGradients and
// auditing (they take a lock: autograd's threads and the DDP hook call
// them during backward); everything else is the training thread's.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/engine_context.h"
#include "client/engine_types.h"
#include "client/model_tensors.h"
#include "client/peer_replay.h"
#include "client/step_core.h"
#include "protocol/replay_plan.h"
#include "kernels/fingerprint.h"

namespace sdc::client {

class ReplayAudit {
 public:
  // REQUIRES: the arguments outlive this.
  ReplayAudit(const EngineContext& ctx, const ModelTensors& model, PeerReplay& replay);

  // Starts `step`: forgets the previous record and chooses the step's plan,
  // if any (none once audits are off).
  void BeginStep(const StepContext& step);
  // Whether this step audits (BeginStep's choice, until TurnOff).
  bool auditing() const;

  // A plan from sdcd (its assignments, replayer and subject): a one-off
  // targeted audit, or with `watch` a standing watch run on every step that
  // runs no other audit, until a later watch replaces it (PlanQueue).
  // `group`: the replica group it assigns; a plan of another group is held
  // (ids stay contiguous) and run with nothing to replay (PlanQueue).
  void AddPlan(uint64_t plan_id, const std::vector<protocol::Assignment>& assignments,
               bool watch, uint32_t group);
  // The highest contiguous plan id this rank holds (agreement input).
  uint64_t plans_held() const { return queue_.held(); }
  // The agreement's minimum over ranks: plans up to it may run.
  void PlansHeldByAll(uint64_t plans_held_by_all) { plans_held_by_all_ = plans_held_by_all; }

  // Replay audits stop for the job from this step on (`why` is recorded,
  // and logged with the step).
  void TurnOff(const StepContext& step, const std::string& why);
  // Why audits are off; empty while they are on.
  const std::string& off_reason() const { return off_; }

  // The first micro-batch's loss bits (LossBits), after its backward; on
  // audit steps also fingerprints the buffers as its forward left them.
  // Throws c10::Error on a kernel failure.
  void RecordFirstMicroBatch(uint64_t loss_bits);
  // True on audit steps until the first micro-batch's local gradients are
  // recorded.
  bool WantsOriginalGradients() const;
  // Fingerprints the gradients of the parameters at `indices`; a parameter
  // never given counts as no gradient. Throws c10::Error when the lists'
  // sizes differ, an index is out of range, or a kernel fails.
  void RecordOriginalGradients(const std::vector<size_t>& indices,
                               const std::vector<torch::Tensor>& gradients);

  // What a preflight found on this rank.
  struct Preflight {
    bool loss_differs = false;
    bool gradients_differ = false;
    bool buffers_differ = false;
  };
  // True at the first audit step that has this rank's original record,
  // until Preflight ran (and again after RetryPreflight).
  bool WantsPreflight() const;
  // The preflight runs again at the next audit step (the engine's second
  // try after a first difference).
  void RetryPreflight() { preflight_done_ = false; }
  // Replays this rank's own first micro-batch and compares its loss bits,
  // gradient and buffer fingerprints with what the rank trained on. Local
  // (no collective). The error of the replay when it raised.
  absl::StatusOr<Preflight> RunPreflight();

  // The audit of this step (REQUIRES: auditing()). Collective: the
  // exchange, one small all-gather, then the tie-breaks. Sets
  // decision.audit_outcome and audit_unverified, and view.audit_mismatch.
  // Returns the first error this rank met (a replay that raised, a
  // malformed message: Internal); the all-gather runs whatever happened, and
  // tells every rank that this rank failed (then no rank judges the audit:
  // audit_outcome "failed"), so no rank waits on another. Only a failure of
  // the all-gather itself returns before it.
  absl::Status Run(const StepContext& step, StepDecision& decision, LocalView& view);

  // After the agreement: when exactly one rank's local gradients held
  // NaN/Inf, a rank of another domain replays its micro-batch (collective
  // over the pair) and reports the result. Only a step of one micro-batch
  // can be replayed as it ran: with accumulation the NaN may come from a
  // later micro-batch nobody holds, and a finite replay of the first would
  // wrongly clear the GPU. Nor where replay audits are off for the job
  // (turned off because an op has no deterministic implementation, or
  // audit_every 0): a replay there proves nothing. Then no replay runs and
  // this returns why (for StepReport::no_confirmation, so sdcd decides at
  // once and keeps the rank a suspect); empty otherwise. A failure of the
  // replay is logged and returned as the reason, not as an error: the step
  // is skipped on every rank anyway, and an error returned by one rank here,
  // after the agreement, would leave the others in the next collective.
  std::string ConfirmLoneNonFinite(const StepContext& step, const Agreement& agreement);

  // audits, audits_unverified, audit_mismatches, audits_off.
  void Summarize(GuardSummary& summary) const;

 private:
  // The first micro-batch's gradient fingerprints as recorded (absent
  // ones: zeros' fingerprint, as a replay's); `recorded` says whether any were.
  std::vector<kernels::Fingerprint> OriginalGradients(bool* recorded) const;

  const EngineContext& ctx_;
  const ModelTensors& model_;
  PeerReplay& replay_;

  // The step's plan.
  protocol::ReplayPlan plan_;
  uint64_t plan_id_ = 0;  // 0: the scheduled plan.
  // Targeted plans and watches, agreed in-band.
  std::map<uint64_t, protocol::ReplayPlan> plans_;
  PlanQueue queue_;
  uint64_t plans_held_by_all_ = 0;
  std::string off_;
  bool preflight_done_ = false;

  // The subject's record.
  uint64_t original_loss_bits_ = 0;
  std::vector<kernels::Fingerprint> original_buffers_;

  uint64_t audits_ = 0;
  uint64_t unverified_ = 0;
  uint64_t mismatches_ = 0;
  uint64_t software_mismatches_ = 0;  // Mismatches explained by a stack difference.

  mutable absl::Mutex mu_;
  bool auditing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<kernels::Fingerprint> original_gradients_ ABSL_GUARDED_BY(mu_);
  bool original_recorded_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_REPLAY_AUDIT_H_
