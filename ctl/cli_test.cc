// The command line without a server: the tables of commands and flags, and
// what is derived from them (parsing, config, help, completion).

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ctl/command.h"
#include "ctl/command_line.h"
#include "ctl/completion.h"
#include "ctl/config.h"
#include "ctl/help.h"
#include "ctl/resources.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::sdcctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

absl::StatusOr<CommandLine> Line(std::vector<std::string> args) {
  args.insert(args.begin(), "sdcctl");
  return ParseCommandLine(args);
}

// The Config of a line, with no config file unless `env` names one.
absl::StatusOr<Config> ConfigOf(std::vector<std::string> args, Environment env = {}) {
  absl::StatusOr<CommandLine> line = Line(std::move(args));
  if (!line.ok()) return line.status();
  return MakeConfig(*line, env);
}

// The message of the error the line gives (parse, config or validation);
// "" when it gives none.
std::string ErrorOf(std::vector<std::string> args, Environment env = {}) {
  absl::StatusOr<Config> c = ConfigOf(std::move(args), env);
  if (!c.ok()) {
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(c.status().message());
  }
  absl::Status s = Validate(*c);
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

// ---------------------------------------------------------------------------
// The tables

TEST(TablesTest, EveryFlagACommandTakesExistsAndEveryCommandRuns) {
  std::set<std::string> names;
  for (const Command& c : Commands()) {
    SCOPED_TRACE(c.Name());
    EXPECT_TRUE(names.insert(c.Name()).second) << "twice";
    EXPECT_NE(c.run, nullptr);
    EXPECT_FALSE(c.summary.empty());
    for (const FlagUse& use : c.flags) {
      const Flag* f = FindFlag(use.flag);
      ASSERT_NE(f, nullptr) << use.flag;
      EXPECT_EQ(f->name, use.flag);
      EXPECT_FALSE(f->global) << use.flag << " is global: every command takes it";
    }
  }
  for (const Flag& f : Flags()) {
    SCOPED_TRACE(f.name);
    ASSERT_NE(f.set, nullptr);
    EXPECT_FALSE(f.help.empty());
    // Every value completion offers is one the flag takes.
    for (const std::string& choice : f.choices) {
      Config c;
      EXPECT_TRUE(f.set(choice, &c).ok()) << choice;
    }
  }
}

TEST(TablesTest, GetAndDescribeComeFromTheResources) {
  for (const Resource& r : Resources()) {
    SCOPED_TRACE(r.plural());
    absl::StatusOr<Match> get = MatchCommand({"get", r.plural()});
    ASSERT_TRUE(get.ok()) << get.status();
    EXPECT_EQ(get->command->resource, &r);
    for (const std::string& flag : r.list_flags()) EXPECT_NE(get->command->Uses(flag), nullptr);
    EXPECT_NE(get->command->Uses("selector"), nullptr);
    absl::StatusOr<Match> describe = MatchCommand({"describe", r.kind(), "7"});
    EXPECT_EQ(describe.ok(), r.describable()) << describe.status();
  }
}

// ---------------------------------------------------------------------------
// Flags

TEST(ParseCommandLineTest, FlagsAnywhereInEveryForm) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-o", "json", "get", "jobs"},
           {"get", "-ojson", "jobs"},
           {"get", "jobs", "-o=json"},
           {"get", "jobs", "--output=json"},
           {"get", "jobs", "-output", "json"},
           {"--o=json", "get", "jobs"}}) {
    absl::StatusOr<Config> c = ConfigOf(args);
    ASSERT_TRUE(c.ok()) << args[0] << ": " << c.status();
    EXPECT_EQ(c->output, OutputFormat::kJson) << args[0];
    EXPECT_EQ(c->command->Name(), "get jobs");
  }
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"get", "jobs", "-l", "job=a"},
           {"get", "jobs", "-ljob=a"},
           {"get", "jobs", "-l=job=a"},
           {"get", "jobs", "--selector", "job=a"}}) {
    absl::StatusOr<Config> c = ConfigOf(args);
    ASSERT_TRUE(c.ok()) << args[2] << ": " << c.status();
    EXPECT_EQ(c->selector, (Selector{{"job", "a"}}));
  }
  absl::StatusOr<Config> c = ConfigOf({"approve", "7", "--dry-run", "--force=false",
                                       "--reason", "bad GPU", "--no_headers", "--", "--x"});
  EXPECT_EQ(c.status().message(),
            "unexpected argument \"--x\" (usage: sdcctl approve ID --reason=TEXT [--dry-run] "
            "[--force])");
  c = ConfigOf({"approve", "7", "--dry_run", "--force=false", "--reason", "bad GPU",
                "--no-headers"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->dry_run);
  EXPECT_FALSE(c->force);
  EXPECT_TRUE(c->no_headers);
  EXPECT_EQ(c->reason, "bad GPU");
  EXPECT_EQ(c->args, (std::vector<std::string>{"7"}));
  c = ConfigOf({"get", "jobs", "-w", "--interval=250ms"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->watch);
  EXPECT_EQ(c->interval, absl::Milliseconds(250));

  absl::StatusOr<CommandLine> line = Line({"approve", "-h"});
  ASSERT_TRUE(line.ok());
  EXPECT_TRUE(line->help);
  line = Line({"-version"});
  ASSERT_TRUE(line.ok());
  EXPECT_TRUE(line->version);
}

TEST(ParseCommandLineTest, BadFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"get", "jobs", "--bogus"}, "unknown flag --bogus (see sdcctl --help)"},
      {{"get", "jobs", "-x"}, "unknown flag -x (see sdcctl --help)"},
      {{"approve", "1", "--as=alice"},
       "--as was removed: sdcd records who decides from the credential (each operator gets a "
       "token: sdcctl operator add NAME)"},
      {{"approve", "1", "--reason"}, "flag --reason needs a value"},
      {{"get", "jobs", "--watch=maybe"}, "bad value \"maybe\" for --watch: want true or false"},
      {{"get", "jobs", "--timeout=soon"},
       "bad value \"soon\" for --timeout: want a duration like 10s or 2m"},
      {{"get", "jobs", "-o", "xml"},
       "unknown output format \"xml\" (want table, wide, json, yaml or name)"},
      {{"diagnose", "node", "a", "--size=-1"}, "--size must not be negative"},
      {{"diagnose", "node", "a", "--repetitions=x"},
       "bad value \"x\" for --repetitions: want an integer"},
      {{"get", "requests", "--state=pend"},
       "unknown request state \"pend\" (want pending, approved, executing, done, failed, denied "
       "or expired)"},
      {{"operator", "add", "x", "--role=root"},
       "bad --role \"root\" (want viewer, operator or admin)"},
      {{"get", "jobs", "-l", "job"},
       "bad label selector term \"job\" (want key=value[,key=value])"},
  };
  for (const auto& [args, want] : cases) EXPECT_EQ(ErrorOf(args), want) << args.back();
}

