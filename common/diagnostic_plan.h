#ifndef SDC_COMMON_DIAGNOSTIC_PLAN_H_
#define SDC_COMMON_DIAGNOSTIC_PLAN_H_

// What a confirmation diagnostic runs: its shape (n, repetitions) and the
// devices it tests. Shared by the agent (which runs it) and sdcd (which
// validates a request before sending it), so both apply the same limits.
//
// The diagnostic computes C = A x B in fp32 with A and B holding integers in
// [kMinEntry, kMaxEntry]. Every product is at most kMaxEntry^2 = 64 in
// magnitude and every partial sum at most 64 n, an integer below 2^24 for
// n <= kMaxSize, hence exactly representable in fp32 (and the inputs in
// TF32): C is exact whatever order or blocking the device sums in, and a
// correct device matches the integer reference bit for bit.
//
// Pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sdc::common {

inline constexpr int kMinEntry = -8;
inline constexpr int kMaxEntry = 8;
inline constexpr uint32_t kDefaultSize = 1024;
// 8192: three 256 MiB fp32 matrices, and a CPU reference of 5.5e11
// multiply-adds (minutes); exactness alone would allow 262,143.
inline constexpr uint32_t kMaxSize = 8192;
inline constexpr uint32_t kDefaultRepetitions = 3;
inline constexpr uint32_t kMaxRepetitions = 1000;
// Device label of the host CPU.
inline constexpr char kCpuDevice[] = "cpu";

// True when every partial sum of an n x n product of such matrices is an
// integer exactly representable in fp32 (below 2^24).
constexpr bool ExactInFp32(uint64_t n) {
  return static_cast<uint64_t>(kMaxEntry) * kMaxEntry * n < (uint64_t{1} << 24);
}
static_assert(ExactInFp32(kMaxSize), "kMaxSize must keep the product exact in fp32");

struct Shape {
  uint32_t size = kDefaultSize;                // n: A, B and C are n x n.
  uint32_t repetitions = kDefaultRepetitions;  // Products computed and compared.
};

// `size` and `repetitions` with 0 meaning the default. InvalidArgument naming
// the field when out of range (size 1..8192, repetitions 1..1000).
absl::StatusOr<Shape> ResolveShape(uint32_t size, uint32_t repetitions);

struct GpuRef {
  std::string uuid;
  uint32_t index = 0;  // NVML index (PCI bus order).
};

struct PlannedDevice {
  std::string label;    // The GPU's UUID, or kCpuDevice.
  int cuda_index = -1;  // CUDA ordinal; -1 for the CPU.
};

// The devices a request for `gpu_uuid` tests on a node with `gpus`: that
// GPU; the CPU for "cpu"; for "" every GPU, or the CPU when there is none.
// CUDA ordinals equal NVML indices: the agent sets CUDA_DEVICE_ORDER=
// PCI_BUS_ID, NVML's order. NotFound when the node has no such GPU.
absl::StatusOr<std::vector<PlannedDevice>> PlanDevices(const std::string& gpu_uuid,
                                                       const std::vector<GpuRef>& gpus);

}  // namespace sdc::common

#endif  // SDC_COMMON_DIAGNOSTIC_PLAN_H_
