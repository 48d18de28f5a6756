#include "protocol/checkpoint_ledger.h"

#include <algorithm>

namespace sdc::protocol {

void CheckpointLedger::Allowed(Step step) {
  if (provisional_.has_value() && *provisional_ < step) {
    confirmed_through_ = std::max(confirmed_through_, *provisional_);
  }
  if (!IsRevoked(step)) provisional_ = step;
}

std::optional<Step> CheckpointLedger::RevokeProvisional() {
  const std::optional<Step> step = provisional_;
  if (step.has_value()) Revoke(*step);
  return step;
}

std::optional<Step> CheckpointLedger::AbandonProvisional() {
  const std::optional<Step> step = provisional_;
  provisional_.reset();
  return step;
}

bool CheckpointLedger::ForgetRevocation(Step step) {
  auto it = std::lower_bound(revoked_.begin(), revoked_.end(), step);
  if (it == revoked_.end() || *it != step) return false;
  revoked_.erase(it);
  return true;
}

void CheckpointLedger::Learn(Step confirmed_through, absl::Span<const Step> revoked) {
  for (Step step : revoked) Revoke(step);
  confirmed_through_ = std::max(confirmed_through_, confirmed_through);
}

CheckpointLedger::Standing CheckpointLedger::Of(Step step) const {
  if (IsRevoked(step)) return Standing::kRevoked;
  return step <= confirmed_through_ ? Standing::kFinal : Standing::kProvisional;
}

bool CheckpointLedger::IsRevoked(Step step) const {
  return std::binary_search(revoked_.begin(), revoked_.end(), step);
}

void CheckpointLedger::Revoke(Step step) {
  if (provisional_ == step) provisional_.reset();
  if (IsRevoked(step)) return;
  revoked_.insert(std::upper_bound(revoked_.begin(), revoked_.end(), step), step);
}

}  // namespace sdc::protocol
