#include "ctl/command_output.h"
#include "ctl/errors.h"
#include "ctl/names.h"
#include "ctl/resources.h"
#include "ctl/selector.h"
#include "ctl/serialize.h"
#include "ctl/text.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace sdc::sdcctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// 2027-01-15T08:00:00Z.
const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

int64_t MillisAgo(absl::Duration d) { return absl::ToUnixMillis(kNow - d); }

// The resource `word` names in the table ("requests", "node").
const Resource& Kind(absl::string_view word) {
  const Resource* r = FindResource(word);
  if (r == nullptr) {
    ADD_FAILURE() << "no resource " << word;
    std::abort();
  }
  return *r;
}

// describe's text for one item of kind `kind` at kNow.
std::string Describe(absl::string_view kind, const google::protobuf::Message& item,
                     const Related& related = {}) {
  return Kind(kind).Describe(item, related, kNow);
}

v1::Transition MakeTransition(v1::RequestState from, v1::RequestState to, int64_t at_ms,
                              const std::string& actor, const std::string& reason) {
  v1::Transition t;
  t.set_from(from);
  t.set_to(to);
  t.set_at_unix_ms(at_ms);
  t.set_actor(actor);
  t.set_reason(reason);
  return t;
}

// A pending request opened five minutes ago.
v1::ReplacementRequest PendingRequest() {
  v1::ReplacementRequest r;
  r.set_id(7);
  r.set_node_name("node-b");
  r.set_state(v1::PENDING);
  r.add_gpu_uuids("GPU-3");
  r.add_incident_ids(4);
  r.set_reason("replay audit blamed rank 3");
  r.set_created_unix_ms(MillisAgo(absl::Minutes(5)));
  r.set_updated_unix_ms(MillisAgo(absl::Minutes(2)));
  *r.add_transitions() = MakeTransition(v1::PENDING, v1::PENDING, r.created_unix_ms(), "sdcd",
                                        "replay audit blamed rank 3");
  r.set_action("replace");
  return r;
}

