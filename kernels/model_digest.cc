#include "kernels/model_digest.h"

#include <algorithm>
#include <cstring>

namespace sdc::kernels {

uint64_t Mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}

void ModelDigestBuilder::Add(absl::string_view name, const Fingerprint& fp) {
  Absorb(name.size());
  for (size_t at = 0; at < name.size(); at += 8) {
    uint64_t word = 0;
    std::memcpy(&word, name.data() + at, std::min<size_t>(8, name.size() - at));
    Absorb(word);
  }
  Absorb(fp.byte_length);
  Absorb(fp.s1);
  Absorb(fp.s2);
  ++entries_;
}

uint64_t ModelDigestBuilder::Finish() const { return Mix64(h_ ^ entries_); }

uint64_t ModelDigest(absl::Span<const NamedFingerprint> entries) {
  ModelDigestBuilder builder;
  for (const NamedFingerprint& e : entries) builder.Add(e.name, e.fingerprint);
  return builder.Finish();
}

}  // namespace sdc::kernels
