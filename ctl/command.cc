#include "ctl/command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace sdc::sdcctl {
namespace {

// "dry-run" and "dry_run" alike.
std::string Normalized(absl::string_view name) { return absl::StrReplaceAll(name, {{"-", "_"}}); }

}  // namespace

std::string Flag::Form() const {
  if (short_name != 0) {
    return is_bool() ? absl::StrCat("-", std::string(1, short_name))
                     : absl::StrCat("-", std::string(1, short_name), " ", value);
  }
  return is_bool() ? absl::StrCat("--", name) : absl::StrCat("--", name, "=", value);
}

bool Word::Is(absl::string_view word) const {
  if (word == name) return true;
  for (const std::string& alias : aliases) {
    if (word == alias) return true;
  }
  return false;
}

std::string Command::Name() const {
  std::string out;
  for (const Word& w : path) absl::StrAppend(&out, out.empty() ? "" : " ", w.name);
  return out;
}

const FlagUse* Command::Uses(absl::string_view flag) const {
  for (const FlagUse& use : flags) {
    if (use.flag == flag) return &use;
  }
  return nullptr;
}

const Flag* FindFlag(absl::string_view name) {
  const std::string wanted = Normalized(name);
  for (const Flag& f : Flags()) {
    if (Normalized(f.name) == wanted) return &f;
    if (f.short_name != 0 && name.size() == 1 && name[0] == f.short_name) return &f;
  }
  return nullptr;
}

const std::string* RemovedFlag(absl::string_view name) {
  static const auto* const kRemoved = new std::vector<std::pair<std::string, std::string>>{
      {"as",
       "--as was removed: sdcd records who decides from the credential (each operator gets a "
       "token: sdcctl operator add NAME)"},
  };
  for (const auto& [flag, why] : *kRemoved) {
    if (name == flag) return &why;
  }
  return nullptr;
}

}  // namespace sdc::sdcctl