// A reboot request that went all the way, opened 2 days 5 hours ago.
v1::ReplacementRequest DoneRequest() {
  v1::ReplacementRequest r;
  r.set_id(12);
  r.set_node_name("node-c");
  r.set_state(v1::DONE);
  r.add_gpu_uuids("GPU-5");
  r.add_gpu_uuids("GPU-6");
  r.add_incident_ids(9);
  r.add_incident_ids(10);
  r.set_reason("weights vote");
  const int64_t created = MillisAgo(absl::Hours(2 * 24 + 5));
  r.set_created_unix_ms(created);
  r.set_updated_unix_ms(MillisAgo(absl::Hours(1)));
  *r.add_transitions() = MakeTransition(v1::PENDING, v1::PENDING, created, "sdcd", "weights vote");
  *r.add_transitions() =
      MakeTransition(v1::PENDING, v1::APPROVED, created + 60'000, "alice", "confirmed by replay");
  *r.add_transitions() =
      MakeTransition(v1::APPROVED, v1::EXECUTING, created + 70'000, "actuator:eks", "");
  *r.add_transitions() = MakeTransition(v1::EXECUTING, v1::DONE, MillisAgo(absl::Hours(1)),
                                        "actuator:eks", "labelled node-c");
  r.set_action("reboot");
  r.set_actuator("eks");
  r.set_actuator_result("labelled node-c");
  return r;
}

// Attributed, 59 seconds old.
v1::Incident ReplayIncident() {
  v1::Incident i;
  i.set_id(4);
  i.set_job_id("job-a");
  i.set_step(120);
  i.set_check(v1::CHECK_REPLAY);
  i.set_outcome("faulty");
  i.add_ranks(3);
  i.add_node_names("node-b");
  i.add_gpu_uuids("GPU-3");
  i.set_confirmed(true);
  i.set_explanation("rank 3 differs from its replay on node-a");
  i.add_differing_tensors("layer.0.weight");
  i.add_differing_tensors("layer.1.bias");
  i.set_created_unix_ms(MillisAgo(absl::Seconds(59)));
  i.set_request_id(7);
  return i;
}

// Not attributed, an hour old, with empty lists and text.
v1::Incident WeightsIncident() {
  v1::Incident i;
  i.set_id(9);
  i.set_job_id("job-b");
  i.set_step(7);
  i.set_check(v1::CHECK_WEIGHTS);
  i.set_outcome("suspect");
  i.add_ranks(5);
  i.add_ranks(6);
  i.add_node_names("node-c");
  i.set_confirmed(false);
  i.set_created_unix_ms(MillisAgo(absl::Hours(1)));
  return i;
}

v1::ListRequestsResponse TwoRequests() {
  v1::ListRequestsResponse r;
  *r.add_requests() = PendingRequest();
  *r.add_requests() = DoneRequest();
  return r;
}

v1::ListIncidentsResponse TwoIncidents() {
  v1::ListIncidentsResponse r;
  *r.add_incidents() = ReplayIncident();
  *r.add_incidents() = WeightsIncident();
  return r;
}

v1::ListSuspectsResponse TwoSuspects() {
  v1::ListSuspectsResponse r;
  v1::Suspect* a = r.add_suspects();
  a->set_gpu_uuid("GPU-3");
  a->set_node_name("node-b");
  a->set_job_id("job-a");
  a->set_rank(3);
  a->set_reason("replay mismatch");
  a->set_incidents(2);
  a->set_targeted_audits_left(1);
  a->set_since_unix_ms(MillisAgo(absl::Seconds(45)));
  v1::Suspect* b = r.add_suspects();
  b->set_gpu_uuid("GPU-5");
  b->set_node_name("node-c");
  b->set_job_id("job-b");
  b->set_rank(5);
  b->set_incidents(1);
  b->set_targeted_audits_left(3);  // No reason, no time: shown as <none>, <unknown>.
  return r;
}

v1::ListJobsResponse TwoJobs() {
  v1::ListJobsResponse r;
  v1::Job* a = r.add_jobs();
  a->set_job_id("job-a");
  a->set_world_size(8);
  a->set_attached_ranks(8);
  a->set_last_step(120);
  a->set_created_unix_ms(MillisAgo(absl::Minutes(12)));
  a->set_open_incidents(1);
  a->set_nodes(2);
  v1::Job* b = r.add_jobs();
  b->set_job_id("job-b");
  b->set_world_size(16);
  b->set_attached_ranks(12);
  b->set_last_step(7);
  b->set_created_unix_ms(MillisAgo(absl::Hours(3 * 24)));
  b->set_nodes(4);
  return r;
}

// ---------------------------------------------------------------------------
// Ages

TEST(FormatAgeTest, TruncatesToLargestUnit) {
  const std::vector<std::pair<int64_t, std::string>> cases = {
      {0, "0s"},     {45, "45s"},       {59, "59s"},           {60, "1m"},       {119, "1m"},
      {720, "12m"},  {3599, "59m"},     {3600, "1h"},          {5 * 3600, "5h"}, {86399, "23h"},
      {86400, "1d"}, {3 * 86400, "3d"}, {400 * 86400, "400d"}, {-5, "0s"},
  };
  for (const auto& [seconds, want] : cases) {
    EXPECT_EQ(FormatAge(seconds), want) << seconds << "s";
  }
}

TEST(FormatAgeTest, SinceUnixMillis) {
  EXPECT_EQ(FormatAgeSince(0, kNow), "<unknown>");
  EXPECT_EQ(FormatAgeSince(absl::ToUnixMillis(kNow) - 1'999, kNow), "1s");
  EXPECT_EQ(FormatAgeSince(absl::ToUnixMillis(kNow) - 60'000, kNow), "1m");
  EXPECT_EQ(FormatAgeSince(absl::ToUnixMillis(kNow) + 30'000, kNow), "0s");  // Clock skew.
}

// ---------------------------------------------------------------------------
// Exit codes and error lines

TEST(ExitCodeForTest, EveryStatusCode) {
  const std::vector<std::pair<grpc::StatusCode, int>> cases = {
      {grpc::StatusCode::OK, 0},
      {grpc::StatusCode::CANCELLED, 1},
      {grpc::StatusCode::UNKNOWN, 1},
      {grpc::StatusCode::INVALID_ARGUMENT, 1},
      {grpc::StatusCode::DEADLINE_EXCEEDED, 5},
      {grpc::StatusCode::NOT_FOUND, 3},
      {grpc::StatusCode::ALREADY_EXISTS, 1},
      {grpc::StatusCode::PERMISSION_DENIED, 6},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, 1},
      {grpc::StatusCode::FAILED_PRECONDITION, 4},
      {grpc::StatusCode::ABORTED, 1},
      {grpc::StatusCode::OUT_OF_RANGE, 1},
      {grpc::StatusCode::UNIMPLEMENTED, 1},
      {grpc::StatusCode::INTERNAL, 1},
      {grpc::StatusCode::UNAVAILABLE, 5},
      {grpc::StatusCode::DATA_LOSS, 1},
      {grpc::StatusCode::UNAUTHENTICATED, 6},
  };
  for (const auto& [code, want] : cases) {
    EXPECT_EQ(ExitCodeFor(code), want) << "code " << static_cast<int>(code);
  }
  EXPECT_EQ(kExitUsage, 2);
}

TEST(RpcErrorMessageTest, OneLinePerCode) {
  const std::string server = "unix:/run/sdc/admin.sock";
  const std::vector<std::pair<grpc::Status, std::string>> cases = {
      {{grpc::StatusCode::UNAVAILABLE, "failed to connect\nto all addresses"},
       "cannot reach sdcd at unix:/run/sdc/admin.sock: failed to connect to all addresses"},
      {{grpc::StatusCode::UNAVAILABLE, ""},
       "cannot reach sdcd at unix:/run/sdc/admin.sock: UNAVAILABLE"},
      {{grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"},
       "cannot reach sdcd at unix:/run/sdc/admin.sock: no answer before the deadline "
       "(Deadline Exceeded; see --timeout)"},
      {{grpc::StatusCode::NOT_FOUND, "no replacement request 77"}, "no replacement request 77"},
      {{grpc::StatusCode::FAILED_PRECONDITION,
        "request 1 is already Denied (by bob: glitch); use --force to decide again"},
       "request 1 is already Denied (by bob: glitch); use --force to decide again"},
      {{grpc::StatusCode::PERMISSION_DENIED, "the admin token is not valid"},
       "permission denied: the admin token is not valid"},
      // sdcd did not accept the credential (a wrong or removed operator's
      // token); PERMISSION_DENIED is a known operator whose role may not.
      {{grpc::StatusCode::UNAUTHENTICATED, "the admin token is not valid"},
       "credential not accepted: the admin token is not valid"},
      {{grpc::StatusCode::UNAUTHENTICATED, "admin calls need a token"},
       "credential not accepted: admin calls need a token"},
      {{grpc::StatusCode::PERMISSION_DENIED, "bob has role viewer; this call needs operator"},
       "permission denied: bob has role viewer; this call needs operator"},
      {{grpc::StatusCode::INVALID_ARGUMENT, "name a GPU UUID or a node"},
       "INVALID_ARGUMENT: name a GPU UUID or a node"},
      {{grpc::StatusCode::INTERNAL, "boom\r\n"}, "INTERNAL: boom  "},
  };
  for (const auto& [status, want] : cases) {
    EXPECT_EQ(RpcErrorMessage(status, server), want);
  }
}

// ---------------------------------------------------------------------------
// Parsing names

TEST(ParseOutputFormatTest, KnownAndUnknown) {
  EXPECT_EQ(*ParseOutputFormat(""), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("wide"), OutputFormat::kWide);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  EXPECT_EQ(*ParseOutputFormat("name"), OutputFormat::kName);
  for (const char* bad : {"xml", "JSON ", "jsonpath", "-o"}) {
    EXPECT_EQ(ParseOutputFormat(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseRequestStateTest, EveryStateAnyCase) {
  const std::vector<std::pair<std::string, v1::RequestState>> cases = {
      {"pending", v1::PENDING}, {"Approved", v1::APPROVED}, {"EXECUTING", v1::EXECUTING},
      {"done", v1::DONE},       {"failed", v1::FAILED},     {"denied", v1::DENIED},
      {"expired", v1::EXPIRED},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<v1::RequestState> got = ParseRequestState(text);
    ASSERT_TRUE(got.ok()) << text;
    EXPECT_EQ(*got, want) << text;
  }
  for (const char* bad : {"", "unknown", "REQUEST_STATE_UNSPECIFIED", "pend"}) {
    EXPECT_EQ(ParseRequestState(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(NamesTest, StatesAndChecks) {
  EXPECT_EQ(StateName(v1::PENDING), "Pending");
  EXPECT_EQ(StateName(v1::APPROVED), "Approved");
  EXPECT_EQ(StateName(v1::EXECUTING), "Executing");
  EXPECT_EQ(StateName(v1::DONE), "Done");
  EXPECT_EQ(StateName(v1::FAILED), "Failed");
  EXPECT_EQ(StateName(v1::DENIED), "Denied");
  EXPECT_EQ(StateName(v1::EXPIRED), "Expired");
  EXPECT_EQ(StateName(v1::REQUEST_STATE_UNSPECIFIED), "Unknown");
  EXPECT_EQ(CheckName(v1::CHECK_NONFINITE), "nonfinite");
  EXPECT_EQ(CheckName(v1::CHECK_REDUCED_GRADIENTS), "reduced_gradients");
  EXPECT_EQ(CheckName(v1::CHECK_REPLAY), "replay");
  EXPECT_EQ(CheckName(v1::CHECK_WEIGHTS), "weights");
  EXPECT_EQ(CheckName(v1::CHECK_KIND_UNSPECIFIED), "unknown");
}

// ---------------------------------------------------------------------------
// Tables

TEST(FormatRequestsTest, Table) {
  EXPECT_EQ(Kind("requests").Format(TwoRequests(), OutputFormat::kTable, kNow),
            "NAME   NODE     STATE     ACTION    GPUS          INCIDENTS   AGE\n"
            "7      node-b   Pending   replace   GPU-3         4           5m\n"
            "12     node-c   Done      reboot    GPU-5,GPU-6   9,10        2d\n");
}

TEST(FormatRequestsTest, Wide) {
  v1::ListRequestsResponse requests = TwoRequests();
  // Request 7 waits for a second approval (sdcd --approvals_required=2).
  requests.mutable_requests(0)->set_approvals_required(2);
  requests.mutable_requests(0)->add_approvals()->set_operator_("alice");
  EXPECT_EQ(Kind("requests").Format(requests, OutputFormat::kWide, kNow),
            "NAME   NODE     STATE     ACTION    GPUS          INCIDENTS   "
            "REASON                       LAST-ACTOR     APPROVALS   AGE\n"
            "7      node-b   Pending   replace   GPU-3         4           "
            "replay audit blamed rank 3   sdcd           1/2         5m\n"
            "12     node-c   Done      reboot    GPU-5,GPU-6   9,10        "
            "weights vote                 actuator:eks   0/1         2d\n");
}

TEST(FormatRequestsTest, Name) {
  EXPECT_EQ(Kind("requests").Format(TwoRequests(), OutputFormat::kName, kNow),
            "request/7\nrequest/12\n");
}

TEST(FormatRequestsTest, EmptyListPrintsNothingButTheDocument) {
  const v1::ListRequestsResponse empty;
  EXPECT_EQ(Kind("requests").Format(empty, OutputFormat::kTable, kNow), "");
  EXPECT_EQ(Kind("requests").Format(empty, OutputFormat::kWide, kNow), "");
  EXPECT_EQ(Kind("requests").Format(empty, OutputFormat::kName, kNow), "");
  EXPECT_EQ(Kind("requests").Format(empty, OutputFormat::kYaml, kNow), "requests: []\n");
  EXPECT_THAT(Kind("requests").Format(empty, OutputFormat::kJson, kNow),
              HasSubstr("\"requests\": []"));
}

TEST(FormatIncidentsTest, Table) {
  EXPECT_EQ(Kind("incidents").Format(TwoIncidents(), OutputFormat::kTable, kNow),
            "NAME   JOB     STEP   CHECK     OUTCOME   RANKS   NODES    ATTRIBUTED   AGE\n"
            "4      job-a   120    replay    faulty    3       node-b   yes          59s\n"
            "9      job-b   7      weights   suspect   5,6     node-c   no           1h\n");
}

TEST(FormatIncidentsTest, Wide) {
  EXPECT_EQ(Kind("incidents").Format(TwoIncidents(), OutputFormat::kWide, kNow),
            "NAME   JOB     STEP   CHECK     OUTCOME   RANKS   NODES    ATTRIBUTED   "
            "GPUS     TENSORS                       EXPLANATION                                "
            "AGE\n"
            "4      job-a   120    replay    faulty    3       node-b   yes          "
            "GPU-3    layer.0.weight,layer.1.bias   rank 3 differs from its replay on node-a   "
            "59s\n"
            "9      job-b   7      weights   suspect   5,6     node-c   no           "
            "<none>   <none>                        <none>                                     "
            "1h\n");
}

TEST(FormatIncidentsTest, Name) {
  EXPECT_EQ(Kind("incidents").Format(TwoIncidents(), OutputFormat::kName, kNow),
            "incident/4\nincident/9\n");
}

TEST(FormatSuspectsTest, Table) {
  EXPECT_EQ(Kind("suspects").Format(TwoSuspects(), OutputFormat::kTable, kNow),
            "NAME    NODE     JOB     RANK   INCIDENTS   TARGETED-LEFT   AGE\n"
            "GPU-3   node-b   job-a   3      2           1               45s\n"
            "GPU-5   node-c   job-b   5      1           3               <unknown>\n");
}

TEST(FormatSuspectsTest, Wide) {
  EXPECT_EQ(Kind("suspects").Format(TwoSuspects(), OutputFormat::kWide, kNow),
            "NAME    NODE     JOB     RANK   INCIDENTS   TARGETED-LEFT   REASON            AGE\n"
            "GPU-3   node-b   job-a   3      2           1               replay mismatch   45s\n"
            "GPU-5   node-c   job-b   5      1           3               <none>            "
            "<unknown>\n");
}

TEST(FormatSuspectsTest, Name) {
  EXPECT_EQ(Kind("suspects").Format(TwoSuspects(), OutputFormat::kName, kNow),
            "suspect/GPU-3\nsuspect/GPU-5\n");
}

TEST(FormatJobsTest, TableAndWideAreTheSame) {
  const std::string want =
      "NAME    WORLD   NODES   ATTACHED   LAST-STEP   INCIDENTS   AGE\n"
      "job-a   8       2       8          120         1           12m\n"
      "job-b   16      4       12         7           0           3d\n";
  EXPECT_EQ(Kind("jobs").Format(TwoJobs(), OutputFormat::kTable, kNow), want);
  EXPECT_EQ(Kind("jobs").Format(TwoJobs(), OutputFormat::kWide, kNow), want);
}

TEST(FormatJobsTest, Name) {
  EXPECT_EQ(Kind("jobs").Format(TwoJobs(), OutputFormat::kName, kNow), "job/job-a\njob/job-b\n");
}

// A job id comes from a trainer: it must not break the table or reach the
// terminal as an escape sequence.
TEST(FormatJobsTest, CellsAreOneLineWithoutControlCharacters) {
  v1::ListJobsResponse r;
  v1::Job* j = r.add_jobs();
  j->set_job_id("a\tb\n\x1b[2J");
  j->set_world_size(1);
  EXPECT_EQ(Kind("jobs").Format(r, OutputFormat::kTable, kNow),
            "NAME       WORLD   NODES   ATTACHED   LAST-STEP   INCIDENTS   AGE\n"
            "a b ?[2J   1       0       0          0           0           <unknown>\n");
}

// Column widths count code points, not bytes.
TEST(FormatJobsTest, AlignsUtf8) {
  v1::ListJobsResponse r;
  r.add_jobs()->set_job_id("jöb");
  r.add_jobs()->set_job_id("job-long");
  const std::string out = Kind("jobs").Format(r, OutputFormat::kTable, kNow);
  EXPECT_THAT(out, HasSubstr("\njöb        0   "));
  EXPECT_THAT(out, HasSubstr("\njob-long   0   "));
}

TEST(FormatHistoryTest, TablesOfBothKindsWithKindInName) {
  v1::HistoryResponse h;
  *h.add_incidents() = ReplayIncident();
  *h.add_requests() = PendingRequest();
  EXPECT_EQ(FormatHistory(h, OutputFormat::kTable, kNow),
            "NAME         JOB     STEP   CHECK    OUTCOME   RANKS   NODES    ATTRIBUTED   AGE\n"
            "incident/4   job-a   120    replay   faulty    3       node-b   yes          59s\n"
            "\n"
            "NAME        NODE     STATE     ACTION    GPUS    INCIDENTS   AGE\n"
            "request/7   node-b   Pending   replace   GPU-3   4           5m\n");
  EXPECT_EQ(FormatHistory(h, OutputFormat::kName, kNow), "incident/4\nrequest/7\n");
  EXPECT_FALSE(IsEmpty(h));
}

TEST(FormatHistoryTest, OnlyRequestsHasNoLeadingBlankLine) {
  v1::HistoryResponse h;
  *h.add_requests() = PendingRequest();
  EXPECT_EQ(FormatHistory(h, OutputFormat::kTable, kNow),
            "NAME        NODE     STATE     ACTION    GPUS    INCIDENTS   AGE\n"
            "request/7   node-b   Pending   replace   GPU-3   4           5m\n");
}

TEST(FormatHistoryTest, Empty) {
  const v1::HistoryResponse h;
  EXPECT_TRUE(IsEmpty(h));
  EXPECT_EQ(FormatHistory(h, OutputFormat::kTable, kNow), "");
  EXPECT_EQ(FormatHistory(h, OutputFormat::kName, kNow), "");
  EXPECT_EQ(FormatHistory(h, OutputFormat::kYaml, kNow), "incidents: []\nrequests: []\n");
}

// ---------------------------------------------------------------------------
// JSON

TEST(ToJsonTest, ParsesBackToTheSameMessageWithProtoFieldNames) {
  const v1::ListRequestsResponse want = TwoRequests();
  const std::string json = Kind("requests").Format(want, OutputFormat::kJson, kNow);
  v1::ListRequestsResponse got;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &got).ok()) << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want)) << json;
  EXPECT_THAT(json, HasSubstr("\"node_name\": \"node-b\""));
  EXPECT_THAT(json, HasSubstr("\"created_unix_ms\": \""));
  EXPECT_THAT(json, HasSubstr("\"state\": \"PENDING\""));
  EXPECT_THAT(json, HasSubstr("\"actuator\": \"\""));  // Defaults are shown.
  EXPECT_THAT(json, Not(HasSubstr("nodeName")));
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.substr(json.size() - 2), "}\n");
}

TEST(ToJsonTest, EveryListIsOneDocument) {
  for (const std::string& json :
       {Kind("incidents").Format(TwoIncidents(), OutputFormat::kJson, kNow),
        Kind("suspects").Format(TwoSuspects(), OutputFormat::kJson, kNow),
        Kind("jobs").Format(TwoJobs(), OutputFormat::kJson, kNow)}) {
    EXPECT_EQ(json.front(), '{') << json;
    EXPECT_EQ(json.substr(json.size() - 2), "}\n") << json;
  }
  v1::ListIncidentsResponse incidents;
  const std::string json = Kind("incidents").Format(TwoIncidents(), OutputFormat::kJson, kNow);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &incidents).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(incidents, TwoIncidents()));
  EXPECT_THAT(json, HasSubstr("\"differing_tensors\": ["));
  EXPECT_THAT(json, HasSubstr("\"check\": \"CHECK_WEIGHTS\""));
  EXPECT_THAT(Kind("jobs").Format(TwoJobs(), OutputFormat::kJson, kNow),
              HasSubstr("\"open_incidents\": 0"));
}

// ---------------------------------------------------------------------------
// YAML

// The emitter's exact output is pinned on a test-only message type, so that
// fields added to the admin API later do not change these goldens; the admin
// messages are checked below by the blocks they must contain.
class ToYamlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
        R"pb(
          name: "sdcctl_yaml_test.proto"
          package: "sdcctl.test"
          syntax: "proto3"
          message_type { name: "Empty" }
          message_type {
            name: "Inner"
            field { name: "label" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
            field { name: "values" number: 2 label: LABEL_REPEATED type: TYPE_INT32 }
          }
          message_type {
            name: "Outer"
            field { name: "i32" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 }
            field { name: "i64" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 }
            field { name: "u64" number: 3 label: LABEL_OPTIONAL type: TYPE_UINT64 }
            field { name: "d" number: 4 label: LABEL_OPTIONAL type: TYPE_DOUBLE }
            field { name: "f" number: 5 label: LABEL_OPTIONAL type: TYPE_FLOAT }
            field { name: "b" number: 6 label: LABEL_OPTIONAL type: TYPE_BOOL }
            field { name: "s" number: 7 label: LABEL_OPTIONAL type: TYPE_STRING }
            field { name: "raw" number: 8 label: LABEL_OPTIONAL type: TYPE_BYTES }
            field {
              name: "color"
              number: 9
              label: LABEL_OPTIONAL
              type: TYPE_ENUM
              type_name: ".sdcctl.test.Color"
            }
            field {
              name: "inner"
              number: 10
              label: LABEL_OPTIONAL
              type: TYPE_MESSAGE
              type_name: ".sdcctl.test.Inner"
            }
            field {
              name: "items"
              number: 11
              label: LABEL_REPEATED
              type: TYPE_MESSAGE
              type_name: ".sdcctl.test.Inner"
            }
            field { name: "tags" number: 12 label: LABEL_REPEATED type: TYPE_STRING }
            field {
              name: "empty"
              number: 13
              label: LABEL_OPTIONAL
              type: TYPE_MESSAGE
              type_name: ".sdcctl.test.Empty"
            }
            field {
              name: "empties"
              number: 14
              label: LABEL_REPEATED
              type: TYPE_MESSAGE
              type_name: ".sdcctl.test.Empty"
            }
            field {
              name: "by_name"
              number: 15
              label: LABEL_OPTIONAL
              type: TYPE_STRING
              oneof_index: 0
            }
            field {
              name: "by_id"
              number: 16
              label: LABEL_OPTIONAL
              type: TYPE_UINT64
              oneof_index: 0
            }
            field { name: "doubles" number: 17 label: LABEL_REPEATED type: TYPE_DOUBLE }
            oneof_decl { name: "subject" }
          }
          enum_type {
            name: "Color"
            value { name: "COLOR_UNSPECIFIED" number: 0 }
            value { name: "RED" number: 1 }
          }
        )pb",
        &file));
    const google::protobuf::FileDescriptor* built = pool_.BuildFile(file);
    ASSERT_NE(built, nullptr);
    outer_ = built->FindMessageTypeByName("Outer");
    ASSERT_NE(outer_, nullptr);
  }

  // An Outer with the given text-format fields.
  std::unique_ptr<google::protobuf::Message> Outer(const std::string& text) {
    std::unique_ptr<google::protobuf::Message> m(factory_.GetPrototype(outer_)->New());
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, m.get())) << text;
    return m;
  }

  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_;
  const google::protobuf::Descriptor* outer_ = nullptr;
};

TEST_F(ToYamlTest, EveryKindOfField) {
  auto m = Outer(R"pb(
    i32: -5
    i64: -9000000000
    u64: 18446744073709551615
    d: 0.1
    f: 1.5
    b: true
    s: "yes"
    raw: "\x00\xff"
    color: RED
    inner { values: [ 1, 2 ] }
    items { label: "a: b" }
    items {}
    tags: [ "x", "" ]
    empty {}
    empties {}
    by_id: 3
    doubles: [ 1e300, -0.25, inf, nan ]
  )pb");
  EXPECT_EQ(ToYaml(*m),
            "i32: -5\n"
            "i64: -9000000000\n"
            "u64: 18446744073709551615\n"
            "d: 0.1\n"
            "f: 1.5\n"
            "b: true\n"
            "s: \"yes\"\n"
            "raw: AP8=\n"
            "color: RED\n"
            "inner:\n"
            "  label: \"\"\n"
            "  values:\n"
            "    - 1\n"
            "    - 2\n"
            "items:\n"
            "  - label: \"a: b\"\n"
            "    values: []\n"
            "  - label: \"\"\n"
            "    values: []\n"
            "tags:\n"
            "  - x\n"
            "  - \"\"\n"
            "empty: {}\n"
            "empties:\n"
            "  - {}\n"
            "by_id: 3\n"  // The oneof's other member is left out.
            "doubles:\n"
            "  - 1.0e+300\n"  // YAML 1.1 (PyYAML) wants the dot.
            "  - -0.25\n"
            "  - .inf\n"
            "  - .nan\n");
}

TEST_F(ToYamlTest, DefaultsShownUnsetMessagesAndOneofsLeftOut) {
  EXPECT_EQ(ToYaml(*Outer("")),
            "i32: 0\n"
            "i64: 0\n"
            "u64: 0\n"
            "d: 0\n"
            "f: 0\n"
            "b: false\n"
            "s: \"\"\n"
            "raw: \"\"\n"
            "color: COLOR_UNSPECIFIED\n"
            "items: []\n"
            "tags: []\n"
            "empties: []\n"
            "doubles: []\n");
  auto by_name = Outer("by_name: \"node-a\"");
  EXPECT_THAT(ToYaml(*by_name), HasSubstr("\nempties: []\nby_name: node-a\ndoubles: []\n"));
  // An enum number the schema does not name (proto3 enums are open).
  auto unknown = Outer("");
  unknown->GetReflection()->SetEnumValue(unknown.get(), outer_->FindFieldByName("color"), 7);
  EXPECT_THAT(ToYaml(*unknown), HasSubstr("\ncolor: 7\n"));
}

TEST_F(ToYamlTest, EmptyMessage) {
  EXPECT_EQ(ToYaml(v1::ListJobsRequest()), "{}\n");
  EXPECT_EQ(ToYaml(v1::ListJobsResponse()), "jobs: []\n");
}

// Strings that YAML would misread unless quoted, and the parser's view of
// them: yaml-cpp gives a quoted scalar the tag "!" (a string whatever it
// looks like) and a plain one "?" (resolved by its text: bool, number, ...).
const std::vector<std::string>& TrickyStrings() {
  static const auto* const kStrings = new std::vector<std::string>{
      "a: b",        "key:",      "x #y",     " lead",      "trail ",      "yes",
      "No",          "off",       "null",     "~",          "123",         "-1",
      "0x1F",        "1e3",       ".inf",     "12:30",      "2027-01-15",  "line\nbreak",
      "two\nlines\n", "tab\there", "cr\r",     "- x",        "[x]",         "{x}",
      "*alias",      "&anchor",   "!tag",     "#comment",   "'q",          "\"q",
      "back\\slash", "",          "jöb",      "del\x7f",    "quote\" and \\ with: colon"};
  return *kStrings;
}

TEST_F(ToYamlTest, ParsesBackToTheSameValues) {
  auto m = Outer(R"pb(
    i32: -5
    i64: -9000000000
    u64: 18446744073709551615
    d: 0.1
    f: 1.5
    b: true
    color: RED
    inner { label: "yes" values: [ 1, -2 ] }
    items { label: "123" }
    doubles: [ 1e300, -0.25, inf, nan, 2.5e-7 ]
  )pb");
  const google::protobuf::Reflection* r = m->GetReflection();
  for (const std::string& t : TrickyStrings()) {
    r->AddString(m.get(), outer_->FindFieldByName("tags"), t);
  }
  const std::string text = ToYaml(*m);
  YAML::Node y;
  ASSERT_NO_THROW(y = YAML::Load(text)) << text;
  EXPECT_EQ(y["i32"].as<int32_t>(), -5);
  EXPECT_EQ(y["i64"].as<int64_t>(), -9000000000);
  EXPECT_EQ(y["u64"].as<uint64_t>(), 18446744073709551615u);
  EXPECT_EQ(y["d"].as<double>(), 0.1);
  EXPECT_EQ(y["f"].as<double>(), 1.5);
  EXPECT_TRUE(y["b"].as<bool>());
  EXPECT_EQ(y["s"].as<std::string>(), "");
  EXPECT_EQ(y["color"].as<std::string>(), "RED");
  for (const char* key : {"i32", "i64", "u64", "d", "f", "b", "color"}) {
    EXPECT_EQ(y[key].Tag(), "?") << key << " should be plain";
  }
  EXPECT_EQ(y["inner"]["label"].as<std::string>(), "yes");
  EXPECT_EQ(y["inner"]["label"].Tag(), "!");
  EXPECT_EQ(y["inner"]["values"][1].as<int>(), -2);
  ASSERT_TRUE(y["items"].IsSequence());
  ASSERT_EQ(y["items"].size(), 1u);
  EXPECT_EQ(y["items"][0]["label"].as<std::string>(), "123");
  EXPECT_EQ(y["items"][0]["label"].Tag(), "!");
  EXPECT_TRUE(y["items"][0]["values"].IsSequence());
  EXPECT_EQ(y["items"][0]["values"].size(), 0u);
  EXPECT_TRUE(y["empties"].IsSequence());
  EXPECT_EQ(y["doubles"][0].as<double>(), 1e300);
  EXPECT_EQ(y["doubles"][1].as<double>(), -0.25);
  EXPECT_TRUE(std::isinf(y["doubles"][2].as<double>()));
  EXPECT_TRUE(std::isnan(y["doubles"][3].as<double>()));
  EXPECT_EQ(y["doubles"][4].as<double>(), 2.5e-7);
  const YAML::Node tags = y["tags"];
  ASSERT_TRUE(tags.IsSequence());
  ASSERT_EQ(tags.size(), TrickyStrings().size());
  for (size_t i = 0; i < tags.size(); ++i) {
    const std::string& want = TrickyStrings()[i];
    EXPECT_EQ(tags[i].as<std::string>(), want) << "in\n" << text;
    // Plain only where the text is a string whatever the resolver does.
    if (tags[i].Tag() == "?") {
      EXPECT_THAT(want, ::testing::AnyOf("jöb", "back\\slash")) << "left plain";
    }
  }
}

TEST(ToYamlAdminTest, RequestParsesBack) {
  v1::ReplacementRequest r = PendingRequest();
  r.set_node_name("123");
  r.set_reason("replay: rank 3\n  diagnostic: FAILED # see node-b");
  r.mutable_transitions(0)->set_actor("no");
  r.mutable_transitions(0)->set_reason(" leading space");
  const YAML::Node y = YAML::Load(ToYaml(r));
  EXPECT_EQ(y["id"].as<uint64_t>(), 7u);
  EXPECT_EQ(y["node_name"].as<std::string>(), "123");
  EXPECT_EQ(y["node_name"].Tag(), "!");
  EXPECT_EQ(y["state"].as<std::string>(), "PENDING");
  EXPECT_EQ(y["reason"].as<std::string>(), "replay: rank 3\n  diagnostic: FAILED # see node-b");
  EXPECT_EQ(y["gpu_uuids"][0].as<std::string>(), "GPU-3");
  EXPECT_EQ(y["incident_ids"][0].as<uint64_t>(), 4u);
  ASSERT_EQ(y["transitions"].size(), 1u);
  EXPECT_EQ(y["transitions"][0]["actor"].as<std::string>(), "no");
  EXPECT_EQ(y["transitions"][0]["actor"].Tag(), "!");
  EXPECT_EQ(y["transitions"][0]["reason"].as<std::string>(), " leading space");
  EXPECT_EQ(y["created_unix_ms"].as<int64_t>(), 1799999700000);
}

TEST(ToYamlAdminTest, RequestWithTransitionsAndEvidence) {
  v1::ReplacementRequest r = PendingRequest();
  r.set_reason("replay: rank 3");
  r.mutable_transitions(0)->set_reason("replay: rank 3");
  *r.add_evidence() = ReplayIncident();
  r.mutable_evidence(0)->clear_explanation();
  r.mutable_evidence(0)->clear_differing_tensors();
  const std::string yaml = ToYaml(r);
  EXPECT_THAT(yaml, StartsWith("id: 7\n"
                               "node_name: node-b\n"
                               "state: PENDING\n"
                               "gpu_uuids:\n"
                               "  - GPU-3\n"
                               "incident_ids:\n"
                               "  - 4\n"
                               "reason: \"replay: rank 3\"\n"
                               "created_unix_ms: 1799999700000\n"));
  EXPECT_THAT(yaml, HasSubstr("\ntransitions:\n"
                              "  - from: PENDING\n"
                              "    to: PENDING\n"
                              "    at_unix_ms: 1799999700000\n"
                              "    actor: sdcd\n"
                              "    reason: \"replay: rank 3\"\n"));
  EXPECT_THAT(yaml, HasSubstr("\nevidence:\n"
                              "  - id: 4\n"
                              "    job_id: job-a\n"
                              "    step: 120\n"
                              "    check: CHECK_REPLAY\n"
                              "    outcome: faulty\n"
                              "    ranks:\n"
                              "      - 3\n"
                              "    node_names:\n"
                              "      - node-b\n"
                              "    gpu_uuids:\n"
                              "      - GPU-3\n"
                              "    confirmed: true\n"
                              "    explanation: \"\"\n"
                              "    differing_tensors: []\n"
                              "    created_unix_ms: 1799999941000\n"
                              "    request_id: 7\n"));
  EXPECT_THAT(yaml, HasSubstr("\naction: replace\n"));
  EXPECT_THAT(yaml, HasSubstr("\nactuator: \"\"\n"));
}

TEST(ToYamlAdminTest, ListsOfEachKind) {
  const std::string jobs = Kind("jobs").Format(TwoJobs(), OutputFormat::kYaml, kNow);
  EXPECT_THAT(jobs, StartsWith("jobs:\n  - job_id: job-a\n"));
  EXPECT_THAT(jobs, HasSubstr("\n  - job_id: job-a\n"
                              "    world_size: 8\n"
                              "    attached_ranks: 8\n"
                              "    last_step: 120\n"
                              "    created_unix_ms: 1799999280000\n"
                              "    open_incidents: 1\n"
                              "    nodes: 2\n"));
  EXPECT_THAT(jobs, HasSubstr("\n  - job_id: job-b\n"
                              "    world_size: 16\n"
                              "    attached_ranks: 12\n"
                              "    last_step: 7\n"
                              "    created_unix_ms: 1799740800000\n"
                              "    open_incidents: 0\n"));
  const std::string suspects = Kind("suspects").Format(TwoSuspects(), OutputFormat::kYaml, kNow);
  EXPECT_THAT(suspects, StartsWith("suspects:\n  - gpu_uuid: GPU-3\n"));
  EXPECT_THAT(suspects, HasSubstr("\n  - gpu_uuid: GPU-5\n"
                                  "    node_name: node-c\n"
                                  "    job_id: job-b\n"
                                  "    rank: 5\n"
                                  "    reason: \"\"\n"
                                  "    incidents: 1\n"
                                  "    targeted_audits_left: 3\n"
                                  "    since_unix_ms: 0\n"));
  const std::string incidents = Kind("incidents").Format(TwoIncidents(), OutputFormat::kYaml, kNow);
  EXPECT_THAT(incidents, StartsWith("incidents:\n  - id: 4\n    job_id: job-a\n"));
  EXPECT_THAT(incidents, HasSubstr("\n  - id: 9\n    job_id: job-b\n    step: 7\n"
                                   "    check: CHECK_WEIGHTS\n    outcome: suspect\n"
                                   "    ranks:\n      - 5\n      - 6\n"));
  v1::HistoryRequest by_gpu;
  by_gpu.set_gpu_uuid("GPU-3");
  EXPECT_EQ(ToYaml(by_gpu), "gpu_uuid: GPU-3\n");
}

TEST(YamlStringTest, QuotesOnlyWhatYamlWouldMisread) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plain", "plain"},
      {"GPU-3", "GPU-3"},
      {"node-b.cluster.local", "node-b.cluster.local"},
      {"a:b", "a:b"},
      {"x#y", "x#y"},
      {"it's", "it's"},
      {"say \"hi\"", "say \"hi\""},
      {"back\\slash", "back\\slash"},
      {"/tmp/x", "/tmp/x"},
      {"jöb", "jöb"},
      {"", "\"\""},
      {"true", "\"true\""},
      {"No", "\"No\""},
      {"off", "\"off\""},
      {"null", "\"null\""},
      {"~", "\"~\""},
      {"=", "\"=\""},
      {"<<", "\"<<\""},
      {"123", "\"123\""},
      {"-1", "\"-1\""},
      {".5", "\".5\""},
      {"1e3", "\"1e3\""},
      {".inf", "\".inf\""},
      {"-.inf", "\"-.inf\""},
      {"2027-01-15", "\"2027-01-15\""},
      {"a: b", "\"a: b\""},
      {"key:", "\"key:\""},
      {"x #y", "\"x #y\""},
      {"- x", "\"- x\""},
      {"-x", "-x"},  // '-' not followed by a space starts a plain scalar.
      {"?x", "?x"},
      {"? x", "\"? x\""},
      {"12:30", "\"12:30\""},  // YAML 1.1 reads a sexagesimal int.
      {"yes", "\"yes\""},
      {"Y", "\"Y\""},
      {"*alias", "\"*alias\""},
      {"&anchor", "\"&anchor\""},
      {"!tag", "\"!tag\""},
      {"{x}", "\"{x}\""},
      {"[x]", "\"[x]\""},
      {"|x", "\"|x\""},
      {">x", "\">x\""},
      {"%x", "\"%x\""},
      {"@x", "\"@x\""},
      {"`x", "\"`x\""},
      {"'q", "\"'q\""},
      {"\"q", "\"\\\"q\""},
      {" lead", "\" lead\""},
      {"trail ", "\"trail \""},
      {"line\nbreak", "\"line\\nbreak\""},
      {"tab\there", "\"tab\\there\""},
      {"cr\r", "\"cr\\r\""},
      {std::string("nul\0x", 5), "\"nul\\x00x\""},
      {"esc\x1b", "\"esc\\x1b\""},
      {"del\x7f", "\"del\\x7f\""},
      {"quote\" and \\ with: colon", "\"quote\\\" and \\\\ with: colon\""},
  };
  for (const auto& [text, want] : cases) {
    EXPECT_EQ(YamlString(text), want) << "for \"" << text << "\"";
  }
}

