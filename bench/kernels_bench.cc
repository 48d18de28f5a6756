// ./sdc bench kernels: throughput of the fingerprint and non-finite scan
// kernels on a transformer-shaped parameter set (~517 MiB of fp32), against
// baselines measured in the same run on the same bytes and thread count:
// a plain streaming read (the memory-bandwidth limit: the fastest of several
// read loops, named in the output), SHA-1 per tensor
// (Megatron-LM's cross-replica weight hash), torch.hash_tensor per tensor
// (the order-insensitive XOR hash TorchTitan's replay check uses) and the
// fingerprint's first level written with plain libtorch tensor ops. Prints a
// table, then one JSON line last.

#include <openssl/sha.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/json_text.h"
#include "kernels/cpu_dispatch.h"
#include "kernels/cuda.h"
#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"
#include "kernels/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifdef SDC_HAVE_CUDA
#include <cuda_runtime.h>
#endif

ABSL_FLAG(int, reps, 7, "Timed repetitions of each measurement.");
ABSL_FLAG(int, d_model, 1024,
          "Width of the transformer-shaped parameter set (1024: 517 MiB; smaller for a smoke run).");

namespace sdc::bench {
namespace {

using kernels::ByteSpan;
using kernels::Fingerprint;
using kernels::ThreadPool;

struct Tensor {
  std::string name;
  std::vector<float> values;
};

// A GPT-style decoder: d_model `d` (1024: 135.6M parameters, 517 MiB of
// fp32), 8 layers, vocabulary 32000, context 2048.
std::vector<Tensor> TransformerParameters(int64_t d) {
  constexpr int64_t layers = 8, vocab = 32000, context = 2048;
  std::vector<std::pair<std::string, int64_t>> shapes = {
      {"embed.weight", vocab * d}, {"pos_embed.weight", context * d}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    for (auto [name, n] : std::vector<std::pair<const char*, int64_t>>{
             {"ln1.weight", d}, {"ln1.bias", d},
             {"attn.qkv.weight", 3 * d * d}, {"attn.qkv.bias", 3 * d},
             {"attn.out.weight", d * d}, {"attn.out.bias", d},
             {"ln2.weight", d}, {"ln2.bias", d},
             {"mlp.fc1.weight", 4 * d * d}, {"mlp.fc1.bias", 4 * d},
             {"mlp.fc2.weight", 4 * d * d}, {"mlp.fc2.bias", d}}) {
      shapes.push_back({p + name, n});
    }
  }
  shapes.push_back({"ln_f.weight", d});
  shapes.push_back({"ln_f.bias", d});
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<Tensor> tensors;
  for (auto& [name, n] : shapes) {
    Tensor t{name, std::vector<float>(n)};
    for (float& v : t.values) v = normal(rng);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// Median wall time of `reps` runs after one warm-up, in seconds.
double MedianSeconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - start)
                        .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double Gbps(uint64_t bytes, double seconds) { return bytes / seconds / 1e9; }

// The memory-bandwidth baseline: every byte loaded once and added, in the
// same 1 MiB chunks on the same pool as the kernels. Several loops, because
// which one streams fastest depends on the CPU; the baseline is the best of
// them, measured in the same run.
uint64_t ReadChunkScalar(const unsigned char* p, uint64_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, sizeof(w));
    a0 += w[0];
    a1 += w[1];
    a2 += w[2];
    a3 += w[3];
  }
  uint64_t sum = a0 + a1 + a2 + a3;
  for (; i < n; ++i) sum += p[i];
  return sum;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t ReadChunkAvx2(const unsigned char* p,
                                                       uint64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  uint64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i* q = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(q + 0));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(q + 1));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(q + 2));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(q + 3));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1),
                                      _mm256_add_epi64(a2, a3)));
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) sum += p[i];
  return sum;
}

// Four independent accumulators, 256 bytes a round; with kPrefetch, each
// round also asks for the line 1 KiB ahead (the scan's distance).
template <bool kPrefetch>
__attribute__((target("avx512f"))) uint64_t ReadChunkAvx512(const unsigned char* p,
                                                           uint64_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  uint64_t i = 0;
  for (; i + 256 <= n; i += 256) {
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 1024 + 128), _MM_HINT_T0);
    }
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 192));
  }
  uint64_t sum = _mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  for (; i < n; ++i) sum += p[i];
  return sum;
}

