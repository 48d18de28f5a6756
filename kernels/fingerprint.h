#ifndef SDC_KERNELS_FINGERPRINT_H_
#define SDC_KERNELS_FINGERPRINT_H_

// The tensor fingerprint: the value replicas compare to prove they hold the
// same bytes. Its definition is the wire meaning for years; it must never
// drift.
//
// DEFINITION. Read a tensor's raw bytes (byte_length of them, in memory
// order) as little-endian unsigned 64-bit words w_0 .. w_{n-1},
// n = ceil(byte_length / 8); when byte_length is not a multiple of 8 the last
// word is zero-padded at its high end. Then
//
//   s1 = sum_{i=0}^{n-1} w_i            mod 2^64
//   s2 = sum_{i=0}^{n-1} (i + 1) * w_i  mod 2^64
//
// and the fingerprint is the triple {byte_length, s1, s2}. A byte length of 0
// gives {0, 0, 0}.
//
// WORKED EXAMPLE. The 17 bytes
//   01 00 00 00 00 00 00 00  02 00 00 00 00 00 00 00  03
// are the words w_0 = 1, w_1 = 2, w_2 = 3 (the last padded with seven zero
// bytes), so s1 = 1 + 2 + 3 = 6 and s2 = 1*1 + 2*2 + 3*3 = 14: the
// fingerprint is {17, 6, 14}. The fp32 tensor {1.0f, 2.0f} is the bytes
// 00 00 80 3f 00 00 00 40, one word 0x400000003f800000, so its fingerprint is
// {8, 0x400000003f800000, 0x400000003f800000}.
//
// PROPERTIES. Any single flipped bit changes s1 (it adds or removes 2^k in
// one word). Swapping two different words w_a != w_b changes s2 by
// (a - b)(w_b - w_a), which is non-zero unless that product wraps to 0 mod
// 2^64. Integer sums are independent of evaluation order, so the scalar, SIMD,
// multi-threaded and CUDA implementations produce the same bits; tests hold
// each of them to the scalar reference (kernels/reference.h).

#include <cstdint>
#include <ostream>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu_dispatch.h"

namespace sdc::kernels {

class ThreadPool;

// A read-only byte range in host memory (or device memory for the CUDA
// entry points in kernels/cuda.h).
struct ByteSpan {
  const void* data = nullptr;
  uint64_t size = 0;  // Bytes.
};

struct Fingerprint {
  uint64_t byte_length = 0;
  uint64_t s1 = 0;
  uint64_t s2 = 0;

  friend bool operator==(const Fingerprint& a, const Fingerprint& b) {
    return a.byte_length == b.byte_length && a.s1 == b.s1 && a.s2 == b.s2;
  }
  friend bool operator!=(const Fingerprint& a, const Fingerprint& b) {
    return !(a == b);
  }
};

std::ostream& operator<<(std::ostream& os, const Fingerprint& fp);

// Fingerprints every tensor of `tensors` into the same position of `out`, in
// one call: work is split into chunks across and within tensors, run on
// `pool` (nullptr: ThreadPool::Default()) with AVX-512 or AVX2 when the CPU
// has them.
//
// Returns InvalidArgument, leaving `out` unspecified, when the spans differ in
// length or a tensor has a null pointer with a non-zero size. Start pointers
// need no alignment.
absl::Status FingerprintTensors(absl::Span<const ByteSpan> tensors,
                                absl::Span<Fingerprint> out,
                                ThreadPool* pool = nullptr);

// Which CPU code path FingerprintTensors and ScanNonFinite take on this
// machine: "avx512", "avx2" or "portable". For logs and benchmarks.
const char* CpuKernelPath();

namespace internal {
// FingerprintTensors on an explicit code path, for tests and benchmarks.
// REQUIRES: `path` is supported by this CPU.
absl::Status FingerprintTensorsOnPath(absl::Span<const ByteSpan> tensors,
                                      absl::Span<Fingerprint> out,
                                      ThreadPool* pool, CpuPath path);
// Checks the arguments of a fingerprint call (shared with the CUDA entry
// point).
absl::Status ValidateFingerprintArgs(absl::Span<const ByteSpan> tensors,
                                     size_t out_size);
}  // namespace internal

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_FINGERPRINT_H_
