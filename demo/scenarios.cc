#include "demo/scenarios.h"

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
       "first audit step, training goes on, and a NaN is still caught and named",
       "nan-gradient:{rank}:step={step}", 0, false, true, true, false, "put-mlp"},
  };
  return *kScenarios;
}

std::optional<Scenario> FindScenario(const std::string& name) {
  for (const Scenario& s : Scenarios()) {
    if (s.name == name) return s;
  }
  return std::nullopt;
}

}  // namespace sdc::demo