TEST(MakeConfigTest, CommandFlagsOnlyWhereTheyApply) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"get", "jobs", "--state=pending"},
       "flag --state does not apply to \"get jobs\" (see sdcctl get --help)"},
      {{"get", "incidents", "--state=pending"},
       "flag --state does not apply to \"get incidents\" (see sdcctl get --help)"},
      {{"get", "requests", "7", "-w"},
       "flag --watch does not apply to \"get requests ID\" (see sdcctl get --help)"},
      {{"describe", "job", "a", "-l", "job=a"},
       "flag --selector does not apply to \"describe job\" (see sdcctl describe --help)"},
      {{"deny", "1", "--reason=x", "--role=admin"},
       "flag --role does not apply to \"deny\" (see sdcctl deny --help)"},
      {{"resolve", "incident", "1", "--dry-run", "--reason=x"},
       "flag --dry-run does not apply to \"resolve incident\" (see sdcctl resolve --help)"},
      {{"approve", "1"}, "approve needs --reason=TEXT (why; it is kept in the request's history)"},
      {{"deny", "1", "--reason= "},
       "deny needs --reason=TEXT (why; it is kept in the request's history)"},
      {{"resolve", "incident", "1"},
       "resolve needs --reason=TEXT (why; it is kept with the incident)"},
  };
  for (const auto& [args, want] : cases) EXPECT_EQ(ErrorOf(args), want) << args[1];
  // The list flags with the list.
  absl::StatusOr<Config> c = ConfigOf({"get", "request", "--state=Pending"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->filter.state, v1::PENDING);
  c = ConfigOf({"get", "incidents", "--job", "job-a"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->filter.job, "job-a");
}

TEST(ValidateTest, UsageErrorsBeforeAnythingIsSent) {
  EXPECT_EQ(ErrorOf({"get", "jobs", "--timeout=0s"}), "--timeout must be positive");
  EXPECT_EQ(ErrorOf({"get", "jobs", "-w", "--interval=0s"}), "--interval must be positive");
  EXPECT_EQ(ErrorOf({"get", "jobs", "--interval=0s"}), "");  // Not watching.
  EXPECT_EQ(ErrorOf({"get", "jobs", "-l", "node=x"}),
            "label \"node\" does not apply to jobs (labels: job)");
  EXPECT_EQ(ErrorOf({"get", "requests", "-l", "check=replay"}),
            "label \"check\" does not apply to requests (labels: node, gpu, state)");
  EXPECT_EQ(ErrorOf({"get", "incidents", "-l", "check=replay,state=open"}), "");
  EXPECT_EQ(ErrorOf({"whoami", "--tls_cert=a.pem"}), "--tls_cert and --tls_key go together");
}

// ---------------------------------------------------------------------------
// Command words

TEST(MatchCommandTest, WordsAliasesAndKindSlashForms) {
  const std::vector<std::tuple<std::vector<std::string>, std::string, std::vector<std::string>>>
      cases = {
          {{"get", "requests"}, "get requests", {}},
          {{"get", "request", "request/7"}, "get requests", {"7"}},
          {{"get", "request/7"}, "get requests", {"7"}},
          {{"get", "nodes", "node/b"}, "get nodes", {"b"}},
          {{"describe", "requests", "12"}, "describe request", {"12"}},
          {{"describe", "request/12"}, "describe request", {"12"}},
          {{"describe", "incident/4"}, "describe incident", {"4"}},
          {{"describe", "incident", "incident/4"}, "describe incident", {"4"}},
          {{"describe", "job/team/run-1"}, "describe job", {"team/run-1"}},
          {{"describe", "job", "job/x"}, "describe job", {"job/x"}},
          {{"describe", "nodes", "node/node-b"}, "describe node", {"node-b"}},
          {{"diagnose", "node/node-b"}, "diagnose node", {"node-b"}},
          {{"diagnose", "nodes", "node-b"}, "diagnose node", {"node-b"}},
          {{"resolve", "incident", "3"}, "resolve incident", {"3"}},
          {{"history", "gpu", "GPU-3"}, "history gpu", {"GPU-3"}},
          {{"history", "node", "node/b"}, "history node", {"b"}},
          {{"operators", "list"}, "operator list", {}},
          {{"operator", "add", "alice"}, "operator add", {"alice"}},
          {{"operator", "remove", "operator/alice"}, "operator remove", {"alice"}},
          {{"approve", "request/3"}, "approve", {"3"}},
          {{"completion", "zsh"}, "completion", {"zsh"}},
          {{"help"}, "help", {}},
          {{"help", "get", "jobs"}, "help", {"get", "jobs"}},
      };
  for (const auto& [words, name, args] : cases) {
    absl::StatusOr<Match> m = MatchCommand(words);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_EQ(m->command->Name(), name);
    EXPECT_EQ(m->args, args) << name;
  }
}

TEST(MatchCommandTest, UsageErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no command given (see sdcctl --help)"},
      {{"frobnicate"}, "unknown command \"frobnicate\" (see sdcctl --help)"},
      {{"get"}, "get what? (want requests, incidents, suspects, jobs, nodes or operators)"},
      {{"get", "pods"},
       "unknown resource \"pods\" (want requests, incidents, suspects, jobs, nodes or operators)"},
      {{"describe", "suspect", "GPU-1"},
       "unknown resource \"suspect\" (want request, incident, job or node)"},
      {{"operator", "rename"},
       "unknown subcommand \"rename\" of operator (want add, list, remove or approve)"},
      {{"history"}, "history what? (want gpu or node)"},
      {{"approve"}, "usage: sdcctl approve ID --reason=TEXT [--dry-run] [--force]"},
      {{"approve", "1", "2"},
       "unexpected argument \"2\" (usage: sdcctl approve ID --reason=TEXT [--dry-run] [--force])"},
      {{"approve", "x"}, "bad request id \"x\" (want a positive integer)"},
      {{"describe", "request", "0"}, "bad request id \"0\" (want a positive integer)"},
      {{"resolve", "incident", "-"}, "bad incident id \"-\" (want a positive integer)"},
      {{"get", "suspects", "GPU-1"},
       "unexpected argument \"GPU-1\" (usage: sdcctl get suspects [-l SELECTOR] [-w] "
       "[--interval=DURATION])"},
      {{"history", "gpu", ""}, "UUID must not be empty"},
      {{"describe", "node", "node/"}, "NAME must not be empty"},
      {{"completion", "fish"}, "bad shell \"fish\" (want bash or zsh)"},
      {{"whoami", "me"}, "unexpected argument \"me\" (usage: sdcctl whoami)"},
  };
  for (const auto& [words, want] : cases) {
    absl::StatusOr<Match> m = MatchCommand(words);
    ASSERT_FALSE(m.ok()) << want;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(m.status().message(), want);
  }
}

