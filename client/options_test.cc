#include "client/options.h"

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "protocol/types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

using ::testing::HasSubstr;

class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"SDC_COORDINATOR", "SDC_JOB_ID", "SDC_NODE_NAME", "SDC_GPU_UUID",
                          "LOCAL_RANK", "SDC_AUDIT_EVERY", "SDC_WEIGHT_CHECK_EVERY",
                          "SDC_INJECT_FAULT", "SDC_ALLOW_FAULT_INJECTION",
                          "SDC_CHECKPOINT_FALLBACK", "SDC_MAX_GRAD_NORM", "SDC_INCARNATION",
                          "SDC_TLS_CERT", "SDC_TLS_KEY", "SDC_VERDICT_WAIT_MS",
                          "SDC_SMALL_COLLECTIVES", "SDC_REPORT_LINGER_MS", "SDC_METRICS_LISTEN",
                          "TORCHELASTIC_RUN_ID", "PET_RDZV_ID", "SLURM_JOB_ID",
                          "TORCHELASTIC_RESTART_COUNT", "SDC_ATTEMPT", "SLURM_RESTART_COUNT",
                          "SDC_RESUME_STEP", "SDC_EVERY_STEP"}) {
      unsetenv(v);
    }
    setenv("SDC_JOB_ID", "job-1", 1);
  }
};

TEST_F(OptionsTest, ShardCoordinatesAreReadAndChecked) {
  using Vars = std::map<std::string, std::string>;
  absl::StatusOr<GuardOptions> none = OptionsFromVariables({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->shard_count, 0u);
  absl::StatusOr<GuardOptions> o = OptionsFromVariables(
      Vars{{"SDC_SHARD_INDEX", "1"}, {"SDC_SHARD_COUNT", "2"}, {"SDC_REPLICA_INDEX", "2"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->shard_index, 1u);
  EXPECT_EQ(o->shard_count, 2u);
  EXPECT_EQ(o->replica_index, 2u);
  for (const Vars& bad : {Vars{{"SDC_SHARD_INDEX", "2"}, {"SDC_SHARD_COUNT", "2"}},
                          Vars{{"SDC_SHARD_INDEX", "1"}},
                          Vars{{"SDC_REPLICA_INDEX", "1"}},
                          Vars{{"SDC_SHARD_COUNT", "4097"}},
                          Vars{{"SDC_SHARD_COUNT", "-1"}}}) {
    absl::StatusOr<GuardOptions> refused = OptionsFromVariables(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.begin()->first;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("SDC_SHARD_"));
  }
}

// SDC_EVERY_STEP switches the libtorch front end's every-step checksums
// on, as it does the Python package's: 0 or 1, off when unset.
TEST_F(OptionsTest, EveryStepIsReadFromTheEnvironment) {
  absl::StatusOr<GuardOptions> unset = OptionsFromEnvironment();
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_FALSE(unset->every_step);
  setenv("SDC_EVERY_STEP", "1", 1);
  absl::StatusOr<GuardOptions> on = OptionsFromEnvironment();
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->every_step);
  setenv("SDC_EVERY_STEP", "0", 1);
  absl::StatusOr<GuardOptions> off = OptionsFromEnvironment();
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->every_step);
  // An override takes the environment's place, as for every variable.
  absl::StatusOr<GuardOptions> overridden = OptionsFromVariables({{"SDC_EVERY_STEP", "1"}});
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_TRUE(overridden->every_step);
  for (const char* bad : {"yes", "2", "true"}) {
    setenv("SDC_EVERY_STEP", bad, 1);
    absl::StatusOr<GuardOptions> refused = OptionsFromEnvironment();
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(refused.status().message(), "SDC_EVERY_STEP: expected 0 or 1") << bad;
  }
  unsetenv("SDC_EVERY_STEP");
}

TEST_F(OptionsTest, MetricsListenIsOffByDefaultAndOffsetByLocalRank) {
  absl::StatusOr<GuardOptions> off = OptionsFromEnvironment();
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->metrics_listen, "");
  setenv("SDC_METRICS_LISTEN", "0.0.0.0:9470", 1);
  setenv("LOCAL_RANK", "3", 1);
  absl::StatusOr<GuardOptions> o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->metrics_listen, "0.0.0.0:9473");
  setenv("SDC_METRICS_LISTEN", "127.0.0.1:0", 1);  // Any free port: no offset.
  o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->metrics_listen, "127.0.0.1:0");
  for (const char* bad : {"9470", "host:port", "0.0.0.0:65534x", "0.0.0.0:70000"}) {
    setenv("SDC_METRICS_LISTEN", bad, 1);
    o = OptionsFromEnvironment();
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(o.status().message(), HasSubstr("SDC_METRICS_LISTEN")) << bad;
  }
  setenv("SDC_METRICS_LISTEN", "0.0.0.0:65534", 1);  // + LOCAL_RANK 3.
  o = OptionsFromEnvironment();
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("above 65535"));
}

