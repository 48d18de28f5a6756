#include "kernels/fingerprint.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/reference.h"
#include "kernels/thread_pool.h"

namespace sdc::kernels {
namespace {

using ::sdc::kernels::internal::FingerprintTensorsOnPath;

// Every path this CPU can run: the portable one always, SIMD when present.
std::vector<CpuPath> Paths() { return SupportedCpuPaths(); }

Fingerprint FastOne(const void* data, uint64_t size, CpuPath path,
                    ThreadPool* pool = nullptr) {
  ByteSpan span{data, size};
  Fingerprint fp;
  absl::Status s = FingerprintTensorsOnPath({&span, 1}, {&fp, 1}, pool, path);
  EXPECT_TRUE(s.ok()) << s;
  return fp;
}

std::vector<uint64_t> Words(std::initializer_list<uint64_t> words) {
  return std::vector<uint64_t>(words);
}

struct HandCase {
  const char* name;
  std::vector<unsigned char> bytes;
  Fingerprint expected;
};

std::vector<unsigned char> AsBytes(const std::vector<uint64_t>& words) {
  std::vector<unsigned char> bytes(8 * words.size());
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

std::vector<HandCase> HandCases() {
  std::vector<HandCase> cases;
  cases.push_back({"empty", {}, {0, 0, 0}});
  // The header's worked example.
  cases.push_back({"seventeen_bytes",
                   {1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3},
                   {17, 6, 14}});
  cases.push_back({"three_bytes_padded", {0x01, 0x02, 0x03}, {3, 0x030201, 0x030201}});
  cases.push_back({"two_floats",
                   {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40},
                   {8, 0x400000003f800000ull, 0x400000003f800000ull}});
  // All ones: s1 = n, s2 = n(n+1)/2. 16 words is one AVX2 round, 40 words is
  // two rounds and a tail.
  cases.push_back({"sixteen_ones", AsBytes(std::vector<uint64_t>(16, 1)),
                   {128, 16, 136}});
  cases.push_back({"forty_ones", AsBytes(std::vector<uint64_t>(40, 1)),
                   {320, 40, 820}});
  // w_i = i + 1 for 100 words: s1 = 5050, s2 = sum (i+1)^2 = 338350.
  std::vector<uint64_t> ramp(100);
  for (int i = 0; i < 100; ++i) ramp[i] = i + 1;
  cases.push_back({"ramp_100", AsBytes(ramp), {800, 5050, 338350}});
  // Wrap-around mod 2^64: s1 = 2(2^64-1) = -2, s2 = 3(2^64-1) = -3.
  cases.push_back({"wraps", AsBytes(Words({~0ull, ~0ull})),
                   {16, 0xfffffffffffffffeull, 0xfffffffffffffffdull}});
  return cases;
}

TEST(FingerprintTest, HandWorkedValues) {
  for (const HandCase& c : HandCases()) {
    EXPECT_EQ(ReferenceFingerprint({c.bytes.data(), c.bytes.size()}), c.expected)
        << c.name << " (reference)";
    for (CpuPath path : Paths()) {
      EXPECT_EQ(FastOne(c.bytes.data(), c.bytes.size(), path), c.expected)
          << c.name << " on " << CpuPathName(path);
    }
  }
}

TEST(FingerprintTest, EverySingleBitFlipIn4KiBChangesTheFingerprint) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> words(512);
  for (uint64_t& w : words) w = rng();
  std::vector<unsigned char> buf = AsBytes(words);
  const Fingerprint original = FastOne(buf.data(), buf.size(), DetectedCpuPath());
  ASSERT_EQ(original, ReferenceFingerprint({buf.data(), buf.size()}));
  for (size_t bit = 0; bit < 8 * buf.size(); ++bit) {
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    const Fingerprint flipped = FastOne(buf.data(), buf.size(), DetectedCpuPath());
    // A flip adds or subtracts 2^k in one word, so s1 itself must move.
    ASSERT_NE(flipped.s1, original.s1) << "bit " << bit;
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  EXPECT_EQ(FastOne(buf.data(), buf.size(), DetectedCpuPath()), original);
}

TEST(FingerprintTest, SwappingTwoDifferentWordsChangesS2) {
  std::mt19937_64 rng(11);
  std::vector<uint64_t> words(512);
  for (uint64_t& w : words) w = rng();
  const std::vector<unsigned char> buf = AsBytes(words);
  const Fingerprint original = FastOne(buf.data(), buf.size(), DetectedCpuPath());
  for (size_t a = 0; a < words.size(); a += 7) {
    for (size_t b = a + 1; b < words.size(); b += 13) {
      ASSERT_NE(words[a], words[b]);
      std::vector<uint64_t> swapped = words;
      std::swap(swapped[a], swapped[b]);
      const std::vector<unsigned char> sbuf = AsBytes(swapped);
      const Fingerprint fp = FastOne(sbuf.data(), sbuf.size(), DetectedCpuPath());
      ASSERT_EQ(fp.s1, original.s1) << "a swap keeps the plain sum";
      ASSERT_NE(fp.s2, original.s2) << "swap " << a << " <-> " << b;
    }
  }
}

TEST(FingerprintTest, ShortLengthsAndMisalignedStartsMatchReference) {
  std::mt19937_64 rng(3);
  std::vector<unsigned char> storage(67 + 8 + 8);
  for (unsigned char& b : storage) b = static_cast<unsigned char>(rng());
  for (CpuPath path : Paths()) {
    for (size_t offset = 0; offset < 8; ++offset) {
      for (size_t length = 0; length <= 67; ++length) {
        const unsigned char* p = storage.data() + offset;
        ASSERT_EQ(FastOne(p, length, path), ReferenceFingerprint({p, length}))
            << CpuPathName(path) << " offset " << offset << " length " << length;
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
    const uint64_t size = i < 4 ? (3ull << 20) + rng() % 4096 : rng() % (700u << 10);
    std::vector<unsigned char> b(size + 1);
    for (unsigned char& x : b) x = static_cast<unsigned char>(rng());
    buffers.push_back(std::move(b));
  }
  for (auto& b : buffers) spans.push_back({b.data() + (b.size() % 2), b.size() - 1});
  std::vector<Fingerprint> expected;
  for (const ByteSpan& s : spans) expected.push_back(ReferenceFingerprint(s));
  for (CpuPath path : Paths()) {
    for (ThreadPool* pool : {&one, &three}) {
      std::vector<Fingerprint> got(spans.size());
      ASSERT_TRUE(FingerprintTensorsOnPath(spans, absl::MakeSpan(got), pool, path).ok());
      for (size_t t = 0; t < spans.size(); ++t) {
        ASSERT_EQ(got[t], expected[t]) << CpuPathName(path) << " threads "
                                       << pool->threads() << " tensor " << t
                                       << " size " << spans[t].size;
      }
    }
  }
  // The public entry point takes the detected path and the default pool.
  std::vector<Fingerprint> got(spans.size());
  ASSERT_TRUE(FingerprintTensors(spans, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, expected);
}

TEST(FingerprintTest, BadInputIsInvalidArgument) {
  std::vector<Fingerprint> out(2);
  const ByteSpan null_with_bytes[] = {{nullptr, 16}};
  absl::Status s = FingerprintTensors(null_with_bytes, absl::MakeSpan(out).first(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 0 has a null pointer and 16 bytes"),
            absl::string_view::npos) << s;

  const unsigned char byte = 1;
  const ByteSpan one[] = {{&byte, 1}};
  s = FingerprintTensors(one, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1 tensors but room for 2"), absl::string_view::npos) << s;

  // A null pointer with no bytes is an empty tensor, not an error.
  const ByteSpan empty[] = {{nullptr, 0}};
  ASSERT_TRUE(FingerprintTensors(empty, absl::MakeSpan(out).first(1)).ok());
  EXPECT_EQ(out[0], (Fingerprint{0, 0, 0}));
}

}  // namespace
}  // namespace sdc::kernels
