// RunCluster reading its trainers' progress lines, with shell stand-ins for
// the trainer (unguarded: no sdcd), so what each rank writes is exact.

#include "demo/launcher.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "demo/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::demo {
namespace {

using ::testing::HasSubstr;

// A trainer stand-in: appends rank 0's or the other ranks' lines (shell
// words, one line each) to its --progress file, then runs `then`.
std::string WriteTrainer(const std::string& dir, const std::string& rank0_lines,
                         const std::string& other_lines, const std::string& then) {
  const std::string path = dir + "/trainer.sh";
  std::ofstream(path) << "#!/bin/sh\n"
                         "for a in \"$@\"; do case \"$a\" in\n"
                         "  --progress=*) p=\"${a#--progress=}\" ;;\n"
                         "  --rank=*) r=\"${a#--rank=}\" ;;\n"
                         "esac; done\n"
                         "if [ \"$r\" = 0 ]; then printf '%s\\n' "
                      << rank0_lines << " >>\"$p\"; else printf '%s\\n' " << other_lines
                      << " >>\"$p\"; fi\n"
                      << then << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

ClusterConfig TwoRanks(const std::string& dir, const std::string& trainer) {
  ClusterConfig c;
  c.run_dir = dir;
  c.nodes = 1;
  c.gpus_per_node = 2;
  c.steps = 1;
  c.unguarded = true;
  c.trainer_binary = trainer;
  c.timeout = absl::Seconds(60);
  return c;
}

// As examples/cluster_support.py writes them: a NaN loss is null.
constexpr char kStep1[] =
    R"('{"step":1,"rank":RANK,"loss":null,"apply":false,"reason":"a \"quoted\" reason\nwith a newline",)"
    R"("audited":false,"outcome":"","unverified":false,"norm":1.5,"repaired":false,)"
    R"("checkpoint":"none","ms":20,"check1_ms":0,"agreement_ms":0,"audit_ms":0,"weight_ms":0,)"
    R"("end_unix_ms":1764860000000}')";

std::string Step1(int rank) {
  std::string s = kStep1;
  s.replace(s.find("RANK"), 4, std::to_string(rank));
  return s;
}

std::string Final(int rank) {
  return absl::StrCat(R"('{"final":true,"rank":)", rank,
                      R"(,"weights_digest":"00000000000000aa","guard":{}}')");
}

TEST(LauncherTest, ReadsStepAndFinalLines) {
  const std::string dir = TestDir("launcher-good");
  const std::string trainer = WriteTrainer(dir, Step1(0) + " " + Final(0),
                                           Step1(1) + " " + Final(1), "exit 0");
  absl::StatusOr<ClusterResult> r = RunCluster(TwoRanks(dir, trainer));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->ranks.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(r->ranks[rank].size(), 1u) << rank;
    const StepRecord& s = r->ranks[rank][0];
    EXPECT_EQ(s.step, 1);
    EXPECT_EQ(s.rank, rank);
    EXPECT_TRUE(std::isnan(s.loss));
    EXPECT_FALSE(s.apply);
    EXPECT_EQ(s.reason, "a \"quoted\" reason\nwith a newline");
    EXPECT_EQ(s.norm, 1.5);
    EXPECT_EQ(r->weight_digests[rank], "00000000000000aa");
  }
}

TEST(LauncherTest, AMalformedLineFailsTheRunNamingFileAndLine) {
  const std::string dir = TestDir("launcher-bad");
  // Rank 1's second line has a bare nan, as StrFormat("%f") used to write.
  const std::string trainer =
      WriteTrainer(dir, Step1(0), Step1(1) + R"( '{"step":2,"rank":1,"loss":nan}')", "exec sleep 60");
  absl::StatusOr<ClusterResult> r = RunCluster(TwoRanks(dir, trainer));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(), HasSubstr(dir + "/progress-1.jsonl line 2: not JSON: parse error"));
  EXPECT_THAT(r.status().message(), HasSubstr(R"({"step":2,"rank":1,"loss":nan})"));
}

TEST(LauncherTest, TpIsTheTransformerSplitOverEachNodesGpus) {
  // examples/layouts.py's tp: dp = nodes (2+), tp = GPUs per node dividing
  // the transformer's 4 heads; anything else is refused before any start.
  struct Case {
    int nodes, gpus;
    const char* model;
  };
  for (const Case& k : {Case{1, 2, "transformer"}, Case{3, 3, "transformer"},
                        Case{3, 2, "bn-mlp"}}) {
    ClusterConfig c = TwoRanks(TestDir("launcher-tp"), "/bin/false");
    c.layout = "tp";
    c.nodes = k.nodes;
    c.gpus_per_node = k.gpus;
    c.model = k.model;
    const absl::StatusOr<ClusterResult> r = RunCluster(c);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << k.nodes << " " << k.model;
    EXPECT_THAT(r.status().message(), HasSubstr("layout tp: the transformer over 2+ nodes"));
  }
  ClusterConfig c = TwoRanks(TestDir("launcher-tp-ok"), "/bin/false");
  c.layout = "tp";
  c.nodes = 3;  // 3 x 2, the transformer: tp's own rule passes; the C++ trainer has no tp.
  const absl::StatusOr<ClusterResult> r = RunCluster(c);
  EXPECT_THAT(r.status().message(), HasSubstr("the Python trainer's only"));
}

}  // namespace
}  // namespace sdc::demo
