#ifndef SDC_CTL_HANDLERS_H_
#define SDC_CTL_HANDLERS_H_

// What each entry of the table of commands (ctl/commands.cc) runs. Each
// returns the exit code; output goes through the Session.

#include "ctl/session.h"

namespace sdc::sdcctl {

// get RESOURCE: the list call, -l, the format; with -w again every
// --interval until SIGINT or SIGTERM (exit 0). get RESOURCE KEY: as
// describe. (ctl/resource_commands.cc)
int RunGet(Session& session);
// describe RESOURCE KEY: the item and its related lists, in -o's format.
int RunDescribe(Session& session);

// The rest (ctl/action_commands.cc).
int RunDiagnose(Session& session);
int RunApprove(Session& session);
int RunDeny(Session& session);
int RunResolve(Session& session);
int RunHistoryGpu(Session& session);
int RunHistoryNode(Session& session);
int RunOperatorAdd(Session& session);
int RunOperatorRemove(Session& session);
int RunOperatorApprove(Session& session);
int RunWhoAmI(Session& session);
int RunVersion(Session& session);
int RunCompletion(Session& session);
int RunHelp(Session& session);

}  // namespace sdc::sdcctl

#endif  // SDC_CTL_HANDLERS_H_
