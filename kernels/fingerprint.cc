#include "kernels/fingerprint.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/mersenne61.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sdc::kernels {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "words are read in host order, which must be little-endian");

constexpr uint64_t B = kFingerprintBlockWords;

// Chunks are whole level-1 blocks, so every chunk starts on a block of its
// tensor and only a tensor's last chunk can end in a partial block or word.
constexpr uint64_t kChunkBytes = 1ull << 20;
static_assert(kChunkBytes % kFingerprintBlockBytes == 0);

// How far ahead of its loads the vector loops ask for data: the hardware
// prefetcher alone leaves the multiplies waiting on memory at times.
constexpr uint64_t kPrefetchBytes = 1024;

inline uint64_t LoadWord(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// One term of level 1: (lo(w) + lo(k) mod 2^32) * (hi(w) + hi(k) mod 2^32).
inline uint64_t NhTerm(uint64_t w, uint64_t k) {
  const uint32_t lo = static_cast<uint32_t>(w) + static_cast<uint32_t>(k);
  const uint32_t hi = static_cast<uint32_t>(w >> 32) + static_cast<uint32_t>(k >> 32);
  return static_cast<uint64_t>(lo) * hi;
}

// Level 1 over `words` whole words at p, key words from index 0, into h[j]
// (sums mod 2^64). REQUIRES: words <= B.
void NhWordsPortable(const unsigned char* p, uint64_t words,
                     const FingerprintKey& key, uint64_t h[2]) {
  const uint64_t* k1 = key.words(0);
  const uint64_t* k2 = key.words(1);
  uint64_t a = 0, b = 0;
  for (uint64_t t = 0; t < words; ++t) {
    const uint64_t w = LoadWord(p + 8 * t);
    a += NhTerm(w, k1[t]);
    b += NhTerm(w, k2[t]);
  }
  h[0] = a;
  h[1] = b;
}

#if defined(__x86_64__)
// Vectors hold four (AVX2) or eight (AVX-512) words. One 32-bit add puts
// lo(w) + lo(k) in the even half and hi(w) + hi(k) in the odd half of each
// 64-bit lane; vpmuludq multiplies the even halves of its operands, so
// shifting a copy right by 32 multiplies the two halves of each lane.
__attribute__((target("avx2"))) inline __m256i NhLanesAvx2(__m256i w,
                                                          const uint64_t* k) {
  const __m256i x =
      _mm256_add_epi32(w, _mm256_load_si256(reinterpret_cast<const __m256i*>(k)));
  return _mm256_mul_epu32(x, _mm256_srli_epi64(x, 32));
}

__attribute__((target("avx2"))) uint64_t SumLanesAvx2(__m256i v) {
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

__attribute__((target("avx2"))) void NhWordsAvx2(const unsigned char* p,
                                                 uint64_t words,
                                                 const FingerprintKey& key,
                                                 uint64_t h[2]) {
  const uint64_t* k1 = key.words(0);
  const uint64_t* k2 = key.words(1);
  // Eight words (one cache line) a round, four independent sums.
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
  uint64_t t = 0;
  for (; t + 8 <= words; t += 8) {
    const unsigned char* q = p + 8 * t;
    _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
    a0 = _mm256_add_epi64(a0, NhLanesAvx2(w0, k1 + t));
    a1 = _mm256_add_epi64(a1, NhLanesAvx2(w1, k1 + t + 4));
    b0 = _mm256_add_epi64(b0, NhLanesAvx2(w0, k2 + t));
    b1 = _mm256_add_epi64(b1, NhLanesAvx2(w1, k2 + t + 4));
  }
  uint64_t a = SumLanesAvx2(_mm256_add_epi64(a0, a1));
  uint64_t b = SumLanesAvx2(_mm256_add_epi64(b0, b1));
  for (; t < words; ++t) {
    const uint64_t w = LoadWord(p + 8 * t);
    a += NhTerm(w, k1[t]);
    b += NhTerm(w, k2[t]);
  }
  h[0] = a;
  h[1] = b;
}

// Two whole blocks in lockstep (see SumChunk): two streams of loads in
// flight keep memory busier than one, where the multiplies would leave gaps.
__attribute__((target("avx2"))) void NhBlockPairAvx2(const unsigned char* p,
                                                     const unsigned char* q,
                                                     const FingerprintKey& key,
                                                     uint64_t hp[2], uint64_t hq[2]) {
  const uint64_t* k1 = key.words(0);
  const uint64_t* k2 = key.words(1);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
  __m256i c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  for (uint64_t t = 0; t < B; t += 8) {
    const unsigned char* x = p + 8 * t;
    const unsigned char* y = q + 8 * t;
    _mm_prefetch(reinterpret_cast<const char*>(x + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(y + kPrefetchBytes), _MM_HINT_T0);
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32));
    const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y));
    const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 32));
    a0 = _mm256_add_epi64(a0, NhLanesAvx2(x0, k1 + t));
    a1 = _mm256_add_epi64(a1, NhLanesAvx2(x1, k1 + t + 4));
    b0 = _mm256_add_epi64(b0, NhLanesAvx2(x0, k2 + t));
    b1 = _mm256_add_epi64(b1, NhLanesAvx2(x1, k2 + t + 4));
    c0 = _mm256_add_epi64(c0, NhLanesAvx2(y0, k1 + t));
    c1 = _mm256_add_epi64(c1, NhLanesAvx2(y1, k1 + t + 4));
    d0 = _mm256_add_epi64(d0, NhLanesAvx2(y0, k2 + t));
    d1 = _mm256_add_epi64(d1, NhLanesAvx2(y1, k2 + t + 4));
  }
  hp[0] = SumLanesAvx2(_mm256_add_epi64(a0, a1));
  hp[1] = SumLanesAvx2(_mm256_add_epi64(b0, b1));
  hq[0] = SumLanesAvx2(_mm256_add_epi64(c0, c1));
  hq[1] = SumLanesAvx2(_mm256_add_epi64(d0, d1));
}

