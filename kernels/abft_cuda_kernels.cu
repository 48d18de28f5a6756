// The passes of the CUDA product check (kernels/abft_cuda.h); see
// abft_cuda_kernels.h for what each computes. Built with --fmad=false: no
// multiply is fused into an add, as in the CPU check (-ffp-contract=off),
// so abft_rule::Threshold gives the same bits on both for the same sums.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "kernels/abft_cuda_kernels.h"

namespace sdc::kernels::abft_cuda_impl {
namespace {

// DType codes, as in kernels/nonfinite.h.
constexpr uint32_t kFloat32 = 0;
constexpr uint32_t kFloat16 = 2;
constexpr uint32_t kBFloat16 = 3;

constexpr int kTile = 32;      // Rows and columns of a tile.
constexpr int kRowThreads = 8; // Threads down a tile's columns.
constexpr int kFinishThreads = 256;

__device__ inline double Load(const void* base, int64_t at, uint32_t dtype) {
  switch (dtype) {
    case kFloat16: {
      const unsigned short h = static_cast<const unsigned short*>(base)[at];
      return static_cast<double>(__half2float(__ushort_as_half(h)));
    }
    case kBFloat16: {
      const unsigned short h = static_cast<const unsigned short*>(base)[at];
      return static_cast<double>(__uint_as_float(static_cast<uint32_t>(h) << 16));
    }
    default:  // kFloat32
      return static_cast<double>(static_cast<const float*>(base)[at]);
  }
}

__device__ inline double LineValue(const ExtraLine& e, int64_t b, int64_t i) {
  if (e.kind == ExtraLine::kOnes) return 1.0;
  return Load(e.data, b * e.batch_stride + i * e.stride, e.dtype);
}

// Element (r, c) of batch member b, the extra lines included; 0 outside.
__device__ inline double Element(const Matrix& m, int64_t b, int64_t r, int64_t c) {
  if (r < m.rows && c < m.cols) {
    return Load(m.data, b * m.batch_stride + r * m.row_stride + c * m.col_stride, m.dtype);
  }
  if (c == m.cols && r < m.rows && m.extra_col.kind != ExtraLine::kNone) {
    return LineValue(m.extra_col, b, r);
  }
  if (r == m.rows && c < m.cols && m.extra_row.kind != ExtraLine::kNone) {
    return LineValue(m.extra_row, b, c);
  }
  return 0.0;
}

__device__ inline double Weight(const Weights& w, int a, int64_t b, int64_t r) {
  return w.w[a] == nullptr ? 1.0 : w.w[a][b * w.batch_stride + r];
}

// Block (32 x 8 threads): tile column tiles x chunk y x batch member z.
__global__ void ColumnStatsKernel(Matrix m, Weights w, uint32_t slots, int64_t chunk_rows,
                                  int64_t chunks, double* out) {
  __shared__ double tile[kTile][kTile + 1];
  __shared__ double sums[kSlots][kRowThreads][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t rows = m.rows + (m.extra_row.kind != ExtraLine::kNone ? 1 : 0);
  const int64_t cols = m.cols + (m.extra_col.kind != ExtraLine::kNone ? 1 : 0);
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t last = first + chunk_rows < rows ? first + chunk_rows : rows;
  // Columns contiguous in memory: lanes walk rows, so the reads coalesce.
  const bool by_rows = m.row_stride == 1 && m.col_stride != 1;
  const int64_t col = c0 + tx;
  double acc[kSlots] = {0.0, 0.0, 0.0, 0.0};
  for (int64_t r0 = first; r0 < last; r0 += kTile) {
    for (int k = ty; k < kTile; k += kRowThreads) {
      if (by_rows) {
        tile[tx][k] = Element(m, b, r0 + tx, c0 + k);
      } else {
        tile[k][tx] = Element(m, b, r0 + k, c0 + tx);
      }
    }
    __syncthreads();
    if (col < cols) {
      for (int k = ty; k < kTile; k += kRowThreads) {
        const int64_t r = r0 + k;
        if (r >= last) break;
        const double x = tile[k][tx];
        const double ax = fabs(x);
        if (slots & 1u) acc[0] = __dadd_rn(acc[0], w.w[0] ? __dmul_rn(Weight(w, 0, b, r), x) : x);
        if (slots & 2u) acc[1] = __dadd_rn(acc[1], w.w[1] ? __dmul_rn(Weight(w, 1, b, r), ax) : ax);
        if (slots & 4u) {
          const double sq = __dmul_rn(x, x);
          acc[2] = __dadd_rn(acc[2], w.w[2] ? __dmul_rn(Weight(w, 2, b, r), sq) : sq);
        }
        if (slots & 8u) acc[3] = __dadd_rn(acc[3], w.w[3] ? __dmul_rn(Weight(w, 3, b, r), ax) : ax);
      }
    }
    __syncthreads();
  }
  for (int a = 0; a < kSlots; ++a) sums[a][ty][tx] = acc[a];
  __syncthreads();
  if (ty == 0 && col < cols) {
    for (int a = 0; a < kSlots; ++a) {
      double total = 0.0;
      for (int t = 0; t < kRowThreads; ++t) total = __dadd_rn(total, sums[a][t][tx]);
      out[((b * chunks + blockIdx.y) * kSlots + a) * cols + col] = total;
    }
  }
}

__global__ void FoldChunksKernel(const double* partials, int64_t batch, int64_t chunks,
                                 int64_t columns, double* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t per_batch = kSlots * columns;
  if (i >= batch * per_batch) return;
  const int64_t b = i / per_batch, within = i % per_batch;
  double total = 0.0;
  for (int64_t r = 0; r < chunks; ++r) {
    total = __dadd_rn(total, partials[(b * chunks + r) * per_batch + within]);
  }
  out[i] = total;
}

__global__ void SquareWeightsKernel(double* l, int64_t batch, int64_t terms, int64_t q,
                                    double site_weight, double input_factor, bool input_rounding) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= batch * terms) return;
  const int64_t b = i / terms, k = i % terms;
  double* lb = l + b * kSlots * terms;
  const double input = k < q && input_rounding ? __dmul_rn(input_factor, lb[2 * terms + k]) : 0.0;
  lb[2 * terms + k] = __dadd_rn(__dmul_rn(site_weight, lb[3 * terms + k]), input);
}

// One candidate for the worst column.
struct Worst {
  double ratio;
  double discrepancy;
  double threshold;
  double reference;
  int64_t index;  // Global column b * s + j; -1 none.
};

// The worse of two: larger ratio, then the lower index (NaN ratios never
// win), so the result does not depend on the reduction's shape.
__device__ inline bool Worse(const Worst& x, const Worst& y) {
  if (y.index < 0) return x.index >= 0;
  if (x.index < 0) return false;
  if (x.ratio > y.ratio) return true;
  if (x.ratio < y.ratio || x.ratio != x.ratio) return false;
  if (y.ratio != y.ratio) return true;
  return x.index < y.index;
}

// A block's tree over its threads' candidates; thread 0 returns the worst.
__device__ Worst BlockWorst(Worst mine) {
  __shared__ Worst shared[kFinishThreads];
  shared[threadIdx.x] = mine;
  __syncthreads();
  for (int half = kFinishThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half && Worse(shared[threadIdx.x + half], shared[threadIdx.x])) {
      shared[threadIdx.x] = shared[threadIdx.x + half];
    }
    __syncthreads();
  }
  return shared[0];
}

