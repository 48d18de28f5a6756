#include "ctl/help.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ctl/resources.h"
#include "ctl/text.h"

namespace sdc::sdcctl {
namespace {

constexpr size_t kWidth = 80;

// `text` wrapped at kWidth: the first line after `first` (already written),
// the others after `indent` spaces. "\n" in `text` starts a new line.
std::string Wrap(absl::string_view text, size_t first, size_t indent) {
  std::string out;
  size_t column = first;
  bool first_line = true;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!first_line) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
    }
    first_line = false;
    bool line_empty = true;
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      if (!line_empty && column + 1 + word.size() > kWidth) {
        absl::StrAppend(&out, "\n", std::string(indent, ' '));
        column = indent;
        line_empty = true;
      }
      if (!line_empty) {
        out.push_back(' ');
        ++column;
      }
      absl::StrAppend(&out, word);
      column += word.size();
      line_empty = false;
    }
  }
  return out;
}

// "  LEFT      right, wrapped" lines; a LEFT too long for its column puts
// `right` on the next line.
std::string TwoColumns(const std::vector<std::pair<std::string, std::string>>& rows) {
  constexpr size_t kLeft = 24;
  std::string out;
  for (const auto& [left, right] : rows) {
    absl::StrAppend(&out, "  ", left);
    if (right.empty()) {
      out.push_back('\n');
      continue;
    }
    if (2 + left.size() + 1 > kLeft) {
      absl::StrAppend(&out, "\n", std::string(kLeft, ' '));
    } else {
      out.append(kLeft - 2 - left.size(), ' ');
    }
    absl::StrAppend(&out, Wrap(right, kLeft, kLeft), "\n");
  }
  return out;
}

// The command's words and arguments, without its flags.
std::string WordsAndArgs(const Command& c) {
  std::string out = c.Name();
  for (const Argument& a : c.args) {
    absl::StrAppend(&out, " ", a.optional || a.rest ? "[" : "", a.placeholder, a.rest ? "..." : "",
                    a.optional || a.rest ? "]" : "");
  }
  return out;
}

// "get requests", or "get" when every get command takes the flag.
std::string TakenBy(const Flag& flag) {
  std::vector<std::string> out;
  std::map<std::string, std::pair<int, int>> groups;  // First word: (commands, takers).
  for (const Command& c : Commands()) {
    auto& [all, takers] = groups[c.path[0].name];
    ++all;
    if (c.Uses(flag.name) != nullptr) ++takers;
  }
  for (const Command& c : Commands()) {
    if (c.Uses(flag.name) == nullptr) continue;
    const auto& [all, takers] = groups[c.path[0].name];
    const std::string name = all == takers ? c.path[0].name : c.Name();
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return absl::StrJoin(out, ", ");
}

std::string FlagRows(const std::vector<const Flag*>& flags, bool with_commands) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Flag* f : flags) {
    std::string form = f->short_name != 0
                           ? absl::StrCat("-", std::string(1, f->short_name), ", --", f->name)
                           : absl::StrCat("--", f->name);
    if (!f->is_bool()) absl::StrAppend(&form, "=", f->value);
    const std::string taken_by = with_commands && !f->global ? TakenBy(*f) : "";
    rows.emplace_back(form, taken_by.empty() ? f->help : absl::StrCat(taken_by, ": ", f->help));
  }
  return TwoColumns(rows);
}

// The labels -l matches, per resource of `commands` that takes -l.
std::string LabelsTable(const std::vector<const Command*>& commands) {
  std::vector<Row> rows;
  for (const Command* c : commands) {
    if (c->resource == nullptr || c->Uses("selector") == nullptr) continue;
    rows.push_back({c->resource->plural(), absl::StrJoin(c->resource->label_keys(), ",")});
  }
  if (rows.empty()) return "";
  return absl::StrCat("Labels (-l key=value[,key=value]):\n", RenderTable(rows, "  "));
}

// The deadline line: the default, and the commands that wait longer.
std::string Deadlines() {
  std::string out = "Deadline of every call: --timeout when given, else 10s";
  for (const Command& c : Commands()) {
    if (c.timeout != absl::Seconds(10)) {
      absl::StrAppend(&out, "; ", c.Name(), ": ", absl::FormatDuration(c.timeout));
    }
  }
  return absl::StrCat(out, ".\n");
}

constexpr char kCredentials[] =
    "sdcd records who approves, denies or resolves from the credential: the token (or client "
    "certificate) of an operator added with `operator add`; the bootstrap token from sdcd's "
    "--admin_token_file is \"root\".";

