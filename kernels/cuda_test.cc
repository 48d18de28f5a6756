// CUDA kernels against the scalar reference. Needs a GPU; without one (or in
// a build without CUDA) every test skips itself, saying why.

#include "kernels/cuda.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/abft.h"
#include "kernels/abft_cuda.h"
#include "kernels/abft_test_values.h"
#include "kernels/cuda_check_queue.h"
#include "kernels/cuda_launcher.h"
#include "kernels/fingerprint.h"
#include "kernels/half_float.h"
#include "kernels/nonfinite.h"
#include "kernels/reference.h"

#ifdef SDC_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace sdc::kernels {
namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status available = CudaAvailable();
    if (!available.ok()) GTEST_SKIP() << "GPU tests skipped: " << available.message();
  }
};

TEST(CudaBuildTest, ReportsWhyItCannotRun) {
  const absl::Status s = CudaAvailable();
  if (s.ok()) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(s.message().empty());
  std::vector<Fingerprint> out(1);
  const unsigned char byte = 1;
  const ByteSpan one[] = {{&byte, 1}};
  const FingerprintKey key = FingerprintKey::FromSeed(kFixedFingerprintSeed);
  EXPECT_EQ(FingerprintTensorsCuda(one, key, absl::MakeSpan(out), nullptr).code(),
            CudaBuilt() ? absl::StatusCode::kInternal
                        : absl::StatusCode::kFailedPrecondition);
}

