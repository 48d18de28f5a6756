#include "kernels/fingerprint.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/mersenne61.h"
#include "kernels/reference.h"
#include "kernels/thread_pool.h"

namespace sdc::kernels {
namespace {

using ::sdc::kernels::internal::FingerprintTensorsOnPath;

// Every path this CPU can run: the portable one always, SIMD when present.
std::vector<CpuPath> Paths() { return SupportedCpuPaths(); }

// The keys the property tests run under: the fixed one and a few others.
const std::vector<FingerprintKey>& Keys() {
  static const auto* keys = new std::vector<FingerprintKey>{
      FingerprintKey::FromSeed(kFixedFingerprintSeed), FingerprintKey::FromSeed(1),
      FingerprintKey::FromSeed(0x5eed5eed5eed5eedull),
      FingerprintKey::FromSeed(0xfedcba9876543210ull)};
  return *keys;
}

Fingerprint FastOne(const void* data, uint64_t size, const FingerprintKey& key,
                    CpuPath path = DetectedCpuPath(), ThreadPool* pool = nullptr) {
  ByteSpan span{data, size};
  Fingerprint fp;
  absl::Status s = FingerprintTensorsOnPath({&span, 1}, key, {&fp, 1}, pool, path);
  EXPECT_TRUE(s.ok()) << s;
  return fp;
}

std::vector<unsigned char> AsBytes(const std::vector<uint64_t>& words) {
  std::vector<unsigned char> bytes(8 * words.size());
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

std::vector<uint64_t> RandomWords(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> words(n);
  for (uint64_t& w : words) w = rng();
  return words;
}

// The definition this one replaced (s1 = sum w_i, s2 = sum (i+1) w_i mod
// 2^64), to show that a pattern below is one it could not see.
std::pair<uint64_t, uint64_t> OldSums(const std::vector<uint64_t>& words) {
  uint64_t s1 = 0, s2 = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    s1 += words[i];
    s2 += (i + 1) * words[i];
  }
  return {s1, s2};
}

// Both outputs must move: each alone already misses with probability at
// most 2^-31 + 2m/(p-1), and the keys here are fixed, so a pass is not luck
// that can change from run to run.
void ExpectBothOutputsChange(const Fingerprint& before, const Fingerprint& after,
                             const std::string& what) {
  EXPECT_NE(before.s1, after.s1) << what;
  EXPECT_NE(before.s2, after.s2) << what;
}

// ---------------------------------------------------------------------------
// The definition, by hand and against an independent model.

TEST(FingerprintKeyTest, FromSeedFollowsTheSpec) {
  // Values from an independent implementation of the key's expansion.
  const FingerprintKey key = FingerprintKey::FromSeed(0);
  EXPECT_EQ(key.seed(), 0u);
  EXPECT_EQ(key.r(0), 0x1c4415072f63b9b5ull);
  EXPECT_EQ(key.r(1), 0x0dcf13cd54372cbeull);
  EXPECT_EQ(key.words(0)[0], 0x06c45d188009454full);
  EXPECT_EQ(key.words(0)[1], 0xf88bb8a8724c81ecull);
  EXPECT_EQ(key.words(0)[2], 0x1b39896a51a8749bull);
  EXPECT_EQ(key.words(1)[0], 0x04dfae11b8dcf861ull);
  EXPECT_EQ(key.words(1)[1], 0x4c3433717af5c89aull);
  EXPECT_EQ(key.words(1)[2], 0x22b7ba9e68349351ull);
  EXPECT_EQ(key.words(1)[kFingerprintBlockWords - 1], 0x02ec155877fe5197ull);
  const FingerprintKey one = FingerprintKey::FromSeed(1);
  EXPECT_EQ(one.r(0), 0x122145bd91204b98ull);
  EXPECT_EQ(one.r(1), 0x17dd71b42cb1dd8cull);
}

TEST(FingerprintKeyTest, MultipliersAreInRangeAndSeedsGiveDifferentKeys) {
  std::set<uint64_t> first_words;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const FingerprintKey key = FingerprintKey::FromSeed(seed * 0x9e3779b97f4a7c15ull);
    for (int j = 0; j < 2; ++j) {
      EXPECT_GE(key.r(j), 1u);
      EXPECT_LT(key.r(j), m61::kPrime);
    }
    first_words.insert(key.words(0)[0]);
    const FingerprintKey again = FingerprintKey::FromSeed(key.seed());
    EXPECT_EQ(std::memcmp(key.words(1), again.words(1), 8 * kFingerprintBlockWords), 0);
  }
  EXPECT_EQ(first_words.size(), 200u);
}

TEST(FingerprintKeyTest, DrawnSeedsDiffer) {
  absl::StatusOr<uint64_t> a = DrawFingerprintSeed();
  absl::StatusOr<uint64_t> b = DrawFingerprintSeed();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, *b);  // Equal with probability 2^-64.
}

