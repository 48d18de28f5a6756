#ifndef SDC_CLIENT_MODEL_TENSORS_H_
#define SDC_CLIENT_MODEL_TENSORS_H_

// The model as the engine's parts see it: its trainable parameters, its
// frozen parameters and its buffers, each by name, as the model holds them
// (the tensors themselves, not copies), all on one device the kernels can
// read; and a copy of the buffers as the current step's forward read them.
// The weight vote's tensors (Weights) are the parameters, the frozen
// parameters and (when voted) that copy of the buffers, in that order.
//
// Thread-compatible: the training thread changes the tensors' values
// (training, replays, repairs); the lists never change after Create.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/engine_types.h"
#include "kernels/fingerprint.h"

namespace sdc::client {

class ModelTensors {
 public:
  // InvalidArgument for no parameters, a tensor without a name (or a name
  // without a tensor), an undefined tensor, a parameter of a dtype the
  // kernels do not read, or tensors on more than one device;
  // Unimplemented / FailedPrecondition (client::CheckDevice) when the
  // kernels cannot read the model's device; Internal on a libtorch failure.
  static absl::StatusOr<ModelTensors> Create(NamedTensors parameters, NamedTensors frozen,
                                             NamedTensors buffers, bool vote_buffers);

  const std::vector<std::string>& parameter_names() const { return parameter_names_; }
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  const std::vector<std::string>& frozen_names() const { return frozen_names_; }
  const std::vector<torch::Tensor>& frozen() const { return frozen_; }
  const std::vector<std::string>& buffer_names() const { return buffer_names_; }
  // The module's buffers now (a replay changes them, then restores them).
  const std::vector<torch::Tensor>& buffers() const { return buffers_; }
  // The buffers as this step's forward read them (CaptureForwardBuffers).
  const std::vector<torch::Tensor>& forward_buffers() const { return forward_buffers_; }
  // The model's device.
  const torch::Device& device() const { return device_; }

  // The weight vote's names: parameters, frozen parameters, and the
  // buffers when voted.
  const std::vector<std::string>& weight_names() const { return weight_names_; }
  // The weight vote's tensors, in weight_names' order. `live`: the buffers
  // as they are now instead of as this step's forward read them (a repair
  // restores those).
  std::vector<torch::Tensor> Weights(bool live = false) const;

  // Copies the buffers as they are now into forward_buffers(). Throws
  // c10::Error on a libtorch failure.
  void CaptureForwardBuffers();
  // Sets every parameter's gradient undefined, so the next backward writes
  // it exactly (not added to zeros, which would turn -0.0 into +0.0).
  void ClearGradients();

  // The fingerprint under `key` of parameter `index`'s gradient when it has
  // none: zeros of its size, whether autograd left it undefined or a reducer
  // filled it with zeros (the keyed fingerprint of zeros is not {n, 0, 0}).
  // REQUIRES: index < parameters().size().
  kernels::Fingerprint AbsentGradient(const kernels::FingerprintKey& key, size_t index) const;
  // The digest a replay audit compares: the first micro-batch's gradient
  // fingerprints (one per parameter), then the buffers' as its forward left
  // them (one per buffer).
  uint64_t AuditDigest(const std::vector<kernels::Fingerprint>& gradients,
                       const std::vector<kernels::Fingerprint>& buffers) const;
  // The layout sdcd checks every rank against: the weight vote's names and
  // byte sizes.
  uint64_t LayoutDigest() const;

 private:
  ModelTensors() = default;

  std::vector<std::string> parameter_names_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::string> frozen_names_;
  std::vector<torch::Tensor> frozen_;
  std::vector<std::string> buffer_names_;
  std::vector<torch::Tensor> buffers_;
  std::vector<torch::Tensor> forward_buffers_;
  std::vector<std::string> weight_names_;
  bool vote_buffers_ = true;
  torch::Device device_ = torch::kCPU;
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_MODEL_TENSORS_H_
