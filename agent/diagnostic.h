#ifndef SDC_AGENT_DIAGNOSTIC_H_
#define SDC_AGENT_DIAGNOSTIC_H_

// The confirmation diagnostic: deterministic matrix products computed on the
// device under test and compared bit for bit with a reference computed
// elsewhere (diagnostic_plan.h explains why the comparison is exact by
// construction).
//
//   A, B    n x n fp32, integers in [-8, 8] from a fixed generator: the same
//           bits on every machine and every run.
//   device  C = torch::matmul(A, B) with libtorch, on the CPU or on a CUDA
//           device, `repetitions` times (one untimed warm-up first).
//   ref     C computed once on the host CPU by a plain loop in 32-bit
//           integer arithmetic: no floating-point unit involved, so a fault
//           in the FP path under test cannot also be in the reference.
//
// CUDA: the CUDA path is plain libtorch (tensors on torch::kCUDA), compiled
// always and guarded at run time: with a CPU-only libtorch (Debian's) or no
// visible device, a CUDA device's outcome is an error saying so, and the
// CPU path still works. libtorch throws c10::Error; it is caught here and
// becomes the outcome's error, never an exception out of this module.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/diagnostic_plan.h"

namespace sdc::agent {

// An n x n fp32 matrix, row-major.
struct Matrix {
  uint32_t n = 0;
  std::vector<float> values;  // n * n entries.
};

// Seeds of the diagnostic's A and B.
inline constexpr uint64_t kSeedA = 0x5dc0a00000000001ull;
inline constexpr uint64_t kSeedB = 0x5dc0b00000000002ull;

// n x n integers in [kMinEntry, kMaxEntry]: entry k is
// (SplitMix64(seed + k + 1) mod 17) - 8, so the same on every machine.
Matrix FillMatrix(uint32_t n, uint64_t seed);

// A x B in 32-bit integer arithmetic on the host, rows split over
// kernels::ThreadPool::Default(). InvalidArgument when the sizes differ or
// an entry is not an integer in [kMinEntry, kMaxEntry], or n exceeds what
// fp32 holds exactly (common::ExactInFp32).
absl::StatusOr<Matrix> ReferenceProduct(const Matrix& a, const Matrix& b);

struct Comparison {
  uint64_t mismatches = 0;    // Elements whose 32 bits differ.
  double max_abs_error = 0;   // Over all elements; +inf if a NaN/Inf differs.
};

// Compares the bit patterns element by element (so +0 vs -0 counts, and a
// NaN never matches). REQUIRES: got.n == want.n.
Comparison CompareBits(const Matrix& got, const Matrix& want);

// OK when libtorch can run on CUDA device `cuda_index`; otherwise
// FailedPrecondition saying why (no CUDA in this libtorch, no device, index
// out of range).
absl::Status CudaDeviceUsable(int cuda_index);

// C = A x B with torch::matmul on the CPU (cuda_index < 0) or CUDA device
// `cuda_index`, `repetitions` times after one warm-up; `each(r, C)` sees
// every product on the host (r from 0). `*seconds` is the compute time of
// the repetitions, device synchronized, host copies excluded.
// FailedPrecondition when the CUDA device is not usable; Internal with
// libtorch's message when it throws; ResourceExhausted when out of memory.
absl::Status DeviceProducts(const Matrix& a, const Matrix& b, int cuda_index,
                            uint32_t repetitions,
                            absl::FunctionRef<void(uint32_t, Matrix&)> each, double* seconds);

// "cpu" for a CUDA ordinal below 0, else "cuda:N".
std::string DeviceName(int cuda_index);

// A matrix as raw native-endian fp32 in a file (n * n * 4 bytes), for the
// agent to hand a request's reference to its diagnostic processes.
absl::Status WriteMatrix(const Matrix& m, const std::string& path);
// NotFound/Internal when the file cannot be read; InvalidArgument when it
// does not hold exactly n * n values.
absl::StatusOr<Matrix> ReadMatrix(const std::string& path, uint32_t n);

struct DiagnosticOptions {
  // Tests only (sdc-agent --inject_diagnostic_fault=yes-i-am-testing): adds
  // 1 to one element of the first repetition's product, after the device
  // computed it and before the comparison. Default: false.
  bool inject_fault = false;
};

// One device's outcome (DiagnosticResult on the wire).
struct DeviceOutcome {
  std::string gpu;           // PlannedDevice::label: a GPU UUID or "cpu".
  std::string device;        // "cpu" or "cuda:N".
  bool pass = false;         // Ran, and every element matched.
  uint64_t mismatches = 0;   // Summed over repetitions.
  double max_abs_error = 0;
  double gflops = 0;         // 2 n^3 repetitions / seconds / 1e9.
  double seconds = 0;
  uint32_t size = 0;
  uint32_t repetitions = 0;
  std::string detail;        // One line.
  std::string error;         // Non-empty: could not run (no verdict).
};

// One request's inputs and reference, computed on first use and shared by
// the devices it tests. Not thread-safe (one worker runs a request).
class ConfirmationDiagnostic {
 public:
  explicit ConfirmationDiagnostic(const common::Shape& shape) : shape_(shape) {}

  // Runs the diagnostic on `device`. Never fails: a problem is the
  // outcome's `error`.
  DeviceOutcome Run(const common::PlannedDevice& device, const DiagnosticOptions& options);

  // The reference product, computed on first use (host CPU, integers only).
  absl::StatusOr<const Matrix*> Reference();
  // Takes `reference` (Reference() of the same shape, perhaps computed by
  // another process) instead of computing it. InvalidArgument when its size
  // is not the shape's.
  absl::Status UseReference(Matrix reference);

 private:
  absl::Status Prepare();

  const common::Shape shape_;
  bool prepared_ = false;
  absl::Status prepare_status_;
  Matrix a_, b_, reference_;
};

}  // namespace sdc::agent

#endif  // SDC_AGENT_DIAGNOSTIC_H_
