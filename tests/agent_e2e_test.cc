// The operator's path with node agents, over loopback with real processes:
// a real sdcd (fresh database, free ports), real sdc-agent processes for
// node-a and node-b, scripted ranks (3 nodes x 2 GPUs) speaking the real
// trainer API with one faulty rank on node-b, and the real sdcctl:
// get nodes, diagnose node, get requests, approve; the EKS actuator runs a
// recording stand-in for kubectl first on PATH. Then the agent actuator (the
// node's agent runs its --action_command), an injected diagnostic fault, a
// diagnostic process killed at its timeout, a GPU inventory read through a
// stand-in NVML library, and agents over TLS with and without client
// certificates.

#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<std::string> kTensors = {"embed.weight", "block.0.weight", "head.weight"};

// The output's line that starts with `first_word` and a space, or "".
std::string LineOf(const std::string& output, const std::string& first_word) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::StartsWith(line, first_word + " ")) return std::string(line);
  }
  return "";
}

bool Matches(const std::string& text, const std::string& regex) {
  return std::regex_match(text, std::regex(regex));
}

class AgentEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    bin_ = dir_ + "/bin";
    testing::Run({"mkdir", "-p", bin_});
    path_ = bin_ + ":" + std::string(std::getenv("PATH"));
  }

  void StartSdcd(const std::vector<std::string>& flags) {
    WriteRecordingStandIn(bin_ + "/kubectl", dir_ + "/kubectl.calls", "node/node-b labeled");
    absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir_, flags, {{"PATH", path_}});
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
  }

  // A real sdc-agent for `node`, heartbeating every second, connecting to
  // `coordinator_` (sdcd's trainer address unless a test sets it).
  Process& LaunchAgent(const std::string& node, const std::vector<std::string>& flags = {}) {
    if (coordinator_.empty()) coordinator_ = sdcd_->agent_address();
    std::vector<std::string> argv = {BinaryPath("agent/sdc-agent"),
                                     absl::StrCat("--coordinator=", coordinator_),
                                     absl::StrCat("--node_name=", node), "--heartbeat=1s"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<Process> p =
        Process::Start(argv, absl::StrCat(dir_, "/agent-", node, ".log"), {{"PATH", path_}});
    EXPECT_TRUE(p.ok()) << p.status();
    agents_.push_back(std::make_unique<Process>(p.ok() ? *std::move(p) : Process()));
    return *agents_.back();
  }

  // LaunchAgent, returning once the agent logged its registration.
  void StartAgent(const std::string& node, const std::vector<std::string>& flags = {}) {
    absl::StatusOr<std::string> line =
        LaunchAgent(node, flags).WaitForLog("registered with sdcd .* as node " + node + " .*");
    ASSERT_TRUE(line.ok()) << line.status();
  }

  void ConnectRanks() {
    absl::StatusOr<testing::Ranks> ranks =
        testing::ConnectRanks(sdcd_->trainer_address(), "job-agents", 6, 2, kTensors);
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    ranks_ = *std::move(ranks);
  }

  // The scheduled audit of `step`; `faulty` gets its own batch and its
  // replays wrong.
  void RunAudit(core::Step step, std::optional<core::Rank> faulty) {
    ASSERT_TRUE(SendScheduledAudit(ranks_, step, faulty).ok());
  }

  // The pending request for `node` (0 if none), read with sdcctl.
  uint64_t PendingRequestFor(const std::string& node) {
    for (int i = 0; i < 100; ++i) {
      RunResult r = sdcd_->Sdcctl({"get", "requests", "--state=pending", "-o", "json"});
      if (r.exit_code == 0 && r.output.find("\"node_name\": \"" + node + "\"") != std::string::npos) {
        const std::regex id("\"id\": \"([0-9]+)\"");
        std::smatch m;
        if (std::regex_search(r.output, m, id)) return std::stoull(m[1]);
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return 0;
  }

  // Polls until request `id` is Done or Failed (bounded: 20 s).
  v1::ReplacementRequest WaitFinished(uint64_t id) {
    auto admin = sdcd_->Admin();
    v1::ReplacementRequest r;
    for (int i = 0; i < 200; ++i) {
      v1::GetRequestRequest q;
      q.set_id(id);
      EXPECT_TRUE(admin->GetRequest(sdcd_->AdminContext().get(), q, &r).ok());
      if (r.state() == v1::DONE || r.state() == v1::FAILED) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return r;
  }

  std::string dir_, bin_, path_, coordinator_;
  std::unique_ptr<Sdcd> sdcd_;
  std::vector<std::unique_ptr<Process>> agents_;
  std::vector<std::unique_ptr<ScriptedRank>> ranks_;
};

TEST_F(AgentEndToEndTest, OperatorPathFromAttributionToReplacement) {
  StartSdcd({"--actuator=eks", "--report_deadline=30s"});
  StartAgent("node-a");
  StartAgent("node-b");
  ConnectRanks();
  RunAudit(10, /*faulty=*/3);  // Rank 3 runs on node-b.

  // Both agents are listed, NAME first and the heartbeat's age last.
  RunResult nodes = sdcd_->Sdcctl({"get", "nodes"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  EXPECT_EQ(LineOf(nodes.output, "NAME"), "NAME     INSTANCE   GPUS   STATUS   AGE");
  EXPECT_TRUE(Matches(LineOf(nodes.output, "node-a"), R"(node-a +<none> +0 +Ready +[0-2]s)"))
      << nodes.output;
  EXPECT_TRUE(Matches(LineOf(nodes.output, "node-b"), R"(node-b +<none> +0 +Ready +[0-2]s)"))
      << nodes.output;

  // The operator confirms on the suspect node with the agent's diagnostic.
  RunResult diagnose = sdcd_->Sdcctl({"diagnose", "node", "node-b", "--size", "192"});
  ASSERT_EQ(diagnose.exit_code, 0) << diagnose.output;
  EXPECT_THAT(diagnose.output,
              HasSubstr("diagnostic 1 on node node-b: PASSED (192x192 fp32, 3 repetitions; "
                        "every element matched the reference bit for bit)"));
  EXPECT_TRUE(Matches(LineOf(diagnose.output, "cpu"),
                      R"(cpu +cpu +pass +0 +0 +[0-9.]+ +[0-9.]+)"))
      << diagnose.output;
  EXPECT_THAT(ReadFile(dir_ + "/agent-node-b.log"),
              HasSubstr("diagnostic 1 on cpu: pass: cpu: 3 products of 192x192 fp32 matched"));
  EXPECT_THAT(ReadFile(dir_ + "/agent-node-a.log"), Not(HasSubstr("diagnostic 1")));

  // The pending request, the approval, and HyperPod's label.
  const uint64_t id = PendingRequestFor("node-b");
  ASSERT_NE(id, 0u);
  RunResult requests = sdcd_->Sdcctl({"get", "requests"});
  ASSERT_EQ(requests.exit_code, 0) << requests.output;
  EXPECT_TRUE(Matches(LineOf(requests.output, absl::StrCat(id)),
                      absl::StrCat(id, R"( +node-b +Pending +replace +GPU-3 +\d+ +\d+s)")))
      << requests.output;
  RunResult approve = sdcd_->Sdcctl(
      {"approve", absl::StrCat(id), "--reason=replay attribution confirmed by diagnostic"});
  ASSERT_EQ(approve.exit_code, 0) << approve.output;
  EXPECT_THAT(approve.output, HasSubstr(absl::StrCat("request ", id, " approved")));
  const v1::ReplacementRequest done = WaitFinished(id);
  ASSERT_EQ(done.state(), v1::DONE) << done.actuator_result();
  EXPECT_EQ(done.actuator(), "eks");
  EXPECT_EQ(ReadFile(dir_ + "/kubectl.calls"),
            "kubectl label node node-b "
            "sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement "
            "--overwrite\n");
  requests = sdcd_->Sdcctl({"get", "requests"});
  EXPECT_TRUE(Matches(LineOf(requests.output, absl::StrCat(id)),
                      absl::StrCat(id, R"( +node-b +Done +replace .*)")))
      << requests.output;
}

TEST_F(AgentEndToEndTest, InjectedDiagnosticFaultFailsDiagnoseWithItsExitCode) {
  StartSdcd({});
  StartAgent("node-a");
  StartAgent("node-b", {"--inject_diagnostic_fault=yes-i-am-testing"});

  RunResult bad = sdcd_->Sdcctl({"diagnose", "node", "node-b", "--size=64", "--repetitions=2"});
  EXPECT_EQ(bad.exit_code, 7) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("diagnostic 1 on node node-b: FAILED (64x64 fp32, 2 "
                                    "repetitions; 1 device computed wrong values, 1 element "
                                    "differs)"));
  EXPECT_TRUE(Matches(LineOf(bad.output, "cpu"), R"(cpu +cpu +FAIL +1 +1 +[0-9.]+ +[0-9.]+)"))
      << bad.output;
  // The same diagnostic on the healthy agent passes: the failure is the
  // injected element, not the method.
  RunResult good = sdcd_->Sdcctl({"diagnose", "node", "node-a", "--size=64", "--repetitions=2"});
  EXPECT_EQ(good.exit_code, 0) << good.output;
  // The result stays visible per node.
  RunResult describe = sdcd_->Sdcctl({"describe", "node", "node-b"});
  ASSERT_EQ(describe.exit_code, 0) << describe.output;
  EXPECT_THAT(describe.output, HasSubstr("Status:          Ready"));
  EXPECT_TRUE(std::regex_search(describe.output,
                                std::regex(R"(\n  1 +Failed +all +64 +2 +1 +1 +\d+s\n)")))
      << describe.output;

  // Errors as sdcctl reports them: an unknown node, a GPU the node lacks, a
  // node whose agent is gone.
  RunResult unknown = sdcd_->Sdcctl({"diagnose", "node", "node-z"});
  EXPECT_EQ(unknown.exit_code, 3) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("no agent has registered node node-z"));
  RunResult no_gpu = sdcd_->Sdcctl({"diagnose", "node", "node-a", "--gpu=GPU-9"});
  EXPECT_EQ(no_gpu.exit_code, 3) << no_gpu.output;
  agents_[1]->Stop();
  RunResult gone = sdcd_->Sdcctl({"diagnose", "node", "node-b"});
  EXPECT_EQ(gone.exit_code, 4) << gone.output;
  EXPECT_THAT(gone.output, HasSubstr("the agent of node node-b is not connected"));
  RunResult nodes = sdcd_->Sdcctl({"get", "nodes"});
  EXPECT_TRUE(Matches(LineOf(nodes.output, "node-b"), R"(node-b +<none> +0 +Disconnected +\d+s)"))
      << nodes.output;
}

TEST_F(AgentEndToEndTest, AgentActuatorRunsTheNodeLocalCommand) {
  StartSdcd({"--actuator=agent", "--actuator_timeout=20s", "--report_deadline=30s"});
  WriteRecordingStandIn(bin_ + "/node-action", dir_ + "/node-action.calls", "drained");
  StartAgent("node-a");  // No --action_command.
  StartAgent("node-b", {absl::StrCat("--action_command=", bin_,
                                     "/node-action --what={action} {request} {node}")});
  ConnectRanks();

  RunAudit(10, /*faulty=*/3);  // node-b.
  const uint64_t b = PendingRequestFor("node-b");
  ASSERT_NE(b, 0u);
  RunResult approve = sdcd_->Sdcctl({"approve", absl::StrCat(b), "--reason=confirmed"});
  ASSERT_EQ(approve.exit_code, 0) << approve.output;
  v1::ReplacementRequest done = WaitFinished(b);
  ASSERT_EQ(done.state(), v1::DONE) << done.actuator_result();
  EXPECT_EQ(done.actuator(), "agent");
  EXPECT_EQ(done.actuator_result(),
            absl::StrCat("agent on node-b: ", bin_, "/node-action --what=replace ", b,
                         " node-b: ok: drained"));
  EXPECT_EQ(ReadFile(dir_ + "/node-action.calls"),
            absl::StrCat("node-action --what=replace ", b, " node-b\n"));

  RunAudit(20, /*faulty=*/1);  // node-a, whose agent has no command.
  const uint64_t a = PendingRequestFor("node-a");
  ASSERT_NE(a, 0u);
  approve = sdcd_->Sdcctl({"approve", absl::StrCat(a), "--reason=confirmed"});
  ASSERT_EQ(approve.exit_code, 0) << approve.output;
  done = WaitFinished(a);
  ASSERT_EQ(done.state(), v1::FAILED) << done.actuator_result();
  EXPECT_THAT(done.actuator_result(),
              HasSubstr("agent on node-a: no node-local action configured (sdc-agent "
                        "--action_command); sdcd asked to replace node node-a for request"));
  EXPECT_EQ(ReadFile(dir_ + "/kubectl.calls"), "");  // Nothing else ran.
}

// A diagnostic longer than the caller's deadline: sdcd answers shortly
// before that deadline with the diagnostic still running (no verdict, exit
// 8), rather than letting the call time out.
TEST_F(AgentEndToEndTest, DiagnoseAnswersBeforeTheCallersDeadline) {
  StartSdcd({});
  StartAgent("node-b");
  const absl::Time start = absl::Now();
  RunResult slow = sdcd_->Sdcctl(
      {"diagnose", "node", "node-b", "--size=4096", "--repetitions=1000", "--timeout=5s"});
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(slow.exit_code, 8) << slow.output;
  EXPECT_THAT(slow.output,
              HasSubstr("diagnostic 1 on node node-b: still running (4096x4096 fp32, 1000 "
                        "repetitions); see sdcctl describe node node-b"));
  EXPECT_LT(took, absl::Seconds(5)) << "sdcd should answer before the caller's deadline";
  RunResult describe = sdcd_->Sdcctl({"describe", "node", "node-b"});
  EXPECT_TRUE(std::regex_search(describe.output,
                                std::regex(R"(\n  1 +Running +all +4096 +1000 +0 +0 +\d+s\n)")))
      << describe.output;
}

// Each device's diagnostic runs in a child process: one still running at
// --diagnostic_timeout is killed, its device reported without a verdict,
// and the agent serves the next request.
TEST_F(AgentEndToEndTest, DiagnosticProcessPastItsTimeoutIsKilledAndTheAgentServesOn) {
  StartSdcd({});
  StartAgent("node-b", {"--diagnostic_timeout=2s"});
  // About 350 s of CPU matrix products.
  RunResult hung = sdcd_->Sdcctl({"diagnose", "node", "node-b", "--gpu=cpu", "--size=2048",
                                  "--repetitions=1000", "--timeout=30s"});
  EXPECT_EQ(hung.exit_code, 8) << hung.output;
  EXPECT_THAT(hung.output, HasSubstr("NO VERDICT (cpu: diagnostic process still running after "
                                     "2s, killed (a hung device?))"));
  RunResult next = sdcd_->Sdcctl({"diagnose", "node", "node-b", "--gpu=cpu", "--size=32"});
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_THAT(ReadFile(agents_.back()->log_path()),
              HasSubstr("diagnostic 2 on cpu: pass: cpu: 3 products of 32x32 fp32 matched"));
}

TEST_F(AgentEndToEndTest, GpuInventoryFromNvml) {
  StartSdcd({});
  StartAgent("hyperpod-i-0123456789abcdef0",
             {absl::StrCat("--nvml_library=", BinaryPath("agent/libfake_nvml.so"))});
  RunResult nodes = sdcd_->Sdcctl({"get", "nodes", "-o", "wide"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  EXPECT_TRUE(Matches(LineOf(nodes.output, "hyperpod-i-0123456789abcdef0"),
                      R"(hyperpod-i-0123456789abcdef0 +\S+ +i-0123456789abcdef0 +2 +)"
                      R"(NVIDIA H100 80GB HBM3 +Ready +)" +
                          absl::StrReplaceAll(kVersion, {{".", "\\."}}) + R"( +\d+s)"))
      << nodes.output;
  RunResult describe = sdcd_->Sdcctl({"describe", "node", "hyperpod-i-0123456789abcdef0"});
  EXPECT_THAT(describe.output,
              HasSubstr("  1       GPU-22222222-0000-0000-0000-000000000000   NVIDIA H100 80GB HBM3"));
  // A GPU diagnostic needs CUDA in the agent's libtorch: without it there is
  // no verdict (exit 8), saying why; the CPU still answers.
  RunResult gpu = sdcd_->Sdcctl({"diagnose", "node", "hyperpod-i-0123456789abcdef0", "--gpu",
                                 "GPU-22222222-0000-0000-0000-000000000000", "--size=32"});
  if (gpu.exit_code == 0) {
    std::printf("CUDA is usable here: the GPU diagnostic ran\n");
  } else {
    EXPECT_EQ(gpu.exit_code, 8) << gpu.output;
    EXPECT_THAT(gpu.output, HasSubstr("NO VERDICT (cuda:1: CUDA is not usable from this agent"));
  }
  RunResult cpu = sdcd_->Sdcctl(
      {"diagnose", "node", "hyperpod-i-0123456789abcdef0", "--gpu=cpu", "--size=32"});
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
}

// Agents over TLS with node identities: an agent whose certificate names
// its node registers and runs a diagnostic over the same stream; one
// without a certificate (the agent port asks for one but does not require
// it, since an EKS agent proves its node with a token instead) is refused
// as unauthenticated, and one speaking plaintext cannot connect; each logs
// the reason and never becomes a node.
TEST_F(AgentEndToEndTest, AgentsProveTheirNodeWithACertificateOverTls) {
  // Node identities on: node-tls's certificate names it (DNS SAN).
  absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::StartWithIdentities(dir_, {"node-tls"});
  ASSERT_TRUE(d.ok()) << d.status();
  sdcd_ = *std::move(d);
  coordinator_ = absl::StrCat("localhost:", sdcd_->agent_port());
  const std::string ca = absl::StrCat("--tls_ca=", sdcd_->pki().ca);
  StartAgent("node-tls", sdcd_->AgentTlsFlags("node-tls"));
  Process& no_cert = LaunchAgent("node-no-cert", {ca});
  Process& plaintext = LaunchAgent("node-plaintext");
  absl::StatusOr<std::string> unproven = no_cert.WaitForLog(
      "stream to sdcd at " + coordinator_ +
      " ended: UNAUTHENTICATED: a node agent proves its node: a client certificate .*");
  ASSERT_TRUE(unproven.ok()) << unproven.status();
  absl::StatusOr<std::string> refused = plaintext.WaitForLog(
      "stream to sdcd at " + coordinator_ + " ended: cannot connect within 10s: UNAVAILABLE: .*");
  ASSERT_TRUE(refused.ok()) << refused.status();

  RunResult nodes = sdcd_->Sdcctl({"get", "nodes", "-o", "name"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  EXPECT_THAT(nodes.output, HasSubstr("node-tls"));
  EXPECT_THAT(nodes.output, Not(HasSubstr("node-no-cert")));
  EXPECT_THAT(nodes.output, Not(HasSubstr("node-plaintext")));
  for (Process* refused : {&no_cert, &plaintext}) {
    EXPECT_THAT(ReadFile(refused->log_path()), Not(HasSubstr("registered with sdcd")));
  }
  RunResult diagnose =
      sdcd_->Sdcctl({"diagnose", "node", "node-tls", "--gpu=cpu", "--size=32"});
  EXPECT_EQ(diagnose.exit_code, 0) << diagnose.output;
}

}  // namespace
}  // namespace sdc::testing
