// The commands that act or report on one thing: diagnose, approve, deny,
// resolve, history, operator add and remove, whoami, version, completion and
// help. What they print is decided in ctl/command_output.h.

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/version.h"
#include "ctl/command.h"
#include "ctl/command_output.h"
#include "ctl/completion.h"
#include "ctl/errors.h"
#include "ctl/handlers.h"
#include "ctl/help.h"
#include "ctl/resources.h"
#include "ctl/serialize.h"

namespace sdc::sdcctl {
namespace {

// Argument `i`, parsed as a positive integer by the command's Argument.
uint64_t IdArg(const Config& c, size_t i) {
  uint64_t id = 0;
  (void)absl::SimpleAtoi(c.args[i], &id);
  return id;
}

int Decide(Session& s, bool approve) {
  const Config& c = s.config();
  if (approve) {
    // The notice names the node and the action, which only sdcd knows.
    v1::GetRequestRequest q;
    q.set_id(IdArg(c, 0));
    v1::ReplacementRequest current;
    grpc::Status status = s.admin().Call(&AdminStub::GetRequest, q, &current);
    if (!status.ok()) return s.Failed(status);
    s.Notice(ApprovalNotice(current));
  }
  v1::DecideRequest q;
  q.set_id(IdArg(c, 0));
  q.set_reason(c.reason);
  q.set_dry_run(c.dry_run);
  q.set_force(c.force);
  v1::ReplacementRequest r;
  grpc::Status status = s.admin().Call(approve ? &AdminStub::Approve : &AdminStub::Deny, q, &r);
  if (!status.ok()) return s.Failed(status);
  s.Print(FormatDecision(r, approve, c.dry_run, c.output));
  return kExitOk;
}

int History(Session& s, v1::HistoryRequest q) {
  v1::HistoryResponse r;
  grpc::Status status = s.admin().Call(&AdminStub::History, q, &r);
  if (!status.ok()) return s.Failed(status);
  s.PrintList(FormatHistory(r, s.config().output, absl::Now()), IsEmpty(r));
  return kExitOk;
}

}  // namespace

int RunDiagnose(Session& s) {
  const Config& c = s.config();
  v1::DiagnoseRequest q;
  q.set_node_name(c.args[0]);
  q.set_gpu_uuid(c.gpu);
  q.set_size(c.size);
  q.set_repetitions(c.repetitions);
  q.set_wait(true);
  v1::Diagnostic r;
  grpc::Status status = s.admin().Call(&NodeAdminStub::Diagnose, q, &r);
  if (!status.ok()) return s.Failed(status);
  s.Print(FormatDiagnostic(r, c.output));
  return DiagnosticExitCode(r);
}

int RunApprove(Session& s) { return Decide(s, /*approve=*/true); }

int RunDeny(Session& s) { return Decide(s, /*approve=*/false); }

int RunResolve(Session& s) {
  const Config& c = s.config();
  v1::ResolveIncidentRequest q;
  q.set_id(IdArg(c, 0));
  q.set_reason(c.reason);
  v1::ListIncidentsResponse one;
  grpc::Status status = s.admin().Call(&AdminStub::ResolveIncident, q, one.add_incidents());
  if (!status.ok()) return s.Failed(status);
  s.Print(FindResource("incidents")->Format(one, c.output, absl::Now()));
  return kExitOk;
}

int RunHistoryGpu(Session& s) {
  v1::HistoryRequest q;
  q.set_gpu_uuid(s.config().args[0]);
  return History(s, q);
}

int RunHistoryNode(Session& s) {
  v1::HistoryRequest q;
  q.set_node_name(s.config().args[0]);
  return History(s, q);
}

int RunOperatorAdd(Session& s) {
  const Config& c = s.config();
  v1::AddOperatorRequest q;
  q.set_name(c.args[0]);
  q.set_role(c.role);
  v1::AddOperatorResponse r;
  grpc::Status status = s.admin().Call(&AdminStub::AddOperator, q, &r);
  if (!status.ok()) return s.Failed(status);
  if (c.output == OutputFormat::kJson || c.output == OutputFormat::kYaml) {
    s.Print(c.output == OutputFormat::kJson ? ToJson(r) : ToYaml(r));
    return kExitOk;
  }
  // The token alone on stdout (sdcctl operator add alice > alice.token).
  s.Notice(OperatorAddedNotice(r.operator_()));
  s.Print(r.token() + "\n");
  return kExitOk;
}

int RunOperatorRemove(Session& s) {
  v1::RemoveOperatorRequest q;
  q.set_name(s.config().args[0]);
  v1::Operator r;
  grpc::Status status = s.admin().Call(&AdminStub::RemoveOperator, q, &r);
  if (!status.ok()) return s.Failed(status);
  s.Print(absl::StrCat("operator/", r.name(), " removed\n"));
  return kExitOk;
}

int RunOperatorApprove(Session& s) {
  v1::ApproveOperatorRequest q;
  q.set_name(s.config().args[0]);
  v1::Operator r;
  grpc::Status status = s.admin().Call(&AdminStub::ApproveOperator, q, &r);
  if (!status.ok()) return s.Failed(status);
  s.Print(absl::StrCat("operator/", r.name(), " approved: its token works now\n"));
  return kExitOk;
}

int RunWhoAmI(Session& s) {
  v1::WhoAmIResponse r;
  grpc::Status status = s.admin().Call(&AdminStub::WhoAmI, {}, &r);
  if (!status.ok()) return s.Failed(status);
  s.Print(FormatWhoAmI(r, s.config().output));
  return kExitOk;
}

// sdcctl's version always; sdcd's when it answers within 3 s (exit 0 either
// way: the version is asked for when something is wrong).
int RunVersion(Session& s) {
  const Config& c = s.config();
  s.Print(absl::StrCat("sdcctl ", kVersion, "\n"));
  absl::StatusOr<Credentials> creds = LoadCredentials(c.connection);
  if (!creds.ok()) {
    s.Print(absl::StrCat("sdcd   unknown (", creds.status().message(), ")\n"));
    return kExitOk;
  }
  Connection quick = c.connection;
  quick.timeout = std::min(c.connection.timeout, absl::Seconds(3));
  AdminClient admin(quick, *creds);
  v1::WhoAmIResponse r;
  grpc::Status status = admin.Call(&AdminStub::WhoAmI, {}, &r);
  s.Print(
      status.ok()
          ? absl::StrCat("sdcd   ", r.server_version(), " at ", c.connection.server, "\n")
          : absl::StrCat("sdcd   unknown (", RpcErrorMessage(status, c.connection.server), ")\n"));
  return kExitOk;
}

int RunCompletion(Session& s) {
  s.Print(s.config().args[0] == "bash" ? BashCompletion() : ZshCompletion());
  return kExitOk;
}

int RunHelp(Session& s) {
  s.Print(Help(s.config().args));
  return kExitOk;
}

}  // namespace sdc::sdcctl