// The CUDA product check's arguments are checked before anything touches a
// device, on any machine.
TEST(CudaBuildTest, ProductCheckRefusesWhatItCannotCheck) {
  const float x[6] = {1, 2, 3, 4, 5, 6};
  const MatrixRef a = RowMajor(x, 2, 3, DType::kFloat32), b = RowMajor(x, 3, 2, DType::kFloat32),
                  c = RowMajor(x, 2, 2, DType::kFloat32);
  absl::StatusOr<size_t> bytes = CudaProductCheckWorkspaceBytes(1, a, b, c, nullptr, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, 0u);
  EXPECT_EQ(*bytes % 16, 0u);
  // Shapes that do not multiply, a batch above 65,535, the row axis.
  EXPECT_EQ(CudaProductCheckWorkspaceBytes(1, a, a, c, nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaProductCheckWorkspaceBytes(65536, a, b, c, nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  AbftOptions rows;
  rows.axis = AbftAxis::kRows;
  EXPECT_EQ(CudaProductCheckWorkspaceBytes(1, a, b, c, nullptr, rows).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An empty product needs no workspace.
  const MatrixRef empty = RowMajor(nullptr, 0, 2, DType::kFloat32);
  absl::StatusOr<size_t> none =
      CudaProductCheckWorkspaceBytes(1, RowMajor(nullptr, 0, 3, DType::kFloat32), b, empty,
                                     nullptr, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0u);
  // Without CUDA, FailedPrecondition; with it, a missing workspace is
  // refused before any launch.
  CudaAbftRecord record;
  EXPECT_EQ(QueueMatrixProductCheckCuda(1, a, b, c, {}, nullptr, {}, 0, false, nullptr, 0,
                                        &record, nullptr)
                .code(),
            CudaBuilt() ? absl::StatusCode::kInvalidArgument
                        : absl::StatusCode::kFailedPrecondition);
  // A record reads back as the CPU check's result.
  CudaAbftRecord failed;
  failed.failed = 2;
  failed.column = 5;
  failed.batch = 1;
  failed.discrepancy = -3;
  failed.threshold = 1;
  const AbftResult r = ResultOfRecord(failed);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.worst_index, 5);
  EXPECT_EQ(r.worst_batch, 1);
  EXPECT_EQ(r.discrepancy, -3);
  EXPECT_TRUE(ResultOfRecord(CudaAbftRecord{}).passed);
}

#ifdef SDC_HAVE_CUDA

// Device copy of a host buffer, freed at scope end.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<unsigned char>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, size_ + 8), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), size_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  unsigned char* data() const { return static_cast<unsigned char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t size_;
};

// The CUDA fingerprint must equal the CPU's bit for bit (and the scalar
// reference's) under any key: sizes on both sides of the 4 KiB level-1
// blocks and the 256 KiB chunks the GPU splits into, misaligned starts,
// and one launch over the whole list.
TEST_F(CudaTest, FingerprintsMatchCpuAndReferenceBitForBit) {
  std::mt19937_64 rng(1);
  std::vector<uint64_t> sizes = {0, 1, 7, 8, 9, 67, 4095, 4096, 4097, 4096 * 9 + 5,
                                 (256ull << 10) - 8, 256ull << 10, (256ull << 10) + 3,
                                 262145, (1ull << 20) + 4096, (5ull << 20) + 3};
  std::vector<std::vector<unsigned char>> host;
  for (uint64_t size : sizes) {
    std::vector<unsigned char> b(size + 1);
    for (auto& x : b) x = static_cast<unsigned char>(rng());
    host.push_back(std::move(b));
  }
  std::vector<std::unique_ptr<DeviceBuffer>> device;
  std::vector<ByteSpan> spans;
  std::vector<ByteSpan> host_spans;
  for (size_t i = 0; i < host.size(); ++i) {
    device.push_back(std::make_unique<DeviceBuffer>(host[i]));
    const size_t offset = i % 2;  // Odd tensors start misaligned.
    const uint64_t size = host[i].size() - 1;
    spans.push_back({device.back()->data() + offset, size});
    host_spans.push_back({host[i].data() + offset, size});
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (uint64_t seed : {kFixedFingerprintSeed, uint64_t{1}, uint64_t{0xfedcba9876543210ull}}) {
    const FingerprintKey key = FingerprintKey::FromSeed(seed);
    std::vector<Fingerprint> got(spans.size());
    ASSERT_TRUE(FingerprintTensorsCuda(spans, key, absl::MakeSpan(got), stream).ok());
    std::vector<Fingerprint> cpu(spans.size());
    ASSERT_TRUE(FingerprintTensors(host_spans, key, absl::MakeSpan(cpu)).ok());
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_EQ(got[i], cpu[i]) << "seed " << seed << " tensor " << i << " size " << sizes[i];
      EXPECT_EQ(got[i], ReferenceFingerprint(host_spans[i], key))
          << "seed " << seed << " tensor " << i << " size " << sizes[i];
    }
  }
  cudaStreamDestroy(stream);
}

TEST_F(CudaTest, ScanCountsMatchReferenceAndSumsAreClose) {
  std::mt19937_64 rng(2);
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const uint64_t n = 3 * kScanChunkElements + 17;
    std::vector<unsigned char> buf(DTypeSize(dtype) * n);
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t bits = 0;
      if (dtype == DType::kFloat32) {
        const float f = static_cast<float>(rng() % 1000) / 100.0f;
        std::memcpy(&bits, &f, 4);
      } else if (dtype == DType::kFloat64) {
        const double d = static_cast<double>(rng() % 1000) / 100.0;
        std::memcpy(&bits, &d, 8);
      } else {
        bits = rng() & 0x3fff;
      }
      std::memcpy(buf.data() + DTypeSize(dtype) * k, &bits, DTypeSize(dtype));
    }
    // One NaN and one Inf in different chunks.
    const uint64_t nan = dtype == DType::kFloat32 ? 0x7fc00000
                         : dtype == DType::kFloat64 ? 0x7ff8000000000000
                         : dtype == DType::kFloat16 ? 0x7e00 : 0x7fc0;
    std::memcpy(buf.data() + DTypeSize(dtype) * 5, &nan, DTypeSize(dtype));
    std::memcpy(buf.data() + DTypeSize(dtype) * (n - 1), &nan, DTypeSize(dtype));
    DeviceBuffer d(buf);
    const TensorRef host_ref{buf.data(), n, dtype};
    const TensorRef dev_ref{d.data(), n, dtype};
    const TensorRef finite_host{buf.data() + DTypeSize(dtype) * 6, n - 7, dtype};
    const TensorRef finite_dev{d.data() + DTypeSize(dtype) * 6, n - 7, dtype};
    std::vector<ScanResult> got(2);
    const TensorRef both[] = {dev_ref, finite_dev};
    ASSERT_TRUE(ScanNonFiniteCuda(both, absl::MakeSpan(got), nullptr).ok());
    EXPECT_EQ(got[0].nonfinite, 2u) << DTypeName(dtype);
    EXPECT_TRUE(std::isnan(got[0].sum_squares));
    const ScanResult want = ReferenceScan(finite_host);
    EXPECT_EQ(got[1].nonfinite, 0u);
    EXPECT_NEAR(got[1].sum_squares, want.sum_squares, 1e-12 * want.sum_squares)
        << DTypeName(dtype);
    (void)host_ref;
  }
}

