#include "kernels/model_digest.h"

#include <vector>

#include "gtest/gtest.h"

namespace sdc::kernels {
namespace {

TEST(ModelDigestTest, WorkedExamplesFromTheHeader) {
  EXPECT_EQ(ModelDigest({}), 0xfe633206332465eaull);
  EXPECT_EQ(Mix64(kDigestSeed ^ 0), 0xfe633206332465eaull);
  const std::vector<NamedFingerprint> one = {{"w", {17, 6, 14}}};
  EXPECT_EQ(ModelDigest(one), 0x090ff95af96ceb39ull);
}

TEST(ModelDigestTest, BuilderMatchesListForm) {
  const std::vector<NamedFingerprint> entries = {
      {"embed.weight", {4096, 1, 2}},
      {"layers.0.attn.qkv.weight", {12288, 3, 4}},
      {"norm.bias", {8, 5, 6}}};
  ModelDigestBuilder b;
  for (const auto& e : entries) b.Add(e.name, e.fingerprint);
  EXPECT_EQ(b.Finish(), ModelDigest(entries));
}

TEST(ModelDigestTest, EveryFieldAndTheOrderMatter) {
  const std::vector<NamedFingerprint> base = {{"a.weight", {16, 100, 200}},
                                              {"b.weight", {16, 300, 400}}};
  const uint64_t d = ModelDigest(base);
  auto changed = [&](auto mutate) {
    std::vector<NamedFingerprint> e = base;
    mutate(e);
    return ModelDigest(e);
  };
  EXPECT_NE(d, changed([](auto& e) { std::swap(e[0], e[1]); }));
  EXPECT_NE(d, changed([](auto& e) { e[0].name = "a.weigh"; }));
  EXPECT_NE(d, changed([](auto& e) { e[1].name = "b.weight2"; }));
  EXPECT_NE(d, changed([](auto& e) { e[0].fingerprint.byte_length = 24; }));
  EXPECT_NE(d, changed([](auto& e) { e[0].fingerprint.s1 ^= 1; }));
  EXPECT_NE(d, changed([](auto& e) { e[1].fingerprint.s2 += 1; }));
  EXPECT_NE(d, changed([](auto& e) { e.pop_back(); }));
  // Moving bytes between names cannot collide: lengths are absorbed first.
  EXPECT_NE(ModelDigest({{"ab", {0, 0, 0}}, {"c", {0, 0, 0}}}),
            ModelDigest({{"a", {0, 0, 0}}, {"bc", {0, 0, 0}}}));
}

}  // namespace
}  // namespace sdc::kernels