__global__ void FinishColumnsKernel(const double* r, const double* c, int64_t batch, int64_t s,
                                    abft_rule::Constants rule, double* blocks) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kFinishThreads + threadIdx.x;
  Worst mine{-1.0, 0.0, 0.0, 0.0, -1};
  bool failed = false;
  if (g < batch * s) {
    const int64_t b = g / s, j = g % s;
    const double* rb = r + b * kSlots * s;
    const double* cb = c + b * kSlots * s;
    const double threshold =
        abft_rule::Threshold(rule, rb[s + j], cb[s + j], rule.probabilistic ? rb[2 * s + j] : 0.0,
                             rule.c_squares ? cb[2 * s + j] : 0.0);
    const double discrepancy = cb[j] - rb[j];
    const double magnitude = fabs(discrepancy);
    const bool finite = isfinite(discrepancy);
    failed = !(finite && magnitude <= threshold);
    double ratio;
    if (!finite) {
      ratio = CUDART_INF;
    } else if (threshold > 0.0) {
      ratio = magnitude / threshold;
    } else {
      ratio = magnitude > 0.0 ? CUDART_INF : 0.0;
    }
    mine = Worst{ratio, discrepancy, threshold, rb[j], g};
  }
  const int count = __syncthreads_count(failed);
  const Worst worst = BlockWorst(mine);
  if (threadIdx.x == 0) {
    double* out = blocks + 8 * static_cast<int64_t>(blockIdx.x);
    out[0] = count;
    out[1] = worst.ratio;
    out[2] = worst.discrepancy;
    out[3] = worst.threshold;
    out[4] = worst.reference;
    out[5] = static_cast<double>(worst.index);
  }
}

