// sdcctl's Main end to end over real loopback gRPC, against a hand-written
// AdminService and NodeAdminService that answer as sdcd does: the exit codes,
// the error lines, the list calls and filters of the table of resources,
// describe's extra calls, and --watch. (tests/sdcd_operators_test.cc runs the
// binary against the real sdcd.)

#include "ctl/sdcctl.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "admin.grpc.pb.h"
#include "ctl/config.h"
#include "ctl/errors.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace sdc::sdcctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kRootToken[] = "root-token";
constexpr char kViewerToken[] = "viewer-token";

// What the fake saw, for the tests to check the calls sdcctl made.
struct Seen {
  absl::Mutex mu;
  v1::RequestState list_requests_state ABSL_GUARDED_BY(mu) = v1::REQUEST_STATE_UNSPECIFIED;
  std::vector<std::string> list_incidents_jobs ABSL_GUARDED_BY(mu);
  std::vector<std::string> list_ranks_jobs ABSL_GUARDED_BY(mu);
  int list_jobs ABSL_GUARDED_BY(mu) = 0;
};

// sdcd's authentication as it answers after the bearer-token change: no
// token or one it does not know is UNAUTHENTICATED; a known operator whose
// role is too low is PERMISSION_DENIED.
grpc::Status Authenticate(grpc::ServerContext* context, bool needs_operator) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return {grpc::StatusCode::UNAUTHENTICATED, "admin calls need a token"};
  const std::string header(it->second.data(), it->second.size());
  if (header == absl::StrCat("Bearer ", kRootToken)) return grpc::Status::OK;
  if (header == absl::StrCat("Bearer ", kViewerToken)) {
    if (!needs_operator) return grpc::Status::OK;
    return {grpc::StatusCode::PERMISSION_DENIED, "bob has role viewer; this call needs operator"};
  }
  return {grpc::StatusCode::UNAUTHENTICATED, "the admin token is not valid"};
}

v1::Incident IncidentOf(uint64_t id, const std::string& job, const std::string& node) {
  v1::Incident i;
  i.set_id(id);
  i.set_job_id(job);
  i.set_check(v1::CHECK_REPLAY);
  i.set_outcome("faulty");
  i.add_node_names(node);
  return i;
}