constexpr char kConfigFile[] =
    "Config file: $SDCCTL_CONFIG, else ~/.config/sdc-guard/sdcctl.yaml when it exists. Keys: "
    "server, token_file, tls_ca, tls_cert, tls_key, output (any other key is an error). Flags and "
    "environment variables override it.";

constexpr char kExitCodes[] =
    "Exit codes:\n"
    "  0 success, 1 other error, 2 usage error, 3 not found, 4 already decided or\n"
    "  other failed precondition, 5 sdcd unreachable, 6 credential not accepted or\n"
    "  missing, or permission denied (the role may not do this); diagnose: 0 passed,\n"
    "  7 a device computed wrong values, 8 no verdict (could not run, agent lost, or\n"
    "  still running at the deadline).\n";

}  // namespace

std::string Synopsis(const Command& c) {
  std::string out = WordsAndArgs(c);
  for (const FlagUse& use : c.flags) {
    const Flag* f = FindFlag(use.flag);
    if (f == nullptr) continue;
    absl::StrAppend(&out, " ", use.required.empty() ? "[" : "", f->Form(),
                    use.required.empty() ? "]" : "");
  }
  return out;
}

std::string Usage() {
  std::string out =
      "sdcctl: the sdc-guard operator CLI (talks to sdcd's admin service).\n\n"
      "Usage:\n"
      "  sdcctl [global flags] COMMAND [ARGS] [command flags]\n"
      "  sdcctl COMMAND --help   one command's usage\n\n"
      "Commands:\n";
  std::vector<std::pair<std::string, std::string>> rows;
  std::vector<const Command*> all;
  for (const Command& c : Commands()) {
    rows.emplace_back(WordsAndArgs(c), c.summary);
    all.push_back(&c);
  }
  absl::StrAppend(&out, TwoColumns(rows), "\n", LabelsTable(all), "\n", Wrap(kCredentials, 0, 0),
                  "\n\nGlobal flags (accepted anywhere on the line):\n");
  std::vector<const Flag*> globals;
  std::vector<const Flag*> command_flags;
  for (const Flag& f : Flags()) (f.global ? globals : command_flags).push_back(&f);
  absl::StrAppend(&out, FlagRows(globals, false),
                  TwoColumns({{"--version", "print sdcctl's version and exit"},
                              {"-h, --help", "this usage; COMMAND --help: one command's"}}),
                  "\n", Wrap(kConfigFile, 0, 0), "\n\nCommand flags:\n",
                  FlagRows(command_flags, true), "\n", Deadlines(), "\n", kExitCodes);
  return out;
}

std::string Help(const std::vector<std::string>& words) {
  if (words.empty()) return Usage();
  std::vector<const Command*> commands;
  for (const Command& c : Commands()) {
    if (!c.path[0].Is(words[0])) continue;
    bool exact = c.path.size() <= words.size();
    for (size_t i = 1; exact && i < c.path.size(); ++i) exact = c.path[i].Is(words[i]);
    if (exact) commands = {&c};
    if (exact) break;
    commands.push_back(&c);
  }
  if (commands.empty()) return Usage();
  std::string out = "Usage:\n";
  std::vector<std::string> paragraphs;
  std::vector<const Flag*> flags;
  for (const Command* c : commands) {
    absl::StrAppend(&out, "  sdcctl ", Wrap(Synopsis(*c), 9, 6), "\n      ", Wrap(c->summary, 6, 6),
                    "\n");
    if (!c->help.empty() &&
        std::find(paragraphs.begin(), paragraphs.end(), c->help) == paragraphs.end()) {
      paragraphs.push_back(c->help);
    }
    for (const FlagUse& use : c->flags) {
      const Flag* f = FindFlag(use.flag);
      if (f != nullptr && std::find(flags.begin(), flags.end(), f) == flags.end()) {
        flags.push_back(f);
      }
    }
  }
  for (const std::string& p : paragraphs) absl::StrAppend(&out, "\n", Wrap(p, 0, 0), "\n");
  const std::string labels = LabelsTable(commands);
  if (!labels.empty()) absl::StrAppend(&out, "\n", labels);
  if (!flags.empty()) absl::StrAppend(&out, "\nFlags:\n", FlagRows(flags, false));
  absl::StrAppend(&out, "\nGlobal flags: see sdcctl --help.\n");
  return out;
}

}  // namespace sdc::sdcctl
