#include "kernels/reference.h"

#include <cmath>
#include <cstring>

namespace sdc::kernels {

Fingerprint ReferenceFingerprint(ByteSpan tensor) {
  const auto* bytes = static_cast<const unsigned char*>(tensor.data);
  Fingerprint fp{tensor.size, 0, 0};
  const uint64_t words = (tensor.size + 7) / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = 0;
    for (uint64_t k = 0; k < 8 && 8 * i + k < tensor.size; ++k) {
      w |= static_cast<uint64_t>(bytes[8 * i + k]) << (8 * k);  // Little-endian.
    }
    fp.s1 += w;
    fp.s2 += (i + 1) * w;
  }
  return fp;
}

namespace {

// The value of element j, decoded from its bits by the IEEE formulas.
double DecodeElement(const TensorRef& t, uint64_t j, bool* nonfinite) {
  const auto* p = static_cast<const unsigned char*>(t.data);
  switch (t.dtype) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p + 4 * j, 4);
      *nonfinite = !std::isfinite(f);
      return f;
    }
    case DType::kFloat64: {
      double d;
      std::memcpy(&d, p + 8 * j, 8);
      *nonfinite = !std::isfinite(d);
      return d;
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * j, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      *nonfinite = !std::isfinite(f);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * j, 2);
      const int sign = (h & 0x8000) ? -1 : 1;
      const int exponent = (h >> 10) & 0x1f;
      const int mantissa = h & 0x3ff;
      if (exponent == 0x1f) {
        *nonfinite = true;
        return mantissa == 0 ? sign * INFINITY : NAN;
      }
      *nonfinite = false;
      if (exponent == 0) return sign * std::ldexp(mantissa, -24);
      return sign * std::ldexp(1024 + mantissa, exponent - 25);
    }
  }
  *nonfinite = false;
  return 0;
}

}  // namespace

ScanResult ReferenceScan(const TensorRef& tensor) {
  ScanResult result;
  for (uint64_t begin = 0; begin < tensor.num_elements;
       begin += kScanChunkElements) {
    double acc[16] = {};
    for (uint64_t j = 0;
         j < kScanChunkElements && begin + j < tensor.num_elements; ++j) {
      bool nonfinite = false;
      const double x = DecodeElement(tensor, begin + j, &nonfinite);
      result.nonfinite += nonfinite ? 1 : 0;
      const double square = x * x;
      acc[j % 16] = acc[j % 16] + square;
    }
    double r[4];
    for (int k = 0; k < 4; ++k) {
      r[k] = (acc[k] + acc[k + 4]) + (acc[k + 8] + acc[k + 12]);
    }
    result.sum_squares = result.sum_squares + ((r[0] + r[1]) + (r[2] + r[3]));
  }
  return result;
}

}  // namespace sdc::kernels