class FakeAdmin final : public v1::AdminService::Service {
 public:
  explicit FakeAdmin(Seen* seen) : seen_(seen) {}

  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* out) override {
    if (grpc::Status s = Authenticate(ctx, false); !s.ok()) return s;
    for (const char* id : {"job-a", "job-b"}) {
      v1::Job* j = out->add_jobs();
      j->set_job_id(id);
      j->set_world_size(8);
    }
    absl::MutexLock lock(&seen_->mu);
    ++seen_->list_jobs;
    return grpc::Status::OK;
  }

  grpc::Status ListRanks(grpc::ServerContext* ctx, const v1::ListRanksRequest* q,
                         v1::ListRanksResponse* out) override {
    if (grpc::Status s = Authenticate(ctx, false); !s.ok()) return s;
    v1::Rank* r = out->add_ranks();
    r->mutable_placement()->set_rank(3);
    r->mutable_placement()->set_node_name("node-b");
    absl::MutexLock lock(&seen_->mu);
    seen_->list_ranks_jobs.push_back(q->job_id());
    return grpc::Status::OK;
  }

  grpc::Status ListIncidents(grpc::ServerContext* ctx, const v1::ListIncidentsRequest* q,
                             v1::ListIncidentsResponse* out) override {
    if (grpc::Status s = Authenticate(ctx, false); !s.ok()) return s;
    for (const v1::Incident& i :
         {IncidentOf(4, "job-a", "node-b"), IncidentOf(9, "job-b", "node-c")}) {
      if (q->job_id().empty() || q->job_id() == i.job_id()) *out->add_incidents() = i;
    }
    absl::MutexLock lock(&seen_->mu);
    seen_->list_incidents_jobs.push_back(q->job_id());
    return grpc::Status::OK;
  }

  grpc::Status ListSuspects(grpc::ServerContext* ctx, const v1::ListSuspectsRequest*,
                            v1::ListSuspectsResponse*) override {
    return Authenticate(ctx, false);  // None.
  }

  grpc::Status ListRequests(grpc::ServerContext* ctx, const v1::ListRequestsRequest* q,
                            v1::ListRequestsResponse* out) override {
    if (grpc::Status s = Authenticate(ctx, false); !s.ok()) return s;
    *out->add_requests() = Request(7);
    absl::MutexLock lock(&seen_->mu);
    seen_->list_requests_state = q->state();
    return grpc::Status::OK;
  }

  grpc::Status GetRequest(grpc::ServerContext* ctx, const v1::GetRequestRequest* q,
                          v1::ReplacementRequest* out) override {
    if (grpc::Status s = Authenticate(ctx, false); !s.ok()) return s;
    if (q->id() != 7 && q->id() != 12) {
      return {grpc::StatusCode::NOT_FOUND, absl::StrCat("no replacement request ", q->id())};
    }
    *out = Request(q->id());
    return grpc::Status::OK;
  }

  grpc::Status Approve(grpc::ServerContext* ctx, const v1::DecideRequest* q,
                       v1::ReplacementRequest* out) override {
    if (grpc::Status s = Authenticate(ctx, true); !s.ok()) return s;
    if (q->id() == 12) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "request 12 is already Done; use --force to decide again"};
    }
    *out = Request(q->id());
    out->set_state(v1::APPROVED);
    return grpc::Status::OK;
  }

  grpc::Status WhoAmI(grpc::ServerContext* ctx, const v1::WhoAmIRequest*,
                      v1::WhoAmIResponse* out) override {
    if (grpc::Status s = Authenticate(ctx, false); !s.ok()) return s;
    out->set_name("root");
    out->set_role(v1::ROLE_ADMIN);
    out->set_server_version("9.9.9");
    return grpc::Status::OK;
  }

 private:
  static v1::ReplacementRequest Request(uint64_t id) {
    v1::ReplacementRequest r;
    r.set_id(id);
    r.set_node_name("node-b");
    r.set_state(id == 12 ? v1::DONE : v1::PENDING);
    r.set_action("replace");
    return r;
  }

  Seen* const seen_;
};

class FakeNodeAdmin final : public v1::NodeAdminService::Service {
 public:
  grpc::Status Diagnose(grpc::ServerContext* ctx, const v1::DiagnoseRequest* q,
                        v1::Diagnostic* out) override {
    if (grpc::Status s = Authenticate(ctx, true); !s.ok()) return s;
    if (q->node_name() != "node-b") {
      return {grpc::StatusCode::NOT_FOUND,
              absl::StrCat("no agent has registered node ", q->node_name())};
    }
    out->set_id(1);
    out->set_node_name("node-b");
    out->set_state(v1::DIAGNOSTIC_FAILED);
    return grpc::Status::OK;
  }
};

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadAll(std::FILE* f) {
  std::rewind(f);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  std::fclose(f);
  return text;
}

class SdcctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&admin_);
    builder.RegisterService(&nodes_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = tmp != nullptr ? tmp : "/tmp";
    root_ = TokenFile("root", kRootToken);
  }

  void TearDown() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }

  std::string TokenFile(const std::string& name, const std::string& token) {
    const std::string path = absl::StrCat(dir_, "/", name, ".token");
    std::ofstream(path) << token << "\n";
    return path;
  }

  // sdcctl --server=the fake --token_file=TOKEN_FILE ARGS, no config file.
  Result Run(const std::string& token_file, std::vector<std::string> args) {
    std::vector<std::string> argv = {"sdcctl", absl::StrCat("--server=127.0.0.1:", port_),
                                     absl::StrCat("--token_file=", token_file)};
    argv.insert(argv.end(), args.begin(), args.end());
    std::FILE* out = std::tmpfile();
    std::FILE* err = std::tmpfile();
    Result r;
    r.exit_code = Main(argv, Environment{"", "", "", "/nonexistent"}, out, err);
    r.out = ReadAll(out);
    r.err = ReadAll(err);
    return r;
  }

  Seen seen_;
  FakeAdmin admin_{&seen_};
  FakeNodeAdmin nodes_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string dir_;
  std::string root_;
};

