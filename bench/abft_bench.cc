// ./sdc bench abft: the cost of checksumming every matrix product of one
// training step of the demo's transformer (batch 8 x context 64 tokens,
// width 64, 4 heads, 2 layers; --width and --tokens scale it), against the
// products themselves computed by MKL's sgemm, the routine torch's CPU
// matmul calls for fp32, taken from libtorch_cpu. Both single-threaded (the
// check runs on the caller's thread); attention's products are one batched
// check per bmm. Before printing any figure it asserts
// that every healthy sgemm output passes both threshold rules and that one
// output element moved by twice the probabilistic threshold fails it, and
// reports that threshold as a fraction of the column's rms: the smallest
// relative error of one element each rule is sure to catch. Prints a table, then one JSON line last,
// whose "per_shape" list holds each product shape's check time / sgemm time.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "kernels/abft.h"
#include "kernels/cpu_dispatch.h"

// MKL inside libtorch_cpu (LP64, column-major).
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);
// The C and Fortran names share one entry point here, which takes a pointer.
extern "C" int mkl_set_num_threads_local_(const int* threads);

ABSL_FLAG(int, reps, 5, "Timed repetitions (the best is kept).");
ABSL_FLAG(int, width, 64, "Model width (the demo: 64).");
ABSL_FLAG(int, tokens, 512, "Tokens per step: batch x context (the demo: 8 x 64).");

namespace sdc::bench {
namespace {

using kernels::AbftOptions;
using kernels::AbftRule;
using kernels::DType;
using kernels::MatrixRef;

// One product C = A B of a step, row-major operands; a transposed operand is
// a transposed view of a row-major tensor, as torch passes W^T and dY^T.
struct ProductSpec {
  std::string name;
  int m, k, n;
  bool a_transposed, b_transposed;
  int count;     // How many of these per step.
  bool batched;  // One bmm of `count` products (attention), else separate calls.
};

std::vector<ProductSpec> StepProducts(int tokens, int width) {
  const int heads = 4, head_dim = width / heads, context = 64;
  const int sequences = std::max(1, tokens / context), vocab = 256;
  std::vector<ProductSpec> out;
  auto linear = [&](const std::string& name, int in, int outs, int count) {
    out.push_back({name + " fwd", tokens, in, outs, false, true, count, false});  // x W^T
    out.push_back({name + " dx", tokens, outs, in, false, false, count, false});  // dy W
    out.push_back({name + " dW", outs, tokens, in, true, false, count, false});   // dy^T x
  };
  const int layers = 2;
  linear("qkv", width, 3 * width, layers);
  linear("proj", width, width, layers);
  linear("fc1", width, 4 * width, layers);
  linear("fc2", 4 * width, width, layers);
  linear("head", width, vocab, 1);
  const int attn = layers * sequences * heads;
  out.push_back({"attn QK^T", context, head_dim, context, false, true, attn, true});
  out.push_back({"attn PV", context, context, head_dim, false, false, attn, true});
  out.push_back({"attn dP = dO V^T", context, head_dim, context, false, true, attn, true});
  out.push_back({"attn dV = P^T dO", context, context, head_dim, true, false, attn, true});
  out.push_back({"attn dQ = dS K", context, context, head_dim, false, false, attn, true});
  out.push_back({"attn dK = dS^T Q", context, context, head_dim, true, false, attn, true});
  return out;
}

// The operands of one product, or of a batch of them stored back to back.
struct Operands {
  int batch = 1;
  std::vector<float> a, b, c;
  MatrixRef a_ref, b_ref, c_ref;  // Product 0; product i at + i * strides.
  kernels::BatchStrides strides;
};

Operands Make(const ProductSpec& p, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Operands o;
  o.batch = p.batched ? p.count : 1;
  o.strides = {int64_t(p.m) * p.k, int64_t(p.k) * p.n, int64_t(p.m) * p.n, 0};
  o.a.resize(size_t(p.m) * p.k * o.batch);
  o.b.resize(size_t(p.k) * p.n * o.batch);
  o.c.assign(size_t(p.m) * p.n * o.batch, 0.0f);
  for (float& v : o.a) v = normal(rng);
  for (float& v : o.b) v = normal(rng);
  // A stored as [m, k] or, transposed, as [k, m]; the same for B.
  o.a_ref = p.a_transposed ? kernels::Transposed(kernels::RowMajor(o.a.data(), p.k, p.m,
                                                                   DType::kFloat32))
                           : kernels::RowMajor(o.a.data(), p.m, p.k, DType::kFloat32);
  o.b_ref = p.b_transposed ? kernels::Transposed(kernels::RowMajor(o.b.data(), p.n, p.k,
                                                                   DType::kFloat32))
                           : kernels::RowMajor(o.b.data(), p.k, p.n, DType::kFloat32);
  o.c_ref = kernels::RowMajor(o.c.data(), p.m, p.n, DType::kFloat32);
  return o;
}

// Row-major C = A B is column-major C^T = B^T A^T; a batch is one sgemm per
// product, as torch's CPU bmm does for small matrices.
void Sgemm(const ProductSpec& p, Operands& o) {
  const char ta = p.a_transposed ? 'T' : 'N', tb = p.b_transposed ? 'T' : 'N';
  const int lda = p.a_transposed ? p.m : p.k, ldb = p.b_transposed ? p.k : p.n;
  const float one = 1.0f, zero = 0.0f;
  for (int i = 0; i < o.batch; ++i) {
    sgemm_(&tb, &ta, &p.n, &p.m, &p.k, &one, o.b.data() + i * o.strides.b, &ldb,
           o.a.data() + i * o.strides.a, &lda, &zero, o.c.data() + i * o.strides.c, &p.n);
  }
}

absl::StatusOr<kernels::AbftResult> Check(const Operands& o, const AbftOptions& options) {
  return kernels::CheckBatchedMatrixProduct(o.batch, o.a_ref, o.b_ref, o.c_ref, o.strides,
                                            nullptr, options);
}

template <typename Fn>
double BestSeconds(int reps, int inner, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) fn();
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
    best = std::min(best, d.count() / inner);
  }
  return best;
}

