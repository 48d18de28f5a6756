#ifndef SDC_KERNELS_CUDA_KERNELS_H_
#define SDC_KERNELS_CUDA_KERNELS_H_

// Internal to //kernels: the boundary between nvcc-compiled code
// (cuda_kernels.cu) and the rest. Plain types only, so nvcc never compiles
// Abseil.

#include <cstddef>
#include <cstdint>

namespace sdc::kernels::cuda_impl {

// Bytes [begin, begin + length) of the tensor at `base`; begin is a multiple
// of 8, so a chunk starts on a word of its tensor.
struct FingerprintChunk {
  const void* base;
  uint64_t begin;
  uint64_t length;
  uint32_t tensor;
};

// Elements [begin, begin + length) of a tensor of dtype code `dtype`
// (the values of sdc::kernels::DType).
struct ScanChunk {
  const void* base;
  uint64_t begin;
  uint64_t length;
  uint32_t dtype;
};

// Each returns a cudaError_t value; 0 is success.

// Fills sums[2*t] = s1 and sums[2*t + 1] = s2 of every tensor t < tensors.
int RunFingerprint(const FingerprintChunk* chunks, size_t num_chunks,
                   size_t tensors, uint64_t* sums, void* stream);

// Fills nonfinite[c] and sum_squares[c] of every chunk c.
int RunScan(const ScanChunk* chunks, size_t num_chunks, uint64_t* nonfinite,
            double* sum_squares, void* stream);

int DeviceCount(int* count);
const char* ErrorString(int code);

}  // namespace sdc::kernels::cuda_impl

#endif  // SDC_KERNELS_CUDA_KERNELS_H_
