// sdc::Guard on a one-rank Gloo group (the multi-rank behaviour is tested
// with real processes in tests/cluster_*_test.cc): what Create refuses, and
// the checkpoint ledger driven by the in-band vote when no coordinator is
// configured.

#include "client/guard.h"

#include <ATen/Context.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <limits>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/gloo_group.h"
#include "demo/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sdc {
namespace {

c10::intrusive_ptr<c10d::ProcessGroup> OneRankGroup(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::remove(path.c_str());
  return client::MakeGlooGroup(path, 0, 1);
}

client::GuardOptions InBandOptions() {
  client::GuardOptions o;
  o.job_id = "unit";
  o.node_name = "node-a";
  o.audit_every = 0;  // One rank has nobody to replay it.
  o.weight_check_every = 0;
  o.checkpoint_fallback = client::CheckpointFallback::kInBand;
  return o;
}

// The mean-squared-error loss_fn of `model` (a Linear or a Sequential) on
// batches {input, target}.
template <typename Model>
LossFn MseOf(Model& model) {
  return [&model](const std::vector<torch::Tensor>& b) {
    return torch::mse_loss(model->forward(b[0]), b[1]);
  };
}

// The value of the sample named exactly `series`, or -1.
double Sample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

TEST(GuardTest, MetricsFollowTheSteps) {
  auto pg = OneRankGroup("metrics");
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions o = InBandOptions();
  o.weight_check_every = 2;
  const int port = demo::FreeLoopbackPort();
  o.metrics_listen = absl::StrCat("127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(o, pg, *model, sgd, MseOf(model));
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string labels = "{rank=\"0\",sdc_job=\"unit\"}";
  absl::StatusOr<std::string> scraped = demo::HttpGet(port, "/metrics");
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  std::string text = *scraped;
  EXPECT_EQ(Sample(text, "sdc_trainer_steps_checked_total" + labels), 0) << text;
  EXPECT_EQ(Sample(text, "sdc_trainer_link_up" + labels), 0) << "no coordinator";
  for (uint64_t step = 1; step <= 3; ++step) {
    absl::StatusOr<StepDecision> d = (*g)->TrainStep(
        step, {{torch::randn({8, 4}), torch::randn({8, 2})}}, false, nullptr);
    ASSERT_TRUE(d.ok()) << d.status();
  }
  // A NaN in the batch makes the local gradients non-finite: skipped.
  torch::Tensor poisoned = torch::randn({8, 4});
  poisoned[0][0] = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<StepDecision> d =
      (*g)->TrainStep(4, {{poisoned, torch::randn({8, 2})}}, false, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->apply);
  scraped = demo::HttpGet(port, "/metrics");
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  text = *scraped;
  EXPECT_EQ(Sample(text, "sdc_trainer_steps_checked_total" + labels), 4) << text;
  EXPECT_EQ(Sample(text, "sdc_trainer_steps_skipped_total" + labels), 1) << text;
  EXPECT_EQ(Sample(text, "sdc_trainer_nonfinite_steps_total" + labels), 1) << text;
  EXPECT_EQ(Sample(text, "sdc_trainer_weight_checks_total" + labels), 2) << text;
  EXPECT_EQ(Sample(text, "sdc_trainer_audits_total" + labels), 0) << "audits are off";
  EXPECT_EQ(Sample(text, "sdc_trainer_audit_seconds_count" + labels), 0) << text;
  EXPECT_GT(Sample(text, "sdc_trainer_guard_seconds_total" + labels), 0) << text;
  (*g)->Shutdown(absl::ZeroDuration());
}

// Issue 43: a step that is no audit issues what a plain loop issues, the
// gradients' all-reduce (one bucket here), weight-check steps included; the
// guard's own agreement runs only when the reduced gradients hold NaN/Inf
// (every rank sees the same), and the counting group does see it then.
TEST(GuardTest, AnOrdinaryStepIssuesNoCollectiveOfItsOwn) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/counting";
  std::remove(path.c_str());
  auto issued = std::make_shared<std::atomic<int64_t>>(0);
  auto pg = client::MakeCountingGlooGroup(path, 0, 1, issued);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions o = InBandOptions();
  o.weight_check_every = 2;
  // The group's own all-reduce for the agreement: on one rank the rooted
  // exchange sends nothing, and the count would not show it.
  o.small_collectives = client::SmallCollectives::kBackend;
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(o, pg, *model, sgd, MseOf(model));
  ASSERT_TRUE(g.ok()) << g.status();
  // What a plain step issues: one all-reduce of the flat gradients.
  int64_t before = issued->load();
  std::vector<torch::Tensor> flat = {torch::zeros({10})};
  pg->allreduce(flat)->wait();
  const int64_t plain = issued->load() - before;
  ASSERT_EQ(plain, 1);
  for (uint64_t step = 1; step <= 4; ++step) {
    before = issued->load();
    absl::StatusOr<StepDecision> d = (*g)->TrainStep(
        step, {{torch::randn({8, 4}), torch::randn({8, 2})}}, false, nullptr);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->apply);
    EXPECT_EQ(issued->load() - before, plain) << "step " << step;
    EXPECT_EQ(d->agreement_ms, 0) << "no agreement at an ordinary step";
  }
  torch::Tensor poisoned = torch::randn({8, 4});
  poisoned[0][0] = std::numeric_limits<float>::quiet_NaN();
  before = issued->load();
  absl::StatusOr<StepDecision> d =
      (*g)->TrainStep(5, {{poisoned, torch::randn({8, 2})}}, false, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->apply);
  EXPECT_EQ(d->reason, "NaN/Inf in every rank's local gradients");
  EXPECT_GT(issued->load() - before, plain) << "the agreement ran";
  (*g)->Shutdown(absl::ZeroDuration());
}