// Same loads, a longer dependency chain: on some CPUs (seen on Zen 4) this
// shape streams faster than the pure-add loop above.
__attribute__((target("avx512f"))) uint64_t ReadChunkAvx512Chained(
    const unsigned char* p, uint64_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  uint64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_loadu_si512(p + i + 64));
    a0 = _mm512_add_epi64(a0, a1);
  }
  uint64_t sum = _mm512_reduce_add_epi64(_mm512_add_epi64(a0, a1));
  for (; i < n; ++i) sum += p[i];
  return sum;
}
#endif

struct ReadLoop {
  const char* name;
  uint64_t (*chunk)(const unsigned char* p, uint64_t n);
};

// The read loops this CPU can run (the kernels' own dispatch decides).
std::vector<ReadLoop> ReadLoops() {
  std::vector<ReadLoop> loops = {{"scalar64", ReadChunkScalar}};
#if defined(__x86_64__)
  const kernels::CpuPath path = kernels::DetectedCpuPath();
  if (path == kernels::CpuPath::kAvx2 || path == kernels::CpuPath::kAvx512) {
    loops.push_back({"avx2", ReadChunkAvx2});
  }
  if (path == kernels::CpuPath::kAvx512) {
    loops.push_back({"avx512", ReadChunkAvx512<false>});
    loops.push_back({"avx512_prefetch", ReadChunkAvx512<true>});
    loops.push_back({"avx512_chained", ReadChunkAvx512Chained});
  }
#endif
  return loops;
}

uint64_t StreamingRead(const std::vector<ByteSpan>& spans, ThreadPool& pool,
                       const ReadLoop& loop) {
  std::vector<uint64_t> sizes;
  for (const ByteSpan& s : spans) sizes.push_back(s.size);
  const auto chunks = kernels::SplitIntoChunks(sizes, 1ull << 20);
  std::vector<uint64_t> sums(chunks.size());
  pool.ParallelFor(chunks.size(), [&](int64_t i) {
    const auto& c = chunks[i];
    const auto* p = static_cast<const unsigned char*>(spans[c.tensor].data) + c.begin;
    sums[i] = loop.chunk(p, c.length);
  });
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  return total;
}

// Mod 2^61 - 1 by 128-bit remainders, apart from the kernels' own code.
uint64_t MulMod61(uint64_t a, uint64_t b) {
  constexpr unsigned __int128 kP = (static_cast<unsigned __int128>(1) << 61) - 1;
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % kP);
}

// The fingerprint as a user would write it with libtorch ops: level 1 (the
// per-block NH sums, int64 arithmetic wrapping mod 2^64) as tensor ops,
// level 2 (a polynomial mod 2^61 - 1 over two values per 4 KiB, which
// tensor ops cannot multiply exactly) as a plain loop.
// REQUIRES: t holds a whole number of 64-bit words.
Fingerprint TorchOpsFingerprint(const torch::Tensor& t, const kernels::FingerprintKey& key) {
  const uint64_t bytes = static_cast<uint64_t>(t.numel() * t.element_size());
  const torch::Tensor words = t.view(torch::kInt64);
  const int64_t n = words.numel();
  const int64_t block = static_cast<int64_t>(kernels::kFingerprintBlockWords);
  const int64_t full = n / block;
  const int64_t mask = 0xffffffff;
  // (lo(w) + lo(k) mod 2^32) * (hi(w) + hi(k) mod 2^32), summed per block.
  auto block_sums = [&](const torch::Tensor& w, const torch::Tensor& k) {
    const torch::Tensor lo = w.bitwise_and(mask).add_(k.bitwise_and(mask)).bitwise_and_(mask);
    const torch::Tensor hi = w.bitwise_right_shift(32)
                                 .bitwise_and_(mask)
                                 .add_(k.bitwise_right_shift(32).bitwise_and(mask))
                                 .bitwise_and_(mask);
    return lo.mul_(hi).sum(-1);
  };
  Fingerprint fp{bytes, 0, 0};
  for (int j = 0; j < 2; ++j) {
    const torch::Tensor k =
        torch::from_blob(const_cast<uint64_t*>(key.words(j)), {block}, torch::kInt64);
    std::vector<int64_t> h;
    if (full > 0) {
      const torch::Tensor sums = block_sums(words.narrow(0, 0, full * block).view({full, block}), k);
      h.assign(sums.data_ptr<int64_t>(), sums.data_ptr<int64_t>() + full);
    }
    if (n > full * block) {
      const int64_t rest = n - full * block;
      h.push_back(block_sums(words.narrow(0, full * block, rest), k.narrow(0, 0, rest))
                      .item<int64_t>());
    }
    const uint64_t r = key.r(j);
    uint64_t a = 0;
    for (const int64_t sum : h) {
      const uint64_t v = static_cast<uint64_t>(sum);
      a = MulMod61(a + (v & 0xffffffffu), r);  // a + y < 2^62: no wrap.
      a = MulMod61(a + (v >> 32), r);
    }
    (j == 0 ? fp.s1 : fp.s2) = MulMod61(a + bytes, r);
  }
  return fp;
}

