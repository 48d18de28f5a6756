#include "daemon/admin_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/version.h"
#include "daemon/convert.h"
#include "daemon/grpc_edge.h"

namespace sdc::daemon {

namespace {

v1::OperatorRole ToProto(Role role) {
  switch (role) {
    case Role::kViewer:
      return v1::ROLE_VIEWER;
    case Role::kOperator:
      return v1::ROLE_OPERATOR;
    case Role::kAdmin:
      return v1::ROLE_ADMIN;
  }
  return v1::OPERATOR_ROLE_UNSPECIFIED;
}

// Finishes `reactor` with `s` after counting it as a rejected input.
template <typename Response>
void Refuse(ServiceMetrics* metrics, RawUnaryReactor<Response>* reactor, const absl::Status& s) {
  metrics->Rejected(RejectReason(s.code()));
  reactor->Reply(ToGrpc(s));
}

}  // namespace

v1::Operator AdminService::OperatorProto(const OperatorRecord& r) const {
  v1::Operator out;
  out.set_name(r.name);
  out.set_role(ToProto(r.role));
  out.set_created_unix_ms(UnixMillis(r.created));
  out.set_created_by(r.created_by);
  out.set_approved_by(r.approved_by);
  out.set_active(operators_->Active(r));
  return out;
}

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* c,
                                                 const grpc::ByteBuffer* in,
                                                 grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListJobsRequest, v1::ListJobsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListJobsRequest&, auto* reactor) {
        for (const core::JobSummary& j : coordinator_->ListJobs()) {
          *reactor->response()->add_jobs() = ToProto(j);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListRanks(grpc::CallbackServerContext* c,
                                                  const grpc::ByteBuffer* in,
                                                  grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListRanksRequest, v1::ListRanksResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListRanksRequest& q, auto* reactor) {
        absl::StatusOr<std::vector<core::RankSummary>> ranks =
            coordinator_->ListRanks(q.job_id());
        if (!ranks.ok()) {
          reactor->Reply(ToGrpc(ranks.status()));
          return;
        }
        for (const core::RankSummary& s : *ranks) *reactor->response()->add_ranks() = ToProto(s);
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListIncidents(grpc::CallbackServerContext* c,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListIncidentsRequest, v1::ListIncidentsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListIncidentsRequest& q, auto* reactor) {
        for (const core::Incident& i : coordinator_->ListIncidents(q.job_id())) {
          *reactor->response()->add_incidents() = ToProto(i);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListSuspects(grpc::CallbackServerContext* c,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListSuspectsRequest, v1::ListSuspectsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListSuspectsRequest&, auto* reactor) {
        for (const core::Suspect& s : coordinator_->ListSuspects()) {
          *reactor->response()->add_suspects() = ToProto(s);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListRequests(grpc::CallbackServerContext* c,
                                                     const grpc::ByteBuffer* in,
                                                     grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListRequestsRequest, v1::ListRequestsResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::ListRequestsRequest& q, auto* reactor) {
        for (const core::ReplacementRequest& req : coordinator_->ListRequests()) {
          if (q.state() != v1::REQUEST_STATE_UNSPECIFIED && ToProto(req.state) != q.state()) {
            continue;
          }
          *reactor->response()->add_requests() = ToProto(req);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

void AdminService::FillEvidence(v1::ReplacementRequest* r) {
  for (uint64_t id : r->incident_ids()) {
    absl::StatusOr<core::Incident> i = coordinator_->GetIncident(id);
    if (i.ok()) *r->add_evidence() = ToProto(*i);
  }
}

grpc::ServerUnaryReactor* AdminService::GetRequest(grpc::CallbackServerContext* c,
                                                   const grpc::ByteBuffer* in,
                                                   grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::GetRequestRequest, v1::ReplacementRequest>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::GetRequestRequest& q, auto* reactor) {
        absl::StatusOr<core::ReplacementRequest> req = coordinator_->GetRequest(q.id());
        if (!req.ok()) {
          Refuse(metrics_, reactor, req.status());
          return;
        }
        *reactor->response() = ToProto(*req);
        FillEvidence(reactor->response());
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::Decide(grpc::CallbackServerContext* c,
                                               const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out, bool approve) {
  return ServeAuthenticated<v1::DecideRequest, v1::ReplacementRequest>(
      auth_, metrics_, c, in, out, Role::kOperator,
      [this, approve](const Principal& who, const v1::DecideRequest& q, auto* reactor) {
        // Under two-person approval every approval names a separately
        // enrolled person: a shared credential (root) would let one person
        // supply the second. Force passes the caps and re-decides: an
        // admin's, and two of them (Escalation).
        std::string refused;
        if (q.force() && who.role < Role::kAdmin) {
          refused = absl::StrCat(who.name, " has role ", RoleName(who.role),
                                 "; --force needs an admin");
        } else if (approve && !who.person && (approvals_required_ > 1 || q.force())) {
          refused = absl::StrCat(
              who.name, " is not a separately enrolled person, so it may not approve when ",
              q.force() ? "forcing (two admins must)"
                        : absl::StrCat(approvals_required_,
                                       " operators must (sdcd --approvals_required)"),
              ": approve with your own credential (sdcctl operator add NAME, then a second "
              "admin's sdcctl operator approve NAME)");
        }
        if (!refused.empty()) {
          metrics_->Rejected("permission_denied");
          reactor->Reply({grpc::StatusCode::PERMISSION_DENIED, refused});
          return;
        }
        // Who decides is the credential's principal; the request's
        // (deprecated) operator field is ignored.
        auto result = approve ? coordinator_->Approve(q.id(), who.name, q.reason(), q.force(),
                                                      q.dry_run())
                              : coordinator_->Deny(q.id(), who.name, q.reason(), q.force(),
                                                   q.dry_run());
        if (!result.ok()) {
          Refuse(metrics_, reactor, result.status());
          return;
        }
        *reactor->response() = ToProto(result->first);
        FillEvidence(reactor->response());
        const bool wake = approve && !q.dry_run();
        delivery_->Deliver(std::move(result->second), [this, reactor, wake](absl::Status s) {
          if (s.ok() && wake && on_approved_) on_approved_();
          reactor->Reply(ToGrpc(s));
        });
      });
}

grpc::ServerUnaryReactor* AdminService::Approve(grpc::CallbackServerContext* c,
                                                const grpc::ByteBuffer* in,
                                                grpc::ByteBuffer* out) {
  return Decide(c, in, out, /*approve=*/true);
}

grpc::ServerUnaryReactor* AdminService::Deny(grpc::CallbackServerContext* c,
                                             const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  return Decide(c, in, out, /*approve=*/false);
}

grpc::ServerUnaryReactor* AdminService::ResolveIncident(grpc::CallbackServerContext* c,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ResolveIncidentRequest, v1::Incident>(
      auth_, metrics_, c, in, out, Role::kOperator,
      [this](const Principal& who, const v1::ResolveIncidentRequest& q, auto* reactor) {
        auto result = coordinator_->ResolveIncident(q.id(), who.name, q.reason());
        if (!result.ok()) {
          Refuse(metrics_, reactor, result.status());
          return;
        }
        *reactor->response() = ToProto(result->first);
        delivery_->Deliver(std::move(result->second),
                           [reactor](absl::Status s) { reactor->Reply(ToGrpc(s)); });
      });
}

grpc::ServerUnaryReactor* AdminService::History(grpc::CallbackServerContext* c,
                                                const grpc::ByteBuffer* in,
                                                grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::HistoryRequest, v1::HistoryResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal&, const v1::HistoryRequest& q, auto* reactor) {
        if (q.gpu_uuid().empty() && q.node_name().empty()) {
          Refuse(metrics_, reactor, absl::InvalidArgumentError("name a GPU UUID or a node"));
          return;
        }
        auto [incidents, requests] = coordinator_->History(q.gpu_uuid(), q.node_name());
        for (const core::Incident& i : incidents) *reactor->response()->add_incidents() = ToProto(i);
        for (const core::ReplacementRequest& req : requests) {
          *reactor->response()->add_requests() = ToProto(req);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::AddOperator(grpc::CallbackServerContext* c,
                                                    const grpc::ByteBuffer* in,
                                                    grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::AddOperatorRequest, v1::AddOperatorResponse>(
      auth_, metrics_, c, in, out, Role::kAdmin,
      [this](const Principal& who, const v1::AddOperatorRequest& q, auto* reactor) {
        Role role = Role::kOperator;
        switch (q.role()) {
          case v1::ROLE_VIEWER:
            role = Role::kViewer;
            break;
          case v1::ROLE_ADMIN:
            role = Role::kAdmin;
            break;
          case v1::ROLE_OPERATOR:
          case v1::OPERATOR_ROLE_UNSPECIFIED:
            break;
          default:
            Refuse(metrics_, reactor, absl::InvalidArgumentError("unknown role"));
            return;
        }
        auto added = operators_->Add(q.name(), role, who, absl::Now());
        if (!added.ok()) {
          Refuse(metrics_, reactor, added.status());
          return;
        }
        *reactor->response()->mutable_operator_() = OperatorProto(added->first);
        reactor->response()->set_token(added->second);
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ListOperators(grpc::CallbackServerContext* c,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ListOperatorsRequest, v1::ListOperatorsResponse>(
      auth_, metrics_, c, in, out, Role::kAdmin,
      [this](const Principal&, const v1::ListOperatorsRequest&, auto* reactor) {
        for (const OperatorRecord& r : operators_->List()) {
          *reactor->response()->add_operators() = OperatorProto(r);
        }
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::RemoveOperator(grpc::CallbackServerContext* c,
                                                       const grpc::ByteBuffer* in,
                                                       grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::RemoveOperatorRequest, v1::Operator>(
      auth_, metrics_, c, in, out, Role::kAdmin,
      [this](const Principal& who, const v1::RemoveOperatorRequest& q, auto* reactor) {
        auto removed = operators_->Remove(q.name(), who);
        if (!removed.ok()) {
          Refuse(metrics_, reactor, removed.status());
          return;
        }
        *reactor->response() = OperatorProto(*removed);
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::ApproveOperator(grpc::CallbackServerContext* c,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::ApproveOperatorRequest, v1::Operator>(
      auth_, metrics_, c, in, out, Role::kAdmin,
      [this](const Principal& who, const v1::ApproveOperatorRequest& q, auto* reactor) {
        auto approved = operators_->Approve(q.name(), who);
        if (!approved.ok()) {
          Refuse(metrics_, reactor, approved.status());
          return;
        }
        *reactor->response() = OperatorProto(*approved);
        reactor->Reply(grpc::Status::OK);
      });
}

grpc::ServerUnaryReactor* AdminService::WhoAmI(grpc::CallbackServerContext* c,
                                               const grpc::ByteBuffer* in,
                                               grpc::ByteBuffer* out) {
  return ServeAuthenticated<v1::WhoAmIRequest, v1::WhoAmIResponse>(
      auth_, metrics_, c, in, out, Role::kViewer,
      [this](const Principal& who, const v1::WhoAmIRequest&, auto* reactor) {
        reactor->response()->set_name(who.name);
        reactor->response()->set_role(ToProto(who.role));
        reactor->response()->set_server_version(kVersion);
        reactor->response()->set_approvals_required(approvals_required_);
        reactor->Reply(grpc::Status::OK);
      });
}

}  // namespace sdc::daemon