TEST(GuardTest, AMetricsPortInUseFailsCreateNamingTheVariable) {
  auto pg = OneRankGroup("metrics-busy");
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  client::GuardOptions o = InBandOptions();
  o.metrics_listen = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(o, pg, *model, sgd, MseOf(model));
  close(fd);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kUnavailable) << g.status();
  EXPECT_NE(g.status().message().find("SDC_METRICS_LISTEN: "), std::string::npos) << g.status();
}

TEST(GuardTest, CreateRefusesWhatItCannotCheck) {
  auto pg = OneRankGroup("refuses");
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions no_job = InBandOptions();
  no_job.job_id.clear();
  EXPECT_EQ(Guard::Create(no_job, pg, *model, sgd, MseOf(model)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Guard::Create(InBandOptions(), pg, *model, sgd, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A tensor whose memory the host cannot read (here the meta device; on a
  // GPU cluster, CUDA) is refused with its name, never read.
  torch::nn::Module elsewhere;
  elsewhere.register_parameter("weight", torch::empty({2, 4}, torch::device(torch::kMeta)));
  torch::optim::SGD sgd2(elsewhere.parameters(), 0.1);
  LossFn unused = [](const std::vector<torch::Tensor>&) { return torch::zeros({}); };
  absl::StatusOr<std::unique_ptr<Guard>> g =
      Guard::Create(InBandOptions(), pg, elsewhere, sgd2, unused);
  ASSERT_EQ(g.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(g.status().message().find("weight is on meta"), std::string::npos)
      << g.status().message();
}

TEST(GuardTest, BeginStepRefusesMicroBatchesAnAuditCannotSend) {
  auto pg = OneRankGroup("limits");
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  absl::StatusOr<std::unique_ptr<Guard>> g =
      Guard::Create(InBandOptions(), pg, *model, sgd, MseOf(model));
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<torch::Tensor> fits = {torch::zeros({2, 4}), torch::zeros({2, 2})};
  EXPECT_TRUE((*g)->BeginStep(1, {fits}).ok());
  const std::vector<torch::Tensor> seven(7, torch::zeros({2}));
  absl::Status s = (*g)->BeginStep(2, {seven});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at most 6"), std::string::npos) << s.message();
  const std::vector<torch::Tensor> deep = {torch::zeros({1, 1, 1, 1, 1, 1, 2})};
  s = (*g)->BeginStep(3, {deep});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("7 dimensions"), std::string::npos) << s.message();
}

TEST(GuardTest, InBandCheckpointsAreProvisionalUntilTheNext) {
  auto pg = OneRankGroup("ledger");
  torch::manual_seed(7);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  absl::StatusOr<std::unique_ptr<Guard>> g =
      Guard::Create(InBandOptions(), pg, *model, sgd, MseOf(model));
  ASSERT_TRUE(g.ok()) << g.status();
  Guard& guard = **g;
  for (uint64_t step = 1; step <= 20; ++step) {
    const bool checkpoint = step % 10 == 0;
    double loss = 0;
    absl::StatusOr<StepDecision> d = guard.TrainStep(
        step, {{torch::randn({8, 4}), torch::randn({8, 2})}}, checkpoint, &loss);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->apply) << step << ": " << d->reason;
    if (!checkpoint) continue;
    absl::StatusOr<bool> may = guard.MayCheckpoint();
    ASSERT_TRUE(may.ok()) << may.status();
    EXPECT_TRUE(*may) << "the in-band vote allows it";
  }
  const protocol::CheckpointLedger& ledger = guard.Checkpoints();
  EXPECT_EQ(ledger.Of(10), protocol::CheckpointLedger::Standing::kFinal);
  EXPECT_EQ(ledger.Of(20), protocol::CheckpointLedger::Standing::kProvisional);
  EXPECT_EQ(guard.RefreshCheckpoints(absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "no coordinator to ask";
  EXPECT_EQ(guard.Summary().checkpoints_allowed, 2u);
  guard.Shutdown(absl::ZeroDuration());
}

// Issue 24, item 11: without a coordinator the fallback allowed a checkpoint
// whenever the replicas' digests agreed, even right after a step some GPU got
// wrong. A failed (skipped) step now vetoes the next checkpoint.
TEST(GuardTest, InBandFallbackVetoesTheCheckpointAfterAFailedCheck) {
  auto pg = OneRankGroup("inband-veto");
  torch::manual_seed(7);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions options = InBandOptions();
  options.faults = *client::ParseFaultSpecs("nan-gradient:0:step=5");
  absl::StatusOr<std::unique_ptr<Guard>> g =
      Guard::Create(options, pg, *model, sgd, MseOf(model));
  ASSERT_TRUE(g.ok()) << g.status();
  Guard& guard = **g;
  for (uint64_t step = 1; step <= 20; ++step) {
    const bool checkpoint = step % 10 == 0;
    double loss = 0;
    absl::StatusOr<StepDecision> d = guard.TrainStep(
        step, {{torch::randn({8, 4}), torch::randn({8, 2})}}, checkpoint, &loss);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->apply, step != 5) << step << ": " << d->reason;
    if (!checkpoint) continue;
    absl::StatusOr<bool> may = guard.MayCheckpoint();
    ASSERT_TRUE(may.ok()) << may.status();
    EXPECT_EQ(*may, step == 20) << "step " << step;
  }
  EXPECT_NE(guard.Summary().last_veto.find("in-band: a check failed since the last checkpoint "
                                           "(step 5: "),
            std::string::npos)
      << guard.Summary().last_veto;
  EXPECT_EQ(guard.Summary().checkpoints_allowed, 1u);
  guard.Shutdown(absl::ZeroDuration());
}

// A model using an op without a deterministic implementation (put_ here)
// trains through its first audit step (deterministic algorithms run
// warn-only), and audits are off for the job from then on.
TEST(GuardTest, AnOpWithoutADeterministicImplementationTurnsAuditsOff) {
  auto pg = OneRankGroup("nondeterministic");
  torch::nn::Linear model(4, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions o = InBandOptions();
  o.audit_every = 2;
  LossFn loss = [&model](const std::vector<torch::Tensor>& b) {
    torch::Tensor mask = torch::ones({2});
    mask.put_(torch::zeros({1}, torch::kLong), torch::ones({1}));
    return torch::mse_loss(model->forward(b[0]) * mask, b[1]);
  };
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(o, pg, *model, sgd, loss);
  ASSERT_TRUE(g.ok()) << g.status();
  const bool deterministic_before = at::globalContext().deterministicAlgorithms();
  for (uint64_t step = 1; step <= 4; ++step) {
    std::vector<std::vector<torch::Tensor>> batches = {{torch::ones({3, 4}), torch::zeros({3, 2})}};
    absl::StatusOr<StepDecision> d = (*g)->TrainStep(step, std::move(batches), false, nullptr);
    ASSERT_TRUE(d.ok()) << "step " << step << ": " << d.status();
    EXPECT_TRUE(d->apply) << step;
    EXPECT_FALSE(d->audited) << step;
    EXPECT_EQ(d->audit_outcome, step == 2 ? "audits_off" : "") << step;
    EXPECT_EQ(at::globalContext().deterministicAlgorithms(), deterministic_before) << step;
  }
  EXPECT_NE((*g)->Summary().audits_off.find("put_ has no deterministic implementation"),
            std::string::npos)
      << (*g)->Summary().audits_off;
  EXPECT_EQ((*g)->Summary().audits, 0u);
}

// The every-step tests' model: a 16-32-4 tanh MLP from seed 0 (its
// forward runs two addmm, its backward three mm: the input needs no
// gradient).
torch::nn::Sequential TanhMlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 4));
}

// FrontEndOptions::every_step on one rank: clean steps raise no alarm and
// check every product (the MLP's forward addmm and backward mm); a product
// error injected at step 3 is caught there and the step skipped (weights
// untouched), and training goes on. The multi-rank job, with sdcd: tests/
// cluster_e2e_test.cc.
TEST(GuardTest, EveryStepChecksumsSkipAStepWithAWrongProduct) {
  auto pg = OneRankGroup("every-step");
  torch::nn::Sequential model = TanhMlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions o = InBandOptions();
  o.faults = *client::ParseFaultSpecs("product:0:step=3:2^-4");
  LossFn loss = MseOf(model);
  FrontEndOptions front_end;
  front_end.every_step = true;
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(o, pg, *model, sgd, loss, front_end);
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<torch::Tensor> before;
  for (uint64_t step = 1; step <= 5; ++step) {
    if (step == 3) {
      for (const torch::Tensor& p : model->parameters()) before.push_back(p.detach().clone());
    }
    absl::StatusOr<StepDecision> d = (*g)->TrainStep(
        step, {{torch::randn({8, 16}), torch::randn({8, 4})}}, false, nullptr);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->apply, step != 3) << step << ": " << d->reason;
    if (step == 3) {
      EXPECT_THAT(d->reason, ::testing::HasSubstr("checksum alarm at step 3 on rank 0"));
      EXPECT_THAT(d->reason, ::testing::HasSubstr("transient"));
      const std::vector<torch::Tensor> after = model->parameters();
      ASSERT_EQ(after.size(), before.size());
      for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i]));
    }
  }
  const ChecksumCounts c = (*g)->Checksums();
  EXPECT_TRUE(c.every_step);
  EXPECT_EQ(c.alarms, 1u);
  EXPECT_EQ(c.skips, 1u);
  EXPECT_EQ(c.unchecked, 0u);
  // Per step: 2 forward addmm, 3 backward mm (dW of each layer, dx of the
  // second; the input needs no gradient).
  EXPECT_EQ(c.checked, 5u * 5u);
  EXPECT_EQ((*g)->Summary().skipped, 1u);
  (*g)->Shutdown(absl::ZeroDuration());
}

