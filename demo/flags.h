#ifndef SDC_DEMO_FLAGS_H_
#define SDC_DEMO_FLAGS_H_

// Command-line flags as sdc-demo and the benchmarks take them: `--name VALUE`
// or `--name=VALUE`. A bad flag calls `usage` with one line saying what is
// wrong (it is expected to print it and exit 2; if it returns, the program
// exits 2 anyway).
//
//   for (FlagReader f(argc, argv, Usage); f.Next();) {
//     if (f.name() == "--steps") steps = f.Number(1);
//     else if (f.name() == "--run-dir") dir = f.Value();
//     else f.Unknown();
//   }

#include <functional>
#include <string>

namespace sdc::demo {

class FlagReader {
 public:
  FlagReader(int argc, char** argv, std::function<void(const std::string&)> usage)
      : argc_(argc), argv_(argv), usage_(std::move(usage)) {}

  // Moves to the next argument; false when none is left.
  bool Next();
  // The flag's name (without "=VALUE").
  const std::string& name() const { return name_; }
  // Its value: after '=', else the next argument.
  std::string Value();
  // Its value as an integer >= `min`.
  int Number(int min);
  // Reports the flag as unknown (`hint` is appended, e.g. "see --help").
  [[noreturn]] void Unknown(const std::string& hint = "");

 private:
  [[noreturn]] void Fail(const std::string& error);

  int argc_;
  char** argv_;
  std::function<void(const std::string&)> usage_;
  int i_ = 0;
  std::string name_;
  std::string inline_value_;
  bool has_inline_value_ = false;
};

}  // namespace sdc::demo

#endif  // SDC_DEMO_FLAGS_H_
