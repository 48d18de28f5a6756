#ifndef SDC_KERNELS_HALF_FLOAT_H_
#define SDC_KERNELS_HALF_FLOAT_H_

// Exact conversions of 16-bit float storage to binary32, for the scalar
// paths of the CPU kernels (nonfinite, abft). Every binary16 and bfloat16
// value, subnormals, infinities and NaN included, is exactly a binary32.

#include <cstdint>
#include <cstring>

namespace sdc::kernels {

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// IEEE binary16 -> binary32.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in binary32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_HALF_FLOAT_H_