TEST_F(SdcctlTest, AnUnacceptedCredentialIsExit6AndSaysSo) {
  const std::string wrong = TokenFile("wrong", "not-a-token");
  Result r = Run(wrong, {"get", "jobs"});
  EXPECT_EQ(r.exit_code, kExitPermission);
  EXPECT_EQ(r.exit_code, 6);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, absl::StrCat("sdcctl: error: credential not accepted: the admin token is not "
                                "valid (sdcctl sent the token in ",
                                wrong, ")\n"));
  // The same for every kind of call: describe, the node service, whoami.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"describe", "job", "job-a"}, {"diagnose", "node", "node-b"}, {"whoami"}}) {
    Result again = Run(wrong, args);
    EXPECT_EQ(again.exit_code, 6) << args[0];
    EXPECT_THAT(again.err, HasSubstr("credential not accepted: the admin token is not valid"));
  }
}

TEST_F(SdcctlTest, ARoleThatMayNotIsExit6PermissionDenied) {
  const std::string bob = TokenFile("bob", kViewerToken);
  Result read = Run(bob, {"get", "requests", "-o", "name"});
  EXPECT_EQ(read.exit_code, 0) << read.err;
  EXPECT_EQ(read.out, "request/7\n");
  Result r = Run(bob, {"approve", "7", "--reason=bad GPU"});
  EXPECT_EQ(r.exit_code, 6);
  EXPECT_EQ(r.out, "");
  // The notice (read with GetRequest, which a viewer may call), then the refusal.
  EXPECT_THAT(r.err, HasSubstr("Approving request 7: node node-b will be marked for replacement"));
  EXPECT_THAT(r.err, HasSubstr("sdcctl: error: permission denied: bob has role viewer; this call "
                               "needs operator\n"));
}

TEST_F(SdcctlTest, ExitCodes) {
  struct Case {
    std::string token_file;
    std::vector<std::string> args;
    int exit_code;
    std::string err;
  };
  const std::string missing = dir_ + "/missing.token";
  const std::vector<Case> cases = {
      {root_, {"describe", "request", "9"}, 3, "no replacement request 9"},
      {root_, {"describe", "incident", "5"}, 3, "no incident 5"},
      {root_, {"get", "incidents", "5"}, 3, "no incident 5"},
      {root_, {"describe", "job", "nope"}, 3, "no job nope"},
      {root_, {"diagnose", "node", "node-z"}, 3, "no agent has registered node node-z"},
      {root_, {"approve", "12", "--reason=x"}, 4, "request 12 is already Done; use --force"},
      {missing, {"get", "jobs"}, 6, "cannot read the admin token: " + missing},
      {root_, {"get", "jobs", "--bogus"}, 2, "unknown flag --bogus"},
      {root_, {"approve", "7"}, 2, "approve needs --reason=TEXT"},
      {root_, {"diagnose", "node", "node-b"}, 7, ""},
  };
  for (const Case& c : cases) {
    Result r = Run(c.token_file, c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args[0] << " " << c.args[1] << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.err));
  }
  Result diagnose = Run(root_, {"diagnose", "node/node-b"});
  EXPECT_THAT(diagnose.out, HasSubstr("diagnostic 1 on node node-b: FAILED"));

  // Nothing listens on port 1: unreachable, exit 5; version still exits 0.
  std::vector<std::string> argv = {"sdcctl", "--server=127.0.0.1:1",
                                   absl::StrCat("--token_file=", root_), "get", "jobs"};
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  EXPECT_EQ(Main(argv, Environment{"", "", "", "/nonexistent"}, out, err), kExitUnreachable);
  ReadAll(out);
  EXPECT_THAT(ReadAll(err), HasSubstr("sdcctl: error: cannot reach sdcd at 127.0.0.1:1: "));
  argv.back() = "version";
  argv.erase(argv.end() - 2);
  out = std::tmpfile();
  err = std::tmpfile();
  EXPECT_EQ(Main(argv, Environment{"", "", "", "/nonexistent"}, out, err), kExitOk);
  EXPECT_THAT(ReadAll(out), HasSubstr("\nsdcd   unknown (cannot reach sdcd at 127.0.0.1:1"));
  ReadAll(err);
  Result version = Run(root_, {"version"});
  EXPECT_THAT(version.out, HasSubstr(absl::StrCat("\nsdcd   9.9.9 at 127.0.0.1:", port_, "\n")));
}

