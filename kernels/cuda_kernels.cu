// CUDA kernels behind kernels/cuda.h. One block per chunk; see
// cuda_kernels.h for the chunk descriptions and fingerprint.h / nonfinite.h
// for the definitions computed here.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_kernels.h"
#include "kernels/mersenne61.h"

namespace sdc::kernels::cuda_impl {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// DType codes, as in kernels/nonfinite.h.
constexpr uint32_t kFloat32 = 0;
constexpr uint32_t kFloat64 = 1;
constexpr uint32_t kFloat16 = 2;
constexpr uint32_t kBFloat16 = 3;

__device__ inline uint64_t WarpSum(uint64_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ inline double WarpSum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The word at p with `left` bytes of the tensor remaining (zero-padded when
// fewer than 8). Unaligned pointers are read a byte at a time.
__device__ inline uint64_t LoadWord(const unsigned char* p, uint64_t left,
                                    bool aligned) {
  if (aligned && left >= 8) return *reinterpret_cast<const uint64_t*>(p);
  uint64_t w = 0;
  for (uint64_t k = 0; k < 8 && k < left; ++k) {
    w |= static_cast<uint64_t>(p[k]) << (8 * k);
  }
  return w;
}

// One term of the fingerprint's level 1 (fingerprint.h): the two 32-bit
// sums multiply in one 32 x 32 -> 64-bit instruction.
__device__ inline uint64_t NhTerm(uint64_t w, uint64_t k) {
  const uint32_t lo = static_cast<uint32_t>(w) + static_cast<uint32_t>(k);
  const uint32_t hi = static_cast<uint32_t>(w >> 32) + static_cast<uint32_t>(k >> 32);
  return static_cast<uint64_t>(lo) * hi;
}

// One thread block per chunk. Warp w takes a run of consecutive level-1
// blocks: its lanes read them a word per lane at a time (coalesced), the
// warp sums each block's level 1 with shuffles, and lane 0 runs level 2's
// Horner over the run. Thread 0 then joins the runs in order (a run of q
// blocks shifts what came before by r^(2q)), lifts the chunk to its place in
// the tensor (r^(2(m - end) + 1), as the CPU does) and adds its two 32-bit
// halves to the tensor's counters: integer atomics commute, so the result
// does not depend on which chunk lands first.
__global__ void FingerprintKernel(const FingerprintChunk* chunks,
                                  const uint64_t* key_words, uint64_t r1,
                                  uint64_t r2, unsigned long long* sums) {
  __shared__ uint64_t key[2 * kBlockWords];
  __shared__ uint64_t run_sums[kWarps][2];
  __shared__ uint64_t run_blocks[kWarps];
  for (uint64_t i = threadIdx.x; i < 2 * kBlockWords; i += blockDim.x) key[i] = key_words[i];
  __syncthreads();
  const FingerprintChunk c = chunks[blockIdx.x];
  const unsigned char* p = static_cast<const unsigned char*>(c.base) + c.begin;
  const bool aligned = (reinterpret_cast<uintptr_t>(p) % 8) == 0;
  const uint64_t words = (c.length + 7) / 8;
  const uint64_t blocks = (words + kBlockWords - 1) / kBlockWords;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const uint64_t per_warp = (blocks + kWarps - 1) / kWarps;
  const uint64_t first = warp * per_warp < blocks ? warp * per_warp : blocks;
  const uint64_t last = first + per_warp < blocks ? first + per_warp : blocks;
  uint64_t a1 = 0;
  uint64_t a2 = 0;
  for (uint64_t b = first; b < last; ++b) {
    uint64_t h1 = 0;
    uint64_t h2 = 0;
    if (aligned && (b + 1) * kBlockWords <= c.length / 8) {
      // A whole aligned block: every load issued before the first is used.
      constexpr int kPerLane = kBlockWords / 32;
      const uint64_t* q = reinterpret_cast<const uint64_t*>(p) + b * kBlockWords + lane;
      uint64_t w[kPerLane];
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) w[s] = q[32 * s];
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) {
        h1 += NhTerm(w[s], key[lane + 32 * s]);
        h2 += NhTerm(w[s], key[kBlockWords + lane + 32 * s]);
      }
    } else {
      for (uint64_t t = lane; t < kBlockWords; t += 32) {
        const uint64_t i = b * kBlockWords + t;
        if (i >= words) break;
        const uint64_t w = LoadWord(p + 8 * i, c.length - 8 * i, aligned);
        h1 += NhTerm(w, key[t]);
        h2 += NhTerm(w, key[kBlockWords + t]);
      }
    }
    h1 = WarpSum(h1);
    h2 = WarpSum(h2);
    if (lane == 0) {
      a1 = m61::Mul(m61::Add(a1, h1 & 0xffffffffu), r1);
      a1 = m61::Mul(m61::Add(a1, h1 >> 32), r1);
      a2 = m61::Mul(m61::Add(a2, h2 & 0xffffffffu), r2);
      a2 = m61::Mul(m61::Add(a2, h2 >> 32), r2);
    }
  }
  if (lane == 0) {
    run_sums[warp][0] = a1;
    run_sums[warp][1] = a2;
    run_blocks[warp] = last - first;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t t1 = 0;
    uint64_t t2 = 0;
    for (int w = 0; w < kWarps; ++w) {
      t1 = m61::Add(m61::Mul(t1, m61::Pow(r1, 2 * run_blocks[w])), run_sums[w][0]);
      t2 = m61::Add(m61::Mul(t2, m61::Pow(r2, 2 * run_blocks[w])), run_sums[w][1]);
    }
    const uint64_t block_bytes = 8 * kBlockWords;
    const uint64_t m = (c.tensor_bytes + block_bytes - 1) / block_bytes;
    const uint64_t end = c.begin / block_bytes + blocks;
    t1 = m61::Mul(t1, m61::Pow(r1, 2 * (m - end) + 1));
    t2 = m61::Mul(t2, m61::Pow(r2, 2 * (m - end) + 1));
    unsigned long long* counters = sums + 4 * static_cast<uint64_t>(c.tensor);
    atomicAdd(counters + 0, static_cast<unsigned long long>(t1 & 0xffffffffu));
    atomicAdd(counters + 1, static_cast<unsigned long long>(t1 >> 32));
    atomicAdd(counters + 2, static_cast<unsigned long long>(t2 & 0xffffffffu));
    atomicAdd(counters + 3, static_cast<unsigned long long>(t2 >> 32));
  }
}

// Element j as fp64, and whether it is NaN/Inf (judged on its exponent bits).
__device__ inline double LoadElement(const void* base, uint32_t dtype,
                                     uint64_t j, bool* nonfinite) {
  switch (dtype) {
    case kFloat64: {
      const double d = static_cast<const double*>(base)[j];
      const uint64_t bits = __double_as_longlong(d);
      *nonfinite = (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
      return d;
    }
    case kFloat16: {
      const unsigned short h = static_cast<const unsigned short*>(base)[j];
      *nonfinite = (h & 0x7c00u) == 0x7c00u;
      return static_cast<double>(__half2float(__ushort_as_half(h)));
    }
    case kBFloat16: {
      const unsigned short h = static_cast<const unsigned short*>(base)[j];
      *nonfinite = (h & 0x7f80u) == 0x7f80u;
      return static_cast<double>(__uint_as_float(static_cast<uint32_t>(h) << 16));
    }
    default: {  // kFloat32
      const float f = static_cast<const float*>(base)[j];
      const uint32_t bits = __float_as_uint(f);
      *nonfinite = (bits & 0x7f800000u) == 0x7f800000u;
      return static_cast<double>(f);
    }
  }
}

// Per chunk: each thread sums its strided elements in order, then a fixed
// shuffle tree and the warps in order, so the result never depends on
// scheduling.
__global__ void ScanKernel(const ScanChunk* chunks,
                           unsigned long long* nonfinite,
                           double* sum_squares) {
  const ScanChunk c = chunks[blockIdx.x];
  unsigned long long bad = 0;
  double sum = 0.0;
  for (uint64_t j = threadIdx.x; j < c.length; j += blockDim.x) {
    bool is_bad = false;
    const double x = LoadElement(c.base, c.dtype, c.begin + j, &is_bad);
    bad += is_bad ? 1 : 0;
    sum = __dadd_rn(sum, __dmul_rn(x, x));
  }
  __shared__ unsigned long long warp_bad[kWarps];
  __shared__ double warp_sum[kWarps];
  bad = WarpSum(static_cast<uint64_t>(bad));
  sum = WarpSum(sum);
  if (threadIdx.x % 32 == 0) {
    warp_bad[threadIdx.x / 32] = bad;
    warp_sum[threadIdx.x / 32] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total_bad = 0;
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      total_bad += warp_bad[w];
      total += warp_sum[w];
    }
    nonfinite[blockIdx.x] = total_bad;
    sum_squares[blockIdx.x] = total;
  }
}

// Device scratch for one call, freed in stream order.
template <typename T>
cudaError_t AllocAsync(T** ptr, size_t count, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(ptr),
                         count == 0 ? 1 : count * sizeof(T), stream);
}

}  // namespace

