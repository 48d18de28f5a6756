// gpu_bench: the CUDA kernels' speed on a GPU, against a device-to-device
// copy of the same bytes measured in the same run, and the fingerprint of a
// 953M-parameter model (AWS measured 31.1 ms on an H100 for the weight vote;
// sdc-guard's goal is 1.5 ms). Prints one JSON line. Without a usable GPU it
// prints {"gpu":false,"reason":...} and exits 0 (tests/gpu/run.sh decides).
//
// Every figure is the best of several runs, timed on the host around the
// blocking kernel entry points (they include copying the small result back):
// what the guard pays per call. GB/s are bytes of the tensors per second; a
// copy of N bytes moves 2N (copy_traffic_gbps), so a kernel that reads at the
// memory's full speed shows about 2x copy_gbps.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cuda.h"

namespace sdc::kernels {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

template <typename F>
double Best(int runs, F f) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (!f()) return -1;
    best = std::min(best, Seconds(start));
  }
  return best;
}

bool Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

// The parameter tensors of a GPT-shaped model of about 953M parameters
// (d_model 2048, 17 layers, vocabulary 50,304, context 2048: 963M), in elements.
std::vector<uint64_t> ModelShapes() {
  const uint64_t d = 2048, vocab = 50304, layers = 17, context = 2048;
  std::vector<uint64_t> shapes = {vocab * d, context * d};
  for (uint64_t l = 0; l < layers; ++l) {
    for (uint64_t n : {d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d}) {
      shapes.push_back(n);
    }
  }
  shapes.push_back(d);
  shapes.push_back(d);
  return shapes;
}

int Main() {
  if (absl::Status s = CudaAvailable(); !s.ok()) {
    std::printf("{\"gpu\":false,\"reason\":\"%s\"}\n", std::string(s.message()).c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t stream = nullptr;
  if (!Check(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;

  // 1 GiB of random-looking floats (finite), and a second buffer to copy into.
  const uint64_t bytes = 1ull << 30;
  void *a = nullptr, *b = nullptr;
  if (!Check(cudaMalloc(&a, bytes), "cudaMalloc") || !Check(cudaMalloc(&b, bytes), "cudaMalloc")) return 1;
  {
    std::vector<float> host(bytes / 4);
    uint32_t x = 12345;
    for (float& v : host) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
    }
    if (!Check(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice), "upload")) return 1;
  }
  const int runs = 10;
  const double copy_s = Best(runs, [&] {
    return Check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream), "copy") &&
           Check(cudaStreamSynchronize(stream), "sync");
  });
  const ByteSpan span{a, bytes};
  Fingerprint fp;
  const FingerprintKey key = FingerprintKey::FromSeed(kFixedFingerprintSeed);
  const double fingerprint_s = Best(runs, [&] {
    return FingerprintTensorsCuda({&span, 1}, key, {&fp, 1}, stream).ok();
  });
  ScanResult scan;
  const TensorRef fp32{a, bytes / 4, DType::kFloat32};
  const double scan32_s = Best(runs, [&] { return ScanNonFiniteCuda({&fp32, 1}, {&scan, 1}, stream).ok(); });
  const TensorRef bf16{a, bytes / 2, DType::kBFloat16};
  const double scan16_s = Best(runs, [&] { return ScanNonFiniteCuda({&bf16, 1}, {&scan, 1}, stream).ok(); });
  cudaFree(b);
  cudaFree(a);

  // The 953M-parameter model, fp32, one tensor per parameter, one call.
  const std::vector<uint64_t> shapes = ModelShapes();
  uint64_t params = 0;
  for (uint64_t n : shapes) params += n;
  void* model = nullptr;
  if (!Check(cudaMalloc(&model, params * 4), "cudaMalloc model")) return 1;
  Check(cudaMemset(model, 0x3c, params * 4), "cudaMemset");
  std::vector<ByteSpan> tensors;
  uint64_t offset = 0;
  for (uint64_t n : shapes) {
    tensors.push_back({static_cast<char*>(model) + offset * 4, n * 4});
    offset += n;
  }
  std::vector<Fingerprint> fps(tensors.size());
  const double model_s = Best(5, [&] {
    return FingerprintTensorsCuda(tensors, key, absl::MakeSpan(fps), stream).ok();
  });
  cudaFree(model);
  cudaStreamDestroy(stream);
  if (copy_s < 0 || fingerprint_s < 0 || scan32_s < 0 || scan16_s < 0 || model_s < 0) {
    std::fprintf(stderr, "gpu_bench: a kernel failed\n");
    return 1;
  }
  const double gb = bytes / 1e9;
  std::printf(
      "{\"gpu\":true,\"device\":\"%s\",\"bytes\":%llu,\"copy_gbps\":%.1f,\"copy_traffic_gbps\":%.1f,"
      "\"fingerprint_gbps\":%.1f,\"fingerprint_vs_copy\":%.3f,\"scan_fp32_gbps\":%.1f,"
      "\"scan_fp32_vs_copy\":%.3f,\"scan_bf16_gbps\":%.1f,\"scan_bf16_vs_copy\":%.3f,"
      "\"model_params\":%llu,\"model_tensors\":%zu,\"model_fingerprint_ms\":%.3f,"
      "\"model_fingerprint_goal_ms\":1.5}\n",
      prop.name, static_cast<unsigned long long>(bytes), gb / copy_s, 2 * gb / copy_s, gb / fingerprint_s,
      copy_s / fingerprint_s, gb / scan32_s, copy_s / scan32_s, gb / scan16_s, copy_s / scan16_s,
      static_cast<unsigned long long>(params), tensors.size(), model_s * 1000);
  return 0;
}

}  // namespace
}  // namespace sdc::kernels

int main() { return sdc::kernels::Main(); }