// ---------------------------------------------------------------------------
// describe, approve, deny

TEST(DescribeRequestTest, HistoryAndEvidence) {
  v1::ReplacementRequest r = DoneRequest();
  *r.add_evidence() = WeightsIncident();  // Incident 10 is missing from the evidence.
  EXPECT_EQ(Describe("request", r),
            "Request:          12\n"
            "Node:             node-c\n"
            "State:            Done\n"
            "Action:           reboot\n"
            "GPUs:             GPU-5,GPU-6\n"
            "Incidents:        9,10\n"
            "Reason:           weights vote\n"
            "Created:          2027-01-13T03:00:00Z (2d ago)\n"
            "Updated:          2027-01-15T07:00:00Z (1h ago)\n"
            "Actuator:         eks\n"
            "Actuator Result:  labelled node-c\n"
            "Transitions:\n"
            "  TIME                   TRANSITION              ACTOR          REASON\n"
            "  2027-01-13T03:00:00Z   Pending -> Pending      sdcd           weights vote\n"
            "  2027-01-13T03:01:00Z   Pending -> Approved     alice          confirmed by replay\n"
            "  2027-01-13T03:01:10Z   Approved -> Executing   actuator:eks   <none>\n"
            "  2027-01-15T07:00:00Z   Executing -> Done       actuator:eks   labelled node-c\n"
            "Evidence:\n"
            "  Incident 9:\n"
            "    Job:          job-b\n"
            "    Step:         7\n"
            "    Check:        weights\n"
            "    Outcome:      suspect\n"
            "    Ranks:        5,6\n"
            "    Nodes:        node-c\n"
            "    GPUs:         <none>\n"
            "    Attributed:   no\n"
            "    Evidence:     proven\n"
            "    Tensors:      <none>\n"
            "    Explanation:  <none>\n"
            "    Created:      2027-01-15T07:00:00Z (1h ago)\n"
            "  Incident 10:  <not returned by sdcd>\n");
}

