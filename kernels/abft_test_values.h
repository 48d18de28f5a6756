#ifndef SDC_KERNELS_ABFT_TEST_VALUES_H_
#define SDC_KERNELS_ABFT_TEST_VALUES_H_

// Tests only: one value stored in, and read back from, the product
// checksums' operand dtypes (float32, bfloat16, float16), rounded to nearest
// even. Shared by kernels/abft_cuda_emulated_test.cc and kernels/cuda_test.cc,
// which build the same operands for the host emulation and the device.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/abft.h"
#include "kernels/half_float.h"

namespace sdc::kernels::test_values {

// bfloat16 storage of f (f is not NaN), rounded to nearest even.
inline uint16_t ToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// IEEE binary16 storage of f, rounded to nearest even.
inline uint16_t ToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return sign | (magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to Inf.
  if (magnitude < 0x38800000u) {                        // Below 2^-14: subnormal.
    float a;
    std::memcpy(&a, &magnitude, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 0x1p24f)));
  }
  uint32_t h = (((magnitude >> 23) - 112) << 10) | ((magnitude & 0x7fffffu) >> 13);
  const uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// The value stored at p in `dtype`, as a float (exact).
inline float Widen(const unsigned char* p, DType dtype) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == DType::kBFloat16 ? BitsToFloat(static_cast<uint32_t>(h) << 16) : HalfToFloat(h);
}

// Stores f at p in `dtype`, rounded to nearest even.
inline void Store(float f, DType dtype, unsigned char* p) {
  if (dtype == DType::kFloat32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = dtype == DType::kBFloat16 ? ToBFloat16(f) : ToHalf(f);
  std::memcpy(p, &h, 2);
}

}  // namespace sdc::kernels::test_values

#endif  // SDC_KERNELS_ABFT_TEST_VALUES_H_
