#include "client/model_tensors.h"

#include <string>

#include "client/tensor_checks.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

NamedTensors Parameters() {
  return {{"w", "b"},
          {torch::ones({2, 3}, torch::requires_grad()), torch::zeros({2}, torch::requires_grad())}};
}
NamedTensors Frozen() { return {{"embedding"}, {torch::full({4}, 2.0f)}}; }
NamedTensors Buffers() { return {{"running_mean"}, {torch::zeros({3})}}; }

absl::StatusCode CreateCode(NamedTensors p, NamedTensors f, NamedTensors b) {
  return ModelTensors::Create(std::move(p), std::move(f), std::move(b), true).status().code();
}

TEST(ModelTensorsTest, CreateRefusesWhatTheKernelsCannotCheck) {
  EXPECT_EQ(CreateCode({}, {}, {}), absl::StatusCode::kInvalidArgument);
  NamedTensors unnamed = Parameters();
  unnamed.names.pop_back();
  EXPECT_EQ(CreateCode(unnamed, {}, {}), absl::StatusCode::kInvalidArgument);
  NamedTensors unnamed_frozen = Frozen();
  unnamed_frozen.names.clear();
  EXPECT_EQ(CreateCode(Parameters(), unnamed_frozen, {}), absl::StatusCode::kInvalidArgument);
  NamedTensors unnamed_buffer = Buffers();
  unnamed_buffer.names.push_back("extra");
  EXPECT_EQ(CreateCode(Parameters(), {}, unnamed_buffer), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCode({{"w"}, {torch::Tensor()}}, {}, {}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCode(Parameters(), {}, {{"undefined"}, {torch::Tensor()}}),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ModelTensors> integer =
      ModelTensors::Create({{"steps"}, {torch::zeros({3}, torch::kInt64)}}, {}, {}, true);
  EXPECT_EQ(integer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(integer.status().message()).find("steps"), std::string::npos);
  // Tensors on two devices (the meta device: no data, never read).
  absl::StatusOr<ModelTensors> split = ModelTensors::Create(
      Parameters(), {{"elsewhere"}, {torch::zeros({2}, torch::Device(torch::kMeta))}}, {}, true);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(split.status().message()).find("one device"), std::string::npos)
      << split.status();
}

TEST(ModelTensorsTest, WeightsAreParametersFrozenThenTheForwardsBuffers) {
  absl::StatusOr<ModelTensors> m = ModelTensors::Create(Parameters(), Frozen(), Buffers(), true);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->weight_names(),
            (std::vector<std::string>{"w", "b", "embedding", "running_mean"}));
  const torch::Tensor live = m->buffers()[0];
  {
    torch::NoGradGuard no_grad;
    torch::Tensor(live).fill_(7);  // A forward updating its running statistics.
  }
  std::vector<torch::Tensor> w = m->Weights();
  ASSERT_EQ(w.size(), 4u);
  EXPECT_TRUE(w[0].is_same(m->parameters()[0])) << "the model's tensors, not copies";
  EXPECT_TRUE(w[2].is_same(m->frozen()[0]));
  EXPECT_EQ(w[3].sum().item<float>(), 0) << "the buffers as the step's forward read them";
  EXPECT_TRUE(m->Weights(/*live=*/true)[3].is_same(live));
  m->CaptureForwardBuffers();
  EXPECT_EQ(m->Weights()[3].sum().item<float>(), 21);
  EXPECT_FALSE(m->Weights()[3].is_same(live));

  absl::StatusOr<ModelTensors> unvoted =
      ModelTensors::Create(Parameters(), Frozen(), Buffers(), /*vote_buffers=*/false);
  ASSERT_TRUE(unvoted.ok()) << unvoted.status();
  EXPECT_EQ(unvoted->weight_names(), (std::vector<std::string>{"w", "b", "embedding"}));
  EXPECT_EQ(unvoted->Weights().size(), 3u);
  EXPECT_EQ(unvoted->buffers().size(), 1u);
}

TEST(ModelTensorsTest, GradientsClearToUndefinedAndAbsentOnesAreZerosOfTheirSize) {
  absl::StatusOr<ModelTensors> m = ModelTensors::Create(Parameters(), {}, {}, true);
  ASSERT_TRUE(m.ok()) << m.status();
  torch::Tensor w = m->parameters()[0];
  w.mutable_grad() = torch::ones({2, 3});
  m->ClearGradients();
  EXPECT_FALSE(w.grad().defined());
  const kernels::FingerprintKey key = kernels::FingerprintKey::FromSeed(9);
  EXPECT_EQ(m->AbsentGradient(key, 0).byte_length, 24u);
  EXPECT_EQ(m->AbsentGradient(key, 1).byte_length, 8u);
  // A reducer's zero-filled gradient has the same fingerprint as none (under
  // the keyed fingerprint that is not {n, 0, 0}).
  EXPECT_EQ(Fingerprints(key, {torch::zeros({2, 3})})[0], m->AbsentGradient(key, 0));
  EXPECT_NE(m->AbsentGradient(key, 0), (kernels::Fingerprint{24, 0, 0}));
}

TEST(ModelTensorsTest, DigestsSeeWhatTheyCover) {
  absl::StatusOr<ModelTensors> m = ModelTensors::Create(Parameters(), Frozen(), Buffers(), true);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<kernels::Fingerprint> grads = {{24, 1, 1}, {8, 2, 2}};
  const uint64_t audit = m->AuditDigest(grads, {{12, 3, 3}});
  EXPECT_NE(audit, m->AuditDigest(grads, {{12, 3, 4}})) << "buffers after the forward count";
  EXPECT_NE(audit, m->AuditDigest({{24, 1, 1}, {8, 2, 3}}, {{12, 3, 3}}));
  // The layout is names and sizes, not values.
  const uint64_t layout = m->LayoutDigest();
  {
    torch::NoGradGuard no_grad;
    torch::Tensor(m->parameters()[0]).fill_(5);
  }
  EXPECT_EQ(m->LayoutDigest(), layout);
  absl::StatusOr<ModelTensors> wider = ModelTensors::Create(
      {{"w", "b"}, {torch::ones({2, 4}), torch::zeros({2})}}, Frozen(), Buffers(), true);
  ASSERT_TRUE(wider.ok());
  EXPECT_NE(wider->LayoutDigest(), layout);
}

}  // namespace
}  // namespace sdc::client
