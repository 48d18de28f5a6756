#ifndef SDC_KERNELS_MODEL_DIGEST_H_
#define SDC_KERNELS_MODEL_DIGEST_H_

// The model digest: one 64-bit value over a model's ordered list of
// (tensor name, fingerprint). Replicas whose digests agree hold the same
// tensors (up to a 2^-64 collision), so a healthy weight vote compares one
// number per rank and looks at single tensors only for a minority.
//
// DEFINITION (wire meaning; must never drift). Build a stream of 64-bit words:
// for each entry in order, the name's byte length, the name's bytes as
// little-endian words (the last zero-padded), then byte_length, s1 and s2 of
// its fingerprint. With Mix the SplitMix64 finalizer
//   z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
//   z *= 0x94d049bb133111eb; z ^= z >> 31
// and h = kDigestSeed, every word x of the stream does h = Mix(h ^ x), and the
// digest is Mix(h ^ number_of_entries).
//
// WORKED EXAMPLE. The empty list is Mix(kDigestSeed ^ 0) = 0xfe633206332465ea.
// One entry named "w" with fingerprint {17, 6, 14} is the stream
// 1, 0x77, 17, 6, 14 and digests to 0x090ff95af96ceb39 (model_digest_test.cc
// holds both).

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/fingerprint.h"

namespace sdc::kernels {

inline constexpr uint64_t kDigestSeed = 0x5344432d67756172ull;  // "SDC-guar"

// The SplitMix64 finalizer used by the digest.
uint64_t Mix64(uint64_t z);

// Accumulates the digest one entry at a time. Not thread-safe.
class ModelDigestBuilder {
 public:
  void Add(absl::string_view name, const Fingerprint& fp);
  uint64_t Finish() const;

 private:
  void Absorb(uint64_t word) { h_ = Mix64(h_ ^ word); }

  uint64_t h_ = kDigestSeed;
  uint64_t entries_ = 0;
};

struct NamedFingerprint {
  std::string name;
  Fingerprint fingerprint;
};

uint64_t ModelDigest(absl::Span<const NamedFingerprint> entries);

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_MODEL_DIGEST_H_
