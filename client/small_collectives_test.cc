// The small collectives on real Gloo groups: each rank a thread of this
// process with its own ProcessGroupGloo over loopback TCP, both algorithms,
// odd and even group sizes.

#include "client/small_collectives.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "client/gloo_group.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

// Runs `body(rank, group)` on `world` threads, one Gloo group member each.
void OnGroup(const std::string& name, int world,
             const std::function<void(int, c10d::ProcessGroup&)>& body) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::remove(path.c_str());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      c10::intrusive_ptr<c10d::ProcessGroup> group =
          MakeGlooGroup(path, rank, world, std::chrono::seconds(30));
      body(rank, *group);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Rank r's words: distinct per rank and position, negative ones included, so
// a maximum taken over the wrong ranks or positions shows.
std::vector<int64_t> WordsOf(int rank) {
  return {rank * 10, -rank * 7, (rank % 2 == 0 ? 1000 : -1000) + rank, int64_t{-1} << 40};
}

TEST(SmallCollectivesTest, AutoIsRootedOnGloo) {
  OnGroup("auto", 1, [](int, c10d::ProcessGroup& pg) {
    EXPECT_EQ(Resolve(SmallCollectives::kAuto, pg), SmallCollectives::kRooted);
    EXPECT_EQ(Resolve(SmallCollectives::kBackend, pg), SmallCollectives::kBackend);
    EXPECT_EQ(Resolve(SmallCollectives::kRooted, pg), SmallCollectives::kRooted);
  });
}

TEST(SmallCollectivesTest, BothAlgorithmsAgreeWithTheDefinition) {
  for (int world : {1, 2, 5, 6}) {
    std::vector<int64_t> max = WordsOf(0), gathered;
    for (int r = 0; r < world; ++r) {
      const std::vector<int64_t> w = WordsOf(r);
      for (size_t i = 0; i < w.size(); ++i) max[i] = std::max(max[i], w[i]);
      gathered.insert(gathered.end(), w.begin(), w.end());
    }
    for (SmallCollectives how : {SmallCollectives::kBackend, SmallCollectives::kRooted}) {
      const std::string name = "group-" + std::to_string(world) + "-" +
                               (how == SmallCollectives::kRooted ? "rooted" : "backend");
      OnGroup(name, world, [&](int rank, c10d::ProcessGroup& pg) {
        // Several rounds on one group: each call's messages stay its own.
        for (int round = 0; round < 3; ++round) {
          std::vector<int64_t> words = WordsOf(rank);
          AllReduceMax(pg, how, words);
          EXPECT_EQ(words, max) << name << " rank " << rank;
          EXPECT_EQ(AllGather(pg, how, WordsOf(rank)), gathered) << name << " rank " << rank;
        }
      });
    }
  }
}

}  // namespace
}  // namespace sdc::client