TEST_F(OptionsTest, DefaultsAndEnvironment) {
  setenv("SDC_COORDINATOR", "sdcd:7400", 1);
  setenv("SDC_NODE_NAME", "node-a", 1);
  setenv("LOCAL_RANK", "3", 1);
  setenv("SDC_AUDIT_EVERY", "50", 1);
  setenv("SDC_VERDICT_WAIT_MS", "250", 1);
  setenv("SDC_INCARNATION", "7", 1);
  absl::StatusOr<GuardOptions> o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator, "sdcd:7400");
  EXPECT_EQ(o->job_id, "job-1");
  EXPECT_EQ(o->node_name, "node-a");
  EXPECT_EQ(o->local_rank, 3u);
  EXPECT_EQ(o->gpu_uuid, "cpu-node-a-3");
  EXPECT_FALSE(o->gpu_uuid_set) << "a model on a GPU reports its CUDA UUID instead";
  EXPECT_EQ(o->audit_every, 50u);
  EXPECT_EQ(o->weight_check_every, 10u);
  EXPECT_EQ(o->verdict_wait, absl::Milliseconds(250));
  EXPECT_EQ(o->incarnation, 7u);
  EXPECT_EQ(o->checkpoint_fallback, CheckpointFallback::kVeto);
  EXPECT_EQ(o->small_collectives, SmallCollectives::kAuto);
  EXPECT_EQ(o->report_linger, absl::Seconds(1));
  EXPECT_TRUE(o->faults.empty());
  setenv("SDC_REPORT_LINGER_MS", "0", 1);
  EXPECT_EQ(OptionsFromEnvironment()->report_linger, absl::ZeroDuration());
  setenv("SDC_SMALL_COLLECTIVES", "backend", 1);
  EXPECT_EQ(OptionsFromEnvironment()->small_collectives, SmallCollectives::kBackend);
  setenv("SDC_SMALL_COLLECTIVES", "rooted", 1);
  EXPECT_EQ(OptionsFromEnvironment()->small_collectives, SmallCollectives::kRooted);
}

