// CUDA kernels against the scalar reference. Needs a GPU; without one (or in
// a build without CUDA) every test skips itself, saying why.

#include "kernels/cuda.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda_check_queue.h"
#include "kernels/cuda_launcher.h"
#include "kernels/fingerprint.h"
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

#endif  // SDC_HAVE_CUDA

}  // namespace
}  // namespace sdc::kernels
