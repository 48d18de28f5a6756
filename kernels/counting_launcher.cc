#include "kernels/counting_launcher.h"

#include <cstring>

#include "kernels/nonfinite.h"

namespace sdc::kernels {

CountingLauncher::~CountingLauncher() {
  for (void* p : live_) delete[] static_cast<unsigned char*>(p);
}

int CountingLauncher::Failing() {
  const int code = fail_next_;
  fail_next_ = 0;
  return code;
}

int CountingLauncher::CurrentDevice(int* device) {
  *device = 0;
  return Failing();
}

int CountingLauncher::AllocDevice(void** ptr, size_t bytes) {
  ++counts_.device_allocs;
  if (int err = Failing(); err != 0) return err;
  *ptr = new unsigned char[bytes == 0 ? 1 : bytes]();
  live_.insert(*ptr);
  return 0;
}

int CountingLauncher::AllocPinned(void** ptr, size_t bytes) {
  ++counts_.pinned_allocs;
  if (int err = Failing(); err != 0) return err;
  *ptr = new unsigned char[bytes == 0 ? 1 : bytes]();
  live_.insert(*ptr);
  return 0;
}

void CountingLauncher::Free(void* ptr) {
  ++counts_.frees;
  if (live_.erase(ptr) == 1) delete[] static_cast<unsigned char*>(ptr);
}

void CountingLauncher::FreeDevice(void* ptr) { Free(ptr); }
void CountingLauncher::FreePinned(void* ptr) { Free(ptr); }

int CountingLauncher::CopyAsync(void* dst, const void* src, size_t bytes, Copy kind, Stream) {
  switch (kind) {
    case Copy::kHostToDevice:
      ++counts_.host_to_device;
      break;
    case Copy::kDeviceToHost:
      ++counts_.device_to_host;
      break;
    case Copy::kDeviceToDevice:
      ++counts_.device_to_device;
      break;
  }
  if (int err = Failing(); err != 0) return err;
  std::memcpy(dst, src, bytes);
  return 0;
}

int CountingLauncher::ZeroAsync(void* dst, size_t bytes, Stream) {
  ++counts_.zeroes;
  if (int err = Failing(); err != 0) return err;
  std::memset(dst, 0, bytes);
  return 0;
}

int CountingLauncher::LaunchScan(const cuda_impl::ScanChunk* chunks, size_t num_chunks,
                                 uint64_t* results, Stream) {
  ++counts_.scan_launches;
  if (int err = Failing(); err != 0) return err;
  for (size_t c = 0; c < num_chunks; ++c) {
    const DType dtype = static_cast<DType>(chunks[c].dtype);
    const TensorRef piece{static_cast<const unsigned char*>(chunks[c].base) +
                              chunks[c].begin * DTypeSize(dtype),
                          chunks[c].length, dtype};
    ScanResult r;
    if (!ScanNonFinite({&piece, 1}, {&r, 1}).ok()) return 1;  // cudaErrorInvalidValue
    results[2 * c] = r.nonfinite;
    std::memcpy(&results[2 * c + 1], &r.sum_squares, sizeof(double));
  }
  return 0;
}

int CountingLauncher::LaunchFingerprint(const cuda_impl::FingerprintChunk*, size_t,
                                        const uint64_t*, uint64_t, uint64_t, uint64_t*,
                                        Stream) {
  ++counts_.fingerprint_launches;
  return Failing();
}

int CountingLauncher::OrderAfter(Stream, Stream) {
  ++counts_.orderings;
  return Failing();
}

int CountingLauncher::Synchronize(Stream) {
  ++counts_.synchronizes;
  return Failing();
}

const char* CountingLauncher::ErrorString(int code) {
  return code == 0 ? "no error" : "counting launcher: injected failure";
}

}  // namespace sdc::kernels