// get: the call the resource names, its server-side filter, -l on sdcctl's
// side, the format, --no-headers, and "No resources found." on stderr.
TEST_F(SdcctlTest, GetThroughTheTableOfResources) {
  Result jobs = Run(root_, {"get", "jobs"});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_THAT(jobs.out, HasSubstr("NAME    WORLD   NODES   ATTACHED   LAST-STEP   INCIDENTS   AGE\n"
                                  "job-a   8       0       0          0           0           "
                                  "<unknown>\n"));
  Result bare = Run(root_, {"get", "jobs", "--no-headers", "-l", "job=job-b"});
  EXPECT_EQ(bare.out, "job-b   8       0       0          0           0           <unknown>\n");

  Result by_node = Run(root_, {"get", "incident", "-l", "node=node-b", "-o", "name"});
  EXPECT_EQ(by_node.out, "incident/4\n");
  Result of_job = Run(root_, {"get", "incidents", "--job=job-b", "-o", "name"});
  EXPECT_EQ(of_job.out, "incident/9\n");
  Result pending = Run(root_, {"get", "requests", "--state=pending", "-o", "json"});
  EXPECT_THAT(pending.out, HasSubstr("\"node_name\": \"node-b\""));
  {
    absl::MutexLock lock(&seen_.mu);
    EXPECT_EQ(seen_.list_requests_state, v1::PENDING);
    EXPECT_EQ(seen_.list_incidents_jobs, (std::vector<std::string>{"", "job-b"}));
  }
  Result none = Run(root_, {"get", "suspects"});
  EXPECT_EQ(none.exit_code, 0);
  EXPECT_EQ(none.out, "");
  EXPECT_EQ(none.err, "No resources found.\n");
  Result yaml = Run(root_, {"get", "suspects", "-o", "yaml"});
  EXPECT_EQ(yaml.out, "suspects: []\n");
  Result one = Run(root_, {"get", "requests", "request/7"});
  EXPECT_THAT(one.out, HasSubstr("Request:          7\nNode:             node-b\n"));
}

// describe job: the job, then its ranks and incidents by the job's id.
TEST_F(SdcctlTest, DescribeJobMakesItsRelatedCalls) {
  Result r = Run(root_, {"describe", "job/job-a"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Job:             job-a\n"));
  EXPECT_THAT(r.out, HasSubstr("Ranks:\n  RANK   NODE     GPU      ATTACHED   CHECKED-THROUGH   "
                               "PROVEN-BY\n  3      node-b   <none>   no         0                 "
                               "unauthenticated\n"));
  EXPECT_THAT(r.out, HasSubstr("Incidents:\n  Incident 4:\n    Job:          job-a\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("Incident 9")));
  absl::MutexLock lock(&seen_.mu);
  EXPECT_EQ(seen_.list_ranks_jobs, (std::vector<std::string>{"job-a"}));
  EXPECT_EQ(seen_.list_incidents_jobs, (std::vector<std::string>{"job-a"}));
}

// get -w lists every --interval until SIGINT, then exits 0.
TEST_F(SdcctlTest, WatchListsUntilInterrupted) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  std::atomic<int> exit_code{-1};
  const std::vector<std::string> argv = {"sdcctl",
                                         absl::StrCat("--server=127.0.0.1:", port_),
                                         absl::StrCat("--token_file=", root_),
                                         "get",
                                         "jobs",
                                         "-o",
                                         "name",
                                         "-w",
                                         "--interval=20ms"};
  std::thread run([&] {
    exit_code = Main(argv, Environment{"", "", "", "/nonexistent"}, out, err);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  auto lists = [this] {
    absl::MutexLock lock(&seen_.mu);
    return seen_.list_jobs;
  };
  while (lists() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_GE(lists(), 3);
  kill(getpid(), SIGINT);  // RunGet's handler is installed before its first list.
  run.join();
  EXPECT_EQ(exit_code.load(), 0);
  const std::string text = ReadAll(out);
  EXPECT_THAT(text, ::testing::StartsWith("job/job-a\njob/job-b\n\njob/job-a\njob/job-b\n\n"));
  EXPECT_EQ(ReadAll(err), "");
}

}  // namespace
}  // namespace sdc::sdcctl
