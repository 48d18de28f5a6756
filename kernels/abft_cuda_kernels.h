#ifndef SDC_KERNELS_ABFT_CUDA_KERNELS_H_
#define SDC_KERNELS_ABFT_CUDA_KERNELS_H_

// Internal to //kernels:abft_cuda: the boundary between the nvcc-compiled
// passes of the CUDA product check (abft_cuda_kernels.cu) and its host code
// (abft_cuda.cc). Plain types only, so nvcc never compiles Abseil. Every
// function returns a cudaError_t value (0: success) and only queues work
// on `stream`; everything the kernels read and write is device memory.

#include <cstdint>

#include "kernels/abft_rule.h"

namespace sdc::kernels::abft_cuda_impl {

// A vector appended to a matrix as one more column (index `cols`) or row
// (index `rows`): absent, all ones, or values at data + i * stride (+ the
// batch member's batch_stride), in elements.
struct ExtraLine {
  enum Kind : uint32_t { kNone = 0, kOnes = 1, kValues = 2 };
  const void* data = nullptr;
  int64_t stride = 0;
  int64_t batch_stride = 0;
  uint32_t dtype = 0;  // sdc::kernels::DType's value.
  uint32_t kind = kNone;
};

// Batch member b's element (r, c) is at data + b * batch_stride + r *
// row_stride + c * col_stride elements.
struct Matrix {
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  int64_t batch_stride = 0;
  uint32_t dtype = 0;
  ExtraLine extra_col;
  ExtraLine extra_row;
};

// The column pass's four sums, slot a of each column: 0 sum w_i x, 1 sum
// w_i |x|, 2 sum w_i x^2, 3 sum w_i |x| (with its own weights).
inline constexpr int kSlots = 4;

// Per-row weights of the four sums (null: every weight 1, no multiply),
// batch member b's at + b * batch_stride.
struct Weights {
  const double* w[kSlots] = {nullptr, nullptr, nullptr, nullptr};
  int64_t batch_stride = 0;
};

// Column sums of `m` with its extra lines (T rows x U columns in all) over
// row chunks of `chunk_rows` rows (a multiple of 32): slot a of column j
// of chunk r of batch member b goes to out[((b * chunks + r) * kSlots + a)
// * U + j]. Slots whose bit (1 << a) is not in `slots` are written as 0.
// Within a chunk the order is fixed (32-row tiles in order; in a tile,
// rows t, t + 8, t + 16, t + 24 per thread t, the eight threads in order).
// REQUIRES: U > 0, batch <= 65535, chunks <= 65535.
int LaunchColumnStats(const Matrix& m, int64_t batch, const Weights& w, uint32_t slots,
                      int64_t chunk_rows, int64_t chunks, double* out, void* stream);

// out[(b * kSlots + a) * U + j] = the sum over chunks, in order, of the
// partials above.
int LaunchFoldChunks(const double* partials, int64_t batch, int64_t chunks, int64_t columns,
                     double* out, void* stream);

// l[b][2][k] = site_weight * l[b][3][k] + (k < q and input_rounding ?
// input_factor * l[b][2][k] : 0), in place, l the L pass's folded sums
// (kSlots x terms per batch member): abft.cc's weights of the variance, in
// the slot the R pass reads them from.
int LaunchSquareWeights(double* l, int64_t batch, int64_t terms, int64_t q, double site_weight,
                        double input_factor, bool input_rounding, void* stream);

// What one product's check leaves in device memory (8 doubles).
struct Record {
  double failed = 0;       // Columns over their threshold.
  double ratio = -1;       // The worst column's |discrepancy| / threshold.
  double discrepancy = 0;  // Its signed discrepancy,
  double threshold = 0;    // threshold
  double reference = 0;    // and reference checksum.
  double column = -1;      // Its column (-1: no column).
  double batch = 0;        // Its batch member.
  double op_id = 0;        // The caller's id of the product.
};

// Columns g = b * s + j: reference, T and the variance from r (the R
// pass's folded sums), observed, S and sum C^2 from c (the C pass's),
// each column's threshold by abft_rule::Threshold and its ratio; the worst
// column (largest ratio, then lowest g) and the count of failing ones go
// to `record`. `blocks` holds 8 doubles per 256 columns. With `poison`,
// a failed check also writes NaN into the worst column's first element of
// `product` (C itself), so what the step computes from it is NaN.
int LaunchFinish(const double* r, const double* c, int64_t batch, int64_t s,
                 const abft_rule::Constants& rule, double op_id, double* blocks,
                 Record* record, const Matrix& product, bool poison, void* stream);

// CUDA's text for an error code.
const char* ErrorString(int code);

}  // namespace sdc::kernels::abft_cuda_impl

#endif  // SDC_KERNELS_ABFT_CUDA_KERNELS_H_