TEST(DescribeRequestTest, AttributedEvidence) {
  v1::ReplacementRequest r = PendingRequest();
  *r.add_evidence() = ReplayIncident();
  const std::string out = Describe("request", r);
  EXPECT_THAT(out, HasSubstr("State:            Pending\n"));
  EXPECT_THAT(out, HasSubstr("Actuator:         <none>\n"));
  EXPECT_THAT(out, HasSubstr("  Incident 4:\n"
                             "    Job:          job-a\n"
                             "    Step:         120\n"
                             "    Check:        replay\n"
                             "    Outcome:      faulty\n"
                             "    Ranks:        3\n"
                             "    Nodes:        node-b\n"
                             "    GPUs:         GPU-3\n"
                             "    Attributed:   yes\n"
                             "    Evidence:     proven\n"
                             "    Tensors:      layer.0.weight,layer.1.bias\n"
                             "    Explanation:  rank 3 differs from its replay on node-a\n"
                             "    Created:      2027-01-15T07:59:01Z (59s ago)\n"));
  EXPECT_THAT(out, Not(HasSubstr("not returned")));
}

TEST(DescribeRequestTest, NothingRecorded) {
  v1::ReplacementRequest r;
  r.set_id(3);
  EXPECT_EQ(Describe("request", r),
            "Request:          3\n"
            "Node:             <none>\n"
            "State:            Unknown\n"
            "Action:           <none>\n"
            "GPUs:             <none>\n"
            "Incidents:        <none>\n"
            "Reason:           <none>\n"
            "Created:          <unknown>\n"
            "Updated:          <unknown>\n"
            "Actuator:         <none>\n"
            "Actuator Result:  <none>\n"
            "Transitions:  <none>\n"
            "Evidence:  <none>\n");
}

