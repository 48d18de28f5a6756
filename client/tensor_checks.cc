#include "client/tensor_checks.h"

#include <cstring>

#include "absl/time/clock.h"
#include "client/device.h"
#include "kernels/model_digest.h"

namespace sdc::client {

void ThrowIfFailed(const absl::Status& s) {
  if (!s.ok()) TORCH_CHECK(false, "sdc-guard kernels: ", std::string(s.message()));
}

std::vector<kernels::Fingerprint> Fingerprints(const kernels::FingerprintKey& key,
                                               const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> dense;
  std::vector<size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    dense.push_back(tensors[i].detach().contiguous());
    index.push_back(i);
  }
  std::vector<kernels::Fingerprint> packed;
  ThrowIfFailed(FingerprintOnDevice(dense, key, &packed));
  std::vector<kernels::Fingerprint> out(tensors.size());
  for (size_t k = 0; k < index.size(); ++k) out[index[k]] = packed[k];
  return out;
}

std::vector<kernels::ScanResult> ScanTensors(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> dense;
  for (const torch::Tensor& t : tensors) dense.push_back(t.detach().contiguous());
  std::vector<kernels::ScanResult> out;
  ThrowIfFailed(ScanOnDevice(dense, &out));
  return out;
}

uint64_t NonFinite(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> scannable;
  for (const torch::Tensor& t : tensors) {
    if (t.defined() && DTypeOf(t).ok()) scannable.push_back(t);
  }
  uint64_t n = 0;
  for (const kernels::ScanResult& r : ScanTensors(scannable)) n += r.nonfinite;
  return n;
}

uint64_t Digest(const std::vector<std::string>& names,
                const std::vector<kernels::Fingerprint>& fps) {
  kernels::ModelDigestBuilder d;
  for (size_t i = 0; i < fps.size(); ++i) d.Add(names[i], fps[i]);
  return d.Finish();
}

uint64_t LossBits(const torch::Tensor& loss) {
  const double v = loss.detach().to(torch::kDouble).item<double>();
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

void FlipMantissaBit(torch::Tensor t, int bit) {
  torch::NoGradGuard no_grad;
  auto flat = t.view({-1});
  float v = flat[0].item<float>();
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits ^= (1u << bit);
  std::memcpy(&v, &bits, 4);
  flat[0].fill_(v);
}

double MsSince(absl::Time t) { return absl::ToDoubleMilliseconds(absl::Now() - t); }

}  // namespace sdc::client
