#include "client/fault_injection.h"

#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/model_digest.h"

namespace sdc::client {

const char* FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kNone:
      return "none";
    case FaultKind::kActivationScale:
      return "activation-scale";
    case FaultKind::kMantissaBitflip:
      return "mantissa-bitflip";
    case FaultKind::kNanGradient:
      return "nan-gradient";
    case FaultKind::kWeight:
      return "weight";
    case FaultKind::kFrozenWeight:
      return "frozen-weight";
    case FaultKind::kOptimizerState:
      return "optimizer-state";
    case FaultKind::kReducedGradient:
      return "reduced-gradient";
    case FaultKind::kReplay:
      return "replay";
    case FaultKind::kReplayError:
      return "replay-error";
    case FaultKind::kScanError:
      return "scan-error";
    case FaultKind::kExchangeError:
      return "exchange-error";
    case FaultKind::kCorruptTransfer:
      return "corrupt-transfer";
    case FaultKind::kSoftwareStack:
      return "software-stack";
    case FaultKind::kLateAuditReports:
      return "late-audit-reports";
    case FaultKind::kProduct:
      return "product";
    case FaultKind::kProductColumn:
      return "product-column";
    case FaultKind::kShardUpdate:
      return "shard-update";
  }
  return "unknown";
}

bool FaultPlan::FiresAt(uint32_t r, uint64_t s) const {
  if (!enabled() || r != rank) return false;
  if (step >= 0) return static_cast<int64_t>(s) == step;
  if (from_step >= 0) return static_cast<int64_t>(s) >= from_step;
  // A hash of (seed, step) decides, so every run and every replay agree.
  const uint64_t h = kernels::Mix64(seed * 0x9e3779b97f4a7c15ull + s);
  return static_cast<double>(h >> 11) * 0x1p-53 < probability;
}

std::string FaultPlan::Describe() const {
  std::string when = step >= 0        ? absl::StrCat("at step ", step)
                     : from_step >= 0 ? absl::StrCat("every step from ", from_step)
                                      : absl::StrCat("with probability ", probability, " per step");
  return absl::StrCat(FaultKindName(kind), " on rank ", rank, " ", when,
                      kind == FaultKind::kActivationScale ? absl::StrCat(" (x", magnitude, ")")
                      : kind == FaultKind::kProduct || kind == FaultKind::kShardUpdate
                          ? absl::StrCat(" (relative ", magnitude, ")")
                      : kind == FaultKind::kProductColumn
                          ? absl::StrCat(" (", magnitude, " x its column's checksum scale)")
                                                          : "");
}

absl::StatusOr<FaultPlan> ParseFaultSpec(const std::string& spec) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("fault spec '", spec, "': ", why));
  };
  if (parts.size() < 3 || parts.size() > 4) return bad("expected KIND:RANK:WHEN[:MAGNITUDE]");
  FaultPlan p;
  static const std::pair<const char*, FaultKind> kKinds[] = {
      {"activation-scale", FaultKind::kActivationScale},
      {"mantissa-bitflip", FaultKind::kMantissaBitflip},
      {"nan-gradient", FaultKind::kNanGradient},
      {"weight", FaultKind::kWeight},
      {"frozen-weight", FaultKind::kFrozenWeight},
      {"optimizer-state", FaultKind::kOptimizerState},
      {"reduced-gradient", FaultKind::kReducedGradient},
      {"replay", FaultKind::kReplay},
      {"replay-error", FaultKind::kReplayError},
      {"scan-error", FaultKind::kScanError},
      {"exchange-error", FaultKind::kExchangeError},
      {"corrupt-transfer", FaultKind::kCorruptTransfer},
      {"software-stack", FaultKind::kSoftwareStack},
      {"late-audit-reports", FaultKind::kLateAuditReports},
      {"product", FaultKind::kProduct},
      {"product-column", FaultKind::kProductColumn},
      {"shard-update", FaultKind::kShardUpdate}};
  for (const auto& [name, kind] : kKinds) {
    if (parts[0] == name) p.kind = kind;
  }
  if (p.kind == FaultKind::kNone) return bad(absl::StrCat("unknown kind '", parts[0], "'"));
  if (!absl::SimpleAtoi(parts[1], &p.rank)) return bad("RANK must be a non-negative integer");
  const std::string& when = parts[2];
  if (absl::StartsWith(when, "step=")) {
    if (!absl::SimpleAtoi(when.substr(5), &p.step) || p.step < 0) return bad("bad step=N");
  } else if (absl::StartsWith(when, "from=")) {
    if (!absl::SimpleAtoi(when.substr(5), &p.from_step) || p.from_step < 0) return bad("bad from=N");
  } else if (absl::StartsWith(when, "p=")) {
    if (!absl::SimpleAtod(when.substr(2), &p.probability) || p.probability < 0 ||
        p.probability > 1) {
      return bad("p=X needs 0 <= X <= 1");
    }
  } else {
    return bad("WHEN must be step=N, from=N or p=X");
  }
  if (p.kind == FaultKind::kProduct || p.kind == FaultKind::kProductColumn) p.magnitude = 0x1p-6;
  if (p.kind == FaultKind::kShardUpdate) p.magnitude = 0x1p-10;
  if (parts.size() == 4) {
    int exponent = 0;
    if (absl::StartsWith(parts[3], "2^") && absl::SimpleAtoi(parts[3].substr(2), &exponent) &&
        exponent >= -1000 && exponent <= 1000) {
      p.magnitude = std::ldexp(1.0, exponent);
    } else if (!absl::SimpleAtod(parts[3], &p.magnitude)) {
      return bad("MAGNITUDE must be a number or 2^E");
    }
  }
  return p;
}

absl::StatusOr<std::vector<FaultPlan>> ParseFaultSpecs(const std::string& specs) {
  std::vector<FaultPlan> plans;
  for (absl::string_view spec : absl::StrSplit(specs, ',')) {
    absl::StatusOr<FaultPlan> plan = ParseFaultSpec(std::string(spec));
    if (!plan.ok()) return plan.status();
    for (const FaultPlan& p : plans) {
      if (p.rank == plan->rank) {
        return absl::InvalidArgumentError(
            absl::StrCat("fault specs '", specs, "': rank ", p.rank, " is named twice"));
      }
    }
    plan->seed = 1 + plan->rank;
    plans.push_back(*plan);
  }
  return plans;
}

FaultPlan FaultFor(const std::vector<FaultPlan>& plans, uint32_t rank) {
  for (const FaultPlan& p : plans) {
    if (p.rank == rank) return p;
  }
  return FaultPlan{};
}

}  // namespace sdc::client
