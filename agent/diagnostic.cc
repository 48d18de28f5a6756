#include "agent/diagnostic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <new>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/thread_pool.h"

namespace sdc::agent {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// The entries as int8 (they are integers in [-8, 8]); InvalidArgument otherwise.
absl::StatusOr<std::vector<int8_t>> Integers(const Matrix& m, const char* name) {
  std::vector<int8_t> out(m.values.size());
  for (size_t i = 0; i < m.values.size(); ++i) {
    const float v = m.values[i];
    if (!(v >= common::kMinEntry && v <= common::kMaxEntry) || v != std::nearbyint(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "[", i / m.n, "][", i % m.n, "] = ", v, " is not an integer in [",
          common::kMinEntry, ", ", common::kMaxEntry, "]"));
    }
    out[i] = static_cast<int8_t>(v);
  }
  return out;
}

}  // namespace

std::string DeviceName(int cuda_index) {
  return cuda_index < 0 ? std::string("cpu") : absl::StrCat("cuda:", cuda_index);
}

Matrix FillMatrix(uint32_t n, uint64_t seed) {
  Matrix m;
  m.n = n;
  m.values.resize(static_cast<size_t>(n) * n);
  const uint64_t span = common::kMaxEntry - common::kMinEntry + 1;
  for (size_t k = 0; k < m.values.size(); ++k) {
    m.values[k] = static_cast<float>(static_cast<int>(SplitMix64(seed + k + 1) % span) +
                                     common::kMinEntry);
  }
  return m;
}

absl::StatusOr<Matrix> ReferenceProduct(const Matrix& a, const Matrix& b) {
  if (a.n != b.n || a.values.size() != static_cast<size_t>(a.n) * a.n ||
      b.values.size() != static_cast<size_t>(b.n) * b.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("shapes differ: ", a.n, "x", a.n, " and ", b.n, "x", b.n));
  }
  if (!common::ExactInFp32(a.n)) {
    return absl::InvalidArgumentError(absl::StrCat("n = ", a.n, " is too large to be exact in fp32"));
  }
  absl::StatusOr<std::vector<int8_t>> ai = Integers(a, "A");
  if (!ai.ok()) return ai.status();
  absl::StatusOr<std::vector<int8_t>> bi = Integers(b, "B");
  if (!bi.ok()) return bi.status();
  const size_t n = a.n;
  Matrix c;
  c.n = a.n;
  c.values.resize(n * n);
  // One row of C per task: acc[j] += A[i][k] * B[k][j], k outer so B is
  // read by rows. Integer sums are exact in any order.
  kernels::ThreadPool::Default().ParallelFor(static_cast<int64_t>(n), [&](int64_t i) {
    std::vector<int32_t> acc(n, 0);
    const int8_t* arow = ai->data() + i * n;
    for (size_t k = 0; k < n; ++k) {
      const int32_t x = arow[k];
      if (x == 0) continue;
      const int8_t* brow = bi->data() + k * n;
      for (size_t j = 0; j < n; ++j) acc[j] += x * brow[j];
    }
    float* crow = c.values.data() + i * n;
    for (size_t j = 0; j < n; ++j) crow[j] = static_cast<float>(acc[j]);
  });
  return c;
}

Comparison CompareBits(const Matrix& got, const Matrix& want) {
  Comparison c;
  for (size_t i = 0; i < want.values.size(); ++i) {
    if (Bits(got.values[i]) == Bits(want.values[i])) continue;
    ++c.mismatches;
    const double error = std::fabs(static_cast<double>(got.values[i]) - want.values[i]);
    c.max_abs_error = std::isnan(error) ? INFINITY : std::max(c.max_abs_error, error);
  }
  return c;
}

absl::Status CudaDeviceUsable(int cuda_index) {
  try {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          "CUDA is not usable from this agent: its libtorch has no CUDA support or no GPU is "
          "visible (torch::cuda::is_available() is false)");
    }
    const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
    if (cuda_index >= count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA device ", cuda_index, " is not visible (", count,
          " visible; check CUDA_VISIBLE_DEVICES and the container's GPU access)"));
    }
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status DeviceProducts(const Matrix& a, const Matrix& b, int cuda_index,
                            uint32_t repetitions,
                            absl::FunctionRef<void(uint32_t, Matrix&)> each, double* seconds) {
  if (cuda_index >= 0) {
    if (absl::Status s = CudaDeviceUsable(cuda_index); !s.ok()) return s;
  }
  *seconds = 0;
  const int64_t n = a.n;
  try {
    torch::NoGradGuard no_grad;
    const torch::Device device =
        cuda_index < 0 ? torch::Device(torch::kCPU)
                       : torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(cuda_index));
    auto on_device = [&](const Matrix& m) {
      return torch::from_blob(const_cast<float*>(m.values.data()), {n, n}, torch::kFloat32)
          .to(torch::TensorOptions().dtype(torch::kFloat32).device(device),
              /*non_blocking=*/false, /*copy=*/true);
    };
    const torch::Tensor ta = on_device(a);
    const torch::Tensor tb = on_device(b);
    auto sync = [&] {
      if (cuda_index >= 0) torch::cuda::synchronize(cuda_index);
    };
    (void)torch::matmul(ta, tb);  // Warm-up: library init, kernel selection.
    sync();
    Matrix host;
    host.n = a.n;
    host.values.resize(static_cast<size_t>(n) * n);
    for (uint32_t r = 0; r < repetitions; ++r) {
      const auto start = std::chrono::steady_clock::now();
      torch::Tensor tc = torch::matmul(ta, tb);
      sync();
      *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const torch::Tensor on_host = tc.to(torch::kCPU).contiguous();
      std::memcpy(host.values.data(), on_host.data_ptr<float>(), host.values.size() * sizeof(float));
      each(r, host);
    }
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.find("out of memory") != std::string::npos) {
      return absl::ResourceExhaustedError(absl::StrCat("libtorch: ", what));
    }
    return absl::InternalError(absl::StrCat("libtorch: ", what));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory for three ", n, "x", n, " fp32 matrices"));
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
  return absl::OkStatus();
}

