#include "ctl/completion.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ctl/command.h"

namespace sdc::sdcctl {
namespace {

// Each word once, in first-seen order.
void AddOnce(const std::string& word, std::vector<std::string>* words) {
  if (std::find(words->begin(), words->end(), word) == words->end()) words->push_back(word);
}

// What completion offers for a flag: "--reason=", "--dry-run", "-o --output=".
std::vector<std::string> FlagWords(const Flag& f) {
  std::vector<std::string> out;
  if (f.short_name != 0) out.push_back(absl::StrCat("-", std::string(1, f.short_name)));
  out.push_back(absl::StrCat("--", f.name, f.is_bool() ? "" : "="));
  return out;
}

// "-o|--output": the words a flag is typed as, for a case pattern.
std::string FlagPattern(const Flag& f) {
  std::string out = absl::StrCat("--", f.name);
  if (f.short_name != 0) out = absl::StrCat("-", std::string(1, f.short_name), "|", out);
  return out;
}

// A first word and its aliases, for a case pattern: "operator|operators".
std::string WordPattern(const Word& w) {
  std::vector<std::string> all = {w.name};
  all.insert(all.end(), w.aliases.begin(), w.aliases.end());
  return absl::StrJoin(all, "|");
}

}  // namespace

std::string BashCompletion() {
  std::vector<std::string> commands;  // First words.
  std::vector<std::string> globals;   // Global flags' words.
  std::vector<std::string> valued;    // Case patterns of flags that take the next word.
  std::string choices;                // Case arms completing flag values.
  for (const Flag& f : Flags()) {
    if (f.global) {
      for (const std::string& w : FlagWords(f)) globals.push_back(w);
    }
    if (!f.is_bool()) valued.push_back(FlagPattern(f));
    if (!f.choices.empty()) {
      absl::StrAppend(&choices, "    ", FlagPattern(f), ") COMPREPLY=($(compgen -W \"",
                      absl::StrJoin(f.choices, " "), "\" -- \"$cur\")); return ;;\n");
    }
  }
  globals.push_back("--help");
  // Per first word (with its aliases): the flags its commands take, and the
  // words that may come second.
  std::vector<std::string> order;
  std::map<std::string, std::string> patterns;
  std::map<std::string, std::vector<std::string>> flags;
  std::map<std::string, std::vector<std::string>> seconds;
  for (const Command& c : Commands()) {
    const std::string& first = c.path[0].name;
    AddOnce(first, &commands);
    if (patterns.count(first) == 0) order.push_back(first);
    patterns[first] = WordPattern(c.path[0]);
    for (const FlagUse& use : c.flags) {
      if (const Flag* f = FindFlag(use.flag)) {
        for (const std::string& w : FlagWords(*f)) AddOnce(w, &flags[first]);
      }
    }
    if (c.path.size() > 1) {
      AddOnce(c.path[1].name, &seconds[first]);
    } else if (!c.args.empty() && c.args[0].accepts == Argument::Accepts::kChoice) {
      for (const std::string& v : c.args[0].choices) AddOnce(v, &seconds[first]);
    } else if (!c.args.empty() && c.args[0].accepts == Argument::Accepts::kCommand) {
      AddOnce("$commands", &seconds[first]);
    }
  }
  std::string flag_arms;
  std::string second_arms;
  for (const std::string& first : order) {
    if (!flags[first].empty()) {
      absl::StrAppend(&flag_arms, "    ", patterns[first], ") flags=\"$flags ",
                      absl::StrJoin(flags[first], " "), "\" ;;\n");
    }
    if (!seconds[first].empty()) {
      absl::StrAppend(&second_arms, "        ", patterns[first], ") COMPREPLY=($(compgen -W \"",
                      absl::StrJoin(seconds[first], " "), "\" -- \"$cur\")) ;;\n");
    }
  }
  return absl::StrCat(
      "# bash completion for sdcctl. Load with: source <(sdcctl completion bash)\n"
      "_sdcctl() {\n"
      "  local cur prev\n"
      "  cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
      "  prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
      "  local commands=\"",
      absl::StrJoin(commands, " "),
      "\"\n"
      "  local globals=\"",
      absl::StrJoin(globals, " "),
      "\"\n"
      "  # The command words typed so far (flags and their values skipped).\n"
      "  local -a typed=()\n"
      "  local i\n"
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    case \"${COMP_WORDS[i]}\" in\n"
      "      ",
      absl::StrJoin(valued, "|"),
      ") ((i++)) ;;\n"
      "      -*) ;;\n"
      "      *) typed+=(\"${COMP_WORDS[i]}\") ;;\n"
      "    esac\n"
      "  done\n"
      "  case \"$prev\" in\n",
      choices,
      "  esac\n"
      "  local flags=\"$globals\"\n"
      "  case \"${typed[0]}\" in\n",
      flag_arms,
      "  esac\n"
      "  if [[ \"$cur\" == -* ]]; then\n"
      "    COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n"
      "    return\n"
      "  fi\n"
      "  case \"${#typed[@]}\" in\n"
      "    0) COMPREPLY=($(compgen -W \"$commands\" -- \"$cur\")) ;;\n"
      "    1)\n"
      "      case \"${typed[0]}\" in\n",
      second_arms,
      "      esac ;;\n"
      "  esac\n"
      "}\n"
      "complete -F _sdcctl sdcctl\n");
}

std::string ZshCompletion() {
  return absl::StrCat(
      "#compdef sdcctl\n"
      "# zsh completion for sdcctl: the bash function through bashcompinit.\n"
      "# Load with: source <(sdcctl completion zsh)\n"
      "autoload -U +X bashcompinit && bashcompinit\n",
      BashCompletion());
}

}  // namespace sdc::sdcctl