// The per-step queue on the real runtime: several steps of queued scans,
// fingerprints and a copy, read once each, against the CPU kernels; the
// fingerprints bit for bit.
TEST_F(CudaTest, QueuedStepsMatchCpuBitForBit) {
  std::mt19937_64 rng(3);
  const FingerprintKey key = FingerprintKey::FromSeed(kFixedFingerprintSeed);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  CudaCheckQueue queue(RuntimeLauncher());
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<unsigned char>> host;
    for (uint64_t n : {uint64_t{3} * kScanChunkElements + 5, uint64_t{1000}, uint64_t{70001}}) {
      std::vector<unsigned char> b(4 * n);
      for (uint64_t k = 0; k < n; ++k) {
        const float f = static_cast<float>(rng() % 1000) / 100.0f;
        std::memcpy(b.data() + 4 * k, &f, 4);
      }
      const uint32_t nan = 0x7fc00000;
      std::memcpy(b.data() + 4 * ((step * 7919) % n), &nan, 4);
      host.push_back(std::move(b));
    }
    std::vector<std::unique_ptr<DeviceBuffer>> device;
    std::vector<TensorRef> refs, host_refs;
    std::vector<ByteSpan> spans, host_spans;
    for (const auto& b : host) {
      device.push_back(std::make_unique<DeviceBuffer>(b));
      refs.push_back({device.back()->data(), b.size() / 4, DType::kFloat32});
      host_refs.push_back({b.data(), b.size() / 4, DType::kFloat32});
      spans.push_back({device.back()->data(), b.size()});
      host_spans.push_back({b.data(), b.size()});
    }
    std::vector<size_t> scans;
    for (const TensorRef& r : refs) {
      absl::StatusOr<size_t> h = queue.QueueScan({&r, 1}, stream);
      ASSERT_TRUE(h.ok()) << h.status();
      scans.push_back(*h);
    }
    absl::StatusOr<size_t> fp = queue.QueueFingerprint(spans, key, stream);
    ASSERT_TRUE(fp.ok()) << fp.status();
    absl::StatusOr<size_t> copy = queue.QueueCopy(device[1]->data(), 8, stream);
    ASSERT_TRUE(copy.ok()) << copy.status();
    absl::StatusOr<CudaCheckQueue::Results> r = queue.Read();
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<Fingerprint> cpu(spans.size());
    ASSERT_TRUE(FingerprintTensors(host_spans, key, absl::MakeSpan(cpu)).ok());
    for (size_t i = 0; i < refs.size(); ++i) {
      ScanResult want;
      ASSERT_TRUE(ScanNonFinite({&host_refs[i], 1}, {&want, 1}).ok());
      EXPECT_EQ(r->scans[scans[i]][0].nonfinite, want.nonfinite) << "step " << step << " " << i;
      EXPECT_EQ(r->fingerprints[*fp][i], cpu[i]) << "step " << step << " tensor " << i;
    }
    ASSERT_EQ(r->copies[*copy].size(), 8u);
    EXPECT_EQ(std::memcmp(r->copies[*copy].data(), host[1].data(), 8), 0);
  }
  cudaStreamDestroy(stream);
}

using test_values::Store;
using test_values::Widen;

// A batch of products in host memory with device copies: A (each p x q,
// row- or column-major), B (q x s), a bias row, and C = A B (+ bias)
// accumulated in fp32 in order and rounded once to C's dtype: a healthy
// product as the rule models it.
struct Product {
  int64_t batch, p, q, s;
  DType in, out;
  bool bias, a_column_major;
  std::vector<unsigned char> a, b, v, c;
  std::unique_ptr<DeviceBuffer> da, db, dv, dc;

