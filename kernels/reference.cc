#include "kernels/reference.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace sdc::kernels {

namespace {

// Field arithmetic mod p = 2^61 - 1 by plain 128-bit remainders,
// independently of kernels/mersenne61.h.
constexpr unsigned __int128 kP = (static_cast<unsigned __int128>(1) << 61) - 1;

uint64_t MulMod(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % kP);
}

uint64_t AddMod(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) + b) % kP);
}

}  // namespace

Fingerprint ReferenceFingerprint(ByteSpan tensor, const FingerprintKey& key) {
  const auto* bytes = static_cast<const unsigned char*>(tensor.data);
  const uint64_t n = tensor.size;
  const uint64_t words = (n + 7) / 8;
  // Level 1: every word's term into the sum of its block.
  std::vector<uint64_t> block_hash[2];
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = 0;
    for (uint64_t k = 0; k < 8 && 8 * i + k < n; ++k) {
      w |= static_cast<uint64_t>(bytes[8 * i + k]) << (8 * k);  // Little-endian.
    }
    const uint64_t block = i / kFingerprintBlockWords;
    const uint64_t t = i % kFingerprintBlockWords;
    for (int j = 0; j < 2; ++j) {
      if (block_hash[j].size() <= block) block_hash[j].push_back(0);
      const uint64_t k = key.words(j)[t];
      const uint64_t lo = ((w & 0xffffffffu) + (k & 0xffffffffu)) % (1ull << 32);
      const uint64_t hi = ((w >> 32) + (k >> 32)) % (1ull << 32);
      block_hash[j][block] += lo * hi;  // Mod 2^64.
    }
  }
  // Level 2: y_0 .. y_{2m-1} and then n as the coefficients of
  // r^(2m+1) .. r^1.
  Fingerprint fp{n, 0, 0};
  for (int j = 0; j < 2; ++j) {
    std::vector<uint64_t> coefficients;
    for (uint64_t h : block_hash[j]) {
      coefficients.push_back(h & 0xffffffffu);
      coefficients.push_back(h >> 32);
    }
    coefficients.push_back(static_cast<uint64_t>(n % kP));
    const uint64_t r = key.r(j);
    uint64_t s = 0;
    uint64_t power = r;  // r^1 for the last coefficient, rising from there.
    for (size_t c = coefficients.size(); c-- > 0;) {
      s = AddMod(s, MulMod(coefficients[c], power));
      power = MulMod(power, r);
    }
    (j == 0 ? fp.s1 : fp.s2) = s;
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