TEST(Mersenne61Test, MatchesWideRemainders) {
  const unsigned __int128 p = m61::kPrime;
  std::mt19937_64 rng(5);
  std::vector<uint64_t> values = {0, 1, 2, m61::kPrime - 1, m61::kPrime - 2,
                                  1ull << 60, (1ull << 32) - 1, 1ull << 32};
  for (int i = 0; i < 2000; ++i) values.push_back(rng() % m61::kPrime);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint64_t a = values[i];
    const uint64_t b = values[(i * 7 + 3) % values.size()];
    ASSERT_EQ(m61::Mul(a, b), static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % p))
        << a << " * " << b;
    ASSERT_EQ(m61::Add(a, b), static_cast<uint64_t>((static_cast<unsigned __int128>(a) + b) % p));
    const uint64_t any = rng();
    ASSERT_EQ(m61::Reduce(any), any % m61::kPrime);
  }
  EXPECT_EQ(m61::Reduce(~0ull), ~0ull % m61::kPrime);
  EXPECT_EQ(m61::Reduce(m61::kPrime), 0u);
  EXPECT_EQ(m61::Pow(3, 0), 1u);
  EXPECT_EQ(m61::Pow(2, 61), 1u);  // 2^61 = 1 (mod 2^61 - 1).
  EXPECT_EQ(m61::Pow(5, m61::kPrime - 1), 1u);  // Fermat.
}

struct HandCase {
  const char* name;
  std::vector<unsigned char> bytes;
  Fingerprint expected;  // Under the key of seed 0.
};

std::vector<HandCase> HandCases() {
  return {
      {"empty", {}, {0, 0, 0}},
      // The header's worked example.
      {"seventeen_bytes",
       {1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3},
       {17, 0x0489f8c06d9afb09ull, 0x0fc9332314831407ull}},
      {"two_floats",
       {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40},
       {8, 0x07cb54e24fbfd7c6ull, 0x0efea1beb280b036ull}},
  };
}

TEST(FingerprintTest, HandWorkedValues) {
  const FingerprintKey key = FingerprintKey::FromSeed(0);
  for (const HandCase& c : HandCases()) {
    EXPECT_EQ(ReferenceFingerprint({c.bytes.data(), c.bytes.size()}, key), c.expected)
        << c.name << " (reference)";
    for (CpuPath path : Paths()) {
      EXPECT_EQ(FastOne(c.bytes.data(), c.bytes.size(), key, path), c.expected)
          << c.name << " on " << CpuPathName(path);
    }
  }
  // The example's intermediate values, as the header shows them.
  const uint64_t h1 = (1 + 0x8009454full) * 0x06c45d18ull + (2 + 0x724c81ecull) * 0xf88bb8a8ull +
                      (3 + 0x51a8749bull) * 0x1b39896aull;
  EXPECT_EQ(h1, 0x7b0a0bc70375bb1cull);
  const uint64_t r = key.r(0);
  const uint64_t s1 = m61::Add(m61::Add(m61::Mul(0x0375bb1c, m61::Pow(r, 3)),
                                        m61::Mul(0x7b0a0bc7, m61::Pow(r, 2))),
                               m61::Mul(17, r));
  EXPECT_EQ(s1, 0x0489f8c06d9afb09ull);
  // Another key, other values (from the independent model too).
  const std::vector<unsigned char> example = HandCases()[1].bytes;
  EXPECT_EQ(FastOne(example.data(), example.size(), FingerprintKey::FromSeed(1)),
            (Fingerprint{17, 0x1eafa1e8c2a50c8bull, 0x1d4a2b3f743c12dbull}));
}

