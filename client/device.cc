#include "client/device.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/Version.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <torch/version.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda.h"

namespace sdc::client {
namespace {

// Positions of `dense` by device, so each device's tensors go to its kernels
// in one call.
std::vector<std::pair<torch::Device, std::vector<size_t>>> ByDevice(
    const std::vector<torch::Tensor>& dense) {
  std::vector<std::pair<torch::Device, std::vector<size_t>>> groups;
  for (size_t i = 0; i < dense.size(); ++i) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == dense[i].device(); });
    if (it == groups.end()) it = groups.insert(groups.end(), {dense[i].device(), {}});
    it->second.push_back(i);
  }
  return groups;
}

// CheckDevice's refusal of `device`, naming it, for a kernel asked to read there.
absl::Status Unreadable(const torch::Device& device) {
  absl::Status s = CheckDevice(device);
  if (s.ok()) s = absl::InternalError("no kernels for this device");
  return absl::Status(s.code(), absl::StrCat("tensors on ", device.str(), ": ", s.message()));
}

at::Generator CudaGenerator(const torch::Device& device) {
  return at::cuda::detail::getDefaultCUDAGenerator(device.index());
}

// Runs a kernel over `dense`, one call per device: `arg` makes each tensor's
// kernel argument, `cpu(args, results)` and `cuda(args, results, stream)`
// are the kernel's two entry points.
template <typename Arg, typename Result, typename MakeArg, typename Cpu, typename Cuda>
absl::Status PerDevice(const std::vector<torch::Tensor>& dense, std::vector<Result>* out,
                       MakeArg arg, Cpu cpu, Cuda cuda) {
  out->assign(dense.size(), Result{});
  for (const auto& [device, positions] : ByDevice(dense)) {
    std::vector<Arg> args;
    for (size_t i : positions) {
      absl::StatusOr<Arg> a = arg(dense[i]);
      if (!a.ok()) return a.status();
      args.push_back(*a);
    }
    std::vector<Result> results(args.size());
    absl::Status s;
    if (device.is_cpu()) {
      s = cpu(absl::MakeConstSpan(args), absl::MakeSpan(results));
    } else if (device.is_cuda()) {
      s = OnCudaStream(device, [&](kernels::CudaStream stream) {
        return cuda(absl::MakeConstSpan(args), absl::MakeSpan(results), stream);
      });
    } else {
      s = Unreadable(device);
    }
    if (!s.ok()) return s;
    for (size_t k = 0; k < positions.size(); ++k) (*out)[positions[k]] = results[k];
  }
  return absl::OkStatus();
}

torch::Tensor GetState(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetState(at::Generator gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

absl::Status OnCudaStream(const torch::Device& device,
                          absl::FunctionRef<absl::Status(kernels::CudaStream)> fn) {
  const c10::cuda::CUDAGuard current(device.index());  // The kernels allocate on the current device.
  return fn(c10::cuda::getCurrentCUDAStream(device.index()).stream());
}

kernels::ByteSpan BytesOf(const torch::Tensor& t) {
  return {t.data_ptr(), static_cast<uint64_t>(t.numel()) * t.element_size()};
}

absl::StatusOr<kernels::TensorRef> ScanRef(const torch::Tensor& t) {
  absl::StatusOr<kernels::DType> dtype = DTypeOf(t);
  if (!dtype.ok()) return dtype.status();
  return kernels::TensorRef{t.data_ptr(), static_cast<uint64_t>(t.numel()), *dtype};
}

std::string GpuUuidString(const unsigned char bytes[16]) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(bytes[i], absl::kZeroPad2));
  }
  return out;
}

absl::StatusOr<std::string> DeviceUuid(const torch::Device& device) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(device.str(), " is not a GPU"));
  }
  cudaDeviceProp prop;
  const cudaError_t e = cudaGetDeviceProperties(&prop, device.index() < 0 ? 0 : device.index());
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceProperties: ", cudaGetErrorString(e)));
  }
  return GpuUuidString(reinterpret_cast<const unsigned char*>(prop.uuid.bytes));
}

protocol::SoftwareStack SoftwareStackOf(const torch::Device& device) {
  protocol::SoftwareStack out;
  out.torch = absl::StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
  if (device.is_cuda()) {
    int v = 0;
    if (cudaDriverGetVersion(&v) == cudaSuccess) out.driver = absl::StrCat(v);
    if (cudaRuntimeGetVersion(&v) == cudaSuccess) out.cuda = absl::StrCat(v);
    // cuBLAS is loaded with torch's CUDA library; looked up rather than
    // linked, so this target needs no cuBLAS of its own.
    using GetProperty = int (*)(int, int*);  // cublasGetProperty(libraryPropertyType, int*)
    if (auto get = reinterpret_cast<GetProperty>(dlsym(RTLD_DEFAULT, "cublasGetProperty"))) {
      int major = 0, minor = 0, patch = 0;
      if (get(0, &major) == 0 && get(1, &minor) == 0 && get(2, &patch) == 0) {
        out.cublas = absl::StrCat(major, ".", minor, ".", patch);
      }
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device.index() < 0 ? 0 : device.index()) == cudaSuccess) {
      out.device = prop.name;
    }
    return out;
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) out.device = std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    break;
  }
  out.isa = at::get_cpu_capability();
  return out;
}

