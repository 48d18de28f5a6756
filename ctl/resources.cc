#include "ctl/resources.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sdc::sdcctl {
namespace {

using Request = v1::ReplacementRequest;

// ---------------------------------------------------------------------------
// What more than one entry shows.

// An item of a list call whose `matches` holds, or NOT_FOUND `missing`: for
// the kinds the admin API has no Get call for.
template <typename Items, typename Match>
grpc::Status FindIn(const Items& items, Match matches, typename Items::value_type* out,
                    const std::string& missing) {
  for (const auto& item : items) {
    if (!matches(item)) continue;
    *out = item;
    return grpc::Status::OK;
  }
  return {grpc::StatusCode::NOT_FOUND, missing};
}

// What an incident says, in the order every description prints it.
Fields IncidentFields(const v1::Incident& i, absl::Time now) {
  return {{"Job", Cell(i.job_id())},
          {"Step", absl::StrCat(i.step())},
          {"Check", CheckName(i.check())},
          {"Outcome", Cell(i.outcome())},
          {"Ranks", JoinCell(i.ranks())},
          {"Nodes", JoinCell(i.node_names())},
          {"GPUs", JoinCell(i.gpu_uuids())},
          {"Attributed", YesNo(i.confirmed())},
          // Evidence from a rank no caller proved opens no request.
          {"Evidence", i.unproven_evidence()
                           ? std::string("unproven (a rank's placement was not proven): it "
                                         "cannot open a replacement request")
                           : std::string("proven")},
          {"Tensors", JoinCell(i.differing_tensors())},
          {"Explanation", Cell(i.explanation())},
          {"Created", FormatTimestamp(i.created_unix_ms(), now)}};
}

// One incident inside another object's description (a request's evidence,
// a job's incidents).
std::string IncidentBlock(const v1::Incident& i, absl::Time now) {
  return absl::StrCat("  Incident ", i.id(), ":\n", LabelBlock(IncidentFields(i, now), "    "));
}

// A description's nested table: "Title:" and the rows indented, or
// "Title:  <none>" without rows.
std::string NestedTable(absl::string_view title, const std::vector<Row>& rows) {
  if (rows.size() <= 1) return absl::StrCat(title, ":  ", kNone, "\n");
  return absl::StrCat(title, ":\n", RenderTable(rows, "  "));
}

// ---------------------------------------------------------------------------
// describe request: approvals, transitions, evidence.

// Shown when approval takes more than one operator, or someone approved.
std::string ApprovalsLine(const Request& r) {
  if (r.approvals_required() <= 1 && r.approvals().empty()) return "";
  std::vector<std::string> names;
  for (const v1::Approval& a : r.approvals()) {
    names.push_back(absl::StrCat(Cell(a.operator_()), a.force() ? " (force)" : ""));
  }
  return absl::StrCat("Approvals:  ", names.empty() ? kNone : absl::StrJoin(names, ", "), " (",
                      r.approvals().size(), " of ", std::max<uint32_t>(1, r.approvals_required()),
                      " required)\n");
}

std::string Transitions(const Request& r) {
  std::vector<Row> rows = {{"TIME", "TRANSITION", "ACTOR", "REASON"}};
  for (const v1::Transition& t : r.transitions()) {
    rows.push_back({FormatUtc(t.at_unix_ms()),
                    absl::StrCat(StateName(t.from()), " -> ", StateName(t.to())), Cell(t.actor()),
                    Cell(t.reason())});
  }
  return NestedTable("Transitions", rows);
}

std::string Evidence(const Request& r, absl::Time now) {
  if (r.incident_ids().empty() && r.evidence().empty()) {
    return absl::StrCat("Evidence:  ", kNone, "\n");
  }
  std::string out = "Evidence:\n";
  for (const v1::Incident& i : r.evidence()) absl::StrAppend(&out, IncidentBlock(i, now));
  // sdcd leaves out incidents it no longer has; say so rather than hide it.
  for (uint64_t id : r.incident_ids()) {
    bool shown = false;
    for (const v1::Incident& i : r.evidence()) shown = shown || i.id() == id;
    if (!shown) absl::StrAppend(&out, "  Incident ", id, ":  <not returned by sdcd>\n");
  }
  return out;
}

// ---------------------------------------------------------------------------
// describe job and describe node: nested tables.

// Who proved a rank's placement: "certificate", "relay", or why not.
std::string Proof(const v1::Rank& r) {
  if (r.identity().empty()) return "unauthenticated";
  if (!r.unproven().empty()) return absl::StrCat(Cell(r.proof()), ", not evidence: ", r.unproven());
  return Cell(r.proof());
}

std::string Ranks(const Related& related) {
  std::vector<Row> rows = {{"RANK", "NODE", "GPU", "ATTACHED", "CHECKED-THROUGH", "PROVEN-BY"}};
  for (const v1::Rank& r : related.ranks.ranks()) {
    rows.push_back({absl::StrCat(r.placement().rank()), Cell(r.placement().node_name()),
                    Cell(r.placement().gpu_uuid()), YesNo(r.attached()),
                    absl::StrCat(r.checks_through_step()), Proof(r)});
  }
  return NestedTable("Ranks", rows);
}

std::string JobIncidents(const Related& related, absl::Time now) {
  if (related.incidents.incidents().empty()) return absl::StrCat("Incidents:  ", kNone, "\n");
  std::string out = "Incidents:\n";
  for (const v1::Incident& i : related.incidents.incidents()) {
    absl::StrAppend(&out, IncidentBlock(i, now));
  }
  return out;
}

// The distinct GPU models of a node, "NVIDIA H100 80GB HBM3" or "A,B".
std::string GpuModels(const v1::Node& n) {
  std::vector<std::string> models;
  for (const v1::GpuIdentity& g : n.gpus()) {
    if (std::find(models.begin(), models.end(), g.model()) == models.end()) {
      models.push_back(g.model());
    }
  }
  return JoinCell(models);
}

std::string NodeGpus(const v1::Node& n) {
  if (n.gpus().empty()) {
    return absl::StrCat("GPUs:  ", kNone,
                        n.gpu_note().empty() ? "" : absl::StrCat(" (", Cell(n.gpu_note()), ")"),
                        "\n");
  }
  std::vector<Row> rows = {{"INDEX", "UUID", "MODEL"}};
  for (const v1::GpuIdentity& g : n.gpus()) {
    rows.push_back({absl::StrCat(g.index()), Cell(g.uuid()), Cell(g.model())});
  }
  return NestedTable("GPUs", rows);
}

std::string NodeDiagnostics(const v1::Node& n, absl::Time now) {
  std::vector<Row> rows = {
      {"NAME", "STATE", "GPU", "SIZE", "REPETITIONS", "DEVICES", "MISMATCHES", "AGE"}};
  for (const v1::Diagnostic& d : n.diagnostics()) {
    uint64_t mismatches = 0;
    for (const v1::DiagnosticResult& r : d.results()) mismatches += r.mismatches();
    rows.push_back({absl::StrCat(d.id()), DiagnosticStateName(d.state()),
                    d.gpu_uuid().empty() ? std::string("all") : Cell(d.gpu_uuid()),
                    absl::StrCat(d.size()), absl::StrCat(d.repetitions()),
                    absl::StrCat(d.results_size()), absl::StrCat(mismatches),
                    FormatAgeSince(d.requested_unix_ms(), now)});
  }
  return NestedTable("Diagnostics", rows);
}

// ---------------------------------------------------------------------------
// The table.

// How describe names one item: a positive integer id, also "KIND/ID".
Argument IdOf(const char* kind) {
  return {"ID", Argument::Accepts::kPositiveInteger, kind};
}

uint64_t IdValue(const std::string& key) {
  uint64_t id = 0;
  (void)absl::SimpleAtoi(key, &id);  // Parsed by IdOf's Argument already.
  return id;
}

Resource Requests() {
  return ResourceBuilder<v1::ListRequestsResponse, Request>("request", "requests", "requests")
      .Summaries("replacement requests; with ID, one with every detail (approvals too)",
                 "state, approvals, transitions, actuator and evidence")
      .ListedBy(
          [](AdminClient& admin, const ListFilter& filter, v1::ListRequestsResponse* out) {
            v1::ListRequestsRequest q;
            q.set_state(filter.state);
            return admin.Call(&AdminStub::ListRequests, q, out);
          },
          {"state"})
      .Named([](const Request& r) { return absl::StrCat(r.id()); })
      .Column("NODE", [](const Request& r) { return Cell(r.node_name()); })
      .Column("STATE", [](const Request& r) { return StateName(r.state()); })
      .Column("ACTION", [](const Request& r) { return Cell(r.action()); })
      .Column("GPUS", [](const Request& r) { return JoinCell(r.gpu_uuids()); })
      .Column("INCIDENTS", [](const Request& r) { return JoinCell(r.incident_ids()); })
      .WideColumn("REASON", [](const Request& r) { return Cell(r.reason()); })
      .WideColumn("LAST-ACTOR",
                  [](const Request& r) {
                    return r.transitions().empty() ? std::string(kNone)
                                                   : Cell(r.transitions().rbegin()->actor());
                  })
      // Of the current round: "1/2" while a second operator's is missing.
      .WideColumn("APPROVALS",
                  [](const Request& r) {
                    return absl::StrCat(r.approvals_size(), "/",
                                        std::max<uint32_t>(1, r.approvals_required()));
                  })
      .Column("AGE", [](const Request& r, absl::Time now) {
        return FormatAgeSince(r.created_unix_ms(), now);
      })
      .Label("node", [](const Request& r) { return r.node_name(); })
      .Label("gpu", [](const Request& r) { return r.gpu_uuids(); })
      .Label("state", [](const Request& r) { return absl::AsciiStrToLower(StateName(r.state())); })
      .DescribedBy(IdOf("request"),
                   [](AdminClient& admin, const std::string& key, Request* out) {
                     v1::GetRequestRequest q;
                     q.set_id(IdValue(key));
                     return admin.Call(&AdminStub::GetRequest, q, out);
                   })
      .Field("Request", [](const Request& r) { return absl::StrCat(r.id()); })
      .Field("Node", [](const Request& r) { return Cell(r.node_name()); })
      .Field("State", [](const Request& r) { return StateName(r.state()); })
      .Field("Action", [](const Request& r) { return Cell(r.action()); })
      .Field("GPUs", [](const Request& r) { return JoinCell(r.gpu_uuids()); })
      .Field("Incidents", [](const Request& r) { return JoinCell(r.incident_ids()); })
      .Field("Reason", [](const Request& r) { return Cell(r.reason()); })
      .Field("Created",
             [](const Request& r, absl::Time now) {
               return FormatTimestamp(r.created_unix_ms(), now);
             })
      .Field("Updated",
             [](const Request& r, absl::Time now) {
               return FormatTimestamp(r.updated_unix_ms(), now);
             })
      .Field("Actuator", [](const Request& r) { return Cell(r.actuator()); })
      .Field("Actuator Result", [](const Request& r) { return Cell(r.actuator_result()); })
      .Section([](const Request& r, absl::Time) { return ApprovalsLine(r); })
      .Section([](const Request& r, absl::Time) { return Transitions(r); })
      .Section(Evidence)
      .Build();
}

Resource Incidents() {
  using v1::Incident;
  return ResourceBuilder<v1::ListIncidentsResponse, Incident>("incident", "incidents",
                                                              "incidents")
      .Summaries("incidents (--job: of one job); with ID, one with every field",
                 "every field of one incident")
      .ListedBy(
          [](AdminClient& admin, const ListFilter& filter, v1::ListIncidentsResponse* out) {
            v1::ListIncidentsRequest q;
            q.set_job_id(filter.job);
            return admin.Call(&AdminStub::ListIncidents, q, out);
          },
          {"job"})
      .Named([](const Incident& i) { return absl::StrCat(i.id()); })
      .Column("JOB", [](const Incident& i) { return Cell(i.job_id()); })
      .Column("STEP", [](const Incident& i) { return absl::StrCat(i.step()); })
      .Column("CHECK", [](const Incident& i) { return CheckName(i.check()); })
      .Column("OUTCOME",
              [](const Incident& i) {
                return Cell(i.resolved_by().empty() ? i.outcome()
                                                    : absl::StrCat(i.outcome(), " (resolved)"));
              })
      .Column("RANKS", [](const Incident& i) { return JoinCell(i.ranks()); })
      .Column("NODES", [](const Incident& i) { return JoinCell(i.node_names()); })
      .Column("ATTRIBUTED", [](const Incident& i) { return YesNo(i.confirmed()); })
      .WideColumn("GPUS", [](const Incident& i) { return JoinCell(i.gpu_uuids()); })
      .WideColumn("TENSORS", [](const Incident& i) { return JoinCell(i.differing_tensors()); })
      .WideColumn("EXPLANATION", [](const Incident& i) { return Cell(i.explanation()); })
      .Column("AGE", [](const Incident& i, absl::Time now) {
        return FormatAgeSince(i.created_unix_ms(), now);
      })
      .Label("job", [](const Incident& i) { return i.job_id(); })
      .Label("node", [](const Incident& i) { return i.node_names(); })
      .Label("gpu", [](const Incident& i) { return i.gpu_uuids(); })
      .Label("check", [](const Incident& i) { return CheckName(i.check()); })
      .Label("outcome", [](const Incident& i) { return i.outcome(); })
      .Label("state",
             [](const Incident& i) { return i.resolved_by().empty() ? "open" : "resolved"; })
      // The admin API has no GetIncident: the list holds every field.
      .DescribedBy(IdOf("incident"),
                   [](AdminClient& admin, const std::string& key, Incident* out) {
                     v1::ListIncidentsResponse all;
                     grpc::Status s = admin.Call(&AdminStub::ListIncidents, {}, &all);
                     if (!s.ok()) return s;
                     return FindIn(
                         all.incidents(), [&](const Incident& i) { return i.id() == IdValue(key); },
                         out, absl::StrCat("no incident ", key));
                   })
      .Field("Incident", [](const Incident& i) { return absl::StrCat(i.id()); })
      .FieldList(IncidentFields)
      .Field("Request",
             [](const Incident& i) {
               return i.request_id() == 0 ? std::string(kNone)
                                          : absl::StrCat("request/", i.request_id());
             })
      .Field("Resolved By", [](const Incident& i) { return Cell(i.resolved_by()); })
      .Field("Resolution", [](const Incident& i) { return Cell(i.resolution()); })
      .Section([](const Incident& i, absl::Time now) {
        if (i.resolved_unix_ms() == 0) return std::string();
        return LabelBlock({{"Resolved", FormatTimestamp(i.resolved_unix_ms(), now)}});
      })
      .Build();
}

Resource Suspects() {
  using v1::Suspect;
  return ResourceBuilder<v1::ListSuspectsResponse, Suspect>("suspect", "suspects", "suspects")
      .Summaries("GPUs under suspicion and the targeted audits they have left")
      .ListedBy([](AdminClient& admin, const ListFilter&, v1::ListSuspectsResponse* out) {
        return admin.Call(&AdminStub::ListSuspects, {}, out);
      })
      .Named([](const Suspect& s) { return Cell(s.gpu_uuid()); })
      .Column("NODE", [](const Suspect& s) { return Cell(s.node_name()); })
      .Column("JOB", [](const Suspect& s) { return Cell(s.job_id()); })
      .Column("RANK", [](const Suspect& s) { return absl::StrCat(s.rank()); })
      .Column("INCIDENTS", [](const Suspect& s) { return absl::StrCat(s.incidents()); })
      .Column("TARGETED-LEFT",
              [](const Suspect& s) { return absl::StrCat(s.targeted_audits_left()); })
      .WideColumn("REASON", [](const Suspect& s) { return Cell(s.reason()); })
      .Column("AGE", [](const Suspect& s, absl::Time now) {
        return FormatAgeSince(s.since_unix_ms(), now);
      })
      .Label("job", [](const Suspect& s) { return s.job_id(); })
      .Label("node", [](const Suspect& s) { return s.node_name(); })
      .Label("gpu", [](const Suspect& s) { return s.gpu_uuid(); })
      .Build();
}

Resource Jobs() {
  using v1::Job;
  // Wide has nothing to add: a job has no free-text fields.
  return ResourceBuilder<v1::ListJobsResponse, Job>("job", "jobs", "jobs")
      .Summaries("jobs: world size, attached ranks, last step, open incidents",
                 "a job's ranks and incidents")
      .ListedBy([](AdminClient& admin, const ListFilter&, v1::ListJobsResponse* out) {
        return admin.Call(&AdminStub::ListJobs, {}, out);
      })
      .Named([](const Job& j) { return Cell(j.job_id()); })
      .Column("WORLD", [](const Job& j) { return absl::StrCat(j.world_size()); })
      .Column("NODES", [](const Job& j) { return absl::StrCat(j.nodes()); })
      .Column("ATTACHED", [](const Job& j) { return absl::StrCat(j.attached_ranks()); })
      .Column("LAST-STEP", [](const Job& j) { return absl::StrCat(j.last_step()); })
      .Column("INCIDENTS", [](const Job& j) { return absl::StrCat(j.open_incidents()); })
      .Column("AGE", [](const Job& j, absl::Time now) {
        return FormatAgeSince(j.created_unix_ms(), now);
      })
      .Label("job", [](const Job& j) { return j.job_id(); })
      // A job id is whatever the trainer sent, "/" included: no "job/" form
      // here (describe job/NAME is split before).
      .DescribedBy({"NAME"},
                   [](AdminClient& admin, const std::string& key, Job* out) {
                     v1::ListJobsResponse all;
                     grpc::Status s = admin.Call(&AdminStub::ListJobs, {}, &all);
                     if (!s.ok()) return s;
                     return FindIn(
                         all.jobs(), [&](const Job& j) { return j.job_id() == key; }, out,
                         absl::StrCat("no job ", key));
                   })
      .WithRelated([](AdminClient& admin, const Job& job, Related* out) {
        v1::ListRanksRequest ranks;
        ranks.set_job_id(job.job_id());
        grpc::Status s = admin.Call(&AdminStub::ListRanks, ranks, &out->ranks);
        if (!s.ok()) return s;
        v1::ListIncidentsRequest incidents;
        incidents.set_job_id(job.job_id());
        return admin.Call(&AdminStub::ListIncidents, incidents, &out->incidents);
      })
      .Field("Job", [](const Job& j) { return Cell(j.job_id()); })
      .Field("World Size", [](const Job& j) { return absl::StrCat(j.world_size()); })
      .Field("Attached Ranks", [](const Job& j) { return absl::StrCat(j.attached_ranks()); })
      .Field("Nodes", [](const Job& j) { return absl::StrCat(j.nodes()); })
      .Field("Last Step", [](const Job& j) { return absl::StrCat(j.last_step()); })
      .Field("Open Incidents", [](const Job& j) { return absl::StrCat(j.open_incidents()); })
      .Field("Created",
             [](const Job& j, absl::Time now) { return FormatTimestamp(j.created_unix_ms(), now); })
      .Section([](const Job&, const Related& related, absl::Time) { return Ranks(related); })
      .Section([](const Job&, const Related& related, absl::Time now) {
        return JobIncidents(related, now);
      })
      .Build();
}

Resource Nodes() {
  using v1::Node;
  return ResourceBuilder<v1::ListNodesResponse, Node>("node", "nodes", "nodes")
      .Summaries("node agents: instance id, GPUs, status, time since heartbeat",
                 "a node's agent, GPUs and recent diagnostics")
      .ListedBy([](AdminClient& admin, const ListFilter&, v1::ListNodesResponse* out) {
        return admin.Call(&NodeAdminStub::ListNodes, {}, out);
      })
      .Named([](const Node& n) { return Cell(n.node_name()); })
      .WideColumn("HOSTNAME", [](const Node& n) { return Cell(n.hostname()); })
      .Column("INSTANCE", [](const Node& n) { return Cell(n.instance_id()); })
      .Column("GPUS", [](const Node& n) { return absl::StrCat(n.gpus_size()); })
      .WideColumn("GPU-MODEL", GpuModels)
      .Column("STATUS", [](const Node& n) { return NodeStatusName(n.status()); })
      .WideColumn("AGENT", [](const Node& n) { return Cell(n.agent_version()); })
      .Column("AGE", [](const Node& n, absl::Time now) {
        return FormatAgeSince(n.last_heartbeat_unix_ms(), now);
      })
      .Label("node", [](const Node& n) { return n.node_name(); })
      .Label("gpu",
             [](const Node& n) {
               std::vector<std::string> uuids;
               for (const v1::GpuIdentity& g : n.gpus()) uuids.push_back(g.uuid());
               return uuids;
             })
      .Label("status",
             [](const Node& n) { return absl::AsciiStrToLower(NodeStatusName(n.status())); })
      .DescribedBy({"NAME", Argument::Accepts::kText, "node"},
                   [](AdminClient& admin, const std::string& key, Node* out) {
                     v1::GetNodeRequest q;
                     q.set_node_name(key);
                     return admin.Call(&NodeAdminStub::GetNode, q, out);
                   })
      .Field("Node", [](const Node& n) { return Cell(n.node_name()); })
      .Field("Hostname", [](const Node& n) { return Cell(n.hostname()); })
      .Field("Instance", [](const Node& n) { return Cell(n.instance_id()); })
      .Field("Status", [](const Node& n) { return NodeStatusName(n.status()); })
      .Field("Agent", [](const Node& n) { return Cell(n.agent_version()); })
      .Field("Heartbeat",
             [](const Node& n) {
               return absl::StrCat("every ", FormatAge(n.heartbeat_interval_ms() / 1000));
             })
      .Field("Last Heartbeat",
             [](const Node& n, absl::Time now) {
               return FormatTimestamp(n.last_heartbeat_unix_ms(), now);
             })
      .Field("Registered",
             [](const Node& n, absl::Time now) {
               return FormatTimestamp(n.registered_unix_ms(), now);
             })
      .Section([](const Node& n, absl::Time) { return NodeGpus(n); })
      .Section(NodeDiagnostics)
      .Build();
}

Resource Operators() {
  using v1::Operator;
  return ResourceBuilder<v1::ListOperatorsResponse, Operator>("operator", "operators",
                                                              "operators")
      .Summaries("(admin) operators and their roles")
      .ListedBy([](AdminClient& admin, const ListFilter&, v1::ListOperatorsResponse* out) {
        return admin.Call(&AdminStub::ListOperators, {}, out);
      })
      .Named([](const Operator& o) { return Cell(o.name()); })
      .Column("ROLE", [](const Operator& o) { return RoleName(o.role()); })
      .Column("CREATED-BY", [](const Operator& o) { return Cell(o.created_by()); })
      // Pending: under two-person approval, no second admin consented yet.
      .Column("STATUS", [](const Operator& o) {
        return std::string(o.active() ? "Active" : "Pending");
      })
      .Column("AGE", [](const Operator& o, absl::Time now) {
        return FormatAgeSince(o.created_unix_ms(), now);
      })
      .Label("role", [](const Operator& o) { return RoleName(o.role()); })
      .Build();
}

}  // namespace

const std::vector<Resource>& Resources() {
  static const auto* const kResources = new std::vector<Resource>{
      Requests(), Incidents(), Suspects(), Jobs(), Nodes(), Operators()};
  return *kResources;
}

const Resource* FindResource(absl::string_view word) {
  for (const Resource& r : Resources()) {
    if (word == r.kind() || word == r.plural()) return &r;
  }
  return nullptr;
}

}  // namespace sdc::sdcctl