TEST(ApprovalNoticeTest, ReplaceWarnsThatLocalVolumesAreWiped) {
  EXPECT_EQ(ApprovalNotice(PendingRequest()),
            "Approving request 7: node node-b will be marked for replacement by the configured "
            "actuator. On SageMaker HyperPod, replacing a node terminates the instance and "
            "wipes its local volumes (instance store, /tmp, local NVMe); jobs on it must "
            "restart from their last checkpoint.\n");
}

TEST(ApprovalNoticeTest, Reboot) {
  EXPECT_EQ(ApprovalNotice(DoneRequest()),
            "Approving request 12: node node-c will be marked for reboot by the configured "
            "actuator. On SageMaker HyperPod, rebooting a node restarts the instance; jobs on "
            "it must restart from their last checkpoint.\n");
}

TEST(FormatDecisionTest, EveryFormat) {
  const v1::ReplacementRequest r = PendingRequest();
  EXPECT_EQ(FormatDecision(r, /*approved=*/true, /*dry_run=*/false, OutputFormat::kTable),
            "request 7 approved\n");
  EXPECT_EQ(FormatDecision(r, /*approved=*/true, /*dry_run=*/true, OutputFormat::kTable),
            "request 7 approved (dry run: nothing changed)\n");
  EXPECT_EQ(FormatDecision(r, /*approved=*/false, /*dry_run=*/false, OutputFormat::kWide),
            "request 7 denied\n");
  EXPECT_EQ(FormatDecision(r, /*approved=*/false, /*dry_run=*/true, OutputFormat::kTable),
            "request 7 denied (dry run: nothing changed)\n");
  EXPECT_EQ(FormatDecision(r, /*approved=*/true, /*dry_run=*/false, OutputFormat::kName),
            "request/7\n");
  EXPECT_EQ(FormatDecision(r, /*approved=*/true, /*dry_run=*/false, OutputFormat::kYaml),
            ToYaml(r));
  EXPECT_EQ(FormatDecision(r, /*approved=*/true, /*dry_run=*/false, OutputFormat::kJson),
            ToJson(r));
}

