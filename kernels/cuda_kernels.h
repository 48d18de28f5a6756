#ifndef SDC_KERNELS_CUDA_KERNELS_H_
#define SDC_KERNELS_CUDA_KERNELS_H_

// Internal to //kernels: the boundary between nvcc-compiled code
// (cuda_kernels.cu) and the rest. Plain types only, so nvcc never compiles
// Abseil.

#include <cstddef>
#include <cstdint>

namespace sdc::kernels::cuda_impl {

// Bytes [begin, begin + length) of the tensor at `base`, of tensor_bytes
// bytes in all; begin is a multiple of the fingerprint's level-1 block
// (kernels/fingerprint.h), so a chunk starts on a block of its tensor.
struct FingerprintChunk {
  const void* base;
  uint64_t begin;
  uint64_t length;
  uint64_t tensor_bytes;
  uint32_t tensor;
};

// Words in a fingerprint level-1 block (kFingerprintBlockWords; cuda.cc
// checks the two agree).
inline constexpr uint64_t kBlockWords = 512;

// Elements [begin, begin + length) of a tensor of dtype code `dtype`
// (the values of sdc::kernels::DType).
struct ScanChunk {
  const void* base;
  uint64_t begin;
  uint64_t length;
  uint32_t dtype;
};

// Each returns a cudaError_t value; 0 is success. The launches only queue
// work on `stream`: everything they read and write is device memory.

// Adds, for every tensor t the chunks name, to sums[4t + 2j] and
// sums[4t + 2j + 1] the sums over its chunks of the low 32 and the high bits
// of each chunk's part of s_{j+1} before the length's term (so that 64-bit
// atomic adds stay exact); the caller zeroes the sums first, then reduces
// them mod p and adds n * r. key_words: K1[0..B-1] then K2[0..B-1].
int LaunchFingerprint(const FingerprintChunk* chunks, size_t num_chunks,
                      const uint64_t* key_words, uint64_t r1, uint64_t r2,
                      uint64_t* sums, void* stream);

// Writes, for every chunk c, results[2c] = its NaN/Inf count and
// results[2c + 1] = the bits of its fp64 sum of squares.
int LaunchScan(const ScanChunk* chunks, size_t num_chunks, uint64_t* results,
               void* stream);

// The runtime calls RuntimeLauncher (cuda_launcher.h) forwards to. `kind`:
// 1 host to device, 2 device to host, 3 device to device.
int GetDevice(int* device);
int Malloc(void** ptr, size_t bytes);
int MallocHost(void** ptr, size_t bytes);
void Free(void* ptr);
void FreeHost(void* ptr);
int MemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream);
int MemsetAsync(void* dst, size_t bytes, void* stream);
int OrderAfter(void* later, void* earlier);
int StreamSynchronize(void* stream);
int DeviceCount(int* count);
const char* ErrorString(int code);

}  // namespace sdc::kernels::cuda_impl

#endif  // SDC_KERNELS_CUDA_KERNELS_H_