// ---------------------------------------------------------------------------
// Difference patterns: each must change both outputs under every key.

// 129 level-1 blocks in one chunk, the last one partial.
constexpr size_t kPatternWords = 128 * kFingerprintBlockWords + 37;

TEST(FingerprintPatternTest, SignFlipsInTwoWordsAtManyDistances) {
  // Bit 63 is the sign of the odd fp32 element (and of an fp64). The old
  // sums saw two such flips only through s2's (a + b + 2) 2^63: blind
  // whenever a - b is even, as for elements 1 and 5 (words 0 and 2).
  std::vector<uint64_t> words = RandomWords(kPatternWords, 21);
  std::vector<size_t> distances = {1, 2, 3, 4, 6, 8, 16, 64, 255, 256, 257, 510, 511, 512,
                                   513, 1023, 1024, 1536, 4096, 8192, 32768, 65535};
  for (const FingerprintKey& key : Keys()) {
    const Fingerprint original = FastOne(words.data(), 8 * words.size(), key);
    for (size_t d : distances) {
      for (size_t a : {size_t{0}, size_t{5}, size_t{511}, size_t{1000}, kPatternWords - 1 - d}) {
        const size_t b = a + d;
        if (b >= words.size()) continue;
        std::vector<uint64_t> flipped = words;
        flipped[a] ^= 1ull << 63;
        flipped[b] ^= 1ull << 63;
        if (d % 2 == 0) {
          ASSERT_EQ(OldSums(flipped), OldSums(words)) << "the old sums should be blind here";
        }
        ExpectBothOutputsChange(
            original, FastOne(flipped.data(), 8 * flipped.size(), key),
            absl::StrCat("sign flips at words ", a, " and ", b, ", seed ", key.seed()));
      }
    }
  }
}

TEST(FingerprintPatternTest, TheIssuesFp32Example) {
  // Negating fp32 elements 1 and 5 of a tensor.
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(i) + 0.5f;
  std::vector<float> negated = values;
  negated[1] = -negated[1];
  negated[5] = -negated[5];
  for (const FingerprintKey& key : Keys()) {
    ExpectBothOutputsChange(FastOne(values.data(), 4 * values.size(), key),
                            FastOne(negated.data(), 4 * negated.size(), key),
                            absl::StrCat("seed ", key.seed()));
  }
}

TEST(FingerprintPatternTest, OffsettingPowersOfTwo) {
  // +2^k at word a and -2^k at word b cancel in the old sums whenever
  // 2^(64-k) divides a - b.
  std::vector<uint64_t> words = RandomWords(kPatternWords, 22);
  for (const FingerprintKey& key : Keys()) {
    const Fingerprint original = FastOne(words.data(), 8 * words.size(), key);
    for (int k = 48; k < 64; ++k) {
      const size_t d = size_t{1} << (64 - k);
      for (size_t multiple = 1; multiple * d < kPatternWords && multiple <= 3; ++multiple) {
        for (size_t a : {size_t{0}, size_t{7}, size_t{3000}}) {
          const size_t b = a + multiple * d;
          if (b >= words.size()) continue;
          std::vector<uint64_t> changed = words;
          changed[a] += 1ull << k;
          changed[b] -= 1ull << k;
          ASSERT_EQ(OldSums(changed), OldSums(words));
          ExpectBothOutputsChange(original, FastOne(changed.data(), 8 * changed.size(), key),
                                  absl::StrCat("+-2^", k, " at words ", a, ", ", b));
        }
      }
    }
  }
}

