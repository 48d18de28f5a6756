#ifndef SDC_DAEMON_CORE_ESCALATION_H_
#define SDC_DAEMON_CORE_ESCALATION_H_

// Replacement requests: the state machine from a confirmed attribution to an
// executed (or refused) node replacement, with the blast-radius caps.
//
//   Pending --approve--> Approved --actuator--> Executing --> Done | Failed
//      |  \--deny--> Denied
//      \--ttl--> Expired
//
// With approvals_required = N > 1 (two-person approval), "approve" moves a
// request only on the N-th approval from distinct operators; the earlier
// ones are recorded (ReplacementRequest::approvals, and a transition to the
// same state) and the same operator approving twice is refused. One deny
// ends the round; denied, expired and failed requests start a new round
// when approved again with force.
//
// Force (deciding a decided request again, or passing the execution cap) is
// two-person whatever N: a forced approval moves the request only once
// max(2, N) distinct operators approved with force in its round. Who may
// force (admins only) is the admin service's rule.
//
// One open request per node: later incidents on the node join it. A decided
// request (Denied, Expired, Failed) can be approved again only with force.
// Not thread-safe: the Coordinator serializes calls.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/records.h"

namespace sdc::core {

struct EscalationPolicy {
  // Pending requests nobody decided expire after this. Default: 24h.
  absl::Duration request_ttl = absl::Hours(24);
  // At most this many requests open (Pending, Approved, Executing) at once;
  // more attributions are recorded as incidents without a request.
  // Default: 4.
  int max_open_requests = 4;
  // At most this many replacements may start executing per window; approving
  // beyond it needs force. Default: 2 per 24h.
  int max_executed_per_window = 2;
  absl::Duration execution_window = absl::Hours(24);
  // Default true: a human approves every replacement. False approves at once
  // (the actor is recorded as "sdcd (policy: auto-approve)").
  bool require_approval = true;
  // Nodes that are never replaced (controllers, login nodes): node names,
  // or instance ids ("i-..."), which also match a node whose name embeds
  // the id (common::InstanceIdFromNodeName). Actuators that resolve a
  // node's instance id otherwise check it too (daemon/actuator.h).
  std::set<std::string> never_replace;
  // "replace" or "reboot": what approval asks the actuator to do.
  std::string action = "replace";
  // Distinct operators whose approvals a request needs. Default: 1.
  int approvals_required = 1;
};

class Escalation {
 public:
  explicit Escalation(EscalationPolicy policy) : policy_(std::move(policy)) {}

  void Restore(std::vector<ReplacementRequest> requests);

  struct OpenResult {
    // The new or joined request; nullopt when none was opened.
    std::optional<ReplacementRequest> request;
    bool opened = false;      // False: joined an open request, or none.
    std::string suppressed;   // Why no request was opened, when none was.
  };
  // Opens (or joins) the request for `node` after confirmed incident
  // `incident_id` blaming `gpu`.
  OpenResult Open(const std::string& node, const std::string& gpu, uint64_t incident_id,
                  const std::string& reason, absl::Time now);

  // REQUIRES nothing; returns NotFound (unknown id), InvalidArgument (empty
  // reason or operator) or FailedPrecondition (already decided without force,
  // executing or finished, the execution cap reached without force, or `op`
  // already approved in this round). Approve returns the request Approved,
  // or still in its state with one more approval when more are required.
  // With dry_run the request is returned as it would become, and nothing
  // changes.
  absl::StatusOr<ReplacementRequest> Approve(uint64_t id, const std::string& op,
                                             const std::string& reason, bool force,
                                             bool dry_run, absl::Time now);
  absl::StatusOr<ReplacementRequest> Deny(uint64_t id, const std::string& op,
                                          const std::string& reason, bool force,
                                          bool dry_run, absl::Time now);

  // Approved -> Executing, for the actuator. FailedPrecondition (and the
  // request stays Approved) while the execution cap is reached, unless it
  // was approved with force.
  absl::StatusOr<ReplacementRequest> StartExecution(uint64_t id, const std::string& actuator,
                                                    absl::Time now);
  // Executing -> Done or Failed, with the actuator's result line.
  absl::StatusOr<ReplacementRequest> FinishExecution(uint64_t id, bool ok,
                                                     const std::string& detail,
                                                     absl::Time now);

  // Expires Pending requests older than the TTL; returns them.
  std::vector<ReplacementRequest> ExpireDue(absl::Time now);

  const ReplacementRequest* Find(uint64_t id) const;
  // The open (Pending, Approved, Executing) request for `node`, or null.
  const ReplacementRequest* OpenFor(const std::string& node) const;
  std::vector<ReplacementRequest> List() const;
  // Approved requests, oldest first.
  std::vector<uint64_t> ReadyToExecute() const;
  const EscalationPolicy& policy() const { return policy_; }

 private:
  void Move(ReplacementRequest& r, RequestState to, const std::string& actor,
            const std::string& reason, absl::Time now);
  int OpenCount() const;
  int ExecutedSince(absl::Time since) const;
  // Executions started in the window plus approvals waiting to start.
  int CommittedExecutions(absl::Time now) const;
  absl::StatusOr<ReplacementRequest*> Decidable(uint64_t id, const std::string& op,
                                               const std::string& reason, bool force);

  EscalationPolicy policy_;
  std::map<uint64_t, ReplacementRequest> requests_;
  uint64_t next_id_ = 1;
};

}  // namespace sdc::core

#endif  // SDC_DAEMON_CORE_ESCALATION_H_
