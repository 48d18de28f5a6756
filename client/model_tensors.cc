#include "client/model_tensors.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/device.h"
#include "client/tensor_checks.h"
#include "kernels/model_digest.h"

namespace sdc::client {

absl::StatusOr<ModelTensors> ModelTensors::Create(NamedTensors parameters, NamedTensors frozen,
                                                  NamedTensors buffers, bool vote_buffers) {
  if (frozen.names.size() != frozen.tensors.size()) {
    return absl::InvalidArgumentError("a name for every frozen parameter is required");
  }
  if (parameters.tensors.empty()) {
    return absl::InvalidArgumentError("the model has no trainable parameters");
  }
  if (parameters.names.size() != parameters.tensors.size() ||
      buffers.names.size() != buffers.tensors.size()) {
    return absl::InvalidArgumentError("a name for every parameter and buffer is required");
  }
  for (size_t i = 0; i < parameters.tensors.size(); ++i) {
    const std::string& name = parameters.names[i];
    if (!parameters.tensors[i].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " is undefined"));
    }
    if (absl::StatusOr<kernels::DType> d = DTypeOf(parameters.tensors[i]); !d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", d.status().message()));
    }
  }
  ModelTensors m;
  m.parameter_names_ = std::move(parameters.names);
  m.parameters_ = std::move(parameters.tensors);
  m.frozen_names_ = std::move(frozen.names);
  m.frozen_ = std::move(frozen.tensors);
  m.buffer_names_ = std::move(buffers.names);
  m.buffers_ = std::move(buffers.tensors);
  m.vote_buffers_ = vote_buffers;
  m.weight_names_ = m.parameter_names_;
  m.weight_names_.insert(m.weight_names_.end(), m.frozen_names_.begin(), m.frozen_names_.end());
  if (vote_buffers) {
    m.weight_names_.insert(m.weight_names_.end(), m.buffer_names_.begin(), m.buffer_names_.end());
  }
  // One device for the whole model, one the kernels can read (a CUDA
  // tensor's pointer is device memory: with no usable GPU it is refused,
  // never read; see ARCHITECTURE.md, "The CUDA path").
  m.device_ = m.parameters_.front().device();
  std::vector<std::string> names = m.parameter_names_;
  names.insert(names.end(), m.frozen_names_.begin(), m.frozen_names_.end());
  names.insert(names.end(), m.buffer_names_.begin(), m.buffer_names_.end());
  std::vector<torch::Tensor> all = m.parameters_;
  all.insert(all.end(), m.frozen_.begin(), m.frozen_.end());
  all.insert(all.end(), m.buffers_.begin(), m.buffers_.end());
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("buffer ", names[i], " is undefined"));
    }
    if (all[i].device() != m.device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          names[i], " is on ", all[i].device().str(), ", ", names.front(), " on ",
          m.device_.str(), ": the guard needs the model on one device"));
    }
  }
  SDC_TORCH_TRY({
    for (const torch::Tensor& b : m.buffers_) m.forward_buffers_.push_back(b.detach().clone());
  });
  if (absl::Status s = CheckDevice(m.device_); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(m.weight_names_.front(), " is on ",
                                               m.device_.str(), ": ", s.message()));
  }
  return m;
}

std::vector<torch::Tensor> ModelTensors::Weights(bool live) const {
  std::vector<torch::Tensor> all = parameters_;
  all.insert(all.end(), frozen_.begin(), frozen_.end());
  if (vote_buffers_) {
    const auto& buffers = live ? buffers_ : forward_buffers_;
    all.insert(all.end(), buffers.begin(), buffers.end());
  }
  return all;
}

void ModelTensors::CaptureForwardBuffers() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) forward_buffers_[i].copy_(buffers_[i]);
}

void ModelTensors::ClearGradients() {
  for (const torch::Tensor& p : parameters_) {
    torch::Tensor param = p;
    param.mutable_grad() = torch::Tensor();
  }
}

kernels::Fingerprint ModelTensors::AbsentGradient(const kernels::FingerprintKey& key,
                                                  size_t index) const {
  // Rare (a parameter the step did not use), so zeros are made each time;
  // on the CPU, since every path fingerprints the same bytes alike.
  const torch::Tensor& p = parameters_[index];
  return Fingerprints(key, {torch::zeros(p.sizes(), p.options().device(torch::kCPU))})[0];
}

uint64_t ModelTensors::AuditDigest(const std::vector<kernels::Fingerprint>& gradients,
                                   const std::vector<kernels::Fingerprint>& buffers) const {
  kernels::ModelDigestBuilder d;
  for (size_t i = 0; i < gradients.size(); ++i) d.Add(parameter_names_[i], gradients[i]);
  for (size_t i = 0; i < buffers.size(); ++i) d.Add(buffer_names_[i], buffers[i]);
  return d.Finish();
}

uint64_t ModelTensors::LayoutDigest() const {
  const std::vector<torch::Tensor> weights = Weights();
  kernels::ModelDigestBuilder layout;
  for (size_t i = 0; i < weights.size(); ++i) {
    layout.Add(weight_names_[i],
               {static_cast<uint64_t>(weights[i].numel()) * weights[i].element_size(), 0, 0});
  }
  return layout.Finish();
}

}  // namespace sdc::client