// One block: the blocks' worst in order, and their failure counts.
// Writes NaN over element (row 0, column j) of batch member b of `m`.
__device__ void Poison(const Matrix& m, int64_t b, int64_t j) {
  const int64_t at = b * m.batch_stride + j * m.col_stride;
  void* base = const_cast<void*>(m.data);
  if (m.dtype == kFloat32) {
    static_cast<uint32_t*>(base)[at] = 0x7fc00000u;
  } else {
    static_cast<unsigned short*>(base)[at] = m.dtype == kFloat16 ? 0x7e00u : 0x7fc0u;
  }
}

__global__ void ReduceBlocksKernel(const double* blocks, int64_t count, int64_t s,
                                   double op_id, Record* record, Matrix product, bool poison) {
  Worst mine{-1.0, 0.0, 0.0, 0.0, -1};
  double failed = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kFinishThreads) {
    const double* in = blocks + 8 * i;
    failed += in[0];
    const Worst w{in[1], in[2], in[3], in[4], static_cast<int64_t>(in[5])};
    if (Worse(w, mine)) mine = w;
  }
  __shared__ double fails[kFinishThreads];
  fails[threadIdx.x] = failed;
  const Worst worst = BlockWorst(mine);  // Synchronizes: fails[] is complete.
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int t = 0; t < kFinishThreads; ++t) total += fails[t];
    Record out;
    out.failed = total;
    out.ratio = worst.ratio;
    out.discrepancy = worst.discrepancy;
    out.threshold = worst.threshold;
    out.reference = worst.reference;
    out.column = worst.index < 0 ? -1.0 : static_cast<double>(worst.index % s);
    out.batch = worst.index < 0 ? 0.0 : static_cast<double>(worst.index / s);
    out.op_id = op_id;
    *record = out;
    if (poison && total > 0 && worst.index >= 0) Poison(product, worst.index / s, worst.index % s);
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int LaunchColumnStats(const Matrix& m, int64_t batch, const Weights& w, uint32_t slots,
                      int64_t chunk_rows, int64_t chunks, double* out, void* stream) {
  const int64_t cols = m.cols + (m.extra_col.kind != ExtraLine::kNone ? 1 : 0);
  if (cols == 0 || batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(CeilDiv(cols, kTile)), static_cast<unsigned>(chunks),
                  static_cast<unsigned>(batch));
  const dim3 block(kTile, kRowThreads);
  ColumnStatsKernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(m, w, slots,
                                                                           chunk_rows, chunks, out);
  return static_cast<int>(cudaGetLastError());
}

int LaunchFoldChunks(const double* partials, int64_t batch, int64_t chunks, int64_t columns,
                     double* out, void* stream) {
  const int64_t n = batch * kSlots * columns;
  if (n == 0) return cudaSuccess;
  FoldChunksKernel<<<static_cast<unsigned>(CeilDiv(n, 256)), 256, 0,
                     static_cast<cudaStream_t>(stream)>>>(partials, batch, chunks, columns, out);
  return static_cast<int>(cudaGetLastError());
}

int LaunchSquareWeights(double* l, int64_t batch, int64_t terms, int64_t q, double site_weight,
                        double input_factor, bool input_rounding, void* stream) {
  const int64_t n = batch * terms;
  if (n == 0) return cudaSuccess;
  SquareWeightsKernel<<<static_cast<unsigned>(CeilDiv(n, 256)), 256, 0,
                        static_cast<cudaStream_t>(stream)>>>(l, batch, terms, q, site_weight,
                                                             input_factor, input_rounding);
  return static_cast<int>(cudaGetLastError());
}

int LaunchFinish(const double* r, const double* c, int64_t batch, int64_t s,
                 const abft_rule::Constants& rule, double op_id, double* blocks,
                 Record* record, const Matrix& product, bool poison, void* stream) {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int64_t n = CeilDiv(batch * s, kFinishThreads);
  if (n > 0) {
    FinishColumnsKernel<<<static_cast<unsigned>(n), kFinishThreads, 0, st>>>(r, c, batch, s, rule,
                                                                             blocks);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  }
  ReduceBlocksKernel<<<1, kFinishThreads, 0, st>>>(blocks, n, s > 0 ? s : 1, op_id, record,
                                                   product, poison);
  return static_cast<int>(cudaGetLastError());
}

const char* ErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace sdc::kernels::abft_cuda_impl