// GCC 12's AVX-512 headers pass an "undefined" vector as the unused merge
// source of unmasked shifts and multiplies, which -Wmaybe-uninitialized
// reports from inside the header (fixed in GCC 13).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
__attribute__((target("avx512f"))) inline __m512i NhLanesAvx512(__m512i w,
                                                               const uint64_t* k) {
  const __m512i x = _mm512_add_epi32(w, _mm512_load_si512(k));
  return _mm512_mul_epu32(x, _mm512_srli_epi64(x, 32));
}

__attribute__((target("avx512f"))) uint64_t SumLanesAvx512(__m512i v) {
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, v);
  uint64_t sum = 0;
  for (uint64_t lane : lanes) sum += lane;
  return sum;
}

__attribute__((target("avx512f"))) void NhWordsAvx512(const unsigned char* p,
                                                     uint64_t words,
                                                     const FingerprintKey& key,
                                                     uint64_t h[2]) {
  const uint64_t* k1 = key.words(0);
  const uint64_t* k2 = key.words(1);
  // Sixteen words (two cache lines) a round, four independent sums.
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
  uint64_t t = 0;
  for (; t + 16 <= words; t += 16) {
    const unsigned char* q = p + 8 * t;
    _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes + 64), _MM_HINT_T0);
    const __m512i w0 = _mm512_loadu_si512(q);
    const __m512i w1 = _mm512_loadu_si512(q + 64);
    a0 = _mm512_add_epi64(a0, NhLanesAvx512(w0, k1 + t));
    a1 = _mm512_add_epi64(a1, NhLanesAvx512(w1, k1 + t + 8));
    b0 = _mm512_add_epi64(b0, NhLanesAvx512(w0, k2 + t));
    b1 = _mm512_add_epi64(b1, NhLanesAvx512(w1, k2 + t + 8));
  }
  uint64_t a = SumLanesAvx512(_mm512_add_epi64(a0, a1));
  uint64_t b = SumLanesAvx512(_mm512_add_epi64(b0, b1));
  for (; t < words; ++t) {
    const uint64_t w = LoadWord(p + 8 * t);
    a += NhTerm(w, k1[t]);
    b += NhTerm(w, k2[t]);
  }
  h[0] = a;
  h[1] = b;
}

