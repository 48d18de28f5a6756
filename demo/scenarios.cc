#include "demo/scenarios.h"

#include <algorithm>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::demo {

const std::vector<Scenario>& Scenarios() {
  static const auto* const kScenarios = new std::vector<Scenario>{
      {"clean", "no fault: every check passes, no alarm", "", 0, false, false, false, false},
      {"nan-gradient", "one GPU writes NaN into its local gradients at one step",
       "nan-gradient:{rank}:step={step}"},
      {"activation-x10000",
       "one activation multiplied by 10,000 on one GPU at one step (AWS's own test)",
       "activation-scale:{rank}:step={step}:10000"},
      {"mantissa-bitflip", "a one-bit mantissa error in one activation: a small finite error",
       "mantissa-bitflip:{rank}:step={step}"},
      {"weight-corruption", "one weight flipped on one GPU right after an optimizer step",
       "weight:{rank}:step={step}"},
      {"reduced-gradient",
       "one GPU receives different reduced gradients from the all-reduce: the step is skipped "
       "and the GPU is a suspect (the bad data may come from elsewhere; targeted audits decide)",
       "reduced-gradient:{rank}:step={step}", 0, false, true, false, false},
      {"faulty-replayer", "a GPU that is wrong only when it replays a peer's micro-batch",
       "replay:{rank}:from={step}", 0, false, true, true, true},
      {"intermittent",
       "one GPU corrupts finite values intermittently (20% of its steps): the hard case",
       "mantissa-bitflip:{rank}:p=0.2", 0, false, true, true, true},
      {"two-node",
       "2 nodes: a finite fault is detected, but nobody can be named (needs 3 nodes)",
       "activation-scale:{rank}:step={step}:10000", 2, false, true, false, false},
      {"coordinator-restart",
       "sdcd is killed (kill -9) and restarted mid-run; a fault after the restart is still caught",
       "activation-scale:{rank}:step={step}:10000", 0, true},
      {"coordinator-late",
       "the intermittent fault, with sdcd started after the trainers' first steps: the ranks "
       "hold their reports until it is there, and it ends with the same incidents and request",
       "mantissa-bitflip:{rank}:p=0.2", 0, false, true, true, true, "", 0, true},
      // Issue 24's cases.
      {"nan-micro-batch",
       "NaN in a step of 2 accumulated micro-batches: not replayable as it ran (a later "
       "micro-batch nobody holds), so the GPU is a suspect, not blamed",
       "nan-gradient:{rank}:step={step}", 0, false, true, false, false, "", 2},
      {"small-world-systemic",
       "4 ranks whose every replay differs (a non-deterministic model): systemic, nobody blamed",
       "replay:0:from={step},replay:1:from={step},replay:2:from={step},replay:3:from={step}", 2,
       false, true, false, false},
      {"buffer-model",
       "a model whose forward reads the running mean it updates; an activation fault there is "
       "named by replays that start from the subject's buffers",
       "activation-scale:{rank}:step={step}:10000", 0, false, true, true, false, "center-mlp"},
      {"frozen-weight",
       "a frozen parameter (requires_grad off) flipped on one GPU: the weight vote names and "
       "repairs it",
       "frozen-weight:{rank}:step={step}", 0, false, true, true, false, "frozen-mlp"},
      {"optimizer-state",
       "one GPU's optimizer state (Adam's moments) flipped after a step: named by the "
       "checkpoint's vote on the optimizer state, or by the weights it corrupts at the next "
       "optimizer step, before any checkpoint holds it",
       "optimizer-state:{rank}:step={step}", 0, false, true, true, false, "bn-mlp"},
      {"nondeterministic-op",
       "a model with an op that has no deterministic implementation: audits turn off at the "
       "first audit step, training goes on, and a NaN is still caught: its GPU a suspect, "
       "since no replay there can confirm it (issue 39, case 8)",
       "nan-gradient:{rank}:step={step}", 0, false, true, false, false, "put-mlp"},
      // Issue 39's cases.
      // The two faults differ (x10000, x3000), as two faulty GPUs' errors do:
      // two GPUs wrong in the same bits are a majority no vote can overrule.
      {"two-faulty-of-three",
       "3 nodes of one GPU, two of them faulty at the same step: every comparison of the ring "
       "mismatches; nobody is named, all are suspects, the provisional checkpoint is revoked",
       "activation-scale:{rank}:step={step}:10000,activation-scale:{next}:step={step}:3000", 3,
       false, true, false, false, "", 0, false, 1, "inconclusive"},
      {"software-stack",
       "one rank on another software stack (emulated: another driver and cuBLAS in its Hello, "
       "one activation rounded differently on every forward): a software mismatch, no GPU "
       "named",
       "software-stack:{rank}:from=0", 0, false, true, false, false, "", 0, false, 0,
       "software_mismatch"},
      {"corrupt-transfer",
       "one bit of a subject's micro-batch flips on its way to its replayer: the checksum "
       "refuses it as a corrupted transfer, no replayer named",
       "corrupt-transfer:{rank}:step={step}", 0, false, true, false, false, "", 0, false, 0,
       "corrupted_transfer"},
      {"late-tiebreak",
       "the activation fault, with the next rank's audit results reaching sdcd after the "
       "tie-break results (a per-stream race): the early tie-breaks are kept, the GPU named",
       "activation-scale:{rank}:step={step}:10000,late-audit-reports:{next}:step={step}"},
      // Issue 44's buddy check (--layout=fsdp).
      {"shard-update",
       "one GPU's optimizer update of its own shard wrong in one element (FSDP: no replica "
       "holds that shard): a buddy on another node recomputes the update, a third node says "
       "who is wrong",
       "shard-update:{rank}:step={step}"},
      // Issue 42's whole loop.
      {"replace-and-resume",
       "the activation fault, then the whole loop: the request approved with sdcctl, the node "
       "replaced by a fresh one, every rank restarted as attempt 1 from the newest final "
       "checkpoint, trained to the end clean",
       "activation-scale:{rank}:step={step}:10000", 0, false, true, true, false, "", 0, false, 0,
       "", true},
  };
  return *kScenarios;
}

