#ifndef SDC_KERNELS_FINGERPRINT_H_
#define SDC_KERNELS_FINGERPRINT_H_

// The tensor fingerprint: the value replicas compare to prove they hold the
// same bytes. A keyed hash: every rank of a job uses the same key (drawn at
// random once per job), so no fixed pattern of errors can pass unseen for
// every key. Its definition is the wire meaning; it must never drift.
//
// DEFINITION. Let p = 2^61 - 1 (prime) and B = kFingerprintBlockWords = 512.
// A key is, for j = 1 and 2, a multiplier r_j in [1, p - 1] and B key words
// K_j[0..B-1] of 64 bits (FingerprintKey::FromSeed says how they are drawn).
// For a 64-bit x write lo(x) = x mod 2^32 and hi(x) = floor(x / 2^32).
//
// Read a tensor's n raw bytes (in memory order) as little-endian unsigned
// 64-bit words w_0 .. w_{N-1}, N = ceil(n / 8), the last one zero-padded at
// its high end. Cut the words into m = ceil(N / B) blocks of B words (the
// last one may be shorter): block b holds w_{bB+t} for t = 0 .. B-1 while
// bB + t < N. Level 1 (NH, as in UMAC) hashes block b to 64 bits:
//
//   H_j(b) = sum_t ((lo(w_{bB+t}) + lo(K_j[t])) mod 2^32)
//                * ((hi(w_{bB+t}) + hi(K_j[t])) mod 2^32)      mod 2^64
//
// and gives two 32-bit values y_j(2b) = lo(H_j(b)), y_j(2b+1) = hi(H_j(b)).
// Level 2 is a polynomial in r_j over the integers mod p, with n (mod p) as
// its last coefficient:
//
//   s_j = sum_{i=0}^{2m-1} y_j(i) * r_j^(2m+1-i)  +  n * r_j      mod p
//
// (Horner: a = 0; a = (a + y) * r_j for each y in order; s_j = (a + n) * r_j.)
// The fingerprint is {byte_length = n, s1, s2}; s1, s2 < p. A byte length of
// 0 gives {0, 0, 0}.
//
// GUARANTEE. For a uniformly random key and any two different byte strings
// X != X' of n bytes each (any change at all: one flipped bit, sign flips in
// many elements, offsetting changes, swaps, a zeroed tail),
//
//   Pr[s1(X) = s1(X') and s2(X) = s2(X')] <= (2^-31 + 2m / (p - 1))^2,
//
// m = ceil(n / 4096): at most 2^-60.8 for n <= 2^40 (m <= 2^28), and about
// 2^-62 for tensors of ordinary size. Strings of different lengths differ in
// byte_length. Proof: the outputs use independent keys, so it is enough to
// show Pr[s_j(X) = s_j(X')] <= 2^-31 + 2m / (p - 1) for one j. Some block b
// differs, in some word at position t of it: (a, c) != (a', c') for its
// (lo, hi) halves. Say a != a' (else swap the roles of lo and hi). Fix every
// key word but K_j[t], and lo(K_j[t]); then u = (a + lo(K)) mod 2^32 and
// u' = (a' + lo(K)) mod 2^32 are fixed and different. H_j(b) = H_j'(b)
// becomes u v - u' v' = D (mod 2^64) for a fixed D, where v = (c + hi(K))
// mod 2^32 takes each value in [0, 2^32) once as hi(K) does, and
// v' = (c' + hi(K)) mod 2^32 is v + d or v + d - 2^32 (d = (c' - c) mod 2^32,
// the second case for v >= 2^32 - d). On each of those two ranges of v,
// u v - u' v' is v (u - u') plus a constant: strictly monotone, spanning
// less than 2^64, so it meets D mod 2^64 at most once. So at most 2 of the
// 2^32 values of hi(K) make H_j(b) collide: probability <= 2^-31. If the
// y_j sequences differ instead, s_j(X) - s_j(X') = r_j E(r_j) where E is a
// nonzero polynomial of degree <= 2m (its coefficients are differences of
// y's, which are < 2^32 < p), so at most 2m of the p - 1 values of r_j are
// roots; r_j is independent of K_j. The sum of the two cases bounds
// Pr[s_j equal]. The key is expanded from a 64-bit seed (FromSeed): the
// bound is proved for a uniform key, and a hardware fault does not depend
// on the seed. With a fixed, published seed (kFixedFingerprintSeed) the
// bound only holds for errors that were not chosen knowing it.
//
// WORKED EXAMPLE (fingerprint_test.cc holds it). The key of seed 0 has
// r1 = 0x1c4415072f63b9b5, r2 = 0x0dcf13cd54372cbe, K1 beginning
// 0x06c45d188009454f, 0xf88bb8a8724c81ec, 0x1b39896a51a8749b and K2
// beginning 0x04dfae11b8dcf861, 0x4c3433717af5c89a, 0x22b7ba9e68349351. The
// 17 bytes
//   01 00 00 00 00 00 00 00  02 00 00 00 00 00 00 00  03
// are the words w_0 = 1, w_1 = 2, w_2 = 3 (the last padded with seven zero
// bytes): one block, m = 1. Level 1 gives
//   H_1(0) = (1 + 0x8009454f) * 0x06c45d18 + (2 + 0x724c81ec) * 0xf88bb8a8
//          + (3 + 0x51a8749b) * 0x1b39896a mod 2^64 = 0x7b0a0bc70375bb1c
// and H_2(0) = 0x3640c95da68bb136, and level 2
//   s1 = 0x0375bb1c r1^3 + 0x7b0a0bc7 r1^2 + 17 r1 mod p = 0x0489f8c06d9afb09,
//   s2 = 0xa68bb136 r2^3 + 0x3640c95d r2^2 + 17 r2 mod p = 0x0fc9332314831407:
// the fingerprint is {17, 0x0489f8c06d9afb09, 0x0fc9332314831407}. The fp32
// tensor {1.0f, 2.0f} (one word, 0x400000003f800000) is
// {8, 0x07cb54e24fbfd7c6, 0x0efea1beb280b036}.
//
// IMPLEMENTATION. Level 1 is sums of 32 x 32 -> 64-bit products mod 2^64,
// independent of evaluation order; level 2 is exact field arithmetic whose
// chunk results combine by powers of r_j. So the scalar, SIMD,
// multi-threaded and CUDA implementations produce the same bits; tests hold
// each of them to the scalar reference (kernels/reference.h).

