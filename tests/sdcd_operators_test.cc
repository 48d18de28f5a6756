// Operators against a real sdcd (loopback gRPC, a real SQLite file) and the
// real sdcctl: per-operator tokens, roles, who a decision is recorded under,
// two-person approval, authentication before parsing, client certificates,
// and sdcctl's config file, selectors, --watch, completion and help.

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "admin.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/scripted_rank.h"
#include "tests/testing/sdcd.h"

namespace sdc::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<std::string> kTensors = {"a", "b"};

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// sdcctl against `sdcd` with the token in `token_file` (and no other
// credential), extra environment `env`.
RunResult Ctl(const Sdcd& sdcd, const std::string& token_file, std::vector<std::string> args,
              const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {BinaryPath("ctl/sdcctl"),
                                   absl::StrCat("--server=", sdcd.admin_address()),
                                   absl::StrCat("--token_file=", token_file)};
  argv.insert(argv.end(), args.begin(), args.end());
  std::map<std::string, std::string> all = {{"HOME", "/nonexistent"}};
  all.insert(env.begin(), env.end());
  return sdc::testing::Run(argv, all);
}

// `operator add NAME --role=ROLE` with the credential in `as` (root's token
// file, or an admin's); the token written to DIR/NAME.token.
std::string AddOperator(const Sdcd& sdcd, const std::string& as, const std::string& dir,
                        const std::string& name, const std::string& role) {
  RunResult r = Ctl(sdcd, as, {"operator", "add", name, absl::StrCat("--role=", role)});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // stdout and stderr share `output`: the token is the line of 64 hex digits.
  std::string token;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (line.size() == 64 && line.find_first_not_of("0123456789abcdef") == std::string::npos) {
      token = std::string(line);
    }
  }
  EXPECT_EQ(token.size(), 64u) << r.output;
  const std::string path = absl::StrCat(dir, "/", name, ".token");
  WriteText(path, token + "\n");
  return path;
}

// One raw unary call: `frame` as the request bytes of `method`, with
// `token` as the bearer token when not empty. Returns the call's status.
grpc::Status RawUnary(const std::string& address, const std::string& method,
                      const std::string& frame, const std::string& token) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  intptr_t tag = 1;
  auto wait = [&cq](intptr_t want) {
    void* got = nullptr;
    bool ok = false;
    return cq.Next(&got, &ok) && reinterpret_cast<intptr_t>(got) == want && ok;
  };
  call->StartCall(reinterpret_cast<void*>(tag));
  bool open = wait(tag++);
  if (open) {
    grpc::Slice slice(frame.data(), frame.size());
    grpc::ByteBuffer buffer(&slice, 1);
    call->WriteLast(buffer, grpc::WriteOptions(), reinterpret_cast<void*>(tag));
    open = wait(tag++);
  }
  grpc::ByteBuffer reply;
  while (open) {
    call->Read(&reply, reinterpret_cast<void*>(tag));
    open = wait(tag++);
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(tag));
  wait(tag);
  return status;
}

std::string TokenOf(const std::string& path) {
  return std::string(absl::StripAsciiWhitespace(ReadFile(path)));
}

class OperatorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir_, {"--approvals_required=2"});
    ASSERT_TRUE(d.ok()) << d.status();
    sdcd_ = *std::move(d);
    // Under two-person rules root enrolls the first two admins, and nobody else.
    adm_one_ = AddOperator(*sdcd_, sdcd_->token_file(), dir_, "adm-one", "admin");
    adm_two_ = AddOperator(*sdcd_, sdcd_->token_file(), dir_, "adm-two", "admin");
  }

  // NAME enrolled by adm-one, with adm-two's consent; its token file.
  std::string Enroll(const std::string& name, const std::string& role) {
    const std::string token = AddOperator(*sdcd_, adm_one_, dir_, name, role);
    RunResult consent = Ctl(*sdcd_, adm_two_, {"operator", "approve", name});
    EXPECT_EQ(consent.exit_code, 0) << consent.output;
    return token;
  }

  // A replacement request (id 1) for the node of a faulty rank.
  void OpenRequest() {
    absl::StatusOr<Ranks> ranks = ConnectRanks(sdcd_->trainer_address(), "job-o", 6, 2, kTensors);
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    ASSERT_TRUE(SendScheduledAudit(*ranks, 10, /*faulty=*/3).ok());
    ranks_ = *std::move(ranks);
    RunResult r = Ctl(*sdcd_, sdcd_->token_file(), {"get", "requests", "-o", "name"});
    ASSERT_THAT(r.output, HasSubstr("request/1")) << r.output;
  }

  std::string dir_;
  std::unique_ptr<Sdcd> sdcd_;
  std::string adm_one_, adm_two_;
  Ranks ranks_;
};

