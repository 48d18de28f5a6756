#include "ctl/sdcctl.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "ctl/admin_client.h"
#include "ctl/command.h"
#include "ctl/command_line.h"
#include "ctl/errors.h"
#include "ctl/help.h"
#include "ctl/session.h"

namespace sdc::sdcctl {

int Main(const std::vector<std::string>& argv, const Environment& env, std::FILE* out,
         std::FILE* err) {
  const Config none;
  Session bare(none, nullptr, out, err);  // For what happens before there is a Config.
  absl::StatusOr<CommandLine> line = ParseCommandLine(argv);
  if (!line.ok()) return bare.Fail(kExitUsage, line.status().message());
  if (line->version) {
    bare.Print(absl::StrCat("sdcctl ", kVersion, "\n"));
    return kExitOk;
  }
  if (line->help) {
    // "sdcctl approve --help": that command's usage, whatever else is on the line.
    bare.Print(Help(line->words));
    return kExitOk;
  }
  absl::StatusOr<Config> config = MakeConfig(*line, env);
  if (!config.ok()) return bare.Fail(kExitUsage, config.status().message());
  if (absl::Status s = Validate(*config); !s.ok()) return bare.Fail(kExitUsage, s.message());
  const Command& command = *config->command;
  if (command.needs != Needs::kServer) {
    Session session(*config, nullptr, out, err);
    return command.run(session);
  }
  absl::StatusOr<Credentials> creds = LoadCredentials(config->connection);
  if (!creds.ok()) {
    return bare.Fail(
        creds.status().code() == absl::StatusCode::kPermissionDenied ? kExitPermission : kExitError,
        creds.status().message());
  }
  AdminClient admin(config->connection, *creds);
  Session session(*config, &admin, out, err);
  return command.run(session);
}

}  // namespace sdc::sdcctl