absl::Status ConfirmationDiagnostic::Prepare() {
  if (prepared_) return prepare_status_;
  prepared_ = true;
  try {
    a_ = FillMatrix(shape_.size, kSeedA);
    b_ = FillMatrix(shape_.size, kSeedB);
    absl::StatusOr<Matrix> reference = ReferenceProduct(a_, b_);
    prepare_status_ = reference.status();
    if (reference.ok()) reference_ = *std::move(reference);
  } catch (const std::bad_alloc&) {
    prepare_status_ = absl::ResourceExhaustedError(
        absl::StrCat("out of host memory for ", shape_.size, "x", shape_.size, " matrices"));
  }
  return prepare_status_;
}

absl::StatusOr<const Matrix*> ConfirmationDiagnostic::Reference() {
  if (absl::Status s = Prepare(); !s.ok()) return s;
  return &reference_;
}

absl::Status ConfirmationDiagnostic::UseReference(Matrix reference) {
  if (reference.n != shape_.size ||
      reference.values.size() != static_cast<size_t>(reference.n) * reference.n) {
    return absl::InvalidArgumentError(absl::StrCat("a ", reference.n, "x", reference.n,
                                                   " reference for a ", shape_.size, "x",
                                                   shape_.size, " diagnostic"));
  }
  a_ = FillMatrix(shape_.size, kSeedA);
  b_ = FillMatrix(shape_.size, kSeedB);
  reference_ = std::move(reference);
  prepared_ = true;
  prepare_status_ = absl::OkStatus();
  return absl::OkStatus();
}

absl::Status WriteMatrix(const Matrix& m, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(m.values.data()),
            static_cast<std::streamsize>(m.values.size() * sizeof(float)));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<Matrix> ReadMatrix(const std::string& path, uint32_t n) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const size_t want = static_cast<size_t>(n) * n * sizeof(float);
  if (static_cast<size_t>(in.tellg()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds ", static_cast<size_t>(in.tellg()),
                                                   " bytes, not the ", want, " of ", n, "x", n,
                                                   " fp32"));
  }
  Matrix m;
  m.n = n;
  m.values.resize(static_cast<size_t>(n) * n);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(m.values.data()), static_cast<std::streamsize>(want));
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", path));
  return m;
}

DeviceOutcome ConfirmationDiagnostic::Run(const common::PlannedDevice& device,
                                          const DiagnosticOptions& options) {
  DeviceOutcome out;
  out.gpu = device.label;
  out.device = DeviceName(device.cuda_index);
  out.size = shape_.size;
  out.repetitions = shape_.repetitions;
  const std::string shape =
      absl::StrCat(shape_.repetitions, " product", shape_.repetitions == 1 ? "" : "s", " of ",
                   shape_.size, "x", shape_.size, " fp32");
  absl::Status status = Prepare();
  if (status.ok()) {
    status = DeviceProducts(a_, b_, device.cuda_index, shape_.repetitions,
                            [&](uint32_t r, Matrix& c) {
                              if (r == 0 && options.inject_fault) {
                                // The middle row, a third of the way along.
                                c.values[(c.n / 2) * static_cast<size_t>(c.n) + c.n / 3] += 1.0f;
                              }
                              const Comparison cmp = CompareBits(c, reference_);
                              out.mismatches += cmp.mismatches;
                              out.max_abs_error = std::max(out.max_abs_error, cmp.max_abs_error);
                            },
                            &out.seconds);
  }
  if (!status.ok()) {
    out.error = std::string(status.message());
    out.detail = absl::StrCat(out.device, ": could not run ", shape, ": ", out.error);
    return out;
  }
  const double flop = 2.0 * shape_.size * shape_.size * static_cast<double>(shape_.size) *
                      shape_.repetitions;
  out.gflops = out.seconds > 0 ? flop / out.seconds / 1e9 : 0;
  out.pass = out.mismatches == 0;
  if (out.pass) {
    out.detail = absl::StrFormat(
        "%s: %s matched the integer reference bit for bit (%.1f GFLOP/s, %.3f s)", out.device,
        shape, out.gflops, out.seconds);
  } else {
    out.detail = absl::StrFormat(
        "%s: %d of %d elements differ from the integer reference (max abs error %g) over %s",
        out.device, out.mismatches,
        static_cast<uint64_t>(shape_.size) * shape_.size * shape_.repetitions,
        out.max_abs_error, shape);
  }
  return out;
}

}  // namespace sdc::agent