TEST_F(OperatorsTest, TheApproverIsTheCredentialsOperatorAndTwoAreNeeded) {
  const std::string alice = Enroll("alice", "operator");
  const std::string carol = Enroll("carol", "operator");
  const std::string bob = Enroll("bob", "viewer");
  ASSERT_NO_FATAL_FAILURE(OpenRequest());

  // A viewer reads but cannot decide.
  RunResult viewer_get = Ctl(*sdcd_, bob, {"get", "requests"});
  EXPECT_EQ(viewer_get.exit_code, 0) << viewer_get.output;
  RunResult diagnose = Ctl(*sdcd_, bob, {"diagnose", "node", "node-b", "--timeout=5s"});
  EXPECT_EQ(diagnose.exit_code, 6) << diagnose.output;
  EXPECT_THAT(diagnose.output, HasSubstr("bob has role viewer; this call needs operator"));
  RunResult viewer = Ctl(*sdcd_, bob, {"approve", "1", "--reason=looks bad"});
  EXPECT_EQ(viewer.exit_code, 6) << viewer.output;
  EXPECT_THAT(viewer.output, HasSubstr("bob has role viewer; this call needs operator"));

  // The shared root token does not count as a person here.
  RunResult root = Ctl(*sdcd_, sdcd_->token_file(), {"approve", "1", "--reason=x"});
  EXPECT_EQ(root.exit_code, 6) << root.output;
  EXPECT_THAT(root.output, HasSubstr("root is not a separately enrolled person, so it may not approve when 2 "
                                       "operators must"));

  // alice's token, whatever name the request carries: recorded as alice.
  v1::DecideRequest q;
  q.set_id(1);
  q.set_reason("replay blames GPU-3");
  // The deprecated field a client could fill in: sdcd must ignore it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  q.set_operator_("mallory");
#pragma GCC diagnostic pop
  auto admin = sdcd_->Admin();
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", TokenOf(alice)));
  v1::ReplacementRequest first;
  grpc::Status s = admin->Approve(&ctx, q, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(first.state(), v1::PENDING);
  ASSERT_EQ(first.approvals_size(), 1);
  EXPECT_EQ(first.approvals(0).operator_(), "alice");
  EXPECT_EQ(first.transitions(first.transitions_size() - 1).actor(), "alice");
  EXPECT_EQ(first.approvals_required(), 2u);

  // alice again: refused, exit 4; --as is gone.
  RunResult again = Ctl(*sdcd_, alice, {"approve", "1", "--reason=still bad"});
  EXPECT_EQ(again.exit_code, 4) << again.output;
  EXPECT_THAT(again.output, HasSubstr("already has alice's approval"));
  RunResult as = Ctl(*sdcd_, carol, {"approve", "1", "--reason=x", "--as=alice"});
  EXPECT_EQ(as.exit_code, 2) << as.output;
  EXPECT_THAT(as.output, HasSubstr("--as was removed"));

  RunResult second = Ctl(*sdcd_, carol, {"approve", "1", "--reason=agreed"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  RunResult detail = Ctl(*sdcd_, carol, {"get", "requests", "1"});
  ASSERT_EQ(detail.exit_code, 0) << detail.output;
  EXPECT_THAT(detail.output, HasSubstr("Approvals:  alice, carol (2 of 2 required)"));
  EXPECT_THAT(detail.output, HasSubstr("Pending -> Approved"));
  RunResult yaml = Ctl(*sdcd_, bob, {"describe", "request", "1", "-o", "yaml"});
  EXPECT_THAT(yaml.output, HasSubstr("operator: carol")) << yaml.output;

  // Restarted, sdcd still knows the operators and the approvals.
  ranks_.clear();
  sdcd_->process().Stop();
  absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(dir_, {"--approvals_required=2"});
  ASSERT_TRUE(d.ok()) << d.status();
  sdcd_ = *std::move(d);
  RunResult who = Ctl(*sdcd_, carol, {"whoami"});
  EXPECT_THAT(who.output, HasSubstr("carol")) << who.output;
  RunResult after = Ctl(*sdcd_, bob, {"get", "requests", "1", "-o", "json"});
  EXPECT_THAT(after.output, HasSubstr("\"operator\": \"alice\"")) << after.output;
}

TEST_F(OperatorsTest, OneDenyEndsTheRequestAndResolveRecordsTheCredential) {
  const std::string alice = Enroll("alice", "operator");
  const std::string dave = Enroll("dave", "operator");
  ASSERT_NO_FATAL_FAILURE(OpenRequest());
  ASSERT_EQ(Ctl(*sdcd_, alice, {"approve", "1", "--reason=bad"}).exit_code, 0);
  RunResult denied = Ctl(*sdcd_, dave, {"deny", "1", "--reason=diagnostic passed"});
  ASSERT_EQ(denied.exit_code, 0) << denied.output;
  RunResult json = Ctl(*sdcd_, alice, {"get", "requests", "1", "-o", "json"});
  EXPECT_THAT(json.output, HasSubstr("\"state\": \"DENIED\"")) << json.output;
  EXPECT_THAT(json.output, HasSubstr("\"actor\": \"dave\""));
}

TEST_F(OperatorsTest, OperatorManagementNeedsAnAdmin) {
  const std::string ops = Enroll("erin", "operator");
  const std::string adm = Enroll("frank", "admin");
  RunResult denied = Ctl(*sdcd_, ops, {"operator", "add", "mallory"});
  EXPECT_EQ(denied.exit_code, 6) << denied.output;
  EXPECT_THAT(denied.output, HasSubstr("erin has role operator; this call needs admin"));
  RunResult list = Ctl(*sdcd_, adm, {"operator", "list", "--no-headers"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_THAT(list.output, ContainsRegex("erin +operator +adm-one +Active"));
  EXPECT_THAT(list.output, Not(HasSubstr("NAME")));
  RunResult dup = Ctl(*sdcd_, adm, {"operator", "add", "erin"});
  EXPECT_EQ(dup.exit_code, 1) << dup.output;
  EXPECT_THAT(dup.output, HasSubstr("operator erin already exists"));
  RunResult removed = Ctl(*sdcd_, adm, {"operator", "remove", "erin"});
  ASSERT_EQ(removed.exit_code, 0) << removed.output;
  RunResult gone = Ctl(*sdcd_, ops, {"get", "jobs"});
  EXPECT_EQ(gone.exit_code, 6) << gone.output;
  EXPECT_THAT(gone.output, HasSubstr("the admin token is not valid"));
  // sdcd's database holds digests, never a token.
  const std::string db = ReadFile(sdcd_->db());
  EXPECT_THAT(db, Not(HasSubstr(TokenOf(adm))));
}

// Issue 38, finding 5, as the attack: one admin mints a second operator to
// supply the second approval. Before, mallory's token worked at once and
// alice + mallory approved the replacement; now mallory's enrollment waits
// for a second admin, and the request stays Pending.
TEST_F(OperatorsTest, OneAdminCannotMintTheSecondApprover) {
  const std::string alice = Enroll("alice", "operator");
  const std::string mallory = AddOperator(*sdcd_, adm_one_, dir_, "mallory", "operator");
  ASSERT_NO_FATAL_FAILURE(OpenRequest());
  ASSERT_EQ(Ctl(*sdcd_, alice, {"approve", "1", "--reason=bad"}).exit_code, 0);
  RunResult second = Ctl(*sdcd_, mallory, {"approve", "1", "--reason=agreed"});
  EXPECT_EQ(second.exit_code, 6) << second.output;
  EXPECT_THAT(second.output, HasSubstr("operator mallory's enrollment waits for a second "
                                       "admin's consent"));
  // adm-one cannot consent to its own enrollment, nor approve it away.
  RunResult self = Ctl(*sdcd_, adm_one_, {"operator", "approve", "mallory"});
  EXPECT_NE(self.exit_code, 0) << self.output;
  RunResult state = Ctl(*sdcd_, alice, {"get", "requests", "1", "-o", "json"});
  EXPECT_THAT(state.output, HasSubstr("\"state\": \"PENDING\"")) << state.output;
  RunResult list = Ctl(*sdcd_, adm_two_, {"operator", "list", "--no-headers"});
  EXPECT_THAT(list.output, ContainsRegex("mallory +operator +adm-one +Pending"));
}

// Authentication precedes parsing: an unauthenticated request (no token, or
// a wrong one) is refused UNAUTHENTICATED whatever its bytes, a huge one
// included; the same bytes
// with a token reach the parser (INVALID_ARGUMENT). Before, the typed
// service parsed first and answered INTERNAL for malformed bytes.
TEST_F(OperatorsTest, UnauthenticatedBytesAreNeverParsed) {
  const std::string malformed = "\xff\xff\xff\xff";
  const std::string huge(12 << 20, '\xff');
  const double invalid_before = sdcd_->Rejected("invalid_argument");
  for (const std::string* frame : {&malformed, &huge}) {
    grpc::Status s = RawUnary(sdcd_->admin_address(), "/sdc.v1.AdminService/Approve", *frame, "");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    s = RawUnary(sdcd_->admin_address(), "/sdc.v1.AdminService/ListJobs", *frame, "wrong");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  // NodeAdminService too.
  grpc::Status diagnose =
      RawUnary(sdcd_->admin_address(), "/sdc.v1.NodeAdminService/Diagnose", huge, "");
  EXPECT_EQ(diagnose.error_code(), grpc::StatusCode::UNAUTHENTICATED) << diagnose.error_message();
  EXPECT_EQ(sdcd_->Rejected("invalid_argument"), invalid_before);
  EXPECT_EQ(sdcd_->Rejected("unauthenticated"), 5);
  grpc::Status nodes = RawUnary(sdcd_->admin_address(), "/sdc.v1.NodeAdminService/GetNode",
                                malformed, TokenOf(sdcd_->token_file()));
  EXPECT_EQ(nodes.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(nodes.error_message(), HasSubstr("not a valid sdc.v1.GetNodeRequest"));
  const double invalid_after_nodes = sdcd_->Rejected("invalid_argument");
  EXPECT_EQ(invalid_after_nodes, invalid_before + 1);
  grpc::Status parsed = RawUnary(sdcd_->admin_address(), "/sdc.v1.AdminService/Approve",
                                 malformed, TokenOf(sdcd_->token_file()));
  EXPECT_EQ(parsed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(parsed.error_message(), HasSubstr("not a valid sdc.v1.DecideRequest"));
  EXPECT_EQ(sdcd_->Rejected("invalid_argument"), invalid_before + 2);
}

TEST_F(OperatorsTest, ConfigFileSelectorsWatchCompletionAndHelp) {
  const std::string alice = Enroll("alice", "operator");
  ASSERT_NO_FATAL_FAILURE(OpenRequest());
  const std::string config = dir_ + "/sdcctl.yaml";
  WriteText(config, absl::StrCat("server: ", sdcd_->admin_address(), "\ntoken_file: ", alice,
                                 "\noutput: name\n"));
  const std::vector<std::string> bare = {BinaryPath("ctl/sdcctl")};
  auto ctl = [&](std::vector<std::string> args, std::map<std::string, std::string> env) {
    std::vector<std::string> argv = bare;
    argv.insert(argv.end(), args.begin(), args.end());
    return sdc::testing::Run(argv, env);
  };
  RunResult who = ctl({"whoami", "-o", "table"}, {{"SDCCTL_CONFIG", config}});
  ASSERT_EQ(who.exit_code, 0) << who.output;
  EXPECT_THAT(who.output, HasSubstr("Name:                alice"));
  // The default path, ~/.config/sdc-guard/sdcctl.yaml; output from the file.
  mkdir((dir_ + "/.config").c_str(), 0700);
  mkdir((dir_ + "/.config/sdc-guard").c_str(), 0700);
  WriteText(dir_ + "/.config/sdc-guard/sdcctl.yaml", ReadFile(config));
  RunResult names = ctl({"get", "incidents"}, {{"HOME", dir_}});
  EXPECT_EQ(names.output, "incident/1\n");
  WriteText(config, "server: x:1\ncolour: blue\n");
  RunResult unknown = ctl({"get", "jobs"}, {{"SDCCTL_CONFIG", config}});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("unknown key \"colour\""));
  RunResult missing = ctl({"get", "jobs"}, {{"SDCCTL_CONFIG", dir_ + "/nope.yaml"}});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;

  // -l on the labels each resource has.
  RunResult three = Ctl(*sdcd_, alice, {"get", "suspects", "-l", "job=job-o", "--no-headers"});
  EXPECT_EQ(three.exit_code, 0) << three.output;
  RunResult by_node = Ctl(*sdcd_, alice, {"get", "incidents", "-l", "node=node-b,check=replay",
                                          "-o", "name"});
  EXPECT_EQ(by_node.output, "incident/1\n");
  RunResult none = Ctl(*sdcd_, alice, {"get", "incidents", "-l", "node=node-a", "-o", "name"});
  EXPECT_EQ(none.output, "No resources found.\n");
  RunResult bad_key = Ctl(*sdcd_, alice, {"get", "jobs", "-l", "node=x"});
  EXPECT_EQ(bad_key.exit_code, 2) << bad_key.output;
  EXPECT_THAT(bad_key.output, HasSubstr("label \"node\" does not apply to jobs (labels: job)"));
  RunResult incident = Ctl(*sdcd_, alice, {"describe", "incident", "1"});
  EXPECT_THAT(incident.output, HasSubstr("Request:      request/1")) << incident.output;
  RunResult job = Ctl(*sdcd_, alice, {"describe", "job", "job-o"});
  EXPECT_THAT(job.output, HasSubstr("World Size:")) << job.output;
  EXPECT_THAT(job.output, HasSubstr("Incident 1:"));
  RunResult no_job = Ctl(*sdcd_, alice, {"describe", "job", "nope"});
  EXPECT_EQ(no_job.exit_code, 3) << no_job.output;

  // --watch lists again until SIGINT, then exits 0.
  absl::StatusOr<Process> watch = Process::Start(
      {BinaryPath("ctl/sdcctl"), absl::StrCat("--server=", sdcd_->admin_address()),
       absl::StrCat("--token_file=", alice), "get", "jobs", "-w", "--interval=100ms"},
      dir_ + "/watch.log", {{"HOME", "/nonexistent"}});
  ASSERT_TRUE(watch.ok()) << watch.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto lines = [&watch] {
    const std::string log = watch->Log();
    return std::count(log.begin(), log.end(), '\n');
  };
  while (absl::Now() < deadline && lines() < 6) absl::SleepFor(absl::Milliseconds(50));
  const std::string log = watch->Log();
  EXPECT_GE(std::count(log.begin(), log.end(), '\n'), 6) << log;
  kill(watch->pid(), SIGINT);
  for (int i = 0; i < 100 && watch->running(); ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(watch->Stop(), 0) << watch->Log();

  // bash completion: the function completes commands, resources and flags.
  RunResult bash = sdc::testing::Run(
      {"bash", "-c",
       absl::StrCat("source <(", BinaryPath("ctl/sdcctl"), " completion bash)\n"
                    "complete_line() { COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); _sdcctl; "
                    "echo \"${COMPREPLY[*]}\"; }\n"
                    "complete_line sdcctl ge\n"
                    "complete_line sdcctl get re\n"
                    "complete_line sdcctl approve 1 --re\n"
                    "complete_line sdcctl get requests --state p\n")});
  ASSERT_EQ(bash.exit_code, 0) << bash.output;
  EXPECT_EQ(bash.output, "get\nrequests\n--reason=\npending\n");
  RunResult zsh = Ctl(*sdcd_, alice, {"completion", "zsh"});
  EXPECT_THAT(zsh.output, HasSubstr("bashcompinit"));

  RunResult help = ctl({"approve", "--help"}, {});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("sdcctl approve ID --reason=TEXT"));
  EXPECT_THAT(help.output, Not(HasSubstr("history gpu")));
  RunResult version = Ctl(*sdcd_, alice, {"version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_THAT(version.output, HasSubstr("sdcctl 0.2.0\nsdcd   "));
  RunResult unreachable =
      ctl({"version", "--server=127.0.0.1:1", absl::StrCat("--token_file=", alice)}, {});
  EXPECT_EQ(unreachable.exit_code, 0);
  EXPECT_THAT(unreachable.output, HasSubstr("sdcd   unknown (cannot reach sdcd"));
}

// With admin mTLS, a client certificate whose CN names a registered
// operator authenticates as that operator; an unregistered CN is refused.
TEST(OperatorCertificateTest, TheCommonNameNamesTheOperator) {
  const std::string dir = TestDir("operator-cert");
  ASSERT_TRUE(WriteTestCertificates(dir).ok());
  absl::StatusOr<std::unique_ptr<Sdcd>> d = Sdcd::Start(
      dir, {absl::StrCat("--tls_cert=", dir, "/server.pem"),
            absl::StrCat("--tls_key=", dir, "/server.key"), "--admin_tls",
            absl::StrCat("--admin_client_ca=", dir, "/ca.pem")});
  ASSERT_TRUE(d.ok()) << d.status();
  std::unique_ptr<Sdcd> sdcd = *std::move(d);
  const std::vector<std::string> tls = {
      absl::StrCat("--server=localhost:", sdcd->admin_port()),
      absl::StrCat("--tls_ca=", dir, "/ca.pem")};
  auto ctl = [&](const std::vector<std::string>& credential, std::vector<std::string> args) {
    std::vector<std::string> argv = {BinaryPath("ctl/sdcctl")};
    argv.insert(argv.end(), tls.begin(), tls.end());
    argv.insert(argv.end(), credential.begin(), credential.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return sdc::testing::Run(argv, {{"HOME", "/nonexistent"}});
  };
  const std::vector<std::string> cert = {absl::StrCat("--tls_cert=", dir, "/client.pem"),
                                         absl::StrCat("--tls_key=", dir, "/client.key"),
                                         absl::StrCat("--token_file=", dir, "/none")};
  const std::vector<std::string> root = {absl::StrCat("--token_file=", sdcd->token_file())};
  RunResult refused = ctl(cert, {"whoami"});
  EXPECT_EQ(refused.exit_code, 6) << refused.output;
  EXPECT_THAT(refused.output,
              HasSubstr("the client certificate's names (\"sdc-client\") name no operator"));
  ASSERT_EQ(ctl(root, {"operator", "add", "sdc-client", "--role=viewer"}).exit_code, 0);
  RunResult who = ctl(cert, {"whoami"});
  ASSERT_EQ(who.exit_code, 0) << who.output;
  EXPECT_THAT(who.output, HasSubstr("Name:                sdc-client"));
  EXPECT_THAT(who.output, HasSubstr("Role:                viewer"));
}

TEST(ApprovalsRequiredFlagTest, OutOfRangeOrWithAutoApprovalIsRefused) {
  const std::string dir = TestDir("approvals-flag");
  const std::vector<std::string> base = {
      BinaryPath("daemon/sdcd"), absl::StrCat("--db=", dir, "/sdcd.db"),
      absl::StrCat("--admin_token_file=", dir, "/admin.token"), "--listen=127.0.0.1:0",
      "--admin_listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"};
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--approvals_required=0"}, "--approvals_required: expected 1..10, got 0"},
           {{"--approvals_required=2", "--approval=auto"},
            "--approvals_required: conflicts with --approval=auto"}}) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    RunResult r = sdc::testing::Run(argv, {}, absl::Seconds(20));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message));
  }
}

// Issue 38, finding 7: sdcd accepted an admin address reachable from the
// network without TLS, so operators' bearer tokens crossed it in clear.
// Now it refuses to start, and says how to fix it; loopback without TLS
// still starts.
TEST(PlaintextAdminTest, APublicAdminAddressWithoutTlsIsRefused) {
  const std::string dir = TestDir("plaintext-admin");
  const std::vector<std::string> argv = {
      BinaryPath("daemon/sdcd"), absl::StrCat("--db=", dir, "/sdcd.db"),
      absl::StrCat("--admin_token_file=", dir, "/admin.token"), "--listen=127.0.0.1:0",
      "--admin_listen=0.0.0.0:0", "--metrics_listen=127.0.0.1:0"};
  RunResult r = sdc::testing::Run(argv, {}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--admin_listen: 0.0.0.0:0 is not a loopback address, and the "
                                  "admin service would carry bearer tokens in clear there"));
}

}  // namespace
}  // namespace sdc::testing