// ---------------------------------------------------------------------------
// Nodes and diagnostics

v1::ListNodesResponse TwoNodes() {
  v1::ListNodesResponse r;
  v1::Node* a = r.add_nodes();
  a->set_node_name("hyperpod-i-0123456789abcdef0");
  a->set_hostname("ip-10-1-0-31");
  a->set_instance_id("i-0123456789abcdef0");
  for (uint32_t i = 0; i < 8; ++i) {
    v1::GpuIdentity* g = a->add_gpus();
    g->set_uuid(absl::StrCat("GPU-", i));
    g->set_model("NVIDIA H100 80GB HBM3");
    g->set_index(i);
  }
  a->set_agent_version("0.1.0");
  a->set_status(v1::NODE_READY);
  a->set_last_heartbeat_unix_ms(MillisAgo(absl::Seconds(12)));
  v1::Node* b = r.add_nodes();
  b->set_node_name("node-b");
  b->set_hostname("node-b");
  b->set_gpu_note("NVML: cannot load libnvidia-ml.so.1");
  b->set_agent_version("0.1.0");
  b->set_status(v1::NODE_DISCONNECTED);
  b->set_last_heartbeat_unix_ms(MillisAgo(absl::Minutes(7)));
  return r;
}

v1::DiagnosticResult DeviceResultFor(const std::string& gpu, const std::string& device,
                                     uint64_t mismatches, const std::string& error = "") {
  v1::DiagnosticResult r;
  r.set_id(3);
  r.set_gpu(gpu);
  r.set_device(device);
  r.set_pass(mismatches == 0 && error.empty());
  r.set_mismatches(mismatches);
  r.set_max_abs_error(mismatches == 0 ? 0 : 1);
  r.set_gflops(error.empty() ? 41234.56 : 0);
  r.set_seconds(error.empty() ? 0.0521 : 0);
  r.set_size(1024);
  r.set_repetitions(3);
  r.set_device_count(2);
  r.set_detail(error.empty() ? "ran" : "");
  r.set_error(error);
  return r;
}

v1::Diagnostic DiagnosticOf(v1::DiagnosticState state, std::vector<v1::DiagnosticResult> results,
                            const std::string& error = "") {
  v1::Diagnostic d;
  d.set_id(3);
  d.set_node_name("node-b");
  d.set_size(1024);
  d.set_repetitions(3);
  d.set_state(state);
  for (auto& r : results) *d.add_results() = r;
  d.set_error(error);
  d.set_requested_unix_ms(MillisAgo(absl::Minutes(2)));
  return d;
}

TEST(FormatNodesTest, TableWideName) {
  EXPECT_EQ(Kind("nodes").Format(TwoNodes(), OutputFormat::kTable, kNow),
            "NAME                           INSTANCE              GPUS   STATUS         AGE\n"
            "hyperpod-i-0123456789abcdef0   i-0123456789abcdef0   8      Ready          12s\n"
            "node-b                         <none>                0      Disconnected   7m\n");
  EXPECT_EQ(Kind("nodes").Format(TwoNodes(), OutputFormat::kWide, kNow),
            "NAME                           HOSTNAME       INSTANCE              GPUS   "
            "GPU-MODEL               STATUS         AGENT   AGE\n"
            "hyperpod-i-0123456789abcdef0   ip-10-1-0-31   i-0123456789abcdef0   8      "
            "NVIDIA H100 80GB HBM3   Ready          0.1.0   12s\n"
            "node-b                         node-b         <none>                0      "
            "<none>                  Disconnected   0.1.0   7m\n");
  EXPECT_EQ(Kind("nodes").Format(TwoNodes(), OutputFormat::kName, kNow),
            "node/hyperpod-i-0123456789abcdef0\nnode/node-b\n");
  EXPECT_EQ(Kind("nodes").Format(v1::ListNodesResponse(), OutputFormat::kTable, kNow), "");
  EXPECT_EQ(Kind("nodes").Format(v1::ListNodesResponse(), OutputFormat::kYaml, kNow),
            "nodes: []\n");
}

TEST(DescribeNodeTest, IdentityGpusAndDiagnostics) {
  v1::Node n = TwoNodes().nodes(0);
  n.mutable_gpus()->DeleteSubrange(2, 6);
  n.set_heartbeat_interval_ms(30'000);
  n.set_registered_unix_ms(MillisAgo(absl::Hours(2)));
  *n.add_diagnostics() =
      DiagnosticOf(v1::DIAGNOSTIC_FAILED, {DeviceResultFor("GPU-0", "cuda:0", 0),
                                           DeviceResultFor("GPU-1", "cuda:1", 4)});
  EXPECT_EQ(Describe("node", n),
            "Node:            hyperpod-i-0123456789abcdef0\n"
            "Hostname:        ip-10-1-0-31\n"
            "Instance:        i-0123456789abcdef0\n"
            "Status:          Ready\n"
            "Agent:           0.1.0\n"
            "Heartbeat:       every 30s\n"
            "Last Heartbeat:  2027-01-15T07:59:48Z (12s ago)\n"
            "Registered:      2027-01-15T06:00:00Z (2h ago)\n"
            "GPUs:\n"
            "  INDEX   UUID    MODEL\n"
            "  0       GPU-0   NVIDIA H100 80GB HBM3\n"
            "  1       GPU-1   NVIDIA H100 80GB HBM3\n"
            "Diagnostics:\n"
            "  NAME   STATE    GPU   SIZE   REPETITIONS   DEVICES   MISMATCHES   AGE\n"
            "  3      Failed   all   1024   3             2         4            2m\n");
  const v1::Node b = TwoNodes().nodes(1);
  EXPECT_THAT(Describe("node", b),
              HasSubstr("GPUs:  <none> (NVML: cannot load libnvidia-ml.so.1)\n"
                        "Diagnostics:  <none>\n"));
}

TEST(FormatDiagnosticTest, PassedFailedNoVerdictRunning) {
  const v1::Diagnostic passed = DiagnosticOf(
      v1::DIAGNOSTIC_PASSED,
      {DeviceResultFor("GPU-0", "cuda:0", 0), DeviceResultFor("GPU-1", "cuda:1", 0)});
  EXPECT_EQ(FormatDiagnostic(passed, OutputFormat::kTable),
            "diagnostic 3 on node node-b: PASSED (1024x1024 fp32, 3 repetitions; every element "
            "matched the reference bit for bit)\n"
            "DEVICE   GPU     RESULT   MISMATCHES   MAX-ABS-ERROR   GFLOP/S   SECONDS\n"
            "cuda:0   GPU-0   pass     0            0               41234.6   0.052\n"
            "cuda:1   GPU-1   pass     0            0               41234.6   0.052\n");
  EXPECT_EQ(DiagnosticExitCode(passed), 0);

  const v1::Diagnostic failed = DiagnosticOf(
      v1::DIAGNOSTIC_FAILED, {DeviceResultFor("GPU-0", "cuda:0", 0),
                              DeviceResultFor("GPU-1", "cuda:1", 1)});
  EXPECT_EQ(FormatDiagnostic(failed, OutputFormat::kWide),
            "diagnostic 3 on node node-b: FAILED (1024x1024 fp32, 3 repetitions; 1 device "
            "computed wrong values, 1 element differs)\n"
            "DEVICE   GPU     RESULT   MISMATCHES   MAX-ABS-ERROR   GFLOP/S   SECONDS   DETAIL\n"
            "cuda:0   GPU-0   pass     0            0               41234.6   0.052     ran\n"
            "cuda:1   GPU-1   FAIL     1            1               41234.6   0.052     ran\n");
  EXPECT_EQ(DiagnosticExitCode(failed), kExitDiagnosticFailed);
  EXPECT_EQ(kExitDiagnosticFailed, 7);

  const v1::Diagnostic no_cuda = DiagnosticOf(
      v1::DIAGNOSTIC_ERROR, {DeviceResultFor("GPU-0", "cuda:0", 0, "CUDA is not usable")});
  EXPECT_EQ(FormatDiagnostic(no_cuda, OutputFormat::kTable),
            "diagnostic 3 on node node-b: NO VERDICT (cuda:0: CUDA is not usable)\n"
            "DEVICE   GPU     RESULT   MISMATCHES   MAX-ABS-ERROR   GFLOP/S   SECONDS\n"
            "cuda:0   GPU-0   error    0            0               0.0       0.000\n");
  EXPECT_EQ(DiagnosticExitCode(no_cuda), kExitDiagnosticNoVerdict);
  EXPECT_EQ(kExitDiagnosticNoVerdict, 8);

  const v1::Diagnostic lost =
      DiagnosticOf(v1::DIAGNOSTIC_ERROR, {}, "the agent's stream ended before it answered");
  EXPECT_EQ(FormatDiagnostic(lost, OutputFormat::kTable),
            "diagnostic 3 on node node-b: NO VERDICT (the agent's stream ended before it "
            "answered)\n");
  const v1::Diagnostic running = DiagnosticOf(v1::DIAGNOSTIC_RUNNING, {});
  EXPECT_EQ(FormatDiagnostic(running, OutputFormat::kTable),
            "diagnostic 3 on node node-b: still running (1024x1024 fp32, 3 repetitions); see "
            "sdcctl describe node node-b\n");
  EXPECT_EQ(DiagnosticExitCode(running), kExitDiagnosticNoVerdict);
  EXPECT_EQ(FormatDiagnostic(running, OutputFormat::kName), "diagnostic/3\n");
  EXPECT_EQ(FormatDiagnostic(running, OutputFormat::kJson), ToJson(running));
}

TEST(NamesTest, NodeStatusesAndDiagnosticStates) {
  EXPECT_EQ(NodeStatusName(v1::NODE_READY), "Ready");
  EXPECT_EQ(NodeStatusName(v1::NODE_STALE), "Stale");
  EXPECT_EQ(NodeStatusName(v1::NODE_DISCONNECTED), "Disconnected");
  EXPECT_EQ(NodeStatusName(v1::NODE_STATUS_UNSPECIFIED), "Unknown");
  EXPECT_EQ(DiagnosticStateName(v1::DIAGNOSTIC_RUNNING), "Running");
  EXPECT_EQ(DiagnosticStateName(v1::DIAGNOSTIC_PASSED), "Passed");
  EXPECT_EQ(DiagnosticStateName(v1::DIAGNOSTIC_FAILED), "Failed");
  EXPECT_EQ(DiagnosticStateName(v1::DIAGNOSTIC_ERROR), "Error");
  EXPECT_EQ(DiagnosticStateName(v1::DIAGNOSTIC_STATE_UNSPECIFIED), "Unknown");
  // A value from a newer sdcd.
  EXPECT_EQ(DiagnosticStateName(static_cast<v1::DiagnosticState>(99)), "Unknown");
  EXPECT_EQ(StateName(static_cast<v1::RequestState>(99)), "Unknown");
  EXPECT_EQ(CheckName(static_cast<v1::CheckKind>(99)), "unknown");
}

TEST(SelectorTest, ParsesTermsAndRejectsMalformedOnes) {
  absl::StatusOr<Selector> s = ParseSelector("node=node-a, state==pending");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (Selector{{"node", "node-a"}, {"state", "pending"}}));
  for (const char* bad : {"", "node", "=x", "node=", "a=b,,c=d"}) {
    absl::StatusOr<Selector> r = ParseSelector(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("want key=value"));
  }
}