TEST(FingerprintPatternTest, HighBitFlipsInSeveralElements) {
  std::mt19937_64 rng(23);
  std::vector<uint64_t> words = RandomWords(kPatternWords, 24);
  std::vector<unsigned char> bytes = AsBytes(words);
  // (element size, bit) pairs: fp32 sign and top exponent bit, bf16 and fp16
  // signs, fp64 sign.
  const std::pair<int, int> kinds[] = {{4, 31}, {4, 30}, {2, 15}, {2, 14}, {8, 63}};
  for (const FingerprintKey& key : Keys()) {
    const Fingerprint original = FastOne(bytes.data(), bytes.size(), key);
    for (auto [size, bit] : kinds) {
      const size_t elements = bytes.size() / size;
      for (int trial = 0; trial < 40; ++trial) {
        std::vector<unsigned char> changed = bytes;
        const int count = 2 + trial % 15;
        std::set<size_t> picked;
        // Half the trials cluster the flips (one faulty row), half spread them.
        const size_t start = rng() % (elements - 64);
        while (static_cast<int>(picked.size()) < count) {
          picked.insert(trial % 2 == 0 ? start + rng() % 64 : rng() % elements);
        }
        for (size_t e : picked) changed[e * size + bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
        ExpectBothOutputsChange(original, FastOne(changed.data(), changed.size(), key),
                                absl::StrCat(count, " flips of bit ", bit, " in ", size,
                                             "-byte elements, seed ", key.seed()));
      }
    }
  }
}

TEST(FingerprintPatternTest, RandomMultiWordChanges) {
  std::mt19937_64 rng(25);
  std::vector<uint64_t> words = RandomWords(kPatternWords, 26);
  for (const FingerprintKey& key : Keys()) {
    const Fingerprint original = FastOne(words.data(), 8 * words.size(), key);
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<uint64_t> changed = words;
      const int count = 1 + static_cast<int>(rng() % 64);
      for (int c = 0; c < count; ++c) {
        uint64_t delta = rng() >> (rng() % 64);  // Masks of every width.
        if (delta == 0) delta = 1;
        changed[rng() % changed.size()] ^= delta;
      }
      if (changed == words) continue;
      ExpectBothOutputsChange(original, FastOne(changed.data(), 8 * changed.size(), key),
                              absl::StrCat("trial ", trial));
    }
  }
}

TEST(FingerprintPatternTest, Swaps) {
  std::vector<uint64_t> words = RandomWords(kPatternWords, 27);
  std::vector<std::pair<size_t, size_t>> pairs = {
      {0, 1}, {0, 2}, {3, 511}, {511, 512}, {0, 512}, {7, 7 + 512 * 5}, {100, 60000}, {0, kPatternWords - 1}};
  for (const FingerprintKey& key : Keys()) {
    const Fingerprint original = FastOne(words.data(), 8 * words.size(), key);
    for (auto [a, b] : pairs) {
      std::vector<uint64_t> swapped = words;
      std::swap(swapped[a], swapped[b]);
      ExpectBothOutputsChange(original, FastOne(swapped.data(), 8 * swapped.size(), key),
                              absl::StrCat("swap of words ", a, " and ", b));
    }
    // Swapping the two fp32 elements inside one word, and two adjacent
    // elements across a word boundary.
    std::vector<unsigned char> bytes = AsBytes(words);
    for (size_t at : {size_t{0}, size_t{4}, size_t{4092}, size_t{8 * 1000 + 4}}) {
      std::vector<unsigned char> swapped = bytes;
      std::swap_ranges(swapped.begin() + at, swapped.begin() + at + 4, swapped.begin() + at + 4);
      ExpectBothOutputsChange(original, FastOne(swapped.data(), swapped.size(), key),
                              absl::StrCat("fp32 swap at byte ", at));
    }
  }
}