absl::Status CheckDevice(const torch::Device& device) {
  if (device.is_cpu()) return absl::OkStatus();
  if (!device.is_cuda()) return absl::UnimplementedError("sdc-guard checks CPU and CUDA tensors only");
  // The kernels first: a build without nvcc has none, whatever torch has.
  return kernels::CudaAvailable();
}

absl::Status CheckDeterministicConfig(const torch::Device& device) {
  if (!device.is_cuda()) return absl::OkStatus();
  // Deterministic algorithms (on for every audited micro-batch) make cuBLAS
  // raise without a fixed workspace configuration.
  const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string w = workspace != nullptr ? workspace : "";
  if (w != ":4096:8" && w != ":16:8") {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUBLAS_WORKSPACE_CONFIG is ", workspace != nullptr ? absl::StrCat("'", w, "'") : "unset",
        ": replay audits run with deterministic algorithms, which cuBLAS refuses unless it is "
        ":4096:8 (or :16:8) before CUDA starts; export CUBLAS_WORKSPACE_CONFIG=:4096:8 in the "
        "job's environment (sdc_guard sets it when imported before CUDA starts)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::DType> DTypeOf(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return kernels::DType::kFloat32;
    case torch::kDouble:
      return kernels::DType::kFloat64;
    case torch::kHalf:
      return kernels::DType::kFloat16;
    case torch::kBFloat16:
      return kernels::DType::kBFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported gradient dtype ", c10::toString(t.scalar_type())));
  }
}

absl::Status FingerprintOnDevice(const std::vector<torch::Tensor>& dense,
                                 const kernels::FingerprintKey& key,
                                 std::vector<kernels::Fingerprint>* out) {
  return PerDevice<kernels::ByteSpan>(
      dense, out,
      [](const torch::Tensor& t) -> absl::StatusOr<kernels::ByteSpan> { return BytesOf(t); },
      [&key](auto in, auto results) { return kernels::FingerprintTensors(in, key, results); },
      [&key](auto in, auto results, kernels::CudaStream stream) {
        return kernels::FingerprintTensorsCuda(in, key, results, stream);
      });
}

absl::Status ScanOnDevice(const std::vector<torch::Tensor>& dense,
                          std::vector<kernels::ScanResult>* out) {
  return PerDevice<kernels::TensorRef>(
      dense, out,
      ScanRef,
      [](auto in, auto results) { return kernels::ScanNonFinite(in, results); },
      [](auto in, auto results, kernels::CudaStream stream) {
        return kernels::ScanNonFiniteCuda(in, results, stream);
      });
}

torch::Tensor CaptureRng(const torch::Device& device) {
  torch::Tensor cpu = GetState(at::detail::getDefaultCPUGenerator());
  if (device.is_cuda()) return torch::cat({cpu, GetState(CudaGenerator(device))});
  return cpu;
}

absl::Status RestoreRng(const torch::Device& device, const torch::Tensor& state) {
  at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
  const int64_t cpu_bytes = GetState(cpu_gen).numel();
  int64_t total = cpu_bytes;
  if (device.is_cuda()) total += GetState(CudaGenerator(device)).numel();
  if (state.scalar_type() != torch::kUInt8 || state.dim() != 1 || state.numel() != total ||
      !state.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RNG state of ", state.numel(), " elements (", c10::toString(state.scalar_type()), " on ",
        state.device().str(), "); this rank's generators for ", device.str(), " take ", total,
        " bytes on the CPU: do the ranks run the same libtorch, with the model on the same kind "
        "of device?"));
  }
  SetState(cpu_gen, state.narrow(0, 0, cpu_bytes).clone());
  if (device.is_cuda()) SetState(CudaGenerator(device), state.narrow(0, cpu_bytes, total - cpu_bytes).clone());
  return absl::OkStatus();
}

std::string BackendName(c10d::ProcessGroup& pg) {
  try {
    return pg.getBackendName();
  } catch (const c10::Error&) {
    return "";  // The base class asserts: this group does not say.
  }
}

torch::Device CollectiveDevice(c10d::ProcessGroup& pg) {
  if (BackendName(pg) == "nccl") return torch::Device(torch::kCUDA, c10::cuda::current_device());
  return torch::Device(torch::kCPU);
}

}  // namespace sdc::client
