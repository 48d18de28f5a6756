#include "ctl/command_line.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "ctl/help.h"

namespace sdc::sdcctl {

const std::string* CommandLine::Value(absl::string_view flag) const {
  const std::string* value = nullptr;
  for (const auto& [f, v] : flags) {
    if (f->name == flag) value = &v;
  }
  return value;
}

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& argv) {
  CommandLine line;
  bool flags_done = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      line.words.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    const bool single_dash = arg[1] != '-';
    const absl::string_view body = absl::StripPrefix(absl::string_view(arg).substr(1), "-");
    absl::string_view name = body;
    const std::string* value = nullptr;
    std::string given;
    const size_t eq = body.find('=');
    if (eq != absl::string_view::npos) {
      name = body.substr(0, eq);
      given = std::string(body.substr(eq + 1));
      value = &given;
    }
    if (name == "h" || name == "help") {
      line.help = true;
      continue;
    }
    if (name == "version") {
      line.version = true;
      continue;
    }
    if (const std::string* removed = RemovedFlag(name)) {
      return absl::InvalidArgumentError(*removed);
    }
    const Flag* flag = FindFlag(name);
    if (flag == nullptr && single_dash) {
      // -oVALUE: a short name with its value attached.
      const Flag* short_flag = FindFlag(body.substr(0, 1));
      if (short_flag != nullptr && short_flag->short_name != 0 && !short_flag->is_bool()) {
        flag = short_flag;
        given = std::string(body.substr(1));
        value = &given;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg, " (see sdcctl --help)"));
    }
    if (value == nullptr) {
      if (flag->is_bool()) {
        given = "true";
      } else if (i + 1 < argv.size()) {
        given = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag ", arg, " needs a value"));
      }
    } else if (flag->is_bool()) {
      bool b;
      if (!absl::SimpleAtob(given, &b)) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad value \"", given, "\" for --", flag->name, ": want true or false"));
      }
    }
    line.flags.emplace_back(flag, std::move(given));
  }
  return line;
}

namespace {

// "a, b or c".
std::string OneOf(const std::vector<std::string>& words) {
  if (words.size() <= 1) return absl::StrJoin(words, "");
  return absl::StrCat(absl::StrJoin(words.begin(), words.end() - 1, ", "), " or ", words.back());
}

bool PathMatches(const Command& c, const std::vector<std::string>& words) {
  if (words.size() < c.path.size()) return false;
  for (size_t i = 0; i < c.path.size(); ++i) {
    if (!c.path[i].Is(words[i])) return false;
  }
  return true;
}

// "describe node/node-b" as "describe node node-b", when some command's
// last path word is "node" there.
std::vector<std::string> SplitKindSlash(const std::vector<std::string>& words) {
  for (const Command& c : Commands()) {
    const size_t last = c.path.size() - 1;
    if (last == 0 || words.size() <= last) continue;
    const std::string& word = words[last];
    const size_t slash = word.find('/');
    if (slash == std::string::npos || slash + 1 == word.size()) continue;
    std::vector<std::string> split(words.begin(), words.begin() + last);
    split.push_back(word.substr(0, slash));
    if (!PathMatches(c, split)) continue;
    split.push_back(word.substr(slash + 1));
    split.insert(split.end(), words.begin() + last + 1, words.end());
    return split;
  }
  return words;
}

absl::Status UsageError(const Command& c, absl::string_view problem) {
  return absl::InvalidArgumentError(
      problem.empty() ? absl::StrCat("usage: sdcctl ", Synopsis(c))
                      : absl::StrCat(problem, " (usage: sdcctl ", Synopsis(c), ")"));
}

}  // namespace

absl::StatusOr<Match> MatchCommand(const std::vector<std::string>& given) {
  if (given.empty()) return absl::InvalidArgumentError("no command given (see sdcctl --help)");
  const std::vector<std::string> words = SplitKindSlash(given);
  const Command* found = nullptr;
  std::vector<std::string> next_words;  // What may follow the first word.
  bool resources = true;                // get and describe: the next word is a resource.
  for (const Command& c : Commands()) {
    if (!c.path[0].Is(words[0])) continue;
    if (c.path.size() > 1) {
      next_words.push_back(c.path[1].name);
      resources = resources && c.resource != nullptr;
    }
    if (PathMatches(c, words) && (found == nullptr || c.path.size() > found->path.size())) {
      found = &c;
    }
  }
  if (found == nullptr) {
    if (next_words.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown command \"", words[0], "\" (see sdcctl --help)"));
    }
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(words[0], " what? (want ", OneOf(next_words), ")"));
    }
    return absl::InvalidArgumentError(
        resources
            ? absl::StrCat("unknown resource \"", words[1], "\" (want ", OneOf(next_words), ")")
            : absl::StrCat("unknown subcommand \"", words[1], "\" of ", words[0], " (want ",
                           OneOf(next_words), ")"));
  }
  Match match{found, {}};
  const std::vector<std::string> rest(words.begin() + found->path.size(), words.end());
  size_t used = 0;
  for (const Argument& a : found->args) {
    if (used == rest.size()) {
      if (a.optional || a.rest) break;
      return UsageError(*found, "");
    }
    const size_t take = a.rest ? rest.size() - used : 1;
    for (size_t i = 0; i < take; ++i, ++used) {
      absl::StatusOr<std::string> value = a.Parse(rest[used]);
      if (!value.ok()) return value.status();
      match.args.push_back(*std::move(value));
    }
  }
  if (used < rest.size()) {
    return UsageError(*found, absl::StrCat("unexpected argument \"", rest[used], "\""));
  }
  return match;
}

}  // namespace sdc::sdcctl
