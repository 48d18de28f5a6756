#ifndef SDC_DAEMON_OPERATORS_H_
#define SDC_DAEMON_OPERATORS_H_

// Who may use sdcd's admin service: the bootstrap "root" token
// (--admin_token_file) and per-operator credentials, each naming one person
// with a role. A decision (approve, deny, resolve) is recorded under the
// name the credential carries, never one the client states.
//
// Two people, really (two-person mode, sdcd --approvals_required >= 2): a
// token names a person only if two admins vouched for its enrollment, the
// one who added it and a second one who consented (Approve); until then it
// authenticates nobody. root is a shared secret, not a person: it enrolls
// only the first admins (while fewer than approvals_required consented
// admins exist, "bootstrap"), and otherwise may only read. A TLS client
// certificate from the admin CA is an external identity (the CA vouched for
// the person) and needs no consent. One-person mode keeps single-admin
// enrollment; switching to two-person mode leaves those enrollments waiting
// for a second admin's consent.
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
// OperatorRecord::approved_by of the first admins root enrolled.
inline constexpr char kBootstrapConsent[] = "(bootstrap)";

struct OperatorRecord {
  std::string name;
  Role role = Role::kOperator;
  std::string token_sha256;  // 32 raw bytes.
  absl::Time created;
  std::string created_by;
  // Who consented to the enrollment: a second admin, kBootstrapConsent, or
  // in one-person mode created_by itself. Empty: nobody yet.
  std::string approved_by;
};

// Where operators are kept (SqliteStore implements it). Calls are rare
// (operators added or removed by hand), so they may block on disk.
class OperatorStore {
 public:
  virtual ~OperatorStore() = default;
  virtual absl::StatusOr<std::vector<OperatorRecord>> LoadOperators() = 0;
  // Inserts; AlreadyExists if the name is taken.
  virtual absl::Status InsertOperator(const OperatorRecord& record) = 0;
  // Sets approved_by; NotFound if there is no such operator.
  virtual absl::Status ApproveOperator(const std::string& name,
                                       const std::string& approved_by) = 0;
  // NotFound if there is no such operator.
  virtual absl::Status DeleteOperator(const std::string& name) = 0;
};

struct Principal {
  std::string name;
  Role role = Role::kViewer;
  // A separately enrolled person (an operator whose enrollment counts, or a
  // certificate from the admin CA); false for root.
  bool person = false;
  // Two-person mode: an enrollment still waiting for a second admin's
  // consent (it authenticates nobody; admin_auth.h refuses it).
  bool pending = false;
};

// The SHA-256 of `data`, 32 raw bytes.
std::string Sha256(absl::string_view data);

// Thread-safe. Lookups are served from memory; changes are written to the
// store first and applied in memory only when the store took them.
class Operators {
 public:
  // Reads every operator from `store` (which must outlive this). An empty
  // `root_token` accepts no root token (client certificates only).
  // `approvals_required` >= 2 is two-person mode (see the top).
  static absl::StatusOr<std::unique_ptr<Operators>> Load(OperatorStore* store,
                                                         std::string root_token,
                                                         int approvals_required = 1);

  // The principal `token` names: root for the bootstrap token, else the
  // operator whose token hashes to the same digest (pending when its
  // enrollment waits for consent). nullopt: none.
  std::optional<Principal> ByToken(absl::string_view token) const;
  // The operator a verified admin-CA certificate names (its subject
  // alternative name): a person, whatever its enrollment's consent.
  std::optional<Principal> ByName(absl::string_view name) const;

  // `by` adds `name` with a fresh token, returned once. In two-person mode
  // the enrollment waits for a second admin's consent, except for the first
  // admins root enrolls; root may enroll nothing else (PermissionDenied).
  // InvalidArgument for a bad name ([A-Za-z0-9._@-]{1,64}), AlreadyExists
  // for a taken one or "root", Internal if no random bytes could be had.
  absl::StatusOr<std::pair<OperatorRecord, std::string>> Add(const std::string& name, Role role,
                                                             const Principal& by,
                                                             absl::Time now);
  // `by` consents to `name`'s enrollment (two-person mode): `by` must be a
  // person other than the one who added it, or root for an admin while
  // bootstrapping. NotFound, PermissionDenied, FailedPrecondition (already
  // active, or one-person mode, where enrollments need no consent).
  absl::StatusOr<OperatorRecord> Approve(const std::string& name, const Principal& by);
  // `by` removes `name`; returns the removed operator. NotFound for an
  // unknown name; in two-person mode PermissionDenied for root, and
  // FailedPrecondition when it would leave fewer consented admins than
  // approvals_required (which would reopen the bootstrap).
  absl::StatusOr<OperatorRecord> Remove(const std::string& name, const Principal& by);
  // By name.
  std::vector<OperatorRecord> List() const;
  // Whether `r`'s enrollment counts (always, in one-person mode).
  bool Active(const OperatorRecord& r) const;
  bool two_person() const { return approvals_required_ >= 2; }

 private:
  Operators(OperatorStore* store, std::string root_token, int approvals_required)
      : store_(store), root_token_(std::move(root_token)), approvals_required_(approvals_required) {}

  // Consented admins.
  int ActiveAdmins() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  OperatorStore* const store_;
  const std::string root_token_;
  const int approvals_required_;
  mutable absl::Mutex mu_;
  std::map<std::string, OperatorRecord> by_name_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> name_by_digest_ ABSL_GUARDED_BY(mu_);
};

// An in-memory OperatorStore for tests.
class MemoryOperatorStore : public OperatorStore {
 public:
  absl::StatusOr<std::vector<OperatorRecord>> LoadOperators() override;
  absl::Status InsertOperator(const OperatorRecord& record) override;
  absl::Status ApproveOperator(const std::string& name, const std::string& approved_by) override;
  absl::Status DeleteOperator(const std::string& name) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, OperatorRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_OPERATORS_H_
