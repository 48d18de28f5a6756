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
                                                           std::string root_token) {
  absl::StatusOr<std::vector<OperatorRecord>> records = store->LoadOperators();
  if (!records.ok()) return records.status();
  std::unique_ptr<Operators> ops(new Operators(store, std::move(root_token)));
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
    return Principal{kRootName, Role::kAdmin};
  }
  const std::string digest = Sha256(token);
  absl::MutexLock lock(&mu_);
  auto it = name_by_digest_.find(digest);
  if (it == name_by_digest_.end()) return std::nullopt;
  const OperatorRecord& r = by_name_.at(it->second);
  if (!ConstantTimeEqual(r.token_sha256, digest)) return std::nullopt;
  return Principal{r.name, r.role};
}

std::optional<Principal> Operators::ByName(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return Principal{it->second.name, it->second.role};
}

absl::StatusOr<std::pair<OperatorRecord, std::string>> Operators::Add(
    const std::string& name, Role role, const std::string& created_by, absl::Time now) {
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
  OperatorRecord record{name, role, Sha256(token), now, created_by};
  absl::MutexLock lock(&mu_);
  if (by_name_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("operator ", name, " already exists"));
  }
  if (absl::Status s = store_->InsertOperator(record); !s.ok()) return s;
  name_by_digest_[record.token_sha256] = name;
  by_name_[name] = record;
  return std::make_pair(record, token);
}

absl::StatusOr<OperatorRecord> Operators::Remove(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("no operator ", absl::CHexEscape(name.substr(0, 80))));
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

absl::Status MemoryOperatorStore::DeleteOperator(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (records_.erase(name) == 0) return absl::NotFoundError(absl::StrCat("no operator ", name));
  return absl::OkStatus();
}

}  // namespace sdc::daemon
