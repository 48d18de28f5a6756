#ifndef SDC_KERNELS_MERSENNE61_H_
#define SDC_KERNELS_MERSENNE61_H_

// Internal to //kernels: arithmetic in the field of integers mod the Mersenne
// prime p = 2^61 - 1, the fingerprint's second level (fingerprint.h). Shared
// by the CPU code and the CUDA kernels (nvcc compiles this header too), so
// both reduce the same way. Every function takes and returns canonical
// values in [0, p).

#include <cstdint>

#if defined(__CUDACC__)
#define SDC_HOST_DEVICE __host__ __device__
#else
#define SDC_HOST_DEVICE
#endif

namespace sdc::kernels::m61 {

inline constexpr uint64_t kPrime = (1ull << 61) - 1;

// x mod p for any 64-bit x. Since 2^61 = 1 (mod p), x = (x >> 61) + (x & p).
SDC_HOST_DEVICE inline uint64_t Reduce(uint64_t x) {
  uint64_t s = (x & kPrime) + (x >> 61);  // <= p + 7
  return s >= kPrime ? s - kPrime : s;
}

// REQUIRES: a, b < p.
SDC_HOST_DEVICE inline uint64_t Add(uint64_t a, uint64_t b) {
  const uint64_t s = a + b;  // < 2p < 2^62: no wrap.
  return s >= kPrime ? s - kPrime : s;
}

// REQUIRES: a, b < p. The 122-bit product hi * 2^64 + lo is
// (product >> 61) * 2^61 + (product & p) = (product >> 61) + (product & p).
SDC_HOST_DEVICE inline uint64_t Mul(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  const uint64_t lo = a * b;
  const uint64_t hi = __umul64hi(a, b);
#else
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  const uint64_t lo = static_cast<uint64_t>(product);
  const uint64_t hi = static_cast<uint64_t>(product >> 64);
#endif
  const uint64_t s = (lo & kPrime) + ((hi << 3) | (lo >> 61));  // < 2^62
  return Reduce(s);
}

// a^e. REQUIRES: a < p.
SDC_HOST_DEVICE inline uint64_t Pow(uint64_t a, uint64_t e) {
  uint64_t result = 1;
  while (e != 0) {
    if (e & 1) result = Mul(result, a);
    a = Mul(a, a);
    e >>= 1;
  }
  return result;
}

}  // namespace sdc::kernels::m61

#endif  // SDC_KERNELS_MERSENNE61_H_
