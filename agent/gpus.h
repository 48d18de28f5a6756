#ifndef SDC_AGENT_GPUS_H_
#define SDC_AGENT_GPUS_H_

// The node's GPUs, read through NVML. libnvidia-ml is loaded with dlopen at
// run time, so one agent binary runs on nodes with and without a driver, and
// builds without NVML's headers: the few function types it calls are
// declared in gpus.cc.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sdc::agent {

// The driver's NVML library (its stable soname).
inline constexpr char kNvmlLibrary[] = "libnvidia-ml.so.1";

struct Gpu {
  std::string uuid;    // "GPU-xxxxxxxx-xxxx-...", as trainers report it.
  std::string model;   // e.g. "NVIDIA H100 80GB HBM3".
  uint32_t index = 0;  // NVML index: PCI bus order.
};

// Every GPU NVML reports, by index: dlopen(`library`), nvmlInit_v2,
// nvmlDeviceGetCount_v2, then per index nvmlDeviceGetHandleByIndex_v2,
// nvmlDeviceGetUUID and nvmlDeviceGetName, and nvmlShutdown. The library is
// closed again before returning.
// FailedPrecondition, saying why, when there is nothing to ask: the library
// cannot be loaded (no driver installed), lacks a symbol, or nvmlInit_v2
// fails (driver not loaded, no permission). Internal when a query of a
// device fails. Thread-safe (calls are serialized).
absl::StatusOr<std::vector<Gpu>> ListGpus(const std::string& library = kNvmlLibrary);

}  // namespace sdc::agent

#endif  // SDC_AGENT_GPUS_H_
