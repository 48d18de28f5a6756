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
                           unsigned long long* results) {
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
    results[2 * static_cast<uint64_t>(blockIdx.x)] = total_bad;
    results[2 * static_cast<uint64_t>(blockIdx.x) + 1] =
        static_cast<unsigned long long>(__double_as_longlong(total));
  }
}

}  // namespace

int LaunchFingerprint(const FingerprintChunk* chunks, size_t num_chunks,
                      const uint64_t* key_words, uint64_t r1, uint64_t r2,
                      uint64_t* sums, void* stream) {
  if (num_chunks == 0) return cudaSuccess;
  FingerprintKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(
      chunks, key_words, r1, r2, reinterpret_cast<unsigned long long*>(sums));
  return static_cast<int>(cudaGetLastError());
}

int LaunchScan(const ScanChunk* chunks, size_t num_chunks, uint64_t* results,
               void* stream) {
  if (num_chunks == 0) return cudaSuccess;
  ScanKernel<<<static_cast<unsigned>(num_chunks), kThreads, 0,
               static_cast<cudaStream_t>(stream)>>>(
      chunks, reinterpret_cast<unsigned long long*>(results));
  return static_cast<int>(cudaGetLastError());
}

int GetDevice(int* device) { return static_cast<int>(cudaGetDevice(device)); }

int Malloc(void** ptr, size_t bytes) {
  return static_cast<int>(cudaMalloc(ptr, bytes == 0 ? 1 : bytes));
}

int MallocHost(void** ptr, size_t bytes) {
  return static_cast<int>(cudaMallocHost(ptr, bytes == 0 ? 1 : bytes));
}

void Free(void* ptr) { cudaFree(ptr); }

void FreeHost(void* ptr) { cudaFreeHost(ptr); }

int MemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  const cudaMemcpyKind k = kind == 1   ? cudaMemcpyHostToDevice
                           : kind == 2 ? cudaMemcpyDeviceToHost
                                       : cudaMemcpyDeviceToDevice;
  return static_cast<int>(
      cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)));
}

int MemsetAsync(void* dst, size_t bytes, void* stream) {
  return static_cast<int>(
      cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)));
}

int OrderAfter(void* later, void* earlier) {
  cudaEvent_t event;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err != cudaSuccess) return static_cast<int>(err);
  err = cudaEventRecord(event, static_cast<cudaStream_t>(earlier));
  if (err == cudaSuccess) {
    err = cudaStreamWaitEvent(static_cast<cudaStream_t>(later), event, 0);
  }
  // Released once the recorded work completes.
  cudaEventDestroy(event);
  return static_cast<int>(err);
}

int StreamSynchronize(void* stream) {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

int DeviceCount(int* count) {
  return static_cast<int>(cudaGetDeviceCount(count));
}

const char* ErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace sdc::kernels::cuda_impl
