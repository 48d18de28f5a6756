// The demo binary as a newcomer runs it (in a fast configuration): exit
// status, the run folder, the HTML report, the printed sdcctl command, and
// one-line failures for bad flags.

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "demo/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::demo {
namespace {

using ::testing::ElementsAre;
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

// The summary reads every log in the run folder: one that holds an earlier
// run is refused before anything starts, not mixed into this run's counts.
TEST(DemoCliTest, ARunFolderHoldingAnEarlierRunIsRefused) {
  const std::string dir = TestDir("demo-used");
  std::ofstream(dir + "/trainer-3.log") << "an earlier run's log\n";
  const RunResult r = Demo({"--run_dir=" + dir, "--steps=4"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("sdc demo: --run_dir: ", dir, " is not empty")));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
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
                        "intermittent", "two-node", "coordinator-restart",
                        "replace-and-resume"}) {
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

// Issue 42's whole loop, shortened (the small MLP): the fault at step 20 is
// caught and attributed, the demo approves the request under its own
// operator credential, the actuator (the HyperPod stand-in) runs, every
// rank restarts as attempt 1 on a fresh node-d, resumed from step 8 (the
// newest final checkpoint: 16 was revoked by the fault, 24 and 32 vetoed
// while the GPU was in the job), and trains to step 100 with no incident.
TEST(DemoCliTest, ReplaceAndResumeClosesTheLoop) {
  const std::string dir = TestDir("demo-resume");
  const RunResult r = Demo({"--scenario=replace-and-resume", "--model=bn-mlp", "--steps=100",
                            "--fault_step=20", "--checkpoint_every=8", "--run_dir=" + dir,
                            "--facts=" + dir + "/facts.json", "--quiet", "--nokeep_coordinator"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json f = nlohmann::json::parse(ReadFile(dir + "/facts.json"));
  // Attempt 0: caught, attributed to rank 3 alone, the checkpoint after the
  // fault's step vetoed, the provisional one before it revoked.
  EXPECT_TRUE(f["detected"].get<bool>());
  EXPECT_TRUE(f["attributed_correctly"].get<bool>());
  EXPECT_EQ(f["blamed"], nlohmann::json::array({3}));
  EXPECT_EQ(f["first_detection_step"], 20);
  EXPECT_EQ(f["skipped_steps"], nlohmann::json::array({20}));
  EXPECT_EQ(f["checkpoints_revoked"], nlohmann::json::array({16}));
  EXPECT_EQ(f["undetected_steps"], nlohmann::json::array());
  // The request: approved by the demo's operator, executed, done.
  EXPECT_EQ(f["requests"], nlohmann::json::array({"node-b"}));
  EXPECT_EQ(f["resume_request_state"], "Done");
  const nlohmann::json& a = f["resume"];
  EXPECT_EQ(a["approved_by"], "demo-operator");
  EXPECT_EQ(a["replaced_node"], "node-b");
  EXPECT_THAT(a["replaced_gpus"].get<std::vector<std::string>>(), ElementsAre("cpu-node-b-1"));
  EXPECT_EQ(a["replacement_node"], "node-d");
  EXPECT_THAT(a["replacement_gpus"].get<std::vector<std::string>>(),
              ElementsAre("cpu-node-d-0", "cpu-node-d-1"));
  EXPECT_THAT(a["actuator_record"].get<std::string>(), HasSubstr("replace node-b request=1"));
  // Attempt 1: resumed from the clean final checkpoint of step 8, trained
  // steps 9 to 100, nothing skipped, no incident, checkpoints allowed again.
  EXPECT_TRUE(a["resumed"].get<bool>());
  EXPECT_EQ(a["attempt"], 1);
  EXPECT_EQ(a["resume_step"], 8);
  EXPECT_FALSE(a["from_corrupted"].get<bool>());
  EXPECT_EQ(a["steps"], 92);
  EXPECT_EQ(a["skipped_steps"], nlohmann::json::array());
  EXPECT_EQ(a["incidents_after"], 0);
  for (int step : {24, 32, 48, 96}) {
    EXPECT_THAT(a["checkpoints_allowed"].get<std::vector<int>>(), testing::Contains(step));
  }
  EXPECT_EQ(a["final_checkpoint"], 88);  // 96 waits, provisional, for a next one.
  EXPECT_TRUE(f["weights_identical"].get<bool>());
  EXPECT_EQ(f["bad_checkpoints"], nlohmann::json::array());
  // sdcd took the restart as attempt 1 (SDC_ATTEMPT=1: 1 x 10^6) of the same job.
  EXPECT_THAT(ReadFile(dir + "/sdcd.log"),
              HasSubstr("attempt 1000000 (world size 6, resuming from step 8) replaces attempt 0"));
  EXPECT_THAT(ReadFile(dir + "/trainer-0.attempt1.log"),
              HasSubstr("resumed from " + dir + "/step-8.pt"));
  // The timeline, in the summary and the HTML report.
  for (const char* line : {"The whole loop (times UTC):", "approval", "by demo-operator",
                           "node-b -> node-d (GPUs cpu-node-d-0, cpu-node-d-1)",
                           "attempt 1: every rank a new process, the same job id",
                           "from step 8's final checkpoint (clean)",
                           "incidents after the resume: 0"}) {
    EXPECT_THAT(r.output, HasSubstr(line));
  }
  const std::string html = ReadFile(dir + "/report.html");
  EXPECT_THAT(html, HasSubstr("<h2>The whole loop</h2>"));
  EXPECT_THAT(html, HasSubstr("from step 8's final checkpoint (clean)"));
}

}  // namespace
}  // namespace sdc::demo