TEST(SelectorTest, FiltersEachResourceByItsLabels) {
  v1::ListIncidentsResponse incidents;
  v1::Incident* a = incidents.add_incidents();
  a->set_id(1);
  a->set_job_id("job-a");
  a->set_check(v1::CHECK_REPLAY);
  a->add_node_names("node-a");
  a->add_node_names("node-b");
  a->add_gpu_uuids("GPU-1");
  v1::Incident* b = incidents.add_incidents();
  b->set_id(2);
  b->set_job_id("job-b");
  b->add_node_names("node-b");
  b->set_resolved_by("alice");
  v1::ListIncidentsResponse all = incidents;
  ASSERT_TRUE(Kind("incidents").Filter({}, &all).ok());
  EXPECT_EQ(all.incidents_size(), 2);
  v1::ListIncidentsResponse by_node = incidents;
  ASSERT_TRUE(Kind("incidents").Filter({{"node", "node-b"}}, &by_node).ok());
  EXPECT_EQ(by_node.incidents_size(), 2);  // Any of an incident's nodes matches.
  v1::ListIncidentsResponse both = incidents;
  ASSERT_TRUE(Kind("incidents").Filter({{"node", "node-b"}, {"check", "replay"}}, &both).ok());
  ASSERT_EQ(both.incidents_size(), 1);
  EXPECT_EQ(both.incidents(0).id(), 1u);
  v1::ListIncidentsResponse resolved = incidents;
  ASSERT_TRUE(Kind("incidents").Filter({{"state", "resolved"}}, &resolved).ok());
  ASSERT_EQ(resolved.incidents_size(), 1);
  EXPECT_EQ(resolved.incidents(0).id(), 2u);

  v1::ListRequestsResponse requests;
  requests.add_requests()->set_state(v1::PENDING);
  requests.add_requests()->set_state(v1::DENIED);
  ASSERT_TRUE(Kind("requests").Filter({{"state", "denied"}}, &requests).ok());
  ASSERT_EQ(requests.requests_size(), 1);
  EXPECT_EQ(requests.requests(0).state(), v1::DENIED);

  v1::ListJobsResponse jobs;
  absl::Status s = Kind("jobs").Filter({{"gpu", "GPU-1"}}, &jobs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "label \"gpu\" does not apply to jobs (labels: job)");
}

TEST(WithoutHeadersTest, DropsTheFirstLine) {
  EXPECT_EQ(WithoutHeaders("NAME   AGE\na      1s\nb      2s\n"), "a      1s\nb      2s\n");
  EXPECT_EQ(WithoutHeaders(""), "");
}

TEST(DescribeRequestTest, ApprovalsShownWhenMoreThanOneIsRequired) {
  v1::ReplacementRequest r;
  r.set_id(3);
  r.set_state(v1::PENDING);
  EXPECT_THAT(Describe("request", r), Not(HasSubstr("Approvals")));
  r.set_approvals_required(2);
  EXPECT_THAT(Describe("request", r), HasSubstr("Approvals:  <none> (0 of 2 required)\n"));
  r.add_approvals()->set_operator_("alice");
  EXPECT_THAT(Describe("request", r), HasSubstr("Approvals:  alice (1 of 2 required)\n"));
}

TEST(DescribeIncidentTest, EveryFieldWithItsRequestAndResolution) {
  v1::Incident i;
  i.set_id(4);
  i.set_job_id("job-a");
  i.set_check(v1::CHECK_WEIGHTS);
  i.set_request_id(2);
  i.set_resolved_by("alice");
  const std::string out = Describe("incident", i);
  EXPECT_THAT(out, StartsWith("Incident:     4\nJob:          job-a\n"));
  EXPECT_THAT(out, HasSubstr("Check:        weights\n"));
  EXPECT_THAT(out, HasSubstr("Request:      request/2\n"));
  EXPECT_THAT(out, HasSubstr("Resolved By:  alice\n"));
}

TEST(OperatorsFormatTest, TableNameAndRoles) {
  v1::ListOperatorsResponse r;
  v1::Operator* o = r.add_operators();
  o->set_name("alice");
  o->set_role(v1::ROLE_ADMIN);
  o->set_created_by("root");
  o->set_created_unix_ms(MillisAgo(absl::Minutes(5)));
  EXPECT_EQ(Kind("operators").Format(r, OutputFormat::kTable, kNow),
            "NAME    ROLE    CREATED-BY   STATUS    AGE\nalice   admin   root         Pending   5m\n");
  o->set_active(true);
  o->set_approved_by("bob");
  EXPECT_EQ(Kind("operators").Format(r, OutputFormat::kTable, kNow),
            "NAME    ROLE    CREATED-BY   STATUS   AGE\nalice   admin   root         Active   5m\n");
  EXPECT_EQ(Kind("operators").Format(r, OutputFormat::kName, kNow), "operator/alice\n");
  EXPECT_EQ(*ParseRole("Viewer"), v1::ROLE_VIEWER);
  EXPECT_EQ(ParseRole("root").status().code(), absl::StatusCode::kInvalidArgument);
}


// ---------------------------------------------------------------------------
// What the table of resources makes possible beyond the cases above.

TEST(DescribeJobTest, SummaryRanksAndIncidents) {
  Related related;
  v1::Rank* r0 = related.ranks.add_ranks();
  r0->mutable_placement()->set_rank(0);
  r0->mutable_placement()->set_node_name("node-a");
  r0->mutable_placement()->set_gpu_uuid("GPU-0");
  r0->set_attached(true);
  r0->set_checks_through_step(120);
  r0->set_identity("node-a");
  r0->set_proof("relay");
  v1::Rank* r3 = related.ranks.add_ranks();
  r3->mutable_placement()->set_rank(3);
  r3->mutable_placement()->set_node_name("node-b");
  r3->set_checks_through_step(110);
  *related.incidents.add_incidents() = ReplayIncident();
  EXPECT_EQ(Describe("job", TwoJobs().jobs(0), related),
            "Job:             job-a\n"
            "World Size:      8\n"
            "Attached Ranks:  8\n"
            "Nodes:           2\n"
            "Last Step:       120\n"
            "Open Incidents:  1\n"
            "Created:         2027-01-15T07:48:00Z (12m ago)\n"
            "Ranks:\n"
            "  RANK   NODE     GPU      ATTACHED   CHECKED-THROUGH   PROVEN-BY\n"
            "  0      node-a   GPU-0    yes        120               relay\n"
            "  3      node-b   <none>   no         110               unauthenticated\n"
            "Incidents:\n"
            "  Incident 4:\n"
            "    Job:          job-a\n"
            "    Step:         120\n"
            "    Check:        replay\n"
            "    Outcome:      faulty\n"
            "    Ranks:        3\n"
            "    Nodes:        node-b\n"
            "    GPUs:         GPU-3\n"
            "    Attributed:   yes\n"
            "    Evidence:     proven\n"
            "    Tensors:      layer.0.weight,layer.1.bias\n"
            "    Explanation:  rank 3 differs from its replay on node-a\n"
            "    Created:      2027-01-15T07:59:01Z (59s ago)\n");
  EXPECT_THAT(Describe("job", TwoJobs().jobs(1)),
              HasSubstr("Ranks:  <none>\nIncidents:  <none>\n"));
}

TEST(DescribeIncidentTest, ResolvedAtGetsItsOwnBlock) {
  v1::Incident i = WeightsIncident();
  i.set_resolved_by("alice");
  i.set_resolution("drained by hand");
  i.set_resolved_unix_ms(MillisAgo(absl::Minutes(3)));
  EXPECT_EQ(Describe("incident", i),
            "Incident:     9\n"
            "Job:          job-b\n"
            "Step:         7\n"
            "Check:        weights\n"
            "Outcome:      suspect\n"
            "Ranks:        5,6\n"
            "Nodes:        node-c\n"
            "GPUs:         <none>\n"
            "Attributed:   no\n"
            "Evidence:     proven\n"
            "Tensors:      <none>\n"
            "Explanation:  <none>\n"
            "Created:      2027-01-15T07:00:00Z (1h ago)\n"
            "Request:      <none>\n"
            "Resolved By:  alice\n"
            "Resolution:   drained by hand\n"
            "Resolved:  2027-01-15T07:57:00Z (3m ago)\n");
}