TEST_F(OptionsTest, TheAttemptCountsTheOuterLauncherThenTorchrun) {
  absl::StatusOr<GuardOptions> o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->attempt_set) << "the guard counts its own";
  EXPECT_EQ(o->resume_step, 0u);
  setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);  // torchrun --max-restarts.
  o = OptionsFromEnvironment();
  EXPECT_TRUE(o->attempt_set);
  EXPECT_EQ(o->attempt, 3u);
  setenv("SLURM_RESTART_COUNT", "1", 1);  // A requeue: torchrun counts from 0 again.
  EXPECT_EQ(OptionsFromEnvironment()->attempt, 1000003u);
  setenv("SDC_ATTEMPT", "2", 1);  // Said by hand: before Slurm's.
  setenv("SDC_RESUME_STEP", "300", 1);
  o = OptionsFromEnvironment();
  EXPECT_EQ(o->attempt, 2000003u);
  EXPECT_EQ(o->resume_step, 300u);
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  EXPECT_EQ(OptionsFromEnvironment()->attempt, 2000000u);
  setenv("TORCHELASTIC_RESTART_COUNT", "1000000", 1);
  EXPECT_EQ(OptionsFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  setenv("TORCHELASTIC_RESTART_COUNT", "x", 1);
  o = OptionsFromEnvironment();
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("TORCHELASTIC_RESTART_COUNT"));
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  setenv("SDC_RESUME_STEP", "-1", 1);
  EXPECT_EQ(OptionsFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(OptionsTest, OverridesTakeThePlaceOfTheEnvironment) {
  setenv("SDC_AUDIT_EVERY", "50", 1);
  setenv("SDC_NODE_NAME", "from-env", 1);
  absl::StatusOr<GuardOptions> o =
      OptionsFromVariables({{"SDC_AUDIT_EVERY", "7"}, {"SDC_JOB_ID", "job-2"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->audit_every, 7u);
  EXPECT_EQ(o->job_id, "job-2");
  EXPECT_EQ(o->node_name, "from-env") << "what is not overridden comes from the environment";
  // Validated by the same code, named the same way.
  o = OptionsFromVariables({{"SDC_AUDIT_EVERY", "-1"}});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("SDC_AUDIT_EVERY: expected a non-negative integer"));
  // An empty override counts as unset, as an empty variable does.
  o = OptionsFromVariables({{"SDC_JOB_ID", ""}});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(OptionsTest, BadValuesNameTheVariable) {
  struct Case {
    const char* var;
    const char* value;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"SDC_AUDIT_EVERY", "often", "SDC_AUDIT_EVERY: expected a non-negative integer, got 'often'"},
           {"SDC_CHECKPOINT_FALLBACK", "maybe", "SDC_CHECKPOINT_FALLBACK: expected veto or in-band"},
           {"SDC_SMALL_COLLECTIVES", "ring", "SDC_SMALL_COLLECTIVES: expected auto, backend or rooted, got 'ring'"},
           {"SDC_REPORT_LINGER_MS", "-5", "SDC_REPORT_LINGER_MS: must not be negative"},
           {"SDC_REPORT_LINGER_MS", "600000", "SDC_REPORT_LINGER_MS: at most 60000"},
           {"SDC_MAX_GRAD_NORM", "-1", "SDC_MAX_GRAD_NORM: expected a non-negative number"},
           {"SDC_TLS_CERT", "/c.pem", "SDC_TLS_CERT and SDC_TLS_KEY go together"},
       }) {
    SetUp();
    setenv(c.var, c.value, 1);
    absl::StatusOr<GuardOptions> o = OptionsFromEnvironment();
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << c.var;
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(c.message));
  }
  unsetenv("SDC_JOB_ID");
  EXPECT_THAT(std::string(OptionsFromEnvironment().status().message()), HasSubstr("SDC_JOB_ID"));
}