// torch.hash_tensor's definition (mode 0): the XOR of every element
// widened to fp64, as bits. Written out to check the call before timing it.
uint64_t XorOfWidenedFloats(const std::vector<float>& values) {
  uint64_t x = 0;
  for (const float v : values) {
    const double d = v;
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    x ^= bits;
  }
  return x;
}

// The value of the first /proc/cpuinfo line whose key is `key`, or "".
std::string CpuInfoField(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name == key) return colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  return "";
}

std::string CpuModel() {
  std::string model = CpuInfoField("model name");
  return model.empty() ? "unknown" : model;
}

// {"avx2":true,...} for the ISA extensions the kernels' speed depends on, as
// the kernel reports them in /proc/cpuinfo.
std::string IsaFlagsJson() {
  const std::string flags = " " + CpuInfoField("flags") + " ";
  std::string json = "{";
  for (const char* flag : {"avx2", "avx512f", "avx512bw", "avx512_bf16",
                           "avx512_vp2intersect"}) {
    const bool present = flags.find(absl::StrCat(" ", flag, " ")) != std::string::npos;
    absl::StrAppend(&json, json.size() > 1 ? "," : "", "\"", flag, "\":",
                    present ? "true" : "false");
  }
  return json + "}";
}

// The 1-minute load average, or -1 when unknown: runs on a busy machine
// measure the scheduler as much as the kernels.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "kernels_bench: %s\n", what.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "fingerprint and non-finite scan throughput, CPU (and GPU when built with CUDA).\n"
      "  kernels_bench [--reps=N]");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument '", rest[1], "' (see --help)"));
  const int reps = absl::GetFlag(FLAGS_reps);
  if (reps < 1) return Fail("--reps must be a positive integer");
  const int d_model = absl::GetFlag(FLAGS_d_model);
  if (d_model < 8) return Fail("--d_model must be at least 8");
  ThreadPool& pool = ThreadPool::Default();
  const int threads = pool.threads();
  const double load_before = LoadAverage();
  torch::set_num_threads(threads);

  std::fprintf(stderr, "building a transformer-shaped parameter set...\n");
  std::vector<Tensor> params = TransformerParameters(d_model);
  std::vector<ByteSpan> spans;
  std::vector<kernels::TensorRef> fp32_refs;
  uint64_t bytes = 0;
  for (const Tensor& t : params) {
    spans.push_back({t.values.data(), t.values.size() * sizeof(float)});
    fp32_refs.push_back({t.values.data(), t.values.size(), kernels::DType::kFloat32});
    bytes += spans.back().size;
  }
  // bf16 copies: the top half of each fp32.
  std::vector<std::vector<uint16_t>> bf16(params.size());
  std::vector<kernels::TensorRef> bf16_refs;
  uint64_t bf16_bytes = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    bf16[t].resize(params[t].values.size());
    for (size_t i = 0; i < bf16[t].size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &params[t].values[i], 4);
      bf16[t][i] = static_cast<uint16_t>(bits >> 16);
    }
    bf16_refs.push_back({bf16[t].data(), bf16[t].size(), kernels::DType::kBFloat16});
    bf16_bytes += 2 * bf16[t].size();
  }
  std::fprintf(stderr, "%zu tensors, %.1f MiB fp32, %d threads, %s path, %d reps\n",
               params.size(), bytes / 1048576.0, threads, kernels::CpuKernelPath(), reps);

  // A job's key: drawn as the guard draws one (the speed does not depend on it).
  const absl::StatusOr<uint64_t> seed = kernels::DrawFingerprintSeed();
  if (!seed.ok()) return Fail(seed.status().ToString());
  const kernels::FingerprintKey key = kernels::FingerprintKey::FromSeed(*seed);

  // Every implementation must agree before any of them is timed.
  std::vector<Fingerprint> ours(spans.size());
  if (auto s = kernels::FingerprintTensors(spans, key, absl::MakeSpan(ours)); !s.ok()) {
    return Fail(s.ToString());
  }
  std::vector<torch::Tensor> views;
  for (size_t t = 0; t < params.size(); ++t) {
    views.push_back(torch::from_blob(params[t].values.data(),
                                     {static_cast<int64_t>(params[t].values.size())},
                                     torch::kFloat32));
    if (TorchOpsFingerprint(views[t], key) != ours[t]) {
      return Fail(absl::StrCat("torch-ops fingerprint disagrees on ", params[t].name,
                               " under the key of seed ", *seed));
    }
    const uint64_t hashed = at::hash_tensor(views[t]).item().toUInt64();
    if (hashed != XorOfWidenedFloats(params[t].values)) {
      return Fail(absl::StrCat("torch.hash_tensor is not the XOR of fp64 bits on ",
                               params[t].name));
    }
  }

  // The scans must see no non-finite value in these finite weights, and
  // must see the one planted in a copy of the last tensor.
  std::vector<kernels::ScanResult> checked(spans.size());
  for (const auto* refs : {&fp32_refs, &bf16_refs}) {
    if (auto s = kernels::ScanNonFinite(*refs, absl::MakeSpan(checked)); !s.ok()) {
      return Fail(s.ToString());
    }
    for (size_t t = 0; t < checked.size(); ++t) {
      if (checked[t].nonfinite != 0 || !std::isfinite(checked[t].sum_squares)) {
        return Fail(absl::StrCat("the scan found non-finite values in finite ", params[t].name));
      }
    }
  }
  {
    std::vector<float> planted = params.back().values;
    planted[planted.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    const kernels::TensorRef ref{planted.data(), planted.size(), kernels::DType::kFloat32};
    kernels::ScanResult one;
    if (auto s = kernels::ScanNonFinite({&ref, 1}, {&one, 1}); !s.ok() || one.nonfinite != 1) {
      return Fail("the scan missed a NaN planted in a copy of " + params.back().name);
    }
  }

  // Measurements run interleaved, round after round, so a noisy neighbour
  // or a clock change hits all of them alike; each reports its median.
  volatile uint64_t sink = 0;
  std::vector<kernels::ScanResult> scans(spans.size());
  std::vector<std::array<unsigned char, SHA_DIGEST_LENGTH>> sha(spans.size());
  std::vector<std::pair<const char*, std::function<void()>>> runs = {
      {"fingerprint",
       [&] { (void)kernels::FingerprintTensors(spans, key, absl::MakeSpan(ours), &pool); }},
      {"nonfinite_fp32",
       [&] { (void)kernels::ScanNonFinite(fp32_refs, absl::MakeSpan(scans), &pool); }},
      {"nonfinite_bf16",
       [&] { (void)kernels::ScanNonFinite(bf16_refs, absl::MakeSpan(scans), &pool); }},
      {"sha1",
       [&] {
         pool.ParallelFor(spans.size(), [&](int64_t t) {
           SHA1(static_cast<const unsigned char*>(spans[t].data), spans[t].size,
                sha[t].data());
         });
       }},
      {"torch_ops",
       [&] {
         for (const torch::Tensor& view : views) sink = sink + TorchOpsFingerprint(view, key).s2;
       }},
      {"hash_tensor",
       [&] {
         for (const torch::Tensor& view : views) {
           sink = sink + at::hash_tensor(view).item().toUInt64();
         }
       }},
  };
  // The read baseline is the fastest of several plain read loops: the
  // kernels are held to the best this machine streams, not to a weak loop.
  const std::vector<ReadLoop> read_loops = ReadLoops();
  const size_t first_read = runs.size();
  for (const ReadLoop& loop : read_loops) {
    runs.push_back({loop.name, [&, loop] { sink = sink + StreamingRead(spans, pool, loop); }});
  }
  std::vector<std::vector<double>> times(runs.size());
  for (int round = 0; round <= reps; ++round) {
    for (size_t k = 0; k < runs.size(); ++k) {
      const auto start = std::chrono::steady_clock::now();
      runs[k].second();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) times[k].push_back(seconds);  // Round 0 warms caches up.
      // libtorch's OpenMP workers keep spinning for a while after their
      // work; let them sleep before the next measurement starts.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }
  auto median = [&](size_t k) {
    std::vector<double> t = times[k];
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  size_t best_read = first_read;
  std::string read_loops_json = "{";
  for (size_t k = first_read; k < runs.size(); ++k) {
    if (median(k) < median(best_read)) best_read = k;
    absl::StrAppend(&read_loops_json, k > first_read ? "," : "", "\"", runs[k].first,
                    "\":", absl::StrFormat("%.3f", Gbps(bytes, median(k))));
  }
  read_loops_json += "}";
  const double read_s = median(best_read);
  const char* const read_loop = runs[best_read].first;
  const double fp_s = median(0), nf32_s = median(1), nf16_s = median(2),
               sha_s = median(3), torch_s = median(4), hash_s = median(5);

  const double read_gbps = Gbps(bytes, read_s);
  const double fp_gbps = Gbps(bytes, fp_s);
  const double nf32_gbps = Gbps(bytes, nf32_s);
  const double nf16_gbps = Gbps(bf16_bytes, nf16_s);
  const double sha_gbps = Gbps(bytes, sha_s);
  const double torch_gbps = Gbps(bytes, torch_s);
  const double hash_gbps = Gbps(bytes, hash_s);

  std::string gpu_json = ",\"gpu\":null";
  std::string gpu_note = "no GPU: " + std::string(kernels::CudaAvailable().message());
#ifdef SDC_HAVE_CUDA
  if (kernels::CudaAvailable().ok()) {
    unsigned char* dev = nullptr;
    unsigned char* copy = nullptr;
    if (cudaMalloc(&dev, bytes) != cudaSuccess || cudaMalloc(&copy, bytes) != cudaSuccess) {
      return Fail("cudaMalloc failed");
    }
    std::vector<ByteSpan> dspans;
    uint64_t off = 0;
    for (const ByteSpan& s : spans) {
      cudaMemcpy(dev + off, s.data, s.size, cudaMemcpyHostToDevice);
      dspans.push_back({dev + off, s.size});
      off += s.size;
    }
    std::vector<Fingerprint> gpu_fp(dspans.size());
    if (auto s = kernels::FingerprintTensorsCuda(dspans, key, absl::MakeSpan(gpu_fp), nullptr);
        !s.ok()) {
      return Fail(s.ToString());
    }
    if (gpu_fp != ours) return Fail("GPU fingerprints differ from the CPU's");
    const double copy_s = MedianSeconds(reps, [&] {
      cudaMemcpy(copy, dev, bytes, cudaMemcpyDeviceToDevice);
      cudaDeviceSynchronize();
    });
    const double gfp_s = MedianSeconds(reps, [&] {
      (void)kernels::FingerprintTensorsCuda(dspans, key, absl::MakeSpan(gpu_fp), nullptr);
    });
    std::vector<kernels::TensorRef> drefs;
    for (const ByteSpan& s : dspans) {
      drefs.push_back({s.data, s.size / 4, kernels::DType::kFloat32});
    }
    const double gnf_s = MedianSeconds(reps, [&] {
      (void)kernels::ScanNonFiniteCuda(drefs, absl::MakeSpan(scans), nullptr);
    });
    cudaFree(dev);
    cudaFree(copy);
    // A device-to-device copy reads and writes every byte.
    const double copy_gbps = Gbps(2 * bytes, copy_s);
    gpu_json = absl::StrFormat(
        ",\"gpu\":{\"d2d_copy_gbps\":%.1f,\"fingerprint_gbps\":%.1f,"
        "\"fingerprint_ms\":%.3f,\"fingerprint_vs_copy\":%.3f,"
        "\"nonfinite_fp32_gbps\":%.1f,\"fingerprint_ms_953m_params\":%.3f}",
        copy_gbps, Gbps(bytes, gfp_s), gfp_s * 1e3, Gbps(bytes, gfp_s) / copy_gbps,
        Gbps(bytes, gnf_s), gfp_s * 1e3 * (953e6 * 4 / bytes));
    gpu_note = absl::StrFormat("GPU fingerprint %.1f GB/s vs d2d copy %.1f GB/s",
                               Gbps(bytes, gfp_s), copy_gbps);
  }
#endif

  std::printf("machine: %s, %d threads, kernel path %s, ISA %s\n", CpuModel().c_str(),
              threads, kernels::CpuKernelPath(), IsaFlagsJson().c_str());
  std::printf("parameter set: %zu tensors, %.1f MiB fp32 (bf16 copy %.1f MiB)\n",
              params.size(), bytes / 1048576.0, bf16_bytes / 1048576.0);
  std::printf("%-24s %10s %12s\n", "measurement", "GB/s", "vs read");
  auto row = [&](const char* name, double gbps) {
    std::printf("%-24s %10.2f %12.3f\n", name, gbps, gbps / read_gbps);
  };
  for (size_t k = first_read; k < runs.size(); ++k) {
    row(absl::StrCat("read ", runs[k].first, k == best_read ? " (best)" : "").c_str(),
        Gbps(bytes, median(k)));
  }
  row("fingerprint", fp_gbps);
  row("nonfinite scan fp32", nf32_gbps);
  row("nonfinite scan bf16", nf16_gbps);
  row("sha1 per tensor", sha_gbps);
  row("torch ops fingerprint", torch_gbps);
  row("torch.hash_tensor", hash_gbps);
  std::printf("fingerprint vs sha1: %.1fx, vs torch ops: %.1fx, vs torch.hash_tensor: %.2fx\n",
              fp_gbps / sha_gbps, fp_gbps / torch_gbps, fp_gbps / hash_gbps);
  std::printf("%s\n", gpu_note.c_str());
  std::printf("load average (1 min) %.2f before, %.2f after, on %d hardware threads\n",
              load_before, LoadAverage(), static_cast<int>(std::thread::hardware_concurrency()));
  std::printf(
      "{\"bytes\":%llu,\"threads\":%d,\"cpu_path\":\"%s\",\"read_gbps\":%.3f,"
      "\"fingerprint_gbps\":%.3f,\"fingerprint_vs_read\":%.3f,"
      "\"nonfinite_fp32_gbps\":%.3f,\"nonfinite_fp32_vs_read\":%.3f,"
      "\"nonfinite_bf16_gbps\":%.3f,\"nonfinite_bf16_vs_read\":%.3f,"
      "\"sha1_gbps\":%.3f,\"fingerprint_vs_sha1\":%.2f,"
      "\"torch_ops_gbps\":%.3f,\"fingerprint_vs_torch_ops\":%.2f,"
      "\"hash_tensor_gbps\":%.3f,\"fingerprint_vs_hash_tensor\":%.3f,"
      "\"cpu_model\":\"%s\",\"isa\":%s,\"fingerprint_path\":\"%s\","
      "\"scan_path\":\"%s\",\"read_loop\":\"%s\",\"read_loops_gbps\":%s,"
      "\"loadavg_1m_before\":%.2f,\"loadavg_1m_after\":%.2f%s}\n",
      static_cast<unsigned long long>(bytes), threads, kernels::CpuKernelPath(),
      read_gbps, fp_gbps, fp_gbps / read_gbps, nf32_gbps, nf32_gbps / read_gbps,
      nf16_gbps, nf16_gbps / read_gbps, sha_gbps, fp_gbps / sha_gbps, torch_gbps,
      fp_gbps / torch_gbps, hash_gbps, fp_gbps / hash_gbps, JsonEscape(CpuModel()).c_str(), IsaFlagsJson().c_str(),
      kernels::CpuKernelPath(), kernels::CpuPathName(kernels::DetectedCpuPath()),
      read_loop, read_loops_json.c_str(), load_before, LoadAverage(), gpu_json.c_str());
  return 0;
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) { return sdc::bench::Main(argc, argv); }
