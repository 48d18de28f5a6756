#include "kernels/cpu_dispatch.h"

#include <algorithm>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/thread_pool.h"

namespace sdc::kernels {
namespace {

#if defined(__x86_64__)
// F16C by CPUID rather than __builtin_cpu_supports: clang before 16 does not
// know the "f16c" feature name, and the fuzz build uses clang.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

// Below this much work, waking the pool costs more than it saves.
constexpr uint64_t kParallelMinBytes = 2ull << 20;

}  // namespace

CpuPath DetectedCpuPath() {
  static const CpuPath path = SupportedCpuPaths().back();
  return path;
}

std::vector<CpuPath> SupportedCpuPaths() {
  std::vector<CpuPath> paths = {CpuPath::kPortable};
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && HasF16c()) {
    paths.push_back(CpuPath::kAvx2);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
      paths.push_back(CpuPath::kAvx512);
    }
  }
#endif
  return paths;
}

const char* CpuPathName(CpuPath path) {
  switch (path) {
    case CpuPath::kAvx2:
      return "avx2";
    case CpuPath::kAvx512:
      return "avx512";
    case CpuPath::kPortable:
      return "portable";
  }
  return "unknown";
}

std::vector<Chunk> SplitIntoChunks(absl::Span<const uint64_t> sizes,
                                   uint64_t chunk_units) {
  std::vector<Chunk> chunks;
  for (uint32_t t = 0; t < sizes.size(); ++t) {
    for (uint64_t begin = 0; begin < sizes[t]; begin += chunk_units) {
      chunks.push_back({t, begin, std::min(chunk_units, sizes[t] - begin)});
    }
  }
  return chunks;
}

void RunChunks(ThreadPool* pool, int64_t chunks, uint64_t total_bytes,
               absl::FunctionRef<void(int64_t)> fn) {
  if (total_bytes < kParallelMinBytes) {
    for (int64_t i = 0; i < chunks; ++i) fn(i);
    return;
  }
  (pool != nullptr ? *pool : ThreadPool::Default()).ParallelFor(chunks, fn);
}

}  // namespace sdc::kernels