void Die(const std::string& why) {
  std::fprintf(stderr, "abft_bench: %s\n", why.c_str());
  std::exit(1);
}

int Main() {
  const int reps = absl::GetFlag(FLAGS_reps), width = absl::GetFlag(FLAGS_width);
  const int tokens = absl::GetFlag(FLAGS_tokens);
  if (reps < 1 || width < 4 || width % 4 != 0 || tokens < 64) {
    Die("--reps >= 1, --width a multiple of 4 (>= 4), --tokens >= 64");
  }
  const int one_thread = 1;
  mkl_set_num_threads_local_(&one_thread);
  std::mt19937_64 rng(45);
  AbftOptions guaranteed, probabilistic;
  probabilistic.rule = AbftRule::kProbabilistic;

  std::printf("%-18s %5s %5s %5s %5s %10s %10s %10s %8s %8s\n", "product", "m", "k", "n",
              "count", "gemm_us", "guar_us", "prob_us", "guar/%", "prob/%");
  double gemm_s = 0, guar_s = 0, prob_s = 0, worst_rel_guar = 0, worst_rel_prob = 0;
  int products = 0;
  std::string per_shape;  // JSON objects, one per product shape.
  for (const ProductSpec& p : StepProducts(tokens, width)) {
    Operands o = Make(p, rng);
    Sgemm(p, o);
    // Correctness first: MKL's healthy output passes both rules; one element
    // moved by twice the probabilistic threshold fails it.
    double rms = 0.0, prob_threshold = 0.0;
    for (int i = 0; i < p.m; ++i) rms += double(o.c[size_t(i) * p.n]) * o.c[size_t(i) * p.n];
    rms = std::sqrt(rms / p.m);
    for (const AbftOptions* opt : {&guaranteed, &probabilistic}) {
      auto r = Check(o, *opt);
      if (!r.ok()) Die(std::string(r.status().message()));
      if (!r->passed) {
        Die(absl::StrFormat("%s: the healthy sgemm output failed (discrepancy %g > %g)",
                            p.name, r->discrepancy, r->threshold));
      }
      double& worst = opt == &guaranteed ? worst_rel_guar : worst_rel_prob;
      worst = std::max(worst, r->threshold / rms);
      if (opt == &probabilistic) prob_threshold = r->threshold;
    }
    const float saved = o.c[0];
    o.c[0] = static_cast<float>(saved + 2.0 * prob_threshold);
    auto bad = Check(o, probabilistic);
    if (!bad.ok() || bad->passed || bad->worst_index != 0) {
      Die(absl::StrFormat("%s: an error of twice the threshold in C[0][0] went undetected",
                          p.name));
    }
    o.c[0] = saved;

    const int inner = std::max(1, int(2e6 / (double(p.m) * p.k * p.n * o.batch)));
    const double g = BestSeconds(reps, inner, [&] { Sgemm(p, o); });
    auto check = [&](const AbftOptions& opt) {
      return BestSeconds(reps, inner, [&] {
        auto r = Check(o, opt);
        if (!r.ok() || !r->passed) Die("a check failed while timed");
      });
    };
    const double cg = check(guaranteed), cp = check(probabilistic);
    // Per-product times (a batch's divided by its size).
    const double per = p.batched ? 1.0 / p.count : 1.0;
    std::printf("%-18s %5d %5d %5d %5d %10.2f %10.2f %10.2f %8.1f %8.1f\n", p.name.c_str(),
                p.m, p.k, p.n, p.count, g * per * 1e6, cg * per * 1e6, cp * per * 1e6,
                100 * cg / g, 100 * cp / g);
    absl::StrAppendFormat(&per_shape,
                          "%s{\"product\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, "
                          "\"count\": %d, \"guaranteed_vs_gemm\": %.4f, "
                          "\"probabilistic_vs_gemm\": %.4f}",
                          per_shape.empty() ? "" : ", ", p.name, p.m, p.k, p.n, p.count, cg / g,
                          cp / g);
    gemm_s += g * per * p.count;
    guar_s += cg * per * p.count;
    prob_s += cp * per * p.count;
    products += p.count;
  }
  std::printf(
      "\nper step (%d products, width %d, %d tokens, %s, 1 thread): sgemm %.3f ms, "
      "checksums %.3f ms guaranteed (%.1f%%), %.3f ms probabilistic (%.1f%%)\n"
      "smallest detectable error of one element, worst product, as a fraction of the "
      "column rms: guaranteed %.3g, probabilistic %.3g\n",
      products, width, tokens, kernels::CpuPathName(kernels::DetectedCpuPath()), gemm_s * 1e3,
      guar_s * 1e3, 100 * guar_s / gemm_s, prob_s * 1e3, 100 * prob_s / gemm_s, worst_rel_guar,
      worst_rel_prob);
  std::printf(
      "{\"products\": %d, \"width\": %d, \"tokens\": %d, \"gemm_ms\": %.4f, "
      "\"abft_guaranteed_ms\": %.4f, \"abft_probabilistic_ms\": %.4f, "
      "\"guaranteed_vs_gemm\": %.4f, \"probabilistic_vs_gemm\": %.4f, "
      "\"guaranteed_detects_rel\": %.4g, \"probabilistic_detects_rel\": %.4g, "
      "\"per_shape\": [%s]}\n",
      products, width, tokens, gemm_s * 1e3, guar_s * 1e3, prob_s * 1e3, guar_s / gemm_s,
      prob_s / gemm_s, worst_rel_guar, worst_rel_prob, per_shape.c_str());
  return 0;
}

}  // namespace
}  // namespace sdc::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return sdc::bench::Main();
}
