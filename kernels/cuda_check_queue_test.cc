// The device-resident checks' host calls per step, pinned without a GPU:
// the production queue (cuda_check_queue.h) driven through a counting
// launcher whose "device" is host memory and whose scan kernel is emulated
// per chunk, so the results are checked too.

#include "kernels/cuda_check_queue.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/counting_launcher.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"

namespace sdc::kernels {
namespace {

using Counts = CountingLauncher::Counts;

CudaLauncher::Stream FakeStream(uintptr_t id) {
  return reinterpret_cast<CudaLauncher::Stream>(id);
}

int Allocations(const Counts& c) { return c.device_allocs + c.pinned_allocs; }

// fp32 gradient buckets whose NaN/Inf positions are known.
struct Bucket {
  std::vector<float> values;
  uint64_t nonfinite = 0;
};

Bucket MakeBucket(size_t n, size_t seed, int bad) {
  Bucket b;
  b.values.resize(n);
  for (size_t i = 0; i < n; ++i) b.values[i] = static_cast<float>((i * 7 + seed) % 13) / 8.0f;
  for (int k = 0; k < bad; ++k) {
    b.values[(k * 104729 + seed) % n] = k % 2 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                                   : std::numeric_limits<float>::infinity();
  }
  for (float v : b.values) b.nonfinite += std::isfinite(v) ? 0 : 1;
  return b;
}

TensorRef RefOf(const Bucket& b) {
  return {b.values.data(), static_cast<uint64_t>(b.values.size()), DType::kFloat32};
}

// The bucket sizes of a small DDP model: several spanning more than one
// scan chunk (kScanChunkElements).
std::vector<Bucket> Buckets(size_t step) {
  std::vector<Bucket> out;
  const size_t sizes[] = {3 * kScanChunkElements + 5, kScanChunkElements, 1000, 70000};
  for (size_t i = 0; i < 4; ++i) out.push_back(MakeBucket(sizes[i], step * 10 + i, (step + i) % 3));
  return out;
}

// One guarded step as StepPipeline runs it on a GPU: every local bucket's
// scan queued from the communication hook, then at the decision the
// reduced buckets' scan and fingerprints, the loss scaler's scale, and the
// step's one read. Checks the hook's calls never wait or read, and returns
// the read's results.
CudaCheckQueue::Results RunStep(CudaCheckQueue& q, const CountingLauncher& launcher,
                                const std::vector<Bucket>& local,
                                const std::vector<Bucket>& reduced) {
  const FingerprintKey key = FingerprintKey::FromSeed(kFixedFingerprintSeed);
  const CudaLauncher::Stream stream = FakeStream(1);
  for (size_t i = 0; i < local.size(); ++i) {
    const Counts before = launcher.counts();
    const TensorRef ref = RefOf(local[i]);
    absl::StatusOr<size_t> h = q.QueueScan({&ref, 1}, stream);
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(*h, i);
    const Counts& after = launcher.counts();
    EXPECT_EQ(after.synchronizes, before.synchronizes) << "bucket " << i << " waited";
    EXPECT_EQ(after.device_to_host, before.device_to_host) << "bucket " << i << " read back";
    EXPECT_EQ(after.scan_launches, before.scan_launches + 1);
  }
  std::vector<TensorRef> refs;
  std::vector<ByteSpan> spans;
  for (const Bucket& b : reduced) {
    refs.push_back(RefOf(b));
    spans.push_back({b.values.data(), b.values.size() * sizeof(float)});
  }
  const Counts before = launcher.counts();
  EXPECT_TRUE(q.QueueScan(refs, stream).ok());
  EXPECT_TRUE(q.QueueFingerprint(spans, key, stream).ok());
  const double scale = 65536.0;  // In "device" memory: the counting launcher's is the host's.
  EXPECT_TRUE(q.QueueCopy(&scale, sizeof(scale), stream).ok());
  EXPECT_EQ(launcher.counts().synchronizes, before.synchronizes);
  EXPECT_EQ(launcher.counts().device_to_host, before.device_to_host);
  absl::StatusOr<CudaCheckQueue::Results> r = q.Read();
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(launcher.counts().synchronizes, before.synchronizes + 1) << "one wait per step";
  EXPECT_EQ(launcher.counts().device_to_host, before.device_to_host + 1) << "one read per step";
  if (r.ok()) {
    EXPECT_EQ(r->copies.size(), 1u);
    double got = 0;
    if (r->copies.size() == 1 && r->copies[0].size() == sizeof(got)) {
      std::memcpy(&got, r->copies[0].data(), sizeof(got));
    }
    EXPECT_EQ(got, scale);
  }
  return r.ok() ? *std::move(r) : CudaCheckQueue::Results{};
}

void ExpectScansMatchCpu(const std::vector<ScanResult>& got, const std::vector<Bucket>& buckets) {
  ASSERT_EQ(got.size(), buckets.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    const TensorRef ref = RefOf(buckets[i]);
    ScanResult cpu;
    ASSERT_TRUE(ScanNonFinite({&ref, 1}, {&cpu, 1}).ok());
    EXPECT_EQ(got[i].nonfinite, buckets[i].nonfinite) << "bucket " << i;
    EXPECT_EQ(got[i].nonfinite, cpu.nonfinite) << "bucket " << i;
    if (cpu.nonfinite == 0) {
      EXPECT_NEAR(got[i].sum_squares, cpu.sum_squares, 1e-9 * cpu.sum_squares) << "bucket " << i;
    }
  }
}

TEST(CudaCheckQueueTest, AGuardedStepWaitsAndReadsOnceAndAllocatesOnlyOnItsFirstStep) {
  CountingLauncher launcher;
  {
    CudaCheckQueue q(launcher);
    for (size_t step = 0; step < 4; ++step) {
      const Counts before = launcher.counts();
      const std::vector<Bucket> local = Buckets(step);
      const std::vector<Bucket> reduced = Buckets(step + 100);
      const CudaCheckQueue::Results r = RunStep(q, launcher, local, reduced);
      const Counts& after = launcher.counts();
      ASSERT_EQ(r.scans.size(), local.size() + 1);
      ASSERT_EQ(r.fingerprints.size(), 1u);
      for (size_t i = 0; i < local.size(); ++i) {
        ExpectScansMatchCpu(r.scans[i], {local[i]});
      }
      ExpectScansMatchCpu(r.scans[local.size()], reduced);
      ASSERT_EQ(r.fingerprints[0].size(), reduced.size());
      for (size_t i = 0; i < reduced.size(); ++i) {
        EXPECT_EQ(r.fingerprints[0][i].byte_length, reduced[i].values.size() * sizeof(float));
      }
      // Per step: one descriptor copy per queued call, one launch each,
      // the fingerprint's counters zeroed, the key uploaded once per job.
      EXPECT_EQ(after.host_to_device - before.host_to_device,
                static_cast<int>(local.size()) + 2 + (step == 0 ? 1 : 0));
      EXPECT_EQ(after.scan_launches - before.scan_launches, static_cast<int>(local.size()) + 1);
      EXPECT_EQ(after.fingerprint_launches - before.fingerprint_launches, 1);
      EXPECT_EQ(after.zeroes - before.zeroes, 1);
      EXPECT_EQ(after.orderings - before.orderings, 0);
      if (step == 0) {
        EXPECT_GT(Allocations(after), 0);
      } else {
        EXPECT_EQ(Allocations(after), Allocations(before)) << "step " << step << " allocated";
        EXPECT_EQ(after.frees, before.frees) << "step " << step << " freed";
        // The scale's copy only: no results moved to a grown buffer.
        EXPECT_EQ(after.device_to_device - before.device_to_device, 1) << "step " << step;
      }
    }
  }
  EXPECT_EQ(launcher.live(), 0u) << "the queue leaked buffers";
}

TEST(CudaCheckQueueTest, AStepLargerThanAnyBeforeGrowsOnceKeepingEarlierResults) {
  CountingLauncher launcher;
  CudaCheckQueue q(launcher);
  RunStep(q, launcher, {MakeBucket(100, 1, 1)}, {MakeBucket(100, 2, 0)});
  // Many buckets (more than the smallest buffers' 4096 bytes of results
  // hold): the results buffer grows while earlier buckets' results sit in
  // it, and they must survive the move.
  std::vector<Bucket> many;
  for (size_t i = 0; i < 300; ++i) many.push_back(MakeBucket(100 + i, i, i % 3));
  const Counts before = launcher.counts();
  CudaCheckQueue::Results r = RunStep(q, launcher, many, {MakeBucket(100, 3, 0)});
  EXPECT_GT(Allocations(launcher.counts()), Allocations(before));
  EXPECT_GT(launcher.counts().device_to_device, before.device_to_device + 1)
      << "the results moved to the grown buffer (besides the scale's copy)";
  ASSERT_EQ(r.scans.size(), many.size() + 1);
  for (size_t i = 0; i < many.size(); ++i) ExpectScansMatchCpu(r.scans[i], {many[i]});
  // The same step again fits.
  const Counts settled = launcher.counts();
  r = RunStep(q, launcher, many, {MakeBucket(100, 3, 0)});
  EXPECT_EQ(Allocations(launcher.counts()), Allocations(settled));
  for (size_t i = 0; i < many.size(); ++i) ExpectScansMatchCpu(r.scans[i], {many[i]});
}

TEST(CudaCheckQueueTest, WorkOnAnotherStreamIsOrderedAfterTheStepsEarlierWork) {
  CountingLauncher launcher;
  CudaCheckQueue q(launcher);
  const Bucket b = MakeBucket(1000, 1, 1);
  const TensorRef ref = RefOf(b);
  ASSERT_TRUE(q.QueueScan({&ref, 1}, FakeStream(1)).ok());
  ASSERT_TRUE(q.QueueScan({&ref, 1}, FakeStream(1)).ok());
  EXPECT_EQ(launcher.counts().orderings, 0);
  ASSERT_TRUE(q.QueueScan({&ref, 1}, FakeStream(2)).ok());
  EXPECT_EQ(launcher.counts().orderings, 1);
  EXPECT_EQ(launcher.counts().synchronizes, 0);
  absl::StatusOr<CudaCheckQueue::Results> r = q.Read();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(launcher.counts().synchronizes, 1);
  for (const auto& s : r->scans) ExpectScansMatchCpu(s, {b});
}

TEST(CudaCheckQueueTest, AStepWithNothingQueuedCallsNothing) {
  CountingLauncher launcher;
  CudaCheckQueue q(launcher);
  const TensorRef empty{nullptr, 0, DType::kFloat32};
  absl::StatusOr<size_t> h = q.QueueScan({&empty, 1}, FakeStream(1));
  ASSERT_TRUE(h.ok());
  absl::StatusOr<CudaCheckQueue::Results> r = q.Read();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->scans.size(), 1u);
  EXPECT_EQ(r->scans[0][0].nonfinite, 0u);
  const Counts& c = launcher.counts();
  EXPECT_EQ(Allocations(c) + c.host_to_device + c.device_to_host + c.scan_launches +
                c.synchronizes,
            0);
}

TEST(CudaCheckQueueTest, AFailedLaunchFailsTheStepAtItsReadAndTheNextStepRuns) {
  CountingLauncher launcher;
  CudaCheckQueue q(launcher);
  const Bucket b = MakeBucket(1000, 1, 2);
  const TensorRef ref = RefOf(b);
  ASSERT_TRUE(q.QueueScan({&ref, 1}, FakeStream(1)).ok());
  ASSERT_TRUE(q.QueueScan({&ref, 1}, FakeStream(1)).ok());
  const Counts before = launcher.counts();
  // The third bucket's first CUDA call (its descriptor copy) fails: the
  // error comes back from that call, from every later one of the step,
  // and from the read.
  launcher.FailNext(719);  // cudaErrorLaunchFailure
  absl::StatusOr<size_t> failed = q.QueueScan({&ref, 1}, FakeStream(1));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("CUDA error 719"), std::string::npos)
      << failed.status();
  absl::StatusOr<size_t> later = q.QueueScan({&ref, 1}, FakeStream(1));
  EXPECT_EQ(later.status(), failed.status());
  const int d2h = launcher.counts().device_to_host;
  absl::StatusOr<CudaCheckQueue::Results> r = q.Read();
  EXPECT_EQ(r.status(), failed.status());
  EXPECT_EQ(launcher.counts().device_to_host, d2h) << "a failed step reads nothing";
  EXPECT_EQ(launcher.counts().synchronizes, before.synchronizes + 1)
      << "the failed step's queued work is waited for before its buffers are reused";
  // The next step starts clean.
  ASSERT_TRUE(q.QueueScan({&ref, 1}, FakeStream(1)).ok());
  r = q.Read();
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectScansMatchCpu(r->scans[0], {b});
}

TEST(CudaCheckQueueTest, BadArgumentsAreRefusedBeforeAnyCall) {
  CountingLauncher launcher;
  CudaCheckQueue q(launcher);
  std::vector<float> v(16);
  const TensorRef misaligned{reinterpret_cast<const unsigned char*>(v.data()) + 1, 4,
                             DType::kFloat32};
  EXPECT_EQ(q.QueueScan({&misaligned, 1}, FakeStream(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const TensorRef null_data{nullptr, 4, DType::kFloat32};
  EXPECT_EQ(q.QueueScan({&null_data, 1}, FakeStream(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const ByteSpan null_span{nullptr, 4};
  EXPECT_EQ(q.QueueFingerprint({&null_span, 1}, FingerprintKey::FromSeed(1), FakeStream(1))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const Counts& c = launcher.counts();
  EXPECT_EQ(Allocations(c) + c.host_to_device + c.scan_launches + c.fingerprint_launches, 0);
}

}  // namespace
}  // namespace sdc::kernels
