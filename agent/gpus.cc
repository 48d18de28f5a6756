#include "agent/gpus.h"

#include <dlfcn.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace sdc::agent {
namespace {

// The slice of nvml.h the agent needs (NVML's C ABI, stable across driver
// releases; the _v2 entry points exist since driver 325).
using nvmlReturn_t = int;  // An enum in nvml.h; NVML_SUCCESS is 0.
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
// NVML_DEVICE_UUID_V2_BUFFER_SIZE and NVML_DEVICE_NAME_V2_BUFFER_SIZE.
constexpr unsigned int kBufferSize = 96;

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using GetCountFn = nvmlReturn_t (*)(unsigned int*);
using GetHandleFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using GetStringFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using ErrorStringFn = const char* (*)(nvmlReturn_t);

ABSL_CONST_INIT absl::Mutex g_nvml_mu(absl::kConstInit);

class Library {
 public:
  explicit Library(void* handle) : handle_(handle) {}
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  template <typename Fn>
  Fn Get(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(handle_, name));
  }

 private:
  void* const handle_;
};

}  // namespace

absl::StatusOr<std::vector<Gpu>> ListGpus(const std::string& library) {
  absl::MutexLock lock(&g_nvml_mu);
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("NVML: cannot load ", why == nullptr ? library : why,
                     " (no NVIDIA driver on this node?)"));
  }
  Library nvml(handle);
  const auto init = nvml.Get<InitFn>("nvmlInit_v2");
  const auto shutdown = nvml.Get<ShutdownFn>("nvmlShutdown");
  const auto get_count = nvml.Get<GetCountFn>("nvmlDeviceGetCount_v2");
  const auto get_handle = nvml.Get<GetHandleFn>("nvmlDeviceGetHandleByIndex_v2");
  const auto get_uuid = nvml.Get<GetStringFn>("nvmlDeviceGetUUID");
  const auto get_name = nvml.Get<GetStringFn>("nvmlDeviceGetName");
  const auto error_string = nvml.Get<ErrorStringFn>("nvmlErrorString");  // Optional.
  if (init == nullptr || shutdown == nullptr || get_count == nullptr || get_handle == nullptr ||
      get_uuid == nullptr || get_name == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVML: ", library, " lacks an entry point the agent needs"));
  }
  auto describe = [&](const char* call, nvmlReturn_t r) {
    const char* text = error_string != nullptr ? error_string(r) : nullptr;
    return absl::StrCat("NVML: ", call, " returned ", r,
                        text != nullptr ? absl::StrCat(" (", text, ")") : "");
  };
  if (nvmlReturn_t r = init(); r != kNvmlSuccess) {
    return absl::FailedPreconditionError(describe("nvmlInit_v2", r));
  }
  std::vector<Gpu> gpus;
  absl::Status status;
  unsigned int count = 0;
  if (nvmlReturn_t r = get_count(&count); r != kNvmlSuccess) {
    status = absl::InternalError(describe("nvmlDeviceGetCount_v2", r));
  }
  for (unsigned int i = 0; status.ok() && i < count; ++i) {
    nvmlDevice_t device = nullptr;
    char uuid[kBufferSize] = {};
    char name[kBufferSize] = {};
    if (nvmlReturn_t r = get_handle(i, &device); r != kNvmlSuccess) {
      status = absl::InternalError(describe(absl::StrCat("nvmlDeviceGetHandleByIndex_v2(", i, ")").c_str(), r));
    } else if (nvmlReturn_t r = get_uuid(device, uuid, kBufferSize); r != kNvmlSuccess) {
      status = absl::InternalError(describe(absl::StrCat("nvmlDeviceGetUUID(", i, ")").c_str(), r));
    } else if (nvmlReturn_t r = get_name(device, name, kBufferSize); r != kNvmlSuccess) {
      status = absl::InternalError(describe(absl::StrCat("nvmlDeviceGetName(", i, ")").c_str(), r));
    } else {
      uuid[kBufferSize - 1] = '\0';
      name[kBufferSize - 1] = '\0';
      gpus.push_back({uuid, name, i});
    }
  }
  shutdown();
  if (!status.ok()) return status;
  return gpus;
}

}  // namespace sdc::agent