// Issue 39, case 8: the in-band topology exchange cut names to 128 bytes
// while sdcd allowed 253, so two nodes whose names share the first 128
// bytes were one failure domain in-band and two at sdcd. Now the exchange
// carries protocol::kMaxNodeNameBytes, and a trainer refuses a longer (or
// unsafe) name at start, as sdcd does.
TEST_F(OptionsTest, ANodeNameSdcdWouldRefuseIsRefusedAtStart) {
  const std::string longest(protocol::kMaxNodeNameBytes, 'n');
  absl::StatusOr<GuardOptions> o = OptionsFromVariables({{"SDC_NODE_NAME", longest}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->node_name, longest);
  for (const std::string& bad :
       {longest + "n", std::string(300, 'a'), std::string("-node"), std::string("node a")}) {
    SCOPED_TRACE(bad);
    o = OptionsFromVariables({{"SDC_NODE_NAME", bad}});
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(o.status().message()), HasSubstr("is not a node name"));
    EXPECT_THAT(std::string(o.status().message()), HasSubstr("1 to 253 characters"));
    EXPECT_THAT(std::string(o.status().message()), HasSubstr("SDC_NODE_NAME"));
  }
  EXPECT_TRUE(CheckNodeName(longest).ok());
  EXPECT_EQ(CheckNodeName(longest + "n").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(OptionsTest, TheJobIdComesFromTheLauncherWhenNotGiven) {
  struct Case {
    std::map<std::string, std::string> vars;
    const char* id;
    const char* source;
  };
  for (const Case& c : std::vector<Case>{
           {{{"SDC_JOB_ID", "mine"}, {"TORCHELASTIC_RUN_ID", "run-7"}, {"SLURM_JOB_ID", "42"}},
            "mine", "SDC_JOB_ID"},
           {{{"TORCHELASTIC_RUN_ID", "run-7"}, {"PET_RDZV_ID", "pj"}, {"SLURM_JOB_ID", "42"}},
            "run-7", "TORCHELASTIC_RUN_ID"},
           // torchrun's static rendezvous without --rdzv_id says "none": not an id.
           {{{"TORCHELASTIC_RUN_ID", "none"}, {"PET_RDZV_ID", "pj"}, {"SLURM_JOB_ID", "42"}},
            "pj", "PET_RDZV_ID"},
           {{{"TORCHELASTIC_RUN_ID", "none"}, {"SLURM_JOB_ID", "42"}}, "42", "SLURM_JOB_ID"},
       }) {
    SetUp();
    unsetenv("SDC_JOB_ID");
    absl::StatusOr<GuardOptions> o = OptionsFromVariables(c.vars);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->job_id, c.id);
    EXPECT_EQ(o->job_id_source, c.source);
    absl::StatusOr<JobId> id = JobIdFromVariables(c.vars);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->id, c.id);
  }
  unsetenv("SDC_JOB_ID");
  absl::StatusOr<JobId> none = JobIdFromVariables({{"TORCHELASTIC_RUN_ID", "none"}});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("--rdzv_id"));
  absl::StatusOr<GuardOptions> o = OptionsFromVariables({{"TORCHELASTIC_RUN_ID", "none"}});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("SDC_JOB_ID: not set"));
}

TEST_F(OptionsTest, FaultInjectionNeedsTheExplicitAllowance) {
  setenv("SDC_INJECT_FAULT", "weight:2:step=5", 1);
  absl::StatusOr<GuardOptions> o = OptionsFromEnvironment();
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("refusing to corrupt a real job"));
  setenv("SDC_ALLOW_FAULT_INJECTION", "yes", 1);
  EXPECT_FALSE(OptionsFromEnvironment().ok()) << "only the exact phrase arms it";
  setenv("SDC_ALLOW_FAULT_INJECTION", "yes-i-am-testing", 1);
  o = OptionsFromEnvironment();
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->faults.size(), 1u);
  EXPECT_EQ(o->faults[0].kind, FaultKind::kWeight);
  EXPECT_EQ(o->faults[0].rank, 2u);
  EXPECT_EQ(o->faults[0].step, 5);
  EXPECT_EQ(o->faults[0].seed, 3u);
}