// ---------------------------------------------------------------------------
// Settings: flags over the environment over the config file over defaults.

TEST(MakeConfigTest, Precedence) {
  const std::string dir = TempDir();
  const std::string file = dir + "/precedence.yaml";
  WriteText(file,
            "server: file:1\ntoken_file: ~/file.token\ntls_ca: /ca.pem\noutput: yaml\n");
  absl::StatusOr<Config> c = ConfigOf({"get", "jobs"}, {"", "", file, "/home/op"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->connection.server, "file:1");
  EXPECT_EQ(c->connection.token_file, "/home/op/file.token");  // "~/" is $HOME.
  EXPECT_EQ(c->connection.tls_ca, "/ca.pem");
  EXPECT_EQ(c->output, OutputFormat::kYaml);
  EXPECT_EQ(c->connection.timeout, absl::Seconds(10));

  c = ConfigOf({"get", "jobs"}, {"env:2", "/env.token", file, "/home/op"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->connection.server, "env:2");
  EXPECT_EQ(c->connection.token_file, "/env.token");

  c = ConfigOf({"get", "jobs", "--server=flag:3", "--token_file=/flag.token", "-o", "wide",
                "--server="},  // An empty value leaves what was there.
               {"env:2", "/env.token", file, "/home/op"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->connection.server, "flag:3");
  EXPECT_EQ(c->connection.token_file, "/flag.token");
  EXPECT_EQ(c->output, OutputFormat::kWide);

  c = ConfigOf({"get", "jobs"}, {"", "", "", "/nonexistent"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->connection.server, kDefaultServer);
  EXPECT_EQ(c->connection.token_file, kDefaultTokenFile);
  EXPECT_EQ(c->output, OutputFormat::kTable);

  // ~/.config/sdc-guard/sdcctl.yaml when $SDCCTL_CONFIG is not set.
  const std::string home = dir + "/home";
  ASSERT_EQ(std::system(("mkdir -p " + home + "/.config/sdc-guard").c_str()), 0);
  WriteText(home + "/.config/sdc-guard/sdcctl.yaml", "output: name\n");
  c = ConfigOf({"get", "jobs"}, {"", "", "", home});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->output, OutputFormat::kName);
}

TEST(MakeConfigTest, ConfigFileErrors) {
  const std::string file = TempDir() + "/bad.yaml";
  WriteText(file, "server: x:1\ncolour: blue\n");
  EXPECT_EQ(ErrorOf({"get", "jobs"}, {"", "", file, ""}),
            absl::StrCat("config file ", file,
                         ": unknown key \"colour\" (known: output, server, tls_ca, tls_cert, "
                         "tls_key, token_file)"));
  WriteText(file, "server: [a, b]\n");
  EXPECT_EQ(ErrorOf({"get", "jobs"}, {"", "", file, ""}),
            absl::StrCat("config file ", file, ": server must be a string"));
  WriteText(file, "output: xml\n");
  EXPECT_THAT(ErrorOf({"get", "jobs"}, {"", "", file, ""}), HasSubstr("unknown output format"));
  EXPECT_THAT(ErrorOf({"get", "jobs"}, {"", "", file + ".missing", ""}),
              HasSubstr("No such file or directory"));
  // Commands that need nothing do not read it.
  EXPECT_EQ(ErrorOf({"completion", "bash"}, {"", "", file + ".missing", ""}), "");
  EXPECT_EQ(ErrorOf({"help", "get"}, {"", "", file, ""}), "");
}

TEST(MakeConfigTest, DiagnoseWaitsTenMinutesUnlessTold) {
  absl::StatusOr<Config> c = ConfigOf({"diagnose", "node", "a"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->connection.timeout, absl::Minutes(10));
  c = ConfigOf({"diagnose", "node", "a", "--timeout=5s", "--gpu", "cpu", "--size", "64"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->connection.timeout, absl::Seconds(5));
  EXPECT_EQ(c->gpu, "cpu");
  EXPECT_EQ(c->size, 64u);
  c = ConfigOf({"operator", "add", "bob", "--role=Viewer"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, v1::ROLE_VIEWER);
  EXPECT_EQ(ConfigOf({"operator", "add", "bob"})->role, v1::ROLE_OPERATOR);
}

// ---------------------------------------------------------------------------
// Help

TEST(HelpTest, OneCommandsUsage) {
  const std::string approve = Help({"approve"});
  EXPECT_THAT(approve, HasSubstr("  sdcctl approve ID --reason=TEXT [--dry-run] [--force]\n"));
  EXPECT_THAT(approve, HasSubstr("--approvals_required=N"));
  EXPECT_THAT(approve, HasSubstr("\n  --dry-run "));
  EXPECT_THAT(approve, Not(HasSubstr("history gpu")));
  EXPECT_THAT(approve, Not(HasSubstr("--role")));

  const std::string get = Help({"get"});
  for (const Resource& r : Resources()) {
    EXPECT_THAT(get, HasSubstr(absl::StrCat("sdcctl get ", r.plural()))) << r.plural();
  }
  EXPECT_THAT(get, HasSubstr("\n  incidents   job,node,gpu,check,outcome,state\n"));
  EXPECT_THAT(get, Not(HasSubstr("sdcctl describe")));

  const std::string one = Help({"get", "jobs"});
  EXPECT_THAT(one, HasSubstr("sdcctl get jobs [NAME] [-l SELECTOR] [-w] [--interval=DURATION]"));
  EXPECT_THAT(one, Not(HasSubstr("get requests")));
  EXPECT_THAT(one, Not(HasSubstr("--state")));

  EXPECT_THAT(Help({"operators"}), HasSubstr("sdcctl operator remove NAME"));
  EXPECT_EQ(Help({"nope"}), Usage());
  EXPECT_EQ(Help({}), Usage());
}

TEST(HelpTest, UsageNamesEveryCommandAndFlag) {
  const std::string usage = Usage();
  for (const Command& c : Commands()) {
    EXPECT_THAT(usage, HasSubstr(absl::StrCat("\n  ", c.Name()))) << c.Name();
  }
  for (const Flag& f : Flags()) {
    EXPECT_THAT(usage, HasSubstr(absl::StrCat("--", f.name))) << f.name;
  }
  EXPECT_THAT(usage, HasSubstr("get requests: only requests in STATE"));
  EXPECT_THAT(usage, HasSubstr("approve, deny, resolve: why"));
  EXPECT_THAT(usage, HasSubstr("diagnose node: 10m"));
  EXPECT_THAT(usage, HasSubstr("6 credential not accepted"));
  // Every line fits 80 columns.
  size_t start = 0;
  while (start < usage.size()) {
    const size_t end = usage.find('\n', start);
    EXPECT_LE(end - start, 80u) << usage.substr(start, end - start);
    start = end + 1;
  }
}

// ---------------------------------------------------------------------------
// Completion, run by bash.

// What the bash function offers for each line, one line of output each.
std::string Complete(const std::vector<std::string>& lines) {
  const std::string script = TempDir() + "/sdcctl.bash";
  WriteText(script, BashCompletion());
  std::string program = absl::StrCat(
      "source ", script,
      "\ncomplete_line() { COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); _sdcctl; "
      "echo \"${COMPREPLY[*]}\"; }\n");
  for (const std::string& line : lines) absl::StrAppend(&program, "complete_line ", line, "\n");
  const std::string file = TempDir() + "/complete.sh";
  WriteText(file, program);
  std::string out;
  FILE* p = popen(absl::StrCat("bash ", file, " 2>&1").c_str(), "r");
  if (p == nullptr) return "popen failed";
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), p)) > 0) out.append(buffer, n);
  EXPECT_EQ(pclose(p), 0) << out;
  return out;
}

TEST(CompletionTest, CommandsResourcesArgumentsFlagsAndValues) {
  EXPECT_EQ(Complete({"sdcctl ge", "sdcctl get re", "sdcctl approve 1 --re",
                      "sdcctl get requests --state p", "sdcctl describe ''",
                      "sdcctl operators r", "sdcctl completion ''", "sdcctl -o json get ''",
                      "sdcctl -o ''", "sdcctl operator add x --role a", "sdcctl help ap",
                      "sdcctl diagnose node n --s", "sdcctl get -"}),
            "get\n"
            "requests\n"
            "--reason=\n"
            "pending\n"
            "request incident job node\n"
            "remove\n"
            "bash zsh\n"
            "requests incidents suspects jobs nodes operators\n"
            "table wide json yaml name\n"
            "admin\n"
            "approve\n"
            "--server= --size=\n"
            "--server= --token_file= --tls_ca= --tls_cert= --tls_key= -o --output= --no-headers "
            "--timeout= --help --state= -l --selector= -w --watch --interval= --job=\n");
  const std::string zsh = ZshCompletion();
  EXPECT_THAT(zsh, HasSubstr("bashcompinit"));
  EXPECT_THAT(zsh, HasSubstr(BashCompletion()));
}

}  // namespace
}  // namespace sdc::sdcctl