// Issue 45: an error of 2^-6 times its column's checksum scale (fault kind
// product-column, the demo's) is above the column's threshold by
// construction: injected at every step, into whichever product and element
// the generator picks, forward or backward, each is caught and its step
// skipped, whatever the element's size within its column (the inputs'
// columns span eight decades here).
TEST(GuardTest, EveryStepChecksumsCatchEveryColumnScaledProductError) {
  auto pg = OneRankGroup("every-step-column");
  torch::nn::Sequential model = TanhMlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions o = InBandOptions();
  o.faults = *client::ParseFaultSpecs("product-column:0:from=1");
  LossFn loss = MseOf(model);
  FrontEndOptions front_end;
  front_end.every_step = true;
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(o, pg, *model, sgd, loss, front_end);
  ASSERT_TRUE(g.ok()) << g.status();
  const torch::Tensor scales = torch::pow(10.0, torch::linspace(-4, 4, 16));
  for (uint64_t step = 1; step <= 12; ++step) {
    absl::StatusOr<StepDecision> d = (*g)->TrainStep(
        step, {{torch::randn({8, 16}) * scales, torch::randn({8, 4})}}, false, nullptr);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_FALSE(d->apply) << step;
    EXPECT_THAT(d->reason, ::testing::HasSubstr(absl::StrCat("checksum alarm at step ", step)));
  }
  EXPECT_EQ((*g)->Checksums().alarms, 12u);
  EXPECT_EQ((*g)->Summary().skipped, 12u);
  (*g)->Shutdown(absl::ZeroDuration());
}