std::optional<Scenario> FindScenario(const std::string& name) {
  for (const Scenario& s : Scenarios()) {
    if (s.name == name) return s;
  }
  return std::nullopt;
}

// The sharded layouts (fsdp, hsdp) replay audits with every rank replaying
// at once (shard_replay.py), so a finite fault in the forward is caught on
// an audit step as under DDP; their weight checks are HSDP's vote per shard
// across the nodes and FSDP's buddy check and at-rest comparison. ZeRO is
// DDP (every check) plus the buddy check of each rank's partition. tp (dp
// nodes x tp GPUs) is HSDP's per tp shard, its replays whole tp groups: an
// activation fault makes its tp group the suspects (tensor_parallel.py).
// The shard-update fault is the buddy check's (fsdp, zero); scenarios that
// depend on the engine's own replays (a faulty replayer, a corrupted
// transfer, targeted audits), micro-batches, another model or a restart
// are DDP's (README, "Layouts").
absl::StatusOr<Scenario> ScenarioOnLayout(const std::string& layout, Scenario s) {
  if (s.name == "shard-update" && layout != "fsdp" && layout != "zero") {
    return absl::InvalidArgumentError(
        "--scenario=shard-update: the buddy check's fault, on --layout=fsdp or zero");
  }
  if (layout == "ddp") return s;
  static const char* const kRuns[] = {"clean", "nan-gradient", "weight-corruption",
                                      "shard-update", "activation-x10000", "mantissa-bitflip",
                                      "intermittent"};
  if (std::find(std::begin(kRuns), std::end(kRuns), s.name) == std::end(kRuns)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--scenario=", s.name, " runs on --layout=ddp; on ", layout, ": ",
        absl::StrJoin(std::begin(kRuns), std::end(kRuns), ", ")));
  }
  return s;
}

}  // namespace sdc::demo
