#include "demo/flags.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sdc::demo {

bool FlagReader::Next() {
  if (++i_ >= argc_) return false;
  name_ = argv_[i_];
  const size_t eq = name_.find('=');
  has_inline_value_ = eq != std::string::npos;
  inline_value_ = has_inline_value_ ? name_.substr(eq + 1) : "";
  if (has_inline_value_) name_.resize(eq);
  return true;
}

std::string FlagReader::Value() {
  if (has_inline_value_) return inline_value_;
  if (i_ + 1 >= argc_) Fail(absl::StrCat(name_, " needs a value"));
  return argv_[++i_];
}

int FlagReader::Number(int min) {
  const std::string v = Value();
  int n = 0;
  if (!absl::SimpleAtoi(v, &n) || n < min) {
    Fail(absl::StrCat(name_, " must be an integer >= ", min, ", got '", v, "'"));
  }
  return n;
}

void FlagReader::Unknown(const std::string& hint) {
  Fail(absl::StrCat("unknown flag '", argv_[i_], "'", hint.empty() ? "" : " (", hint,
                    hint.empty() ? "" : ")"));
}

void FlagReader::Fail(const std::string& error) {
  usage_(error);
  std::exit(2);
}

}  // namespace sdc::demo