TEST(FingerprintPatternTest, ZeroPaddingAndZeroedTails) {
  std::vector<unsigned char> bytes = AsBytes(RandomWords(2 * kFingerprintBlockWords, 28));
  for (const FingerprintKey& key : Keys()) {
    for (size_t length : {size_t{1}, size_t{7}, size_t{8}, size_t{13}, size_t{4095}, size_t{4096},
                          size_t{4100}, bytes.size() - 9}) {
      const Fingerprint shorter = FastOne(bytes.data(), length, key);
      // Zero bytes appended: the padding of the last word must not hide them.
      for (size_t extra : {1, 3, 7, 8, 9, 4096}) {
        std::vector<unsigned char> padded(bytes.begin(), bytes.begin() + length);
        padded.resize(length + extra, 0);
        const Fingerprint longer = FastOne(padded.data(), padded.size(), key);
        EXPECT_NE(longer.byte_length, shorter.byte_length);
        ExpectBothOutputsChange(shorter, longer,
                                absl::StrCat(length, " bytes + ", extra, " zero bytes"));
      }
      // The tail zeroed in place.
      for (size_t zeroed : {size_t{1}, size_t{5}, size_t{8}, size_t{100}}) {
        if (zeroed > length) continue;
        std::vector<unsigned char> changed(bytes.begin(), bytes.begin() + length);
        std::fill(changed.end() - zeroed, changed.end(), 0);
        if (std::equal(changed.begin(), changed.end(), bytes.begin())) continue;
        ExpectBothOutputsChange(shorter, FastOne(changed.data(), changed.size(), key),
                                absl::StrCat(length, " bytes, last ", zeroed, " zeroed"));
      }
    }
  }
}