__attribute__((target("avx512f"))) void NhBlockPairAvx512(const unsigned char* p,
                                                         const unsigned char* q,
                                                         const FingerprintKey& key,
                                                         uint64_t hp[2], uint64_t hq[2]) {
  const uint64_t* k1 = key.words(0);
  const uint64_t* k2 = key.words(1);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
  __m512i c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  for (uint64_t t = 0; t < B; t += 16) {
    const unsigned char* x = p + 8 * t;
    const unsigned char* y = q + 8 * t;
    for (uint64_t line = 0; line < 128; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(x + kPrefetchBytes + line), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(y + kPrefetchBytes + line), _MM_HINT_T0);
    }
    const __m512i x0 = _mm512_loadu_si512(x);
    const __m512i x1 = _mm512_loadu_si512(x + 64);
    const __m512i y0 = _mm512_loadu_si512(y);
    const __m512i y1 = _mm512_loadu_si512(y + 64);
    a0 = _mm512_add_epi64(a0, NhLanesAvx512(x0, k1 + t));
    a1 = _mm512_add_epi64(a1, NhLanesAvx512(x1, k1 + t + 8));
    b0 = _mm512_add_epi64(b0, NhLanesAvx512(x0, k2 + t));
    b1 = _mm512_add_epi64(b1, NhLanesAvx512(x1, k2 + t + 8));
    c0 = _mm512_add_epi64(c0, NhLanesAvx512(y0, k1 + t));
    c1 = _mm512_add_epi64(c1, NhLanesAvx512(y1, k1 + t + 8));
    d0 = _mm512_add_epi64(d0, NhLanesAvx512(y0, k2 + t));
    d1 = _mm512_add_epi64(d1, NhLanesAvx512(y1, k2 + t + 8));
  }
  hp[0] = SumLanesAvx512(_mm512_add_epi64(a0, a1));
  hp[1] = SumLanesAvx512(_mm512_add_epi64(b0, b1));
  hq[0] = SumLanesAvx512(_mm512_add_epi64(c0, c1));
  hq[1] = SumLanesAvx512(_mm512_add_epi64(d0, d1));
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

void NhWords(const unsigned char* p, uint64_t words, const FingerprintKey& key,
             CpuPath path, uint64_t h[2]) {
#if defined(__x86_64__)
  if (path == CpuPath::kAvx512) return NhWordsAvx512(p, words, key, h);
  if (path == CpuPath::kAvx2) return NhWordsAvx2(p, words, key, h);
#else
  (void)path;
#endif
  NhWordsPortable(p, words, key, h);
}

// Level 1 of the whole blocks at p and q.
void NhBlockPair(const unsigned char* p, const unsigned char* q,
                 const FingerprintKey& key, CpuPath path, uint64_t hp[2],
                 uint64_t hq[2]) {
#if defined(__x86_64__)
  if (path == CpuPath::kAvx512) return NhBlockPairAvx512(p, q, key, hp, hq);
  if (path == CpuPath::kAvx2) return NhBlockPairAvx2(p, q, key, hp, hq);
#endif
  NhWords(p, B, key, path, hp);
  NhWords(q, B, key, path, hq);
}

// Level 2 within one chunk of `length` bytes at p (whole blocks of its
// tensor, the last word zero-padded): Horner's a = (a + y) * r_j over the
// chunk's own y values, a sum of y * r_j^(distance from the chunk's end).
struct ChunkSums {
  uint64_t a[2] = {0, 0};
};

// One Horner step per half of H: a = (a + lo(h)) * r, then (a + hi(h)) * r.
inline uint64_t HornerBlock(uint64_t a, uint64_t h, uint64_t r) {
  a = m61::Mul(m61::Add(a, h & 0xffffffffu), r);
  return m61::Mul(m61::Add(a, h >> 32), r);
}

ChunkSums SumChunk(const unsigned char* p, uint64_t length,
                   const FingerprintKey& key, CpuPath path) {
  const uint64_t whole = length / 8;
  const uint64_t tail = length % 8;
  const uint64_t words = whole + (tail != 0 ? 1 : 0);
  ChunkSums s;
  // The first 2h whole blocks as h pairs (i, h + i): the first half's Horner
  // sum and the second half's, joined as a * r^(2h) + b.
  const uint64_t h = whole / B / 2;
  ChunkSums second;
  for (uint64_t i = 0; i < h; ++i) {
    uint64_t hp[2], hq[2];
    NhBlockPair(p + 8 * B * i, p + 8 * B * (h + i), key, path, hp, hq);
    for (int j = 0; j < 2; ++j) {
      s.a[j] = HornerBlock(s.a[j], hp[j], key.r(j));
      second.a[j] = HornerBlock(second.a[j], hq[j], key.r(j));
    }
  }
  if (h > 0) {
    for (int j = 0; j < 2; ++j) {
      s.a[j] = m61::Add(m61::Mul(s.a[j], m61::Pow(key.r(j), 2 * h)), second.a[j]);
    }
  }
  // Then the rest one block at a time: at most a whole block and the
  // tensor's partial last one.
  for (uint64_t begin = 2 * h * B; begin < words; begin += B) {
    const uint64_t count = std::min(B, words - begin);
    const uint64_t full = std::min(count, whole - begin);  // begin <= whole.
    uint64_t hb[2];
    NhWords(p + 8 * begin, full, key, path, hb);
    if (full < count) {  // The zero-padded last word, at position `full`.
      uint64_t w = 0;
      std::memcpy(&w, p + 8 * whole, tail);
      hb[0] += NhTerm(w, key.words(0)[full]);
      hb[1] += NhTerm(w, key.words(1)[full]);
    }
    for (int j = 0; j < 2; ++j) s.a[j] = HornerBlock(s.a[j], hb[j], key.r(j));
  }
  return s;
}

