#ifndef SDC_DAEMON_OPERATORS_H_
#define SDC_DAEMON_OPERATORS_H_

// Who may use sdcd's admin service: the bootstrap "root" token
// (--admin_token_file) and per-operator credentials, each naming one person
// with a role. A decision (approve, deny, resolve) is recorded under the
// name the credential carries, never one the client states.
//
// Operator tokens are 256 random bits; sdcd keeps only their SHA-256. A fast
// hash is enough: password hashes are slow to stop guessing low-entropy
// secrets from a stolen hash, and guessing a 256-bit random token is
// infeasible at any speed. Lookups go by the digest (timing reveals at most
// which digest prefixes exist, which does not help find a preimage), and
// the root token and the final digest match are compared in constant time.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sdc::daemon {

// Ordered: each role may do everything the ones below it may.
enum class Role { kViewer = 1, kOperator = 2, kAdmin = 3 };

// "viewer", "operator", "admin".
const char* RoleName(Role role);
// InvalidArgument naming the accepted values.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// The principal the bootstrap token names.
inline constexpr char kRootName[] = "root";

struct OperatorRecord {
  std::string name;
  Role role = Role::kOperator;
  std::string token_sha256;  // 32 raw bytes.
  absl::Time created;
  std::string created_by;
};

// Where operators are kept (SqliteStore implements it). Calls are rare
// (operators added or removed by hand), so they may block on disk.
class OperatorStore {
 public:
  virtual ~OperatorStore() = default;
  virtual absl::StatusOr<std::vector<OperatorRecord>> LoadOperators() = 0;
  // Inserts; AlreadyExists if the name is taken.
  virtual absl::Status InsertOperator(const OperatorRecord& record) = 0;
  // NotFound if there is no such operator.
  virtual absl::Status DeleteOperator(const std::string& name) = 0;
};

struct Principal {
  std::string name;
  Role role = Role::kViewer;
};

// The SHA-256 of `data`, 32 raw bytes.
std::string Sha256(absl::string_view data);

// Thread-safe. Lookups are served from memory; changes are written to the
// store first and applied in memory only when the store took them.
class Operators {
 public:
  // Reads every operator from `store` (which must outlive this). An empty
  // `root_token` accepts no root token (client certificates only).
  static absl::StatusOr<std::unique_ptr<Operators>> Load(OperatorStore* store,
                                                         std::string root_token);

  // The principal `token` names: root for the bootstrap token, else the
  // operator whose token hashes to the same digest. nullopt: none.
  std::optional<Principal> ByToken(absl::string_view token) const;
  // The operator a verified client certificate's common name names.
  std::optional<Principal> ByName(absl::string_view name) const;

  // Adds `name` with a fresh token, returned once. InvalidArgument for a
  // bad name ([A-Za-z0-9._@-]{1,64}), AlreadyExists for a taken one or
  // "root", Internal if no random bytes could be had.
  absl::StatusOr<std::pair<OperatorRecord, std::string>> Add(const std::string& name, Role role,
                                                             const std::string& created_by,
                                                             absl::Time now);
  // NotFound for an unknown name; returns the removed operator.
  absl::StatusOr<OperatorRecord> Remove(const std::string& name);
  // By name.
  std::vector<OperatorRecord> List() const;

 private:
  Operators(OperatorStore* store, std::string root_token)
      : store_(store), root_token_(std::move(root_token)) {}

  OperatorStore* const store_;
  const std::string root_token_;
  mutable absl::Mutex mu_;
  std::map<std::string, OperatorRecord> by_name_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> name_by_digest_ ABSL_GUARDED_BY(mu_);
};

// An in-memory OperatorStore for tests.
class MemoryOperatorStore : public OperatorStore {
 public:
  absl::StatusOr<std::vector<OperatorRecord>> LoadOperators() override;
  absl::Status InsertOperator(const OperatorRecord& record) override;
  absl::Status DeleteOperator(const std::string& name) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, OperatorRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_OPERATORS_H_
