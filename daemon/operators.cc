#include "daemon/operators.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace sdc::daemon {
namespace {

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' &&
        ch != '@' && ch != '-') {
      return false;
    }
  }
  return true;
}

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kOperator:
      return "operator";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kViewer, Role::kOperator, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role \"", name, "\" (want viewer, operator or admin)"));
}

std::string Sha256(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

absl::StatusOr<std::unique_ptr<Operators>> Operators::Load(OperatorStore* store,
                                                           std::string root_token,
                                                           int approvals_required) {
  absl::StatusOr<std::vector<OperatorRecord>> records = store->LoadOperators();
  if (!records.ok()) return records.status();
  std::unique_ptr<Operators> ops(
      new Operators(store, std::move(root_token), approvals_required));
  absl::MutexLock lock(&ops->mu_);
  for (OperatorRecord& r : *records) {
    ops->name_by_digest_[r.token_sha256] = r.name;
    std::string name = r.name;
    ops->by_name_[name] = std::move(r);
  }
  return ops;
}

std::optional<Principal> Operators::ByToken(absl::string_view token) const {
  if (token.empty()) return std::nullopt;
  if (!root_token_.empty() && ConstantTimeEqual(token, root_token_)) {
    return Principal{kRootName, Role::kAdmin, /*person=*/false, /*pending=*/false};
  }
  const std::string digest = Sha256(token);
  absl::MutexLock lock(&mu_);
  auto it = name_by_digest_.find(digest);
  if (it == name_by_digest_.end()) return std::nullopt;
  const OperatorRecord& r = by_name_.at(it->second);
  if (!ConstantTimeEqual(r.token_sha256, digest)) return std::nullopt;
  const bool active = Active(r);
  return Principal{r.name, r.role, active, !active};
}

std::optional<Principal> Operators::ByName(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return Principal{it->second.name, it->second.role, /*person=*/true, /*pending=*/false};
}

bool Operators::Active(const OperatorRecord& r) const {
  if (!two_person()) return true;
  return !r.approved_by.empty() && r.approved_by != r.created_by;
}

int Operators::ActiveAdmins() const {
  int n = 0;
  for (const auto& [name, r] : by_name_) n += r.role == Role::kAdmin && Active(r) ? 1 : 0;
  return n;
}

absl::StatusOr<std::pair<OperatorRecord, std::string>> Operators::Add(
    const std::string& name, Role role, const Principal& by, absl::Time now) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad operator name \"", absl::CHexEscape(name.substr(0, 80)),
        "\" (1 to 64 of letters, digits and . _ @ -)"));
  }
  if (name == kRootName) {
    return absl::AlreadyExistsError("\"root\" is the bootstrap token's name");
  }
  unsigned char random[32];
  if (RAND_bytes(random, sizeof(random)) != 1) {
    return absl::InternalError("no random bytes for a token");
  }
  const std::string token =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(random), 32));
  OperatorRecord record{name, role, Sha256(token), now, by.name, ""};
  absl::MutexLock lock(&mu_);
  if (by_name_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("operator ", name, " already exists"));
  }
  if (!two_person()) {
    record.approved_by = by.name;
  } else if (!by.person) {
    // root, a shared secret, vouches for nobody once the admins exist.
    if (role != Role::kAdmin || ActiveAdmins() >= approvals_required_) {
      return absl::PermissionDeniedError(absl::StrCat(
          "under two-person approval root enrolls only the first ", approvals_required_,
          " admins (", ActiveAdmins(), " exist); an admin adds operators now, and a second "
          "admin consents (sdcctl operator approve NAME)"));
    }
    record.approved_by = kBootstrapConsent;
  }
  if (absl::Status s = store_->InsertOperator(record); !s.ok()) return s;
  name_by_digest_[record.token_sha256] = name;
  by_name_[name] = record;
  return std::make_pair(record, token);
}

absl::StatusOr<OperatorRecord> Operators::Approve(const std::string& name,
                                                  const Principal& by) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no operator ", absl::CHexEscape(name.substr(0, 80))));
  }
  OperatorRecord& r = it->second;
  if (!two_person()) {
    return absl::FailedPreconditionError(
        "enrollments need no consent unless sdcd runs with --approvals_required >= 2");
  }
  if (Active(r)) {
    return absl::FailedPreconditionError(
        absl::StrCat("operator ", name, " is already active (consent: ", r.approved_by, ")"));
  }
  std::string consent = by.name;
  if (!by.person) {
    if (r.role != Role::kAdmin || ActiveAdmins() >= approvals_required_) {
      return absl::PermissionDeniedError(
          "root is not a person: a second admin consents to an enrollment");
    }
    consent = kBootstrapConsent;
  } else if (by.name == r.created_by) {
    return absl::FailedPreconditionError(absl::StrCat(
        by.name, " added operator ", name, "; a second admin must consent"));
  }
  if (absl::Status s = store_->ApproveOperator(name, consent); !s.ok()) return s;
  r.approved_by = consent;
  return r;
}

absl::StatusOr<OperatorRecord> Operators::Remove(const std::string& name, const Principal& by) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no operator ", absl::CHexEscape(name.substr(0, 80))));
  }
  if (two_person()) {
    if (!by.person) {
      return absl::PermissionDeniedError(
          "under two-person approval root manages no operators once the admins exist");
    }
    if (it->second.role == Role::kAdmin && Active(it->second) &&
        ActiveAdmins() <= approvals_required_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "removing admin ", name, " would leave ", ActiveAdmins() - 1,
          " admins, fewer than two-person approval needs (", approvals_required_,
          "): add and approve another admin first"));
    }
  }
  if (absl::Status s = store_->DeleteOperator(name); !s.ok()) return s;
  OperatorRecord removed = it->second;
  name_by_digest_.erase(removed.token_sha256);
  by_name_.erase(it);
  return removed;
}

std::vector<OperatorRecord> Operators::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<OperatorRecord> out;
  for (const auto& [name, r] : by_name_) out.push_back(r);
  return out;
}

absl::StatusOr<std::vector<OperatorRecord>> MemoryOperatorStore::LoadOperators() {
  absl::MutexLock lock(&mu_);
  std::vector<OperatorRecord> out;
  for (const auto& [name, r] : records_) out.push_back(r);
  return out;
}

absl::Status MemoryOperatorStore::InsertOperator(const OperatorRecord& record) {
  absl::MutexLock lock(&mu_);
  if (!records_.emplace(record.name, record).second) {
    return absl::AlreadyExistsError(absl::StrCat("operator ", record.name, " already exists"));
  }
  return absl::OkStatus();
}

absl::Status MemoryOperatorStore::ApproveOperator(const std::string& name,
                                                  const std::string& approved_by) {
  absl::MutexLock lock(&mu_);
  auto it = records_.find(name);
  if (it == records_.end()) return absl::NotFoundError(absl::StrCat("no operator ", name));
  it->second.approved_by = approved_by;
  return absl::OkStatus();
}

absl::Status MemoryOperatorStore::DeleteOperator(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (records_.erase(name) == 0) return absl::NotFoundError(absl::StrCat("no operator ", name));
  return absl::OkStatus();
}

}  // namespace sdc::daemon
