#ifndef SDC_CLIENT_TENSOR_CHECKS_H_
#define SDC_CLIENT_TENSOR_CHECKS_H_

// The engine's parts call the kernels through these few functions and
// nothing else: every fingerprint any part takes is Fingerprints' (under the
// job's key, EngineContext::fingerprint_key()), every non-finite scan
// ScanTensors'. Plus the small tensor helpers the
// parts share and the boundary where a libtorch error becomes a Status.
//
// Stateless functions; each may run on any thread. They throw c10::Error on
// a kernel or libtorch failure: callers catch it with SDC_TORCH_TRY.

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"

namespace sdc::client {

// Every library error inside a step becomes a Status at this boundary:
// libtorch's, and any other exception (a Python loss function's, which the
// extension module's callback throws as pybind11's error_already_set).
#define SDC_TORCH_TRY(expr)                                                   \
  try {                                                                       \
    expr;                                                                     \
  } catch (const c10::Error& e) {                                             \
    return absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace())); \
  } catch (const std::exception& e) {                                         \
    return absl::InternalError(e.what());                                     \
  }

// A kernel failure inside a step (a CUDA error, say) ends the step as a
// libtorch failure would: it throws c10::Error, which SDC_TORCH_TRY catches.
void ThrowIfFailed(const absl::Status& s);

// Fingerprints under `key` of `tensors` in order; an undefined tensor's is
// {0, 0, 0}. The tensors may be on the CPU or one CUDA device
// (client/device.h).
std::vector<kernels::Fingerprint> Fingerprints(const kernels::FingerprintKey& key,
                                               const std::vector<torch::Tensor>& tensors);

// Non-finite scans (NaN/Inf count and sum of squares) of floating-point
// `tensors`, in order. REQUIRES: every tensor defined and of a dtype the
// kernels read (client::DTypeOf).
std::vector<kernels::ScanResult> ScanTensors(const std::vector<torch::Tensor>& tensors);

// NaN/Inf elements over the defined floating-point tensors of `tensors`
// (others are skipped).
uint64_t NonFinite(const std::vector<torch::Tensor>& tensors);

// A digest of named fingerprints (kernels::ModelDigestBuilder, in order).
// REQUIRES: names.size() >= fps.size().
uint64_t Digest(const std::vector<std::string>& names,
                const std::vector<kernels::Fingerprint>& fps);

// The bits of a scalar loss as a double (what audits compare). Reads the
// loss to the host.
uint64_t LossBits(const torch::Tensor& loss);

// A one-bit change of the first element's mantissa (fault injection): a
// small finite error. REQUIRES: `t` is float32 and not empty.
void FlipMantissaBit(torch::Tensor t, int bit);

// Milliseconds since `t`.
double MsSince(absl::Time t);

}  // namespace sdc::client

#endif  // SDC_CLIENT_TENSOR_CHECKS_H_
