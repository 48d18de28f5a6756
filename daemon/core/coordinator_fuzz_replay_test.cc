// Runs the fuzz target's body (coordinator_fuzz.cc) on fixed inputs under the
// normal build, so every ./sdc test exercises it even without clang: a
// scripted 3x2 cluster, then 3,000 pseudo-random inputs from a fixed seed.

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace sdc::core {
void FuzzCoordinatorOnce(const uint8_t* data, size_t size);
namespace {

TEST(CoordinatorFuzzReplayTest, RandomScriptsKeepInvariants) {
  std::mt19937_64 rng(20261202);
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> input(rng() % 2048);
    for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
    FuzzCoordinatorOnce(input.data(), input.size());  // Aborts on a violation.
  }
}

TEST(CoordinatorFuzzReplayTest, EmptyAndTinyInputs) {
  FuzzCoordinatorOnce(nullptr, 0);
  const uint8_t one = 7;
  FuzzCoordinatorOnce(&one, 1);
}

}  // namespace
}  // namespace sdc::core
