#ifndef SDC_CLIENT_FAULT_INJECTION_H_
#define SDC_CLIENT_FAULT_INJECTION_H_

// Software fault injection, for tests and demos only. Off by default, and
// impossible to enable by accident: it needs both SDC_INJECT_FAULT=<spec>
// and SDC_ALLOW_FAULT_INJECTION=yes-i-am-testing; anything else is an error
// at start, and an armed rank logs a warning on every injection.
//
// Spec: KIND:RANK:WHEN[:MAGNITUDE], e.g. "activation-scale:3:step=40:10000",
// "mantissa-bitflip:3:p=0.05", "nan-gradient:1:step=25". Several faults at
// once (two faulty GPUs, say) are comma-separated specs, one per rank:
// "replay:1:step=15,activation-scale:3:step=15".
//   KIND      activation-scale    multiply one activation by MAGNITUDE (default 10000)
//             mantissa-bitflip    flip a low mantissa bit of one activation (a small finite error)
//             nan-gradient        set one local gradient element to NaN
//             weight              corrupt one weight element after optimizer.step()
//             frozen-weight       the same in the first frozen parameter (requires_grad off)
//             optimizer-state     the same in the optimizer's first floating-point state tensor
//             reduced-gradient    corrupt one element of the reduced gradients on RANK
//             replay              corrupt only the replays RANK computes for peers
//             replay-error        RANK's replays raise (after the forward), as a loss
//                                 function or autograd would
//             scan-error          RANK's check 1 of a local bucket raises
//             exchange-error      RANK, receiving a peer's micro-batch, finds it malformed
//             corrupt-transfer    one bit of RANK's micro-batch flips on its way to its
//                                 audit replayer (after its checksum; the tie-break
//                                 send is intact)
//             software-stack      RANK emulates another software stack: its Hello reports
//                                 another driver and cuBLAS, and every forward it runs
//                                 (its own and replays) rounds one activation differently
//                                 by one ulp, as another cuBLAS's kernels would
//             late-audit-reports  RANK sends its original and replay results to sdcd only
//                                 after the step's tie-breaks and a 2 s pause, so tie-break
//                                 results reach sdcd before them (a per-stream race)
//             product             perturb one element of one matrix product's output
//                                 (forward or backward) by the relative error MAGNITUDE
//                                 (default 2^-6); injected by the every-step checksums
//                                 of either front end (client/product_checks.h)
//             product-column      the same element, perturbed by MAGNITUDE (default 2^-6)
//                                 times its column's checksum scale T_j = (e^T |A| |B|)_j
//                                 (+ m |bias_j|), the quantity the column's threshold is a
//                                 small multiple of (kernels/abft.h: at most about
//                                 K 2^-24 T_j for an fp32 product of K terms), so the error
//                                 is above the threshold by construction (2^18 / K times it
//                                 at 2^-6; a product of zeros gets MAGNITUDE itself); the
//                                 demo's intermittent GPU under --every_step
//             shard-update        multiply one element of RANK's optimizer update of its
//                                 shard by 1 + MAGNITUDE (default 2^-10), inside the slice
//                                 the buddy check verifies at that step (FSDP2 without
//                                 replicas); injected by the Python front end
//                                 (sdc_guard/buddy.py) right after optimizer.step()
//   RANK      the global rank that misbehaves
//   WHEN      step=N (exactly that step), from=N (every step from N on),
//             p=X (each step with probability X, from a seeded generator)
//   MAGNITUDE a number, or a power of two written 2^E (e.g. 2^-8)

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sdc::client {

enum class FaultKind {
  kNone,
  kActivationScale,
  kMantissaBitflip,
  kNanGradient,
  kWeight,
  kFrozenWeight,
  kOptimizerState,
  kReducedGradient,
  kReplay,
  kReplayError,
  kScanError,
  kExchangeError,
  kCorruptTransfer,
  kSoftwareStack,
  kLateAuditReports,
  kProduct,
  kProductColumn,
  kShardUpdate,
};

const char* FaultKindName(FaultKind kind);

struct FaultPlan {
  FaultKind kind = FaultKind::kNone;
  uint32_t rank = 0;
  int64_t step = -1;       // step=N
  int64_t from_step = -1;  // from=N
  double probability = 0;  // p=X
  double magnitude = 10000;
  uint64_t seed = 1;

  bool enabled() const { return kind != FaultKind::kNone; }
  // Whether the fault fires on `rank` at `step` (deterministic in seed).
  bool FiresAt(uint32_t rank, uint64_t step) const;
  std::string Describe() const;
};

// Parses a spec; InvalidArgument with the reason.
absl::StatusOr<FaultPlan> ParseFaultSpec(const std::string& spec);

// Parses comma-separated specs, at most one per rank; each plan's seed is
// 1 + its rank, so every run of a scenario draws the same steps.
absl::StatusOr<std::vector<FaultPlan>> ParseFaultSpecs(const std::string& specs);

// The plan for `rank` among `plans`, or a disabled plan.
FaultPlan FaultFor(const std::vector<FaultPlan>& plans, uint32_t rank);

}  // namespace sdc::client

#endif  // SDC_CLIENT_FAULT_INJECTION_H_
