#ifndef SDC_KERNELS_CPU_DISPATCH_H_
#define SDC_KERNELS_CPU_DISPATCH_H_

// Internal to //kernels: runtime CPU dispatch and the chunking shared by the
// CPU kernels. Binaries are built for baseline x86-64 (never -march=native);
// the AVX2 code paths are compiled with function target attributes and chosen
// at run time.

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace sdc::kernels {

class ThreadPool;

enum class CpuPath {
  kPortable,  // Plain C++; any CPU.
  kAvx2,      // AVX2 and F16C, x86-64 only.
  kAvx512,    // AVX-512F and BW (with AVX2 and F16C), x86-64 only.
};

// Every path this CPU can run, slowest first (tests run them all).
std::vector<CpuPath> SupportedCpuPaths();

// The fastest path this CPU supports.
CpuPath DetectedCpuPath();
const char* CpuPathName(CpuPath path);

// A piece of one tensor: units [begin, begin + length) of tensor `tensor`.
// Units are bytes for fingerprints and elements for scans.
struct Chunk {
  uint32_t tensor;
  uint64_t begin;
  uint64_t length;
};

// Splits tensors of the given sizes (in units) into chunks of at most
// `chunk_units`, in tensor order and then position order. Empty tensors get
// no chunk.
std::vector<Chunk> SplitIntoChunks(absl::Span<const uint64_t> sizes,
                                   uint64_t chunk_units);

// Runs fn(i) for each chunk index, on `pool` (nullptr: the default pool) when
// the work is worth the threads (`total_bytes` at least a few chunks), else
// inline on the caller.
void RunChunks(ThreadPool* pool, int64_t chunks, uint64_t total_bytes,
               absl::FunctionRef<void(int64_t)> fn);

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_CPU_DISPATCH_H_