  MatrixRef A(const unsigned char* base) const {
    return a_column_major ? MatrixRef{base, p, q, 1, p, in} : MatrixRef{base, p, q, q, 1, in};
  }
  MatrixRef B(const unsigned char* base) const { return RowMajor(base, q, s, in); }
  MatrixRef C(const unsigned char* base) const { return RowMajor(base, p, s, out); }
  MatrixRef V(const unsigned char* base) const { return MatrixRef{base, 1, s, 0, 1, in}; }
  BatchStrides Strides() const { return {p * q, q * s, p * s, s}; }
};

Product MakeProduct(int64_t batch, int64_t p, int64_t q, int64_t s, DType in, DType out,
                    bool bias, bool a_column_major, uint64_t seed) {
  Product x{batch, p, q, s, in, out, bias, a_column_major, {}, {}, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t is = DTypeSize(in), os = DTypeSize(out);
  x.a.resize(batch * p * q * is);
  x.b.resize(batch * q * s * is);
  x.v.resize(batch * s * is);
  x.c.resize(batch * p * s * os);
  for (size_t i = 0; i < x.a.size(); i += is) Store(normal(rng), in, &x.a[i]);
  for (size_t i = 0; i < x.b.size(); i += is) Store(normal(rng), in, &x.b[i]);
  for (size_t i = 0; i < x.v.size(); i += is) Store(normal(rng), in, &x.v[i]);
  const BatchStrides st = x.Strides();
  for (int64_t n = 0; n < batch; ++n) {
    const MatrixRef a = x.A(x.a.data() + n * st.a * is);
    for (int64_t i = 0; i < p; ++i) {
      for (int64_t j = 0; j < s; ++j) {
        float acc = bias ? Widen(&x.v[(n * st.bias + j) * is], in) : 0.0f;
        for (int64_t l = 0; l < q; ++l) {
          const float ail = Widen(static_cast<const unsigned char*>(a.data) +
                                      (i * a.row_stride + l * a.col_stride) * is,
                                  in);
          const float blj = Widen(&x.b[(n * st.b + l * s + j) * is], in);
          const float product = ail * blj;  // Rounded, then added: no FMA.
          acc += product;
        }
        Store(acc, out, &x.c[(n * st.c + i * s + j) * os]);
      }
    }
  }
  x.da = std::make_unique<DeviceBuffer>(x.a);
  x.db = std::make_unique<DeviceBuffer>(x.b);
  x.dv = std::make_unique<DeviceBuffer>(x.v);
  x.dc = std::make_unique<DeviceBuffer>(x.c);
  return x;
}

// The device check of x (C from the device copy), read back.
CudaAbftRecord CheckOnDevice(const Product& x, const AbftOptions& options, bool poison,
                             cudaStream_t stream) {
  const MatrixRef a = x.A(x.da->data()), b = x.B(x.db->data()), c = x.C(x.dc->data()),
                  v = x.V(x.dv->data());
  absl::StatusOr<size_t> bytes =
      CudaProductCheckWorkspaceBytes(x.batch, a, b, c, x.bias ? &v : nullptr, options);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  void* workspace = nullptr;
  CudaAbftRecord* record = nullptr;
  EXPECT_EQ(cudaMalloc(&workspace, bytes.value_or(0) + 16), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&record, sizeof(CudaAbftRecord)), cudaSuccess);
  const absl::Status queued = QueueMatrixProductCheckCuda(
      x.batch, a, b, c, x.Strides(), x.bias ? &v : nullptr, options, 41, poison, workspace,
      bytes.value_or(0), record, stream);
  EXPECT_TRUE(queued.ok()) << queued;
  CudaAbftRecord out;
  EXPECT_EQ(cudaMemcpyAsync(&out, record, sizeof(out), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaFree(record);
  cudaFree(workspace);
  return out;
}

AbftResult CheckOnHost(const Product& x, const AbftOptions& options) {
  const MatrixRef v = x.V(x.v.data());
  absl::StatusOr<AbftResult> r = CheckBatchedMatrixProduct(
      x.batch, x.A(x.a.data()), x.B(x.b.data()), x.C(x.c.data()), x.Strides(),
      x.bias ? &v : nullptr, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.value_or(AbftResult{});
}

// Healthy products of each dtype pass on the device as on the CPU, with the
// same worst column and the same threshold to the fp64 sums' rounding; one
// element of C moved by a quarter of its column's magnitude fails on both,
// at its column and batch member, and with `poison` the device writes NaN
// into that column's first element.
TEST_F(CudaTest, ProductChecksMatchTheCpuCheck) {
  struct Case {
    int64_t batch, p, q, s;
    DType in, out;
    bool bias, a_column_major;
  };
  const Case cases[] = {
      {1, 96, 200, 70, DType::kFloat32, DType::kFloat32, true, false},
      {3, 64, 48, 33, DType::kFloat32, DType::kFloat32, false, true},
      {1, 3000, 64, 40, DType::kFloat32, DType::kFloat32, true, false},  // Row chunks folded.
      {2, 80, 128, 96, DType::kBFloat16, DType::kBFloat16, true, false},
      {2, 80, 128, 96, DType::kBFloat16, DType::kFloat32, false, true},
      {1, 130, 256, 64, DType::kFloat16, DType::kFloat16, true, true},
  };
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  uint64_t seed = 10;
  for (const Case& k : cases) {
    Product x = MakeProduct(k.batch, k.p, k.q, k.s, k.in, k.out, k.bias, k.a_column_major, ++seed);
    for (AbftRule rule : {AbftRule::kGuaranteed, AbftRule::kProbabilistic}) {
      AbftOptions options;
      options.rule = rule;
      const std::string what = absl::StrCat(DTypeName(k.in), "->", DTypeName(k.out), " ", k.batch,
                                            "x", k.p, "x", k.q, "x", k.s,
                                            rule == AbftRule::kGuaranteed ? " guaranteed" : " probabilistic");
      const AbftResult cpu = CheckOnHost(x, options);
      const CudaAbftRecord gpu = CheckOnDevice(x, options, /*poison=*/true, stream);
      EXPECT_TRUE(cpu.passed) << what;
      EXPECT_EQ(gpu.failed, 0) << what;
      EXPECT_EQ(gpu.op_id, 41) << what;
      EXPECT_EQ(static_cast<int64_t>(gpu.column), cpu.worst_index) << what;
      EXPECT_EQ(static_cast<int64_t>(gpu.batch), cpu.worst_batch) << what;
      EXPECT_NEAR(gpu.threshold, cpu.threshold, 1e-12 * cpu.threshold) << what;
      EXPECT_NEAR(gpu.discrepancy, cpu.discrepancy, 1e-3 * cpu.threshold) << what;
      EXPECT_NEAR(gpu.reference, cpu.reference, 1e-3 * cpu.threshold) << what;
    }
  }
  // One element off: caught on both, at its column, and poisoned on the
  // device.
  for (const Case& k : cases) {
    Product x = MakeProduct(k.batch, k.p, k.q, k.s, k.in, k.out, k.bias, k.a_column_major, 99);
    const int64_t n = k.batch - 1, i = k.p / 2, j = k.s / 3, os = DTypeSize(k.out);
    double column = 0;
    for (int64_t r = 0; r < k.p; ++r) {
      column += std::fabs(Widen(&x.c[(n * k.p * k.s + r * k.s + j) * os], k.out));
    }
    unsigned char* e = &x.c[(n * k.p * k.s + i * k.s + j) * os];
    Store(Widen(e, k.out) + static_cast<float>(0.25 * column), k.out, e);
    x.dc = std::make_unique<DeviceBuffer>(x.c);
    AbftOptions options;
    options.rule = AbftRule::kProbabilistic;
    const AbftResult cpu = CheckOnHost(x, options);
    const CudaAbftRecord gpu = CheckOnDevice(x, options, /*poison=*/true, stream);
    EXPECT_FALSE(cpu.passed) << k.p;
    EXPECT_GE(gpu.failed, 1) << k.p;
    EXPECT_EQ(static_cast<int64_t>(gpu.column), j) << k.p;
    EXPECT_EQ(static_cast<int64_t>(gpu.batch), n) << k.p;
    EXPECT_EQ(cpu.worst_index, j) << k.p;
    std::vector<unsigned char> first(os);
    ASSERT_EQ(cudaMemcpy(first.data(), x.dc->data() + (n * k.p * k.s + j) * os, os,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(std::isnan(Widen(first.data(), k.out))) << k.p;
  }
  cudaStreamDestroy(stream);
}

#endif  // SDC_HAVE_CUDA

}  // namespace
}  // namespace sdc::kernels
