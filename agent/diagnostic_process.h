#ifndef SDC_AGENT_DIAGNOSTIC_PROCESS_H_
#define SDC_AGENT_DIAGNOSTIC_PROCESS_H_

// Runs each device's confirmation diagnostic in a child process: this same
// binary, started as `sdc-agent __diagnostic ...`. The device under test is
// the one we suspect: its kernel may hang, crash the process, or leave a
// sticky CUDA error that makes every later CUDA call in that process fail.
// In a child, that costs the child; the agent keeps serving, kills a child
// still running at the timeout, and reports why the device has no verdict.
//
// The agent computes the request's reference product once (host CPU,
// integers only, no libtorch) and hands it to every child in a file; a child
// runs only the device's products and the comparison, and writes its outcome
// as a DiagnosticResult. The files live in a fresh directory under $TMPDIR
// (default /tmp), removed when the request is done.

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "agent.pb.h"
#include "common/diagnostic_plan.h"
#include "agent/diagnostic.h"

namespace sdc::agent {

// The first argument that makes sdc-agent a diagnostic child.
inline constexpr char kDiagnosticChildCommand[] = "__diagnostic";

struct DiagnosticProcessOptions {
  std::string agent_binary = "/proc/self/exe";  // This binary.
  absl::Duration timeout = absl::Minutes(30);  // Per device.
  bool inject_fault = false;                   // DiagnosticOptions::inject_fault.
};

// The wire form of an outcome (id and device_count left 0).
v1::DiagnosticResult ToProto(const DeviceOutcome& outcome);

// Runs `shape` on every device of `devices` in turn, one child process each,
// and calls `each` with each device's result as soon as it is known. Never
// fails: a child that could not start, timed out, died or wrote no result
// yields a result whose `error` says so.
void RunDiagnosticProcesses(const common::Shape& shape,
                            const std::vector<common::PlannedDevice>& devices,
                            const DiagnosticProcessOptions& options,
                            absl::FunctionRef<void(v1::DiagnosticResult)> each);

// main() of a child: args are what follows kDiagnosticChildCommand. Returns
// the process's exit code (0 when it wrote a result, even a failing one).
int DiagnosticChildMain(const std::vector<std::string>& args);

}  // namespace sdc::agent

#endif  // SDC_AGENT_DIAGNOSTIC_PROCESS_H_
