// A stand-in for libnvidia-ml.so.1 with the entry points agent/gpus.cc
// calls, for gpus_test and the agent's end-to-end test. Its behaviour comes
// from $FAKE_NVML:
//   unset or "2gpus"    two H100s, GPU-11111111-... and GPU-22222222-...
//   "driver_not_loaded" nvmlInit_v2 returns 9 (NVML_ERROR_DRIVER_NOT_LOADED)
//   "uuid_fails"        nvmlDeviceGetUUID of device 1 returns 999 (UNKNOWN)
// and $FAKE_NVML_UUIDS, "UUID0,UUID1" when set, names the two devices (the
// relay test's agents list the GPU ids their ranks report).
// Every nvmlInit_v2 must be matched by an nvmlShutdown: the fake counts and
// nvmlShutdown returns 1 (UNINITIALIZED) when it is not.

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int g_inits = 0;
// Handles are pointers to these indices.
unsigned int g_devices[2] = {0, 1};

const char* Mode() {
  const char* m = std::getenv("FAKE_NVML");
  return m == nullptr ? "2gpus" : m;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  if (std::strcmp(Mode(), "driver_not_loaded") == 0) return 9;
  ++g_inits;
  return 0;
}

int nvmlShutdown() {
  if (g_inits == 0) return 1;
  --g_inits;
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned int* count) {
  if (g_inits == 0) return 1;
  *count = 2;
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (g_inits == 0) return 1;
  if (index >= 2) return 2;  // INVALID_ARGUMENT.
  *device = &g_devices[index];
  return 0;
}

int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  const unsigned int i = *static_cast<unsigned int*>(device);
  if (i == 1 && std::strcmp(Mode(), "uuid_fails") == 0) return 999;
  if (const char* names = std::getenv("FAKE_NVML_UUIDS"); names != nullptr) {
    const char* comma = std::strchr(names, ',');
    if (comma == nullptr) return 999;
    const char* from = i == 0 ? names : comma + 1;
    const size_t n = i == 0 ? static_cast<size_t>(comma - names) : std::strlen(from);
    std::snprintf(uuid, length, "%.*s", static_cast<int>(n), from);
    return 0;
  }
  std::snprintf(uuid, length, "GPU-%u%u%u%u%u%u%u%u-0000-0000-0000-000000000000", i + 1, i + 1,
                i + 1, i + 1, i + 1, i + 1, i + 1, i + 1);
  return 0;
}

int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  std::snprintf(name, length, "NVIDIA H100 80GB HBM3");
  return 0;
}

const char* nvmlErrorString(int result) {
  switch (result) {
    case 9:
      return "Driver Not Loaded";
    case 999:
      return "Unknown Error";
    default:
      return "Other";
  }
}

int sdc_fake_nvml_inits() { return g_inits; }

}  // extern "C"