// describe -o name|json|yaml: the item alone, whatever the kind.
TEST(FormatOneTest, NameJsonAndYamlOfOneItem) {
  const v1::ReplacementRequest r = PendingRequest();
  EXPECT_EQ(Kind("request").FormatOne(r, {}, OutputFormat::kName, kNow), "request/7\n");
  EXPECT_EQ(Kind("request").FormatOne(r, {}, OutputFormat::kJson, kNow), ToJson(r));
  EXPECT_EQ(Kind("request").FormatOne(r, {}, OutputFormat::kYaml, kNow), ToYaml(r));
  EXPECT_EQ(Kind("request").FormatOne(r, {}, OutputFormat::kWide, kNow), Describe("request", r));
  const v1::Job j = TwoJobs().jobs(0);
  EXPECT_EQ(Kind("job").FormatOne(j, {}, OutputFormat::kName, kNow), "job/job-a\n");
  EXPECT_EQ(Kind("node").FormatOne(TwoNodes().nodes(1), {}, OutputFormat::kName, kNow),
            "node/node-b\n");
  EXPECT_EQ(Kind("incident").FormatOne(ReplayIncident(), {}, OutputFormat::kName, kNow),
            "incident/4\n");
}

TEST(FormatOperatorsTest, WideIsTheTableAndRoleIsALabel) {
  v1::ListOperatorsResponse r;
  for (const auto& [name, role] : std::vector<std::pair<std::string, v1::OperatorRole>>{
           {"alice", v1::ROLE_ADMIN}, {"bob", v1::ROLE_VIEWER}, {"carol", v1::ROLE_ADMIN}}) {
    v1::Operator* o = r.add_operators();
    o->set_name(name);
    o->set_role(role);
    o->set_created_by("root");
    o->set_active(true);
    o->set_created_unix_ms(MillisAgo(absl::Hours(2)));
  }
  const std::string table =
      "NAME    ROLE     CREATED-BY   STATUS   AGE\n"
      "alice   admin    root         Active   2h\n"
      "bob     viewer   root         Active   2h\n"
      "carol   admin    root         Active   2h\n";
  EXPECT_EQ(Kind("operators").Format(r, OutputFormat::kTable, kNow), table);
  EXPECT_EQ(Kind("operators").Format(r, OutputFormat::kWide, kNow), table);
  ASSERT_TRUE(Kind("operators").Filter({{"role", "admin"}}, &r).ok());
  EXPECT_EQ(Kind("operators").Format(r, OutputFormat::kName, kNow),
            "operator/alice\noperator/carol\n");
  EXPECT_EQ(Kind("operators").Filter({{"node", "x"}}, &r).message(),
            "label \"node\" does not apply to operators (labels: role)");
}

// Filtering keeps the matching items in their order, whatever lies between.
TEST(SelectorTest, KeepsTheOrderOfWhatMatches) {
  v1::ListSuspectsResponse r;
  for (const char* node : {"a", "b", "a", "c", "a", "b"}) {
    v1::Suspect* s = r.add_suspects();
    s->set_node_name(node);
    s->set_gpu_uuid(absl::StrCat("GPU-", r.suspects_size()));
  }
  ASSERT_TRUE(Kind("suspects").Filter({{"node", "a"}}, &r).ok());
  EXPECT_EQ(Kind("suspects").Format(r, OutputFormat::kName, kNow),
            "suspect/GPU-1\nsuspect/GPU-3\nsuspect/GPU-5\n");
  ASSERT_TRUE(Kind("suspects").Filter({{"node", "b"}}, &r).ok());
  EXPECT_EQ(Kind("suspects").Count(r), 0);
}

TEST(SelectorTest, NodesMatchByAnyGpuAndLowerCaseStatus) {
  v1::ListNodesResponse nodes = TwoNodes();
  ASSERT_TRUE(Kind("nodes").Filter({{"gpu", "GPU-7"}, {"status", "ready"}}, &nodes).ok());
  EXPECT_EQ(Kind("nodes").Format(nodes, OutputFormat::kName, kNow),
            "node/hyperpod-i-0123456789abcdef0\n");
  nodes = TwoNodes();
  EXPECT_EQ(Kind("nodes").Filter({{"state", "ready"}}, &nodes).message(),
            "label \"state\" does not apply to nodes (labels: node, gpu, status)");
  EXPECT_EQ(Kind("nodes").Count(nodes), 2);  // Untouched.
}

// Every resource, as a table: NAME first and AGE last in both formats, wide
// a superset of the table in the same order, the empty list prints nothing,
// names are kind/NAME, and every label key filters.
TEST(ResourceTableTest, EveryResourceKeepsTheLayoutRules) {
  std::vector<std::string> plurals;
  for (const Resource& r : Resources()) plurals.push_back(r.plural());
  EXPECT_EQ(plurals, (std::vector<std::string>{"requests", "incidents", "suspects", "jobs",
                                               "nodes", "operators"}));
  for (const Resource& r : Resources()) {
    SCOPED_TRACE(r.plural());
    EXPECT_EQ(FindResource(r.kind()), &r);
    std::unique_ptr<google::protobuf::Message> list = r.NewList();
    const Row table = r.Rows(*list, /*wide=*/false, "", kNow)[0];
    const Row wide = r.Rows(*list, /*wide=*/true, "", kNow)[0];
    EXPECT_EQ(table.front(), "NAME");
    EXPECT_EQ(table.back(), "AGE");
    EXPECT_EQ(wide.front(), "NAME");
    EXPECT_EQ(wide.back(), "AGE");
    size_t w = 0;
    for (const std::string& column : table) {
      while (w < wide.size() && wide[w] != column) ++w;
      EXPECT_LT(w, wide.size()) << column << " missing from wide, or out of order";
    }
    EXPECT_EQ(r.Format(*list, OutputFormat::kTable, kNow), "");
    EXPECT_EQ(r.Format(*list, OutputFormat::kName, kNow), "");
    EXPECT_THAT(r.Format(*list, OutputFormat::kYaml, kNow), HasSubstr(": []\n"));
    EXPECT_FALSE(r.label_keys().empty());
    for (const std::string& key : r.label_keys()) {
      EXPECT_TRUE(r.CheckSelector({{key, "x"}}).ok()) << key;
    }
    EXPECT_EQ(r.CheckSelector({{"colour", "x"}}).code(), absl::StatusCode::kInvalidArgument);
  }
}

// describe's kinds and how each is named.
TEST(ResourceTableTest, DescribableKindsAndTheirKeys) {
  std::vector<std::string> kinds;
  for (const Resource& r : Resources()) {
    if (!r.describable()) continue;
    kinds.push_back(absl::StrCat(r.kind(), " ", r.key().placeholder));
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"request ID", "incident ID", "job NAME",
                                             "node NAME"}));
  EXPECT_EQ(*Kind("request").key().Parse("request/7"), "7");
  EXPECT_EQ(Kind("request").key().Parse("0").status().message(),
            "bad request id \"0\" (want a positive integer)");
  EXPECT_EQ(*Kind("node").key().Parse("node/node-b"), "node-b");
  // A job id is whatever the trainer sent.
  EXPECT_EQ(*Kind("job").key().Parse("job/team-a"), "job/team-a");
}

TEST(FormatHistoryTest, WideAndJson) {
  v1::HistoryResponse h;
  *h.add_incidents() = WeightsIncident();
  *h.add_requests() = DoneRequest();
  EXPECT_EQ(
      FormatHistory(h, OutputFormat::kWide, kNow),
      "NAME         JOB     STEP   CHECK     OUTCOME   RANKS   NODES    ATTRIBUTED   GPUS     "
      "TENSORS   EXPLANATION   AGE\n"
      "incident/9   job-b   7      weights   suspect   5,6     node-c   no           <none>   "
      "<none>    <none>        1h\n"
      "\n"
      "NAME         NODE     STATE   ACTION   GPUS          INCIDENTS   REASON         "
      "LAST-ACTOR     APPROVALS   AGE\n"
      "request/12   node-c   Done    reboot   GPU-5,GPU-6   9,10        weights vote   "
      "actuator:eks   0/1         2d\n");
  EXPECT_EQ(FormatHistory(h, OutputFormat::kJson, kNow), ToJson(h));
}

TEST(WhoAmITest, EveryFormat) {
  v1::WhoAmIResponse r;
  r.set_name("alice");
  r.set_role(v1::ROLE_OPERATOR);
  r.set_approvals_required(2);
  r.set_server_version("0.2.0");
  EXPECT_EQ(FormatWhoAmI(r, OutputFormat::kTable),
            "Name:                alice\n"
            "Role:                operator\n"
            "Approvals Required:  2\n"
            "Server Version:      0.2.0\n");
  EXPECT_EQ(FormatWhoAmI(r, OutputFormat::kName), "operator/alice\n");
  EXPECT_EQ(FormatWhoAmI(r, OutputFormat::kYaml), ToYaml(r));
  v1::Operator added;
  added.set_name("bob");
  added.set_role(v1::ROLE_VIEWER);
  EXPECT_EQ(OperatorAddedNotice(added),
            "operator/bob added (role viewer). Its token follows, shown this once: give it to "
            "bob to keep in a file only they can read (token_file in sdcctl.yaml).\n");
}

}  // namespace
}  // namespace sdc::sdcctl
