#ifndef SDC_KERNELS_CUDA_LAUNCHER_H_
#define SDC_KERNELS_CUDA_LAUNCHER_H_

// Every CUDA host call the device-resident checks make (cuda_check_queue.h)
// goes through this interface: allocation, asynchronous copies, kernel
// launches, stream ordering and the one synchronization. The real
// implementation (RuntimeLauncher) forwards to the CUDA runtime and the
// kernels of cuda_kernels.cu; tests substitute a counting one
// (counting_launcher.h), so the number of host calls per step is pinned by
// a test that runs without a GPU.
//
// Plain types only (errors are cudaError_t values as int, 0 success), so
// both nvcc- and gcc-compiled code can implement it.

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_kernels.h"

struct CUstream_st;

namespace sdc::kernels {

class CudaLauncher {
 public:
  using Stream = CUstream_st*;
  enum class Copy { kHostToDevice, kDeviceToHost, kDeviceToDevice };

  virtual ~CudaLauncher() = default;

  // The current device's index (allocations land there).
  virtual int CurrentDevice(int* device) = 0;
  // Device memory on the current device; blocking, so only called when a
  // persistent buffer must grow.
  virtual int AllocDevice(void** ptr, size_t bytes) = 0;
  // Page-locked host memory (what lets a copy be asynchronous).
  virtual int AllocPinned(void** ptr, size_t bytes) = 0;
  // Free what the Alloc calls returned. REQUIRES: no queued work uses it.
  virtual void FreeDevice(void* ptr) = 0;
  virtual void FreePinned(void* ptr) = 0;
  // Queued on `stream`; returns once queued. Host memory must be pinned.
  virtual int CopyAsync(void* dst, const void* src, size_t bytes, Copy kind,
                        Stream stream) = 0;
  // Zeroes `bytes` of device memory, queued on `stream`.
  virtual int ZeroAsync(void* dst, size_t bytes, Stream stream) = 0;
  // The kernels (cuda_kernels.h), reading descriptors and the key from
  // device memory and writing into device memory.
  virtual int LaunchScan(const cuda_impl::ScanChunk* chunks, size_t num_chunks,
                         uint64_t* results, Stream stream) = 0;
  virtual int LaunchFingerprint(const cuda_impl::FingerprintChunk* chunks,
                                size_t num_chunks, const uint64_t* key_words,
                                uint64_t r1, uint64_t r2, uint64_t* sums,
                                Stream stream) = 0;
  // Makes work queued on `later` from now on wait for what is queued on
  // `earlier` so far (an event recorded on one, waited on by the other);
  // the host does not wait.
  virtual int OrderAfter(Stream later, Stream earlier) = 0;
  // Blocks the host until everything queued on `stream` has run.
  virtual int Synchronize(Stream stream) = 0;
  virtual const char* ErrorString(int code) = 0;
};

// The CUDA runtime's launcher (one per process; thread-safe, as the
// runtime is). In a build without CUDA every call fails with
// cudaErrorNoDevice's value.
CudaLauncher& RuntimeLauncher();

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_CUDA_LAUNCHER_H_
