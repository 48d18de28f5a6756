#ifndef SDC_KERNELS_COUNTING_LAUNCHER_H_
#define SDC_KERNELS_COUNTING_LAUNCHER_H_

// A CudaLauncher for tests on machines without a GPU: "device" memory is
// host memory, copies are memcpy, the scan kernel is emulated per chunk
// with the CPU scan (so results can be checked), the fingerprint kernel
// leaves its counters as they are (only counted), and every call is
// counted by kind. Not thread-safe.

#include <cstddef>
#include <cstdint>
#include <set>

#include "kernels/cuda_launcher.h"

namespace sdc::kernels {

class CountingLauncher : public CudaLauncher {
 public:
  struct Counts {
    int device_allocs = 0;
    int pinned_allocs = 0;
    int frees = 0;
    int host_to_device = 0;
    int device_to_host = 0;
    int device_to_device = 0;
    int zeroes = 0;
    int scan_launches = 0;
    int fingerprint_launches = 0;
    int orderings = 0;
    int synchronizes = 0;
  };

  ~CountingLauncher() override;

  const Counts& counts() const { return counts_; }
  // Allocations not yet freed.
  size_t live() const { return live_.size(); }
  // The next call of any kind fails with `code` (once).
  void FailNext(int code) { fail_next_ = code; }

  int CurrentDevice(int* device) override;
  int AllocDevice(void** ptr, size_t bytes) override;
  int AllocPinned(void** ptr, size_t bytes) override;
  void FreeDevice(void* ptr) override;
  void FreePinned(void* ptr) override;
  int CopyAsync(void* dst, const void* src, size_t bytes, Copy kind, Stream stream) override;
  int ZeroAsync(void* dst, size_t bytes, Stream stream) override;
  int LaunchScan(const cuda_impl::ScanChunk* chunks, size_t num_chunks, uint64_t* results,
                 Stream stream) override;
  int LaunchFingerprint(const cuda_impl::FingerprintChunk* chunks, size_t num_chunks,
                        const uint64_t* key_words, uint64_t r1, uint64_t r2, uint64_t* sums,
                        Stream stream) override;
  int OrderAfter(Stream later, Stream earlier) override;
  int Synchronize(Stream stream) override;
  const char* ErrorString(int code) override;

 private:
  int Failing();
  void Free(void* ptr);

  Counts counts_;
  std::set<void*> live_;
  int fail_next_ = 0;
};

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_COUNTING_LAUNCHER_H_
