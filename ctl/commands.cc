// The table of sdcctl's commands (ctl/command.h): get and describe once per
// resource of the table of resources, then the commands that act.

#include <vector>

#include "ctl/command.h"
#include "ctl/handlers.h"
#include "ctl/resources.h"

namespace sdc::sdcctl {
namespace {

using Accepts = Argument::Accepts;

// get RESOURCE [KEY]: the resource's own list flags, then -l, -w and
// --interval, none of which apply with a KEY.
Command GetCommand(const Resource& r) {
  Command c;
  c.path = {{"get"}, {r.plural(), {r.kind()}}};
  if (r.describable()) {
    Argument key = r.key();
    key.optional = true;
    c.args = {key};
  }
  for (const std::string& flag : r.list_flags()) c.flags.push_back({flag, "", true});
  for (const char* flag : {"selector", "watch", "interval"}) c.flags.push_back({flag, "", true});
  c.summary = r.list_summary();
  c.run = RunGet;
  c.resource = &r;
  return c;
}

Command DescribeCommand(const Resource& r) {
  Command c;
  c.path = {{"describe"}, {r.kind(), {r.plural()}}};
  c.args = {r.key()};
  c.summary = r.describe_summary();
  c.run = RunDescribe;
  c.resource = &r;
  return c;
}

std::vector<Command> Build() {
  std::vector<Command> out;
  for (const Resource& r : Resources()) out.push_back(GetCommand(r));
  for (const Resource& r : Resources()) {
    if (r.describable()) out.push_back(DescribeCommand(r));
  }
  const Argument request_id = {"ID", Accepts::kPositiveInteger, "request"};

  Command diagnose;
  diagnose.path = {{"diagnose"}, {"node", {"nodes"}}};
  diagnose.args = {{"NAME", Accepts::kText, "node"}};
  diagnose.flags = {{"gpu"}, {"size"}, {"repetitions"}};
  diagnose.summary = "run the agent's confirmation diagnostic and wait for its verdict";
  diagnose.help =
      "n x n fp32 matrix products on each device (or the CPU), every element compared with a "
      "reference bit for bit. Exit 0: passed; 7: a device computed wrong values; 8: no verdict "
      "(could not run, agent lost, or still running at the deadline).";
  diagnose.run = RunDiagnose;
  diagnose.timeout = absl::Minutes(10);  // A large diagnostic on the CPU takes minutes.
  out.push_back(diagnose);

  Command approve;
  approve.path = {{"approve"}};
  approve.args = {request_id};
  approve.flags = {
      {"reason", "approve needs --reason=TEXT (why; it is kept in the request's history)"},
      {"dry-run"},
      {"force"}};
  approve.summary = "approve a replacement request";
  approve.help =
      "Approves replacement request ID as the operator your credential names (role operator or "
      "admin). With sdcd --approvals_required=N the request runs after N distinct operators "
      "approve. --force (admins only) decides a decided request again or passes the execution "
      "cap, and needs two admins' forced approvals.";
  approve.run = RunApprove;
  out.push_back(approve);

  Command deny = approve;
  deny.path = {{"deny"}};
  deny.flags[0].required = "deny needs --reason=TEXT (why; it is kept in the request's history)";
  deny.summary = "deny a replacement request";
  deny.help =
      "Denies replacement request ID as the operator your credential names; one deny ends the "
      "request.";
  deny.run = RunDeny;
  out.push_back(deny);

  Command resolve;
  resolve.path = {{"resolve"}, {"incident", {"incidents"}}};
  resolve.args = {{"ID", Accepts::kPositiveInteger, "incident"}};
  resolve.flags = {{"reason", "resolve needs --reason=TEXT (why; it is kept with the incident)"}};
  resolve.summary = "close an incident whose GPU was dealt with by hand";
  resolve.help =
      "For an incident with no request to deny (the open-request cap or a never-replace node "
      "suppressed it): once resolved it stops vetoing checkpoints.";
  resolve.run = RunResolve;
  out.push_back(resolve);

  Command history_gpu;
  history_gpu.path = {{"history"}, {"gpu", {"gpus"}}};
  history_gpu.args = {{"UUID"}};
  history_gpu.summary = "every incident and request involving a GPU";
  history_gpu.run = RunHistoryGpu;
  out.push_back(history_gpu);

  Command history_node;
  history_node.path = {{"history"}, {"node", {"nodes"}}};
  history_node.args = {{"NAME", Accepts::kText, "node"}};
  history_node.summary = "every incident and request involving a node";
  history_node.run = RunHistoryNode;
  out.push_back(history_node);

  const char* const kOperatorsHelp =
      "Needs role admin (the bootstrap token is root, an admin). `add` prints the new token once "
      "on stdout: sdcctl operator add alice > alice.token. Under two-person approval (sdcd "
      "--approvals_required=2) the token works once a second admin runs `sdcctl operator "
      "approve alice`; root enrolls only the first admins.";
  Command operator_add;
  operator_add.path = {{"operator", {"operators"}}, {"add"}};
  operator_add.args = {{"NAME"}};
  operator_add.flags = {{"role"}};
  operator_add.summary = "(admin) a new operator; prints its token once, on stdout";
  operator_add.help = kOperatorsHelp;
  operator_add.run = RunOperatorAdd;
  out.push_back(operator_add);

  Command operator_list;
  operator_list.path = {{"operator", {"operators"}}, {"list"}};
  operator_list.summary = "(admin) operators and their roles (as get operators)";
  operator_list.help = kOperatorsHelp;
  operator_list.run = RunGet;
  operator_list.resource = FindResource("operators");
  out.push_back(operator_list);

  Command operator_remove;
  operator_remove.path = {{"operator", {"operators"}}, {"remove"}};
  operator_remove.args = {{"NAME", Accepts::kText, "operator"}};
  operator_remove.summary = "(admin) its token stops working at once";
  operator_remove.help = kOperatorsHelp;
  operator_remove.run = RunOperatorRemove;
  out.push_back(operator_remove);

  Command operator_approve;
  operator_approve.path = {{"operator", {"operators"}}, {"approve"}};
  operator_approve.args = {{"NAME", Accepts::kText, "operator"}};
  operator_approve.summary = "(admin) a second admin's consent: the operator's token works";
  operator_approve.help = kOperatorsHelp;
  operator_approve.run = RunOperatorApprove;
  out.push_back(operator_approve);

  Command whoami;
  whoami.path = {{"whoami"}};
  whoami.summary = "the operator your credential names, its role, sdcd's version";
  whoami.run = RunWhoAmI;
  out.push_back(whoami);

  Command version;
  version.path = {{"version"}};
  version.summary = "sdcctl's version and, when reachable, sdcd's";
  version.run = RunVersion;
  version.needs = Needs::kConfig;
  out.push_back(version);

  Command completion;
  completion.path = {{"completion"}};
  completion.args = {{"SHELL", Accepts::kChoice, "", {"bash", "zsh"}}};
  completion.summary = "a shell completion script: source <(sdcctl completion bash)";
  completion.help = "bash: source <(sdcctl completion bash); zsh: source <(sdcctl completion zsh)";
  completion.run = RunCompletion;
  completion.needs = Needs::kNothing;
  out.push_back(completion);

  Command help;
  help.path = {{"help"}};
  help.args = {{"COMMAND", Accepts::kCommand, "", {}, /*optional=*/true, /*rest=*/true}};
  help.summary = "this usage, or one command's (as COMMAND --help)";
  help.run = RunHelp;
  help.needs = Needs::kNothing;
  out.push_back(help);
  return out;
}

}  // namespace

const std::vector<Command>& Commands() {
  static const auto* const kCommands = new std::vector<Command>(Build());
  return *kCommands;
}

}  // namespace sdc::sdcctl