// GuardOptions::every_step (SDC_EVERY_STEP=1) switches the checksums on
// without FrontEndOptions: one step checks its 5 products.
TEST(GuardTest, EveryStepChecksumsFollowTheOptions) {
  auto pg = OneRankGroup("every-step-options");
  torch::nn::Sequential model = TanhMlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  client::GuardOptions o = InBandOptions();
  o.every_step = true;
  LossFn loss = MseOf(model);
  absl::StatusOr<std::unique_ptr<Guard>> g = Guard::Create(o, pg, *model, sgd, loss);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<StepDecision> d =
      (*g)->TrainStep(1, {{torch::randn({8, 16}), torch::randn({8, 4})}}, false, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->apply) << d->reason;
  const ChecksumCounts c = (*g)->Checksums();
  EXPECT_TRUE(c.every_step);
  EXPECT_EQ(c.checked, 5u);
  EXPECT_EQ(c.alarms, 0u);
  (*g)->Shutdown(absl::ZeroDuration());
}

TEST(OptimizerTensorsTest, EveryLibtorchOptimizerStateTensorIsRead) {
  torch::manual_seed(3);
  torch::nn::Linear model(4, 2);  // weight and bias
  const std::vector<torch::Tensor> params = model->parameters();
  auto one_step = [&](torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::mse_loss(model->forward(torch::randn({8, 4})), torch::randn({8, 2})).backward();
    opt.step();
  };
  torch::optim::Adam amsgrad(params, torch::optim::AdamOptions(1e-3).amsgrad(true));
  one_step(amsgrad);
  EXPECT_EQ(OptimizerTensors(amsgrad, params).size(), 6u) << "exp_avg, exp_avg_sq, max_exp_avg_sq";
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(1e-3).amsgrad(true));
  one_step(adamw);
  EXPECT_EQ(OptimizerTensors(adamw, params).size(), 6u);
  torch::optim::RMSprop rms(params,
                            torch::optim::RMSpropOptions(1e-3).momentum(0.9).centered(true));
  one_step(rms);
  EXPECT_EQ(OptimizerTensors(rms, params).size(), 6u) << "square_avg, momentum, grad_avg";
  torch::optim::Adagrad adagrad(params, torch::optim::AdagradOptions(1e-2));
  one_step(adagrad);
  EXPECT_EQ(OptimizerTensors(adagrad, params).size(), 2u) << "sum";
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  one_step(sgd);
  std::string unknown;
  EXPECT_EQ(OptimizerTensors(sgd, params, &unknown).size(), 2u);
  EXPECT_TRUE(unknown.empty()) << unknown;
}

}  // namespace
}  // namespace sdc