TEST(FaultSpecTest, ParsesAndFires) {
  absl::StatusOr<FaultPlan> p = ParseFaultSpec("activation-scale:3:step=40:10000");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->FiresAt(3, 40));
  EXPECT_FALSE(p->FiresAt(3, 41));
  EXPECT_FALSE(p->FiresAt(2, 40));
  EXPECT_EQ(p->magnitude, 10000);
  EXPECT_EQ(p->Describe(), "activation-scale on rank 3 at step 40 (x10000)");
  p = ParseFaultSpec("replay:1:from=10");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->FiresAt(1, 9));
  EXPECT_TRUE(p->FiresAt(1, 10));
  EXPECT_TRUE(p->FiresAt(1, 1000));
  // The error paths of a guarded step (issue 40, item 3).
  for (const char* kind : {"replay-error", "scan-error", "exchange-error"}) {
    p = ParseFaultSpec(absl::StrCat(kind, ":2:step=4"));
    ASSERT_TRUE(p.ok()) << kind;
    EXPECT_EQ(FaultKindName(p->kind), std::string(kind));
    EXPECT_TRUE(p->FiresAt(2, 4));
  }
  // A product's relative error (issue 45): 2^E or a number; 2^-6 by default.
  p = ParseFaultSpec("product:4:step=7:2^-8");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, FaultKind::kProduct);
  EXPECT_EQ(p->magnitude, 0x1p-8);
  EXPECT_TRUE(p->FiresAt(4, 7));
  EXPECT_EQ(p->Describe(), "product on rank 4 at step 7 (relative 0.00390625)");
  p = ParseFaultSpec("product:4:step=7");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->magnitude, 0x1p-6);
  p = ParseFaultSpec("product:4:step=7:0.5");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->magnitude, 0.5);
  // The same, times the column's checksum scale (the demo's --every_step).
  p = ParseFaultSpec("product-column:3:p=0.2");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, FaultKind::kProductColumn);
  EXPECT_EQ(p->magnitude, 0x1p-6);
  EXPECT_EQ(p->Describe(),
            "product-column on rank 3 with probability 0.2 per step (0.015625 x its column's "
            "checksum scale)");
  // One rank's optimizer update of its shard (issue 44 item 3): 2^-10 by default.
  p = ParseFaultSpec("shard-update:3:step=4");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, FaultKind::kShardUpdate);
  EXPECT_EQ(p->magnitude, 0x1p-10);
  EXPECT_TRUE(p->FiresAt(3, 4));
  EXPECT_FALSE(p->FiresAt(2, 4));
  EXPECT_EQ(p->Describe(), "shard-update on rank 3 at step 4 (relative 0.000976562)");
  // A probability fires on about that share of steps, the same on every run.
  p = ParseFaultSpec("mantissa-bitflip:0:p=0.25");
  ASSERT_TRUE(p.ok());
  int fired = 0;
  for (uint64_t s = 0; s < 10000; ++s) fired += p->FiresAt(0, s) ? 1 : 0;
  EXPECT_GT(fired, 2300);
  EXPECT_LT(fired, 2700);
  for (const char* bad : {"explode:1:step=2", "nan-gradient:x:step=2", "weight:1:when=3",
                          "weight:1:p=2", "weight:1", "activation-scale:1:step=2:big",
                          "product:1:step=2:2^x", "product:1:step=2:2^-9999"}) {
    EXPECT_EQ(ParseFaultSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(FaultSpecTest, SeveralRanksAtOnce) {
  absl::StatusOr<std::vector<FaultPlan>> p =
      ParseFaultSpecs("replay:1:step=15,activation-scale:3:step=15");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ(FaultFor(*p, 1).kind, FaultKind::kReplay);
  EXPECT_EQ(FaultFor(*p, 3).kind, FaultKind::kActivationScale);
  EXPECT_EQ(FaultFor(*p, 3).seed, 4u);
  EXPECT_FALSE(FaultFor(*p, 2).enabled());
  absl::StatusOr<std::vector<FaultPlan>> twice =
      ParseFaultSpecs("replay:1:step=15,weight:1:step=3");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("rank 1 is named twice"));
  EXPECT_FALSE(ParseFaultSpecs("replay:1:step=15,").ok()) << "an empty spec is a mistake";
}

}  // namespace
}  // namespace sdc::client
