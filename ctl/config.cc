#include "ctl/config.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ctl/command.h"
#include "ctl/command_line.h"
#include "yaml-cpp/yaml.h"

namespace sdc::sdcctl {

Environment ReadEnvironment() {
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  return {get("SDC_ADMIN_ADDR"), get("SDC_ADMIN_TOKEN_FILE"), get("SDCCTL_CONFIG"), get("HOME")};
}

absl::StatusOr<FileConfig> ReadConfigFile(const Environment& env) {
  std::string path = env.config_file;
  const bool required = !path.empty();
  if (path.empty()) {
    if (env.home.empty()) return FileConfig{};
    path = absl::StrCat(env.home, "/.config/sdc-guard/sdcctl.yaml");
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (!required && errno == ENOENT) return FileConfig{};
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  std::fclose(f);
  FileConfig out;
  const std::map<std::string, std::string*> keys = {
      {"server", &out.server},     {"token_file", &out.token_file}, {"tls_ca", &out.tls_ca},
      {"tls_cert", &out.tls_cert}, {"tls_key", &out.tls_key},       {"output", &out.output}};
  try {
    YAML::Node root = YAML::Load(text);
    if (root.IsNull()) return out;
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file ", path, ": expected a mapping of key: value"));
    }
    for (const auto& entry : root) {
      const std::string key = entry.first.as<std::string>();
      auto it = keys.find(key);
      if (it == keys.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config file ", path, ": unknown key \"", key,
                         "\" (known: output, server, tls_ca, tls_cert, tls_key, token_file)"));
      }
      if (!entry.second.IsScalar()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config file ", path, ": ", key, " must be a string"));
      }
      std::string value = entry.second.as<std::string>();
      // "~/x" means $HOME/x, as in a shell.
      if (absl::StartsWith(value, "~/") && !env.home.empty()) {
        value = absl::StrCat(env.home, value.substr(1));
      }
      *it->second = value;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": ", e.what()));
  }
  return out;
}

namespace {

// Each layer overrides the one below where it says something.
void Override(const std::string& value, std::string* out) {
  if (!value.empty()) *out = value;
}

// InvalidArgument when the line names a command flag the command does not
// take, or leaves out one it requires.
absl::Status CheckFlags(const CommandLine& line, const Config& c) {
  const Command& command = *c.command;
  for (const auto& [flag, value] : line.flags) {
    if (flag->global) continue;
    const FlagUse* use = command.Uses(flag->name);
    if (use == nullptr || (use->list_only && !c.args.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flag --", flag->name, " does not apply to \"", command.Name(),
          c.args.empty() || use == nullptr ? "" : absl::StrCat(" ", command.args[0].placeholder),
          "\" (see sdcctl ", command.path[0].name, " --help)"));
    }
  }
  for (const FlagUse& use : command.flags) {
    const std::string* value = line.Value(use.flag);
    if (!use.required.empty() && (value == nullptr || absl::StripAsciiWhitespace(*value).empty())) {
      return absl::InvalidArgumentError(use.required);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> MakeConfig(const CommandLine& line, const Environment& env) {
  absl::StatusOr<Match> match = MatchCommand(line.words);
  if (!match.ok()) return match.status();
  Config c;
  c.command = match->command;
  c.args = std::move(match->args);
  if (absl::Status s = CheckFlags(line, c); !s.ok()) return s;

  c.connection.server = kDefaultServer;
  c.connection.token_file = kDefaultTokenFile;
  c.connection.timeout = c.command->timeout;
  if (c.command->needs != Needs::kNothing) {
    absl::StatusOr<FileConfig> file = ReadConfigFile(env);
    if (!file.ok()) return file.status();
    Override(file->server, &c.connection.server);
    Override(file->token_file, &c.connection.token_file);
    Override(file->tls_ca, &c.connection.tls_ca);
    Override(file->tls_cert, &c.connection.tls_cert);
    Override(file->tls_key, &c.connection.tls_key);
    if (!file->output.empty()) {
      absl::StatusOr<OutputFormat> output = ParseOutputFormat(file->output);
      if (!output.ok()) return output.status();
      c.output = *output;
    }
  }
  Override(env.admin_addr, &c.connection.server);
  Override(env.token_file, &c.connection.token_file);
  for (const auto& [flag, value] : line.flags) {
    if (absl::Status s = flag->set(value, &c); !s.ok()) return s;
  }
  return c;
}

absl::Status Validate(const Config& c) {
  if (c.connection.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeout must be positive");
  }
  if (c.watch && c.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--interval must be positive");
  }
  if (c.command->resource != nullptr) {
    if (absl::Status s = c.command->resource->CheckSelector(c.selector); !s.ok()) return s;
  }
  if (c.connection.tls_cert.empty() != c.connection.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  return absl::OkStatus();
}

}  // namespace sdc::sdcctl
