#ifndef SDC_DAEMON_ADMIN_SERVICE_H_
#define SDC_DAEMON_ADMIN_SERVICE_H_

// AdminService, what operators call (sdcctl): list jobs, ranks, incidents,
// suspects and replacement requests; decide requests; resolve incidents;
// manage operators. Every call is authenticated before its request is
// parsed (admin_auth.h); roles per method: see proto/admin.proto.

#include <functional>
#include <utility>

#include "admin.grpc.pb.h"
#include "daemon/admin_auth.h"
#include "daemon/core/coordinator.h"
#include "daemon/delivery.h"
#include "daemon/operators.h"
#include "daemon/service_metrics.h"
#include "grpcpp/grpcpp.h"

namespace sdc::daemon {

// Every method raw: authentication precedes parsing (ServeAuthenticated).
using AdminServiceBase = v1::AdminService::WithRawCallbackMethod_ListJobs<
    v1::AdminService::WithRawCallbackMethod_ListRanks<
    v1::AdminService::WithRawCallbackMethod_ListIncidents<
    v1::AdminService::WithRawCallbackMethod_ListSuspects<
    v1::AdminService::WithRawCallbackMethod_ListRequests<
    v1::AdminService::WithRawCallbackMethod_GetRequest<
    v1::AdminService::WithRawCallbackMethod_Approve<
    v1::AdminService::WithRawCallbackMethod_Deny<
    v1::AdminService::WithRawCallbackMethod_History<
    v1::AdminService::WithRawCallbackMethod_ResolveIncident<
    v1::AdminService::WithRawCallbackMethod_AddOperator<
    v1::AdminService::WithRawCallbackMethod_ListOperators<
    v1::AdminService::WithRawCallbackMethod_RemoveOperator<
    v1::AdminService::WithRawCallbackMethod_ApproveOperator<
    v1::AdminService::WithRawCallbackMethod_WhoAmI<
    v1::AdminService::Service>>>>>>>>>>>>>>>;

// Thread-safe. Roles per method: see proto/admin.proto.
class AdminService final : public AdminServiceBase {
 public:
  // `operators` is the same registry `auth` reads (AddOperator and
  // RemoveOperator change it). `approvals_required` is reported by WhoAmI.
  AdminService(core::Coordinator* coordinator, Delivery* delivery, ServiceMetrics* metrics,
               AdminAuth auth, Operators* operators, int approvals_required,
               std::function<void()> on_approved)
      : coordinator_(coordinator),
        delivery_(delivery),
        metrics_(metrics),
        auth_(std::move(auth)),
        operators_(operators),
        approvals_required_(approvals_required),
        on_approved_(std::move(on_approved)) {}

#define SDC_ADMIN_RAW_METHOD(Method)                                          \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* c,           \
                                   const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  SDC_ADMIN_RAW_METHOD(ListJobs)
  SDC_ADMIN_RAW_METHOD(ListRanks)
  SDC_ADMIN_RAW_METHOD(ListIncidents)
  SDC_ADMIN_RAW_METHOD(ListSuspects)
  SDC_ADMIN_RAW_METHOD(ListRequests)
  SDC_ADMIN_RAW_METHOD(GetRequest)
  SDC_ADMIN_RAW_METHOD(Approve)
  SDC_ADMIN_RAW_METHOD(Deny)
  SDC_ADMIN_RAW_METHOD(History)
  SDC_ADMIN_RAW_METHOD(ResolveIncident)
  SDC_ADMIN_RAW_METHOD(AddOperator)
  SDC_ADMIN_RAW_METHOD(ListOperators)
  SDC_ADMIN_RAW_METHOD(RemoveOperator)
  SDC_ADMIN_RAW_METHOD(ApproveOperator)
  SDC_ADMIN_RAW_METHOD(WhoAmI)
#undef SDC_ADMIN_RAW_METHOD

 private:
  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* c, const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out, bool approve);
  void FillEvidence(v1::ReplacementRequest* r);
  v1::Operator OperatorProto(const OperatorRecord& r) const;

  core::Coordinator* coordinator_;
  Delivery* delivery_;
  ServiceMetrics* metrics_;
  const AdminAuth auth_;
  Operators* const operators_;
  const int approvals_required_;
  std::function<void()> on_approved_;
};

}  // namespace sdc::daemon

#endif  // SDC_DAEMON_ADMIN_SERVICE_H_