#include <cstdint>
#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu_dispatch.h"

namespace sdc::kernels {

class ThreadPool;

// Words per level-1 block (B in the definition): 4 KiB of tensor.
inline constexpr uint64_t kFingerprintBlockWords = 512;
inline constexpr uint64_t kFingerprintBlockBytes = 8 * kFingerprintBlockWords;

// The seed of the key that compares results across separate jobs (tests,
// tools, the demo's final weight digest): every process that uses it gets the
// same fingerprints. A guarded job draws its own (DrawFingerprintSeed).
inline constexpr uint64_t kFixedFingerprintSeed = 0;

// A fingerprint key, expanded from a 64-bit seed. Equal seeds give equal
// keys on every machine; ranks that compare fingerprints must share one.
// Immutable after construction; 8 KiB, so pass it by reference.
class FingerprintKey {
 public:
  // The key of `seed`: SplitMix64 from state `seed` (each output: state +=
  // 0x9e3779b97f4a7c15, then the state through the SplitMix64 finalizer,
  // Mix64 in model_digest.h) gives, in
  // order, r1 and r2 (each the first output whose top 61 bits, x >> 3, lie in
  // [1, p - 1]: outputs outside are skipped), then K1[0..B-1], then
  // K2[0..B-1] (one output each).
  static FingerprintKey FromSeed(uint64_t seed);

  uint64_t seed() const { return seed_; }
  // REQUIRES: j is 0 (for s1) or 1 (for s2).
  uint64_t r(int j) const { return r_[j]; }
  const uint64_t* words(int j) const { return k_[j]; }

 private:
  FingerprintKey() = default;

  uint64_t seed_ = 0;
  uint64_t r_[2] = {};
  alignas(64) uint64_t k_[2][kFingerprintBlockWords] = {};
};

// A seed from the operating system's cryptographic random source
// (getrandom(2)), for a job's key: draw it once on one rank and send it to
// the others. Unavailable when the system refuses.
absl::StatusOr<uint64_t> DrawFingerprintSeed();

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

// Fingerprints every tensor of `tensors` under `key` into the same position
// of `out`, in one call: work is split into chunks across and within
// tensors, run on `pool` (nullptr: ThreadPool::Default()) with AVX-512 or
// AVX2 when the CPU has them.
//
// Returns InvalidArgument, leaving `out` unspecified, when the spans differ in
// length or a tensor has a null pointer with a non-zero size. Start pointers
// need no alignment.
absl::Status FingerprintTensors(absl::Span<const ByteSpan> tensors,
                                const FingerprintKey& key,
                                absl::Span<Fingerprint> out,
                                ThreadPool* pool = nullptr);

// Which CPU code path FingerprintTensors and ScanNonFinite take on this
// machine: "avx512", "avx2" or "portable". For logs and benchmarks.
const char* CpuKernelPath();

namespace internal {
// FingerprintTensors on an explicit code path, for tests and benchmarks.
// REQUIRES: `path` is supported by this CPU.
absl::Status FingerprintTensorsOnPath(absl::Span<const ByteSpan> tensors,
                                      const FingerprintKey& key,
                                      absl::Span<Fingerprint> out,
                                      ThreadPool* pool, CpuPath path);
// Checks the arguments of a fingerprint call (shared with the CUDA entry
// point).
absl::Status ValidateFingerprintArgs(absl::Span<const ByteSpan> tensors,
                                     size_t out_size);
// Level-1 blocks of a tensor of `bytes` bytes: m in the definition.
inline uint64_t FingerprintBlocks(uint64_t bytes) {
  return (bytes + kFingerprintBlockBytes - 1) / kFingerprintBlockBytes;
}
}  // namespace internal

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_FINGERPRINT_H_