TEST(FingerprintPatternTest, EverySingleBitFlipAcrossABlockBoundary) {
  // 4 KiB + 13 bytes: a whole block, then a partial one with a padded word.
  std::vector<unsigned char> buf = AsBytes(RandomWords(kFingerprintBlockWords + 2, 7));
  buf.resize(kFingerprintBlockBytes + 13);
  const FingerprintKey& key = Keys()[2];
  const Fingerprint original = FastOne(buf.data(), buf.size(), key);
  ASSERT_EQ(original, ReferenceFingerprint({buf.data(), buf.size()}, key));
  for (size_t bit = 0; bit < 8 * buf.size(); ++bit) {
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    const Fingerprint flipped = FastOne(buf.data(), buf.size(), key);
    ASSERT_NE(flipped.s1, original.s1) << "bit " << bit;
    ASSERT_NE(flipped.s2, original.s2) << "bit " << bit;
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  EXPECT_EQ(FastOne(buf.data(), buf.size(), key), original);
}

TEST(FingerprintPatternTest, ChangesAtChunkBoundariesOnEveryPathAndThreadCount) {
  // Three 1 MiB chunks and a partial fourth; changes on both sides of each
  // boundary, and a pair that straddles one.
  constexpr size_t kWords = 3 * (1u << 17) + 1000;
  std::vector<uint64_t> words = RandomWords(kWords, 29);
  std::vector<unsigned char> bytes = AsBytes(words);
  bytes.resize(bytes.size() - 3);
  ThreadPool one(1);
  ThreadPool three(3);
  const FingerprintKey& key = Keys()[1];
  const Fingerprint original = ReferenceFingerprint({bytes.data(), bytes.size()}, key);
  const std::vector<std::vector<size_t>> patterns = {
      {(1u << 17) - 1}, {1u << 17}, {(1u << 17) - 1, 1u << 17}, {(2u << 17) - 1, (3u << 17) + 2},
      {kWords - 1}, {0, kWords - 1}};
  for (CpuPath path : Paths()) {
    for (ThreadPool* pool : {&one, &three}) {
      ASSERT_EQ(FastOne(bytes.data(), bytes.size(), key, path, pool), original)
          << CpuPathName(path) << " threads " << pool->threads();
      for (const std::vector<size_t>& at : patterns) {
        std::vector<unsigned char> changed = bytes;
        for (size_t w : at) changed[8 * w + 7 - (w == kWords - 1 ? 3 : 0)] ^= 0x80;
        const Fingerprint got = FastOne(changed.data(), changed.size(), key, path, pool);
        EXPECT_EQ(got, ReferenceFingerprint({changed.data(), changed.size()}, key));
        ExpectBothOutputsChange(original, got,
                                absl::StrCat(CpuPathName(path), " threads ", pool->threads(),
                                             " first word ", at[0]));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Every path and thread count, bit for bit against the reference.

TEST(FingerprintTest, ShortLengthsBlockEdgesAndMisalignedStartsMatchReference) {
  std::mt19937_64 rng(3);
  std::vector<unsigned char> storage(3 * kFingerprintBlockBytes + 16);
  for (unsigned char& b : storage) b = static_cast<unsigned char>(rng());
  std::vector<size_t> lengths;
  for (size_t l = 0; l <= 67; ++l) lengths.push_back(l);
  for (size_t edge : {kFingerprintBlockBytes, 2 * kFingerprintBlockBytes}) {
    for (size_t l = edge - 17; l <= edge + 17; ++l) lengths.push_back(l);
  }
  for (const FingerprintKey& key : Keys()) {
    for (CpuPath path : Paths()) {
      for (size_t offset = 0; offset < 8; ++offset) {
        for (size_t length : lengths) {
          const unsigned char* p = storage.data() + offset;
          ASSERT_EQ(FastOne(p, length, key, path), ReferenceFingerprint({p, length}, key))
              << CpuPathName(path) << " offset " << offset << " length " << length;
        }
      }
    }
  }
}

TEST(FingerprintTest, RandomBuffersMatchReferenceOnAnyThreadCount) {
  std::mt19937_64 rng(42);
  ThreadPool one(1);
  ThreadPool three(3);
  // Sizes cross the 1 MiB chunk boundary and the pool's 2 MiB threshold.
  std::vector<std::vector<unsigned char>> buffers;
  std::vector<ByteSpan> spans;
  for (int i = 0; i < 24; ++i) {
    uint64_t size = i < 4 ? (3ull << 20) + rng() % 4096 : rng() % (700u << 10);
    if (i == 4) size = (1ull << 20) + 1;
    if (i == 5) size = (2ull << 20) - 1;
    std::vector<unsigned char> b(size + 1);
    for (unsigned char& x : b) x = static_cast<unsigned char>(rng());
    buffers.push_back(std::move(b));
  }
  for (auto& b : buffers) spans.push_back({b.data() + (b.size() % 2), b.size() - 1});
  const FingerprintKey& key = Keys()[3];
  std::vector<Fingerprint> expected;
  for (const ByteSpan& s : spans) expected.push_back(ReferenceFingerprint(s, key));
  for (CpuPath path : Paths()) {
    for (ThreadPool* pool : {&one, &three}) {
      std::vector<Fingerprint> got(spans.size());
      ASSERT_TRUE(FingerprintTensorsOnPath(spans, key, absl::MakeSpan(got), pool, path).ok());
      for (size_t t = 0; t < spans.size(); ++t) {
        ASSERT_EQ(got[t], expected[t]) << CpuPathName(path) << " threads "
                                       << pool->threads() << " tensor " << t
                                       << " size " << spans[t].size;
      }
    }
  }
  // The public entry point takes the detected path and the default pool.
  std::vector<Fingerprint> got(spans.size());
  ASSERT_TRUE(FingerprintTensors(spans, key, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, expected);
}

TEST(FingerprintTest, KeysGiveUnrelatedValues) {
  const std::vector<unsigned char> bytes = AsBytes(RandomWords(1000, 9));
  std::set<uint64_t> s1s;
  for (const FingerprintKey& key : Keys()) s1s.insert(FastOne(bytes.data(), bytes.size(), key).s1);
  EXPECT_EQ(s1s.size(), Keys().size());
}

TEST(FingerprintTest, BadInputIsInvalidArgument) {
  const FingerprintKey& key = Keys()[0];
  std::vector<Fingerprint> out(2);
  const ByteSpan null_with_bytes[] = {{nullptr, 16}};
  absl::Status s = FingerprintTensors(null_with_bytes, key, absl::MakeSpan(out).first(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 0 has a null pointer and 16 bytes"),
            absl::string_view::npos) << s;

  const unsigned char byte = 1;
  const ByteSpan one[] = {{&byte, 1}};
  s = FingerprintTensors(one, key, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1 tensors but room for 2"), absl::string_view::npos) << s;

  // A null pointer with no bytes is an empty tensor, not an error.
  const ByteSpan empty[] = {{nullptr, 0}};
  ASSERT_TRUE(FingerprintTensors(empty, key, absl::MakeSpan(out).first(1)).ok());
  EXPECT_EQ(out[0], (Fingerprint{0, 0, 0}));
}

}  // namespace
}  // namespace sdc::kernels
