#ifndef SDC_CLIENT_DEVICE_H_
#define SDC_CLIENT_DEVICE_H_

// What depends on where a trainer's tensors live: which kernels scan and
// fingerprint them, which random generators a replay captures and restores,
// and where the process group wants its messages.
//
// CPU tensors use the CPU kernels. CUDA tensors use the CUDA kernels on the
// device's current stream, after whatever the trainer queued on it, and the
// device's CUDA generator travels with an audited micro-batch (see
// docs/ARCHITECTURE.md, "The CUDA path"). CheckDevice refuses CUDA tensors,
// saying why, when no GPU is usable or the kernels were built without nvcc.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "kernels/cuda.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"
#include "protocol/types.h"

namespace sdc::client {

// OK when the guard can check tensors on `device`; otherwise Unimplemented
// or FailedPrecondition saying why.
absl::Status CheckDevice(const torch::Device& device);

// OK when replays on `device` can be deterministic, which audits need: for
// CUDA, cuBLAS's workspace fixed (CUBLAS_WORKSPACE_CONFIG :4096:8 or :16:8
// before CUDA starts); FailedPrecondition naming the variable otherwise.
// Always OK on the CPU.
absl::Status CheckDeterministicConfig(const torch::Device& device);

// A GPU's UUID as NVML prints it and DCGM labels its metrics (`UUID`):
// "GPU-" and the 16 bytes as 8-4-4-4-12 lowercase hex digits.
std::string GpuUuidString(const unsigned char bytes[16]);

// The UUID (GpuUuidString) of CUDA device `device`, from the CUDA runtime (no
// NVML needed: the runtime reports the same UUID). FailedPrecondition when
// the device cannot be queried; InvalidArgument for a CPU device.
absl::StatusOr<std::string> DeviceUuid(const torch::Device& device);

// The software a rank on `device` computes with, for Hello (issue 39, case
// 3): torch's version everywhere; on a GPU the CUDA driver and runtime
// versions, cuBLAS's version and the GPU's model; on the CPU the CPU's model
// name and the vector ISA ATen dispatches to. A field that cannot be read
// stays empty (unknown).
protocol::SoftwareStack SoftwareStackOf(const torch::Device& device);

// The kernels' element type for a floating-point tensor; InvalidArgument
// for any other.
absl::StatusOr<kernels::DType> DTypeOf(const torch::Tensor& t);

// Fingerprints under `key` of contiguous tensors, each on the CPU or a CUDA
// device.
absl::Status FingerprintOnDevice(const std::vector<torch::Tensor>& dense,
                                 const kernels::FingerprintKey& key,
                                 std::vector<kernels::Fingerprint>* out);

// Non-finite scans of contiguous floating-point tensors, as above.
absl::Status ScanOnDevice(const std::vector<torch::Tensor>& dense,
                          std::vector<kernels::ScanResult>* out);

// What the kernels read of a contiguous tensor: its elements (ScanRef;
// InvalidArgument for a dtype DTypeOf refuses) or its bytes (BytesOf).
absl::StatusOr<kernels::TensorRef> ScanRef(const torch::Tensor& dense);
kernels::ByteSpan BytesOf(const torch::Tensor& dense);

// Runs fn(stream) with CUDA device `device` current and `stream` its
// current stream: where the trainer's own next kernel on it would go, so
// work fn queues there runs after what the trainer queued and before what
// it queues next. Returns fn's status.
absl::Status OnCudaStream(const torch::Device& device,
                          absl::FunctionRef<absl::Status(kernels::CudaStream)> fn);

// Every random generator a forward pass on `device` draws from (the CPU's,
// and for a CUDA device its CUDA generator), as one uint8 CPU tensor.
torch::Tensor CaptureRng(const torch::Device& device);

// Sets those generators to `state` (CaptureRng's, from a rank whose model
// is on the same kind of device). InvalidArgument, with nothing set, when
// `state` is not the size CaptureRng(device) gives here.
absl::Status RestoreRng(const torch::Device& device, const torch::Tensor& state);

// The backend's name ("gloo", "nccl"); empty for a group that has none.
std::string BackendName(c10d::ProcessGroup& pg);

// Where `pg` wants the tensors it sends: the CPU for Gloo, the current CUDA
// device for NCCL.
torch::Device CollectiveDevice(c10d::ProcessGroup& pg);

}  // namespace sdc::client

#endif  // SDC_CLIENT_DEVICE_H_
