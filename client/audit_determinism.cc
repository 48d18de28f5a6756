#include "client/audit_determinism.h"

#include <ATen/Context.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace sdc::client {
namespace {

// What libtorch's alert says of an op without a deterministic implementation.
constexpr char kNoDeterministic[] = " does not have a deterministic implementation";

}  // namespace

void AuditDeterminism::Alerts::Install() {
  if (installed_) return;
  previous_ = c10::WarningUtils::get_warning_handler();
  c10::WarningUtils::set_warning_handler(this);
  installed_ = true;
}

void AuditDeterminism::Alerts::Uninstall() {
  if (!installed_) return;
  c10::WarningUtils::set_warning_handler(previous_);
  installed_ = false;
}

void AuditDeterminism::Alerts::process(const c10::Warning& warning) {
  const std::string& msg = warning.msg();
  if (const size_t at = msg.find(kNoDeterministic); at != std::string::npos) {
    if (first_.empty()) {
      first_ = absl::StrCat(msg.substr(0, std::min<size_t>(at, 48)),
                            " has no deterministic implementation");
    }
    return;
  }
  if (previous_ != nullptr) previous_->process(warning);
}

std::string AuditDeterminism::Alerts::Take() { return std::exchange(first_, std::string()); }

AuditDeterminism::AuditDeterminism(const EngineContext& ctx) : ctx_(ctx) {}

AuditDeterminism::~AuditDeterminism() { alerts_.Uninstall(); }

void AuditDeterminism::BeginStep(bool audit) {
  Restore();  // A step that ended without Restore: its setting first.
  saved_ = true;
  before_ = at::globalContext().deterministicAlgorithms();
  warn_only_before_ = at::globalContext().deterministicAlgorithmsWarnOnly();
  noted_.clear();
  alerts_.Uninstall();  // A step that ended in an exception left it installed.
  (void)alerts_.Take();
  if (audit) {
    // Warn-only: an op with no deterministic implementation must not stop
    // training; audits stop instead.
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    alerts_.Install();
  }
}

void AuditDeterminism::Note(const std::string& what) {
  if (noted_.empty()) noted_ = what.substr(0, 200);
}

std::string AuditDeterminism::Noted() {
  const std::string alert = alerts_.Take();
  if (!alert.empty()) Note(alert);
  return noted_;
}

void AuditDeterminism::Restore() {
  alerts_.Uninstall();
  if (!saved_) return;
  saved_ = false;
  at::globalContext().setDeterministicAlgorithms(before_, warn_only_before_);
}

}  // namespace sdc::client
