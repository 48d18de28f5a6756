#include "kernels/fingerprint.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_dispatch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace sdc::kernels {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "words are read in host order, which must be little-endian");

// Chunks are a multiple of 8 bytes, so every chunk starts on a word of its
// tensor and only a tensor's last chunk can end in a partial word.
constexpr uint64_t kChunkBytes = 1ull << 20;

// Sums over the words of one chunk, positions counted from the chunk start:
// s1 = sum w_j, s2 = sum (j + 1) w_j.
struct Sums {
  uint64_t s1 = 0;
  uint64_t s2 = 0;
};

inline uint64_t LoadWord(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// Folds L interleaved lanes after M rounds into chunk sums. Lane l saw the
// words w_{L*m + l}, m = 0..M-1, and kept a_l = sum w and the running sum of
// running sums b_l = sum (M - m) w. Then sum m * w = M a_l - b_l, and the
// position weight of w_{L*m + l} is L*m + l + 1, so
//   s2 = sum_l [ L (M a_l - b_l) + (l + 1) a_l ].
// This needs only additions in the loop, which every SIMD unit has for 64-bit
// lanes (a 64-bit multiply does not exist in AVX2).
Sums FoldLanes(const uint64_t* a, const uint64_t* b, int lanes,
               uint64_t rounds) {
  Sums s;
  for (int l = 0; l < lanes; ++l) {
    s.s1 += a[l];
    s.s2 += static_cast<uint64_t>(lanes) * (rounds * a[l] - b[l]) +
            static_cast<uint64_t>(l + 1) * a[l];
  }
  return s;
}

// Adds words [from, n) one at a time.
void AddTailWords(const unsigned char* p, uint64_t from, uint64_t n,
                  Sums& s) {
  for (uint64_t j = from; j < n; ++j) {
    const uint64_t w = LoadWord(p + 8 * j);
    s.s1 += w;
    s.s2 += (j + 1) * w;
  }
}

Sums SumWordsPortable(const unsigned char* p, uint64_t n) {
  constexpr int kLanes = 8;
  uint64_t a[kLanes] = {};
  uint64_t b[kLanes] = {};
  const uint64_t rounds = n / kLanes;
  for (uint64_t m = 0; m < rounds; ++m) {
    const unsigned char* q = p + 8 * kLanes * m;
    for (int l = 0; l < kLanes; ++l) {
      a[l] += LoadWord(q + 8 * l);
      b[l] += a[l];
    }
  }
  Sums s = FoldLanes(a, b, kLanes, rounds);
  AddTailWords(p, rounds * kLanes, n, s);
  return s;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) Sums SumWordsAvx2(const unsigned char* p,
                                                  uint64_t n) {
  // Four vectors of four lanes: 16 words (128 bytes) a round, eight
  // independent add chains.
  constexpr int kLanes = 16;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  __m256i b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  const uint64_t rounds = n / kLanes;
  for (uint64_t m = 0; m < rounds; ++m) {
    const __m256i* q = reinterpret_cast<const __m256i*>(p + 128 * m);
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(q + 0));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(q + 1));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(q + 2));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(q + 3));
    b0 = _mm256_add_epi64(b0, a0);
    b1 = _mm256_add_epi64(b1, a1);
    b2 = _mm256_add_epi64(b2, a2);
    b3 = _mm256_add_epi64(b3, a3);
  }
  alignas(32) uint64_t a[kLanes];
  alignas(32) uint64_t b[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a + 0), a0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(a + 4), a1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(a + 8), a2);
  _mm256_store_si256(reinterpret_cast<__m256i*>(a + 12), a3);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b + 0), b0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b + 4), b1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b + 8), b2);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b + 12), b3);
  Sums s = FoldLanes(a, b, kLanes, rounds);
  AddTailWords(p, rounds * kLanes, n, s);
  return s;
}

__attribute__((target("avx512f"))) Sums SumWordsAvx512(const unsigned char* p,
                                                      uint64_t n) {
  // Two vectors of eight lanes: 16 words a round, as in the AVX2 path.
  constexpr int kLanes = 16;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  __m512i b0 = a0, b1 = a0;
  const uint64_t rounds = n / kLanes;
  for (uint64_t m = 0; m < rounds; ++m) {
    const unsigned char* q = p + 128 * m;
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(q));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(q + 64));
    b0 = _mm512_add_epi64(b0, a0);
    b1 = _mm512_add_epi64(b1, a1);
  }
  alignas(64) uint64_t a[kLanes];
  alignas(64) uint64_t b[kLanes];
  _mm512_store_si512(a + 0, a0);
  _mm512_store_si512(a + 8, a1);
  _mm512_store_si512(b + 0, b0);
  _mm512_store_si512(b + 8, b1);
  Sums s = FoldLanes(a, b, kLanes, rounds);
  AddTailWords(p, rounds * kLanes, n, s);
  return s;
}
#endif

// Sums of one chunk of `length` bytes at p, the last word zero-padded.
Sums SumChunk(const unsigned char* p, uint64_t length, CpuPath path) {
  const uint64_t words = length / 8;
#if defined(__x86_64__)
  Sums s = path == CpuPath::kAvx512 ? SumWordsAvx512(p, words)
           : path == CpuPath::kAvx2 ? SumWordsAvx2(p, words)
                                    : SumWordsPortable(p, words);
#else
  (void)path;
  Sums s = SumWordsPortable(p, words);
#endif
  if (const uint64_t tail = length % 8; tail != 0) {
    uint64_t w = 0;
    std::memcpy(&w, p + 8 * words, tail);
    s.s1 += w;
    s.s2 += (words + 1) * w;
  }
  return s;
}

}  // namespace

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
  std::vector<Sums> partial(chunks.size());
  RunChunks(pool, static_cast<int64_t>(chunks.size()), total, [&](int64_t i) {
    const Chunk& c = chunks[i];
    const auto* base = static_cast<const unsigned char*>(tensors[c.tensor].data);
    partial[i] = SumChunk(base + c.begin, c.length, path);
  });
  for (size_t t = 0; t < tensors.size(); ++t) out[t] = {sizes[t], 0, 0};
  // A chunk starting at word b contributes its own sums shifted by b
  // positions: sum (b + j + 1) w_j = s2_local + b * s1_local.
  for (size_t i = 0; i < chunks.size(); ++i) {
    Fingerprint& fp = out[chunks[i].tensor];
    fp.s1 += partial[i].s1;
    fp.s2 += partial[i].s2 + (chunks[i].begin / 8) * partial[i].s1;
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::Status FingerprintTensors(absl::Span<const ByteSpan> tensors,
                                absl::Span<Fingerprint> out,
                                ThreadPool* pool) {
  return internal::FingerprintTensorsOnPath(tensors, out, pool,
                                            DetectedCpuPath());
}

}  // namespace sdc::kernels
