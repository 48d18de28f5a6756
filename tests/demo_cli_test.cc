// The demo binary as a newcomer runs it (in a fast configuration): exit
// status, the run folder, the HTML report, the printed sdcctl command, and
// one-line failures for bad flags.

#include <sys/stat.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "demo/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::demo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RunResult Demo(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {BinaryPath("demo/sdc-demo")};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv, {}, absl::Minutes(5));
}

TEST(DemoCliTest, BadFlagsFailAtOnceWithOneLine) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           // What the demo checks itself: exit 2.
           {{"--scenario", "nope"}, 2, "sdc demo: unknown scenario 'nope'"},
           {{"--nodes=0"}, 2, "sdc demo: --nodes must be at least 1, got 0"},
           {{"--fault_step=-5"}, 2, "--fault_step must be at least 1 (or -1: chosen for you), got -5"},
           {{"--trainer=go"}, 2,
            "--trainer must be cpp, python, hf, lightning or accelerate, got 'go'"},
           {{"--run_dir", "/proc/sdc-demo-cannot-write"}, 2, "sdc demo: --run_dir: cannot create"},
           {{"stray"}, 2, "sdc demo: unexpected argument 'stray'"},
           // What Abseil's flag parser refuses: exit 1, as in every program here.
           {{"--bogus"}, 1, "Unknown command line flag 'bogus'"},
           {{"--gpus-per-node=2"}, 1, "Unknown command line flag 'gpus-per-node'"},
           {{"--steps=many"}, 1, "Illegal value 'many' specified for flag 'steps'"},
       }) {
    const RunResult r = Demo(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args[0];
    EXPECT_THAT(r.output, HasSubstr(c.message));
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

TEST(DemoCliTest, HelpListsTheDemosFlagsWithTheirHelp) {
  const RunResult r = Demo({"--help"});
  EXPECT_EQ(r.exit_code, 1);  // Abseil's --help exits 1.
  EXPECT_THAT(r.output, HasSubstr("./sdc demo [--scenario=NAME|list]"));
  EXPECT_THAT(r.output, HasSubstr("[--trainer=cpp|python|hf|lightning|accelerate]"));
  EXPECT_THAT(r.output, HasSubstr("--gpus_per_node (Ranks (\"GPUs\") per node.); default: 2;"));
  EXPECT_THAT(r.output, HasSubstr("--scenario (The fault to inject; --scenario=list names every "
                                  "scenario.);"));
  EXPECT_THAT(r.output, HasSubstr("--keep_coordinator (Leave sdcd running"));
  // Only the demo's own flags, not those of the libraries it links.
  EXPECT_THAT(r.output, Not(HasSubstr("--flagfile")));
}

TEST(DemoCliTest, ListsEveryScenario) {
  const RunResult r = Demo({"--scenario=list"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"clean", "nan-gradient", "activation-x10000", "mantissa-bitflip",
                        "weight-corruption", "reduced-gradient", "faulty-replayer",
                        "intermittent", "two-node", "coordinator-restart"}) {
    EXPECT_THAT(r.output, HasSubstr(s));
  }
}

TEST(DemoCliTest, FaultyReplayerRunWritesAReportAndTheApproveCommand) {
  const std::string dir = TestDir("demo-run");
  const RunResult r = Demo({"--scenario", "faulty-replayer", "--steps=16", "--fault_step=10",
                            "--checkpoint_every", "8", "--run_dir=" + dir, "--quiet",
                            "--nokeep_coordinator"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("replay:3:from=10"));
  EXPECT_THAT(r.output, HasSubstr("blamed: rank 3 on node node-b"));
  EXPECT_THAT(r.output, HasSubstr("Steps skipped on every rank: 10"));
  EXPECT_THAT(r.output, HasSubstr("Checkpoints written: 8; vetoed: 16"));
  EXPECT_THAT(r.output, HasSubstr("at the end: final none; provisional none; revoked and deleted 8"));
  EXPECT_THAT(r.output, HasSubstr("Replicas at the end: identical weights on every rank"));
  EXPECT_THAT(r.output, HasSubstr("Replacement request 1 for node-b is Pending"));
  const std::string html = ReadFile(dir + "/report.html");
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, HasSubstr("incident 1 at step 10"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  struct stat st;
  EXPECT_EQ(stat((dir + "/sdcd.db").c_str(), &st), 0);
  // Checkpoint 8 was written provisional, then revoked when rank 3 was
  // attributed faulty at step 10; 16 was vetoed.
  for (const char* name : {"step-8.pt", "step-8.pt.provisional", "step-16.pt",
                           "step-16.pt.provisional"}) {
    EXPECT_NE(stat((dir + "/" + name).c_str(), &st), 0) << name;
  }
  EXPECT_THAT(ReadFile(dir + "/trainer-0.log"), HasSubstr("checkpoint of step 8 revoked"));
}

}  // namespace
}  // namespace sdc::demo