int RunFingerprint(const FingerprintChunk* chunks, size_t num_chunks,
                   size_t tensors, const uint64_t* key_words, uint64_t r1,
                   uint64_t r2, uint64_t* sums, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  FingerprintChunk* d_chunks = nullptr;
  uint64_t* d_key = nullptr;
  unsigned long long* d_sums = nullptr;
  cudaError_t err = AllocAsync(&d_chunks, num_chunks, stream);
  if (err == cudaSuccess) err = AllocAsync(&d_key, 2 * kBlockWords, stream);
  if (err == cudaSuccess) err = AllocAsync(&d_sums, 4 * tensors, stream);
  if (err == cudaSuccess && num_chunks > 0) {
    err = cudaMemcpyAsync(d_chunks, chunks, num_chunks * sizeof(*chunks),
                          cudaMemcpyHostToDevice, stream);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(d_key, key_words, 2 * kBlockWords * sizeof(*d_key),
                          cudaMemcpyHostToDevice, stream);
  }
  if (err == cudaSuccess) {
    err = cudaMemsetAsync(d_sums, 0, 4 * tensors * sizeof(*d_sums), stream);
  }
  if (err == cudaSuccess && num_chunks > 0) {
    FingerprintKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0,
                        stream>>>(d_chunks, d_key, r1, r2, d_sums);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess && tensors > 0) {
    err = cudaMemcpyAsync(sums, d_sums, 4 * tensors * sizeof(*d_sums),
                          cudaMemcpyDeviceToHost, stream);
  }
  if (d_chunks != nullptr) cudaFreeAsync(d_chunks, stream);
  if (d_key != nullptr) cudaFreeAsync(d_key, stream);
  if (d_sums != nullptr) cudaFreeAsync(d_sums, stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  return static_cast<int>(err != cudaSuccess ? err : sync);
}

int RunScan(const ScanChunk* chunks, size_t num_chunks, uint64_t* nonfinite,
            double* sum_squares, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (num_chunks == 0) return cudaSuccess;
  ScanChunk* d_chunks = nullptr;
  unsigned long long* d_bad = nullptr;
  double* d_sum = nullptr;
  cudaError_t err = AllocAsync(&d_chunks, num_chunks, stream);
  if (err == cudaSuccess) err = AllocAsync(&d_bad, num_chunks, stream);
  if (err == cudaSuccess) err = AllocAsync(&d_sum, num_chunks, stream);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(d_chunks, chunks, num_chunks * sizeof(*chunks),
                          cudaMemcpyHostToDevice, stream);
  }
  if (err == cudaSuccess) {
    ScanKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(
        d_chunks, d_bad, d_sum);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(nonfinite, d_bad, num_chunks * sizeof(*d_bad),
                          cudaMemcpyDeviceToHost, stream);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(sum_squares, d_sum, num_chunks * sizeof(*d_sum),
                          cudaMemcpyDeviceToHost, stream);
  }
  if (d_chunks != nullptr) cudaFreeAsync(d_chunks, stream);
  if (d_bad != nullptr) cudaFreeAsync(d_bad, stream);
  if (d_sum != nullptr) cudaFreeAsync(d_sum, stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  return static_cast<int>(err != cudaSuccess ? err : sync);
}

int DeviceCount(int* count) {
  return static_cast<int>(cudaGetDeviceCount(count));
}

const char* ErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace sdc::kernels::cuda_impl
