#ifndef SDC_DEMO_PROGRESS_LINE_H_
#define SDC_DEMO_PROGRESS_LINE_H_

// The trainers' progress lines (--progress): one JSON object per line, one
// per step, then a final line. demo/sdc-trainer writes them with StepLine and
// FinalLine, examples/cluster_support.py writes the same keys with Python's
// json module, and the launcher reads both with ParseProgressLine.
//
// JSON has no NaN or infinity: a non-finite number is written as null, and
// null reads back as NaN (a diverged loss stays visible as one; it does not
// turn into 0).
//
// Free functions and plain structs: safe to use from any thread.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/statusor.h"

namespace sdc::demo {

// One rank's step, as its trainer saw it.
struct StepRecord {
  int step = 0;
  int rank = 0;
  double loss = 0;
  bool apply = true;
  std::string reason;
  bool audited = false;
  std::string outcome;
  bool unverified = false;
  double norm = 0;
  bool repaired = false;
  std::string checkpoint;  // none | allowed | vetoed
  double ms = 0;
  double check1_ms = 0;  // The guard's own work (see sdc::StepDecision).
  double agreement_ms = 0;
  double audit_ms = 0;
  double weight_ms = 0;
  double end_unix_ms = 0;  // When the step ended, milliseconds since the epoch.
  // With the trainer's --count_collectives: the collectives the step issued
  // (the gradients' all-reduce and the guard's own alike); -1: not counted,
  // and the line has no "collectives" key.
  int collectives = -1;
};

// A rank's last line: `{"final":true,"rank":R,"weights_digest":"...","guard":{...}}`.
struct FinalRecord {
  int rank = 0;
  std::string weights_digest;  // The parameters' model digest, 16 hex digits.
  // The guard's summary counters by name (steps, skipped, audits, ...);
  // empty when the rank ran unguarded. Non-integer entries of "guard" (the
  // Python trainer's audits_off reason) are not kept.
  std::map<std::string, int64_t> guard;
};

// One line of a progress file: a step, or the final line.
using ProgressLine = std::variant<StepRecord, FinalRecord>;

// The JSON text of one line, without the newline. Strings are escaped as
// JSON requires (invalid UTF-8 is replaced by U+FFFD); non-finite numbers
// are written as null.
std::string StepLine(const StepRecord& record);
std::string FinalLine(const FinalRecord& record);

// Parses one line (without its newline). A line with "final": true is a
// FinalRecord, any other a StepRecord. Every key StepLine / FinalLine writes
// is required ("guard" and "collectives" excepted), with its JSON type; a number may be null
// (read as NaN) except the integers "step" and "rank". Unknown keys are
// ignored. Returns kInvalidArgument, saying what is wrong, for anything else.
absl::StatusOr<ProgressLine> ParseProgressLine(std::string_view line);

}  // namespace sdc::demo

#endif  // SDC_DEMO_PROGRESS_LINE_H_
