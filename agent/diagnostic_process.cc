#include "agent/diagnostic_process.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/subprocess.h"

namespace sdc::agent {
namespace {

// A fresh private directory under $TMPDIR (default /tmp), or "" on failure.
std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp",
                                     "/sdc-diagnostic-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

// The last non-empty line of a child's output, for an error message.
std::string LastLine(const std::string& output) {
  std::string last;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipWhitespace())) {
    last = std::string(absl::StripAsciiWhitespace(line));
  }
  return last;
}

DeviceOutcome Failed(const common::Shape& shape, const common::PlannedDevice& device,
                     const std::string& error) {
  DeviceOutcome out;
  out.gpu = device.label;
  out.device = DeviceName(device.cuda_index);
  out.size = shape.size;
  out.repetitions = shape.repetitions;
  out.error = error;
  out.detail = absl::StrCat(out.device, ": no verdict: ", error);
  return out;
}

// Why a child gave no result, from how it ended.
std::string ChildFailure(const common::CommandResult& r, absl::Duration timeout) {
  if (!r.started) return absl::StrCat("diagnostic process did not start: ", LastLine(r.output));
  if (r.timed_out) {
    return absl::StrCat("diagnostic process still running after ", absl::FormatDuration(timeout),
                        ", killed (a hung device?)");
  }
  if (r.signal != 0) {
    return absl::StrCat("diagnostic process died of signal ", r.signal, " (", strsignal(r.signal),
                        ")");
  }
  const std::string last = LastLine(r.output);
  return absl::StrCat("diagnostic process exited with code ", r.exit_code,
                      last.empty() ? "" : ": ", last);
}

}  // namespace

v1::DiagnosticResult ToProto(const DeviceOutcome& o) {
  v1::DiagnosticResult r;
  r.set_gpu(o.gpu);
  r.set_pass(o.pass);
  r.set_mismatches(o.mismatches);
  r.set_max_abs_error(o.max_abs_error);
  r.set_gflops(o.gflops);
  r.set_seconds(o.seconds);
  r.set_detail(o.detail);
  r.set_error(o.error);
  r.set_size(o.size);
  r.set_repetitions(o.repetitions);
  r.set_device(o.device);
  return r;
}

void RunDiagnosticProcesses(const common::Shape& shape,
                            const std::vector<common::PlannedDevice>& devices,
                            const DiagnosticProcessOptions& options,
                            absl::FunctionRef<void(v1::DiagnosticResult)> each) {
  const std::string dir = MakeTempDir();
  std::string setup_error;
  const std::string reference_path = dir + "/reference.f32";
  if (dir.empty()) {
    setup_error = absl::StrCat("cannot create a directory under $TMPDIR: ", strerror(errno));
  } else {
    ConfirmationDiagnostic diagnostic(shape);
    absl::StatusOr<const Matrix*> reference = diagnostic.Reference();
    absl::Status written = reference.ok() ? WriteMatrix(**reference, reference_path)
                                          : reference.status();
    if (!written.ok()) setup_error = std::string(written.message());
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    const common::PlannedDevice& device = devices[i];
    if (!setup_error.empty()) {
      each(ToProto(Failed(shape, device, setup_error)));
      continue;
    }
    const std::string result_path = absl::StrCat(dir, "/result-", i, ".pb");
    const common::CommandResult r = common::RunCommand(
        {options.agent_binary, kDiagnosticChildCommand, absl::StrCat(shape.size),
         absl::StrCat(shape.repetitions), device.label, absl::StrCat(device.cuda_index),
         options.inject_fault ? "inject" : "no-inject", reference_path, result_path},
        options.timeout);
    v1::DiagnosticResult result;
    std::ifstream in(result_path, std::ios::binary);
    if (r.ok() && in && result.ParseFromIstream(&in)) {
      each(std::move(result));
    } else {
      each(ToProto(Failed(shape, device, ChildFailure(r, options.timeout))));
    }
  }
  std::error_code ignored;
  if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
}

int DiagnosticChildMain(const std::vector<std::string>& args) {
  // Dies with the agent: a diagnostic nobody will read must not keep a
  // device busy.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "sdc-agent %s: %s\n", kDiagnosticChildCommand, why.c_str());
    return 2;
  };
  if (args.size() != 7) {
    return fail("want SIZE REPETITIONS LABEL CUDA_INDEX inject|no-inject REFERENCE RESULT");
  }
  common::Shape shape;
  common::PlannedDevice device;
  device.label = args[2];
  if (!absl::SimpleAtoi(args[0], &shape.size) || !absl::SimpleAtoi(args[1], &shape.repetitions) ||
      !absl::SimpleAtoi(args[3], &device.cuda_index)) {
    return fail("SIZE, REPETITIONS and CUDA_INDEX must be integers");
  }
  absl::StatusOr<Matrix> reference = ReadMatrix(args[5], shape.size);
  if (!reference.ok()) return fail(std::string(reference.status().message()));
  ConfirmationDiagnostic diagnostic(shape);
  if (absl::Status s = diagnostic.UseReference(*std::move(reference)); !s.ok()) {
    return fail(std::string(s.message()));
  }
  const DeviceOutcome out = diagnostic.Run(device, {args[4] == "inject"});
  // The agent reads the result only after a clean exit, so a child that dies
  // mid-write leaves nothing half-read.
  std::ofstream file(args[6], std::ios::binary | std::ios::trunc);
  if (!ToProto(out).SerializeToOstream(&file)) return fail("cannot write " + args[6]);
  file.close();
  return file ? 0 : fail("cannot write " + args[6]);
}

}  // namespace sdc::agent