// SplitMix64 (Steele, Lea and Flood): the key's expansion.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

}  // namespace

FingerprintKey FingerprintKey::FromSeed(uint64_t seed) {
  FingerprintKey key;
  key.seed_ = seed;
  SplitMix64 rng(seed);
  for (uint64_t& r : key.r_) {
    do {
      r = rng.Next() >> 3;
    } while (r == 0 || r >= m61::kPrime);
  }
  for (auto& words : key.k_) {
    for (uint64_t& k : words) k = rng.Next();
  }
  return key;
}

absl::StatusOr<uint64_t> DrawFingerprintSeed() {
  uint64_t seed = 0;
  ssize_t got;
  do {
    got = getrandom(&seed, sizeof(seed), 0);
  } while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof(seed))) {
    return absl::UnavailableError(absl::StrCat(
        "getrandom: ", got < 0 ? std::strerror(errno) : "short read"));
  }
  return seed;
}

std::ostream& operator<<(std::ostream& os, const Fingerprint& fp) {
  return os << "{bytes=" << fp.byte_length << " s1=0x" << std::hex << fp.s1
            << " s2=0x" << fp.s2 << std::dec << "}";
}

const char* CpuKernelPath() { return CpuPathName(DetectedCpuPath()); }

namespace internal {

absl::Status ValidateFingerprintArgs(absl::Span<const ByteSpan> tensors,
                                     size_t out_size) {
  if (tensors.size() != out_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("FingerprintTensors: ", tensors.size(),
                     " tensors but room for ", out_size, " fingerprints"));
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].data == nullptr && tensors[t].size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("FingerprintTensors: tensor ", t,
                       " has a null pointer and ", tensors[t].size, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status FingerprintTensorsOnPath(absl::Span<const ByteSpan> tensors,
                                      const FingerprintKey& key,
                                      absl::Span<Fingerprint> out,
                                      ThreadPool* pool, CpuPath path) {
  if (absl::Status s = ValidateFingerprintArgs(tensors, out.size()); !s.ok()) {
    return s;
  }
  std::vector<uint64_t> sizes(tensors.size());
  uint64_t total = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    sizes[t] = tensors[t].size;
    total += tensors[t].size;
  }
  const std::vector<Chunk> chunks = SplitIntoChunks(sizes, kChunkBytes);
  std::vector<ChunkSums> partial(chunks.size());
  RunChunks(pool, static_cast<int64_t>(chunks.size()), total, [&](int64_t i) {
    const Chunk& c = chunks[i];
    const auto* base = static_cast<const unsigned char*>(tensors[c.tensor].data);
    partial[i] = SumChunk(base + c.begin, c.length, key, path);
  });
  // A chunk ending at block e of a tensor of m blocks is followed by
  // 2(m - e) values of y and the length: its Horner sum is short of the
  // definition's powers by r^(2(m - e) + 1).
  for (size_t t = 0; t < tensors.size(); ++t) out[t] = {sizes[t], 0, 0};
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const uint64_t m = FingerprintBlocks(sizes[c.tensor]);
    const uint64_t end = FingerprintBlocks(c.begin + c.length);
    Fingerprint& fp = out[c.tensor];
    for (int j = 0; j < 2; ++j) {
      uint64_t& s = j == 0 ? fp.s1 : fp.s2;
      s = m61::Add(s, m61::Mul(partial[i].a[j], m61::Pow(key.r(j), 2 * (m - end) + 1)));
    }
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t n = m61::Reduce(sizes[t]);
    out[t].s1 = m61::Add(out[t].s1, m61::Mul(n, key.r(0)));
    out[t].s2 = m61::Add(out[t].s2, m61::Mul(n, key.r(1)));
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::Status FingerprintTensors(absl::Span<const ByteSpan> tensors,
                                const FingerprintKey& key,
                                absl::Span<Fingerprint> out,
                                ThreadPool* pool) {
  return internal::FingerprintTensorsOnPath(tensors, key, out, pool,
                                            DetectedCpuPath());
}

}  // namespace sdc::kernels
