#include "kernels/abft_cuda.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/abft_cuda_kernels.h"
#include "kernels/abft_rule.h"

// The passes, as abft.cc's CheckColumns with L = A, R = B and, for a bias,
// a column of ones appended to L and the bias appended to R as a row:
//   1. (probabilistic) L^T's column sums of |x|: each row's absolute sum r_i;
//   2. L's column sums of x, |x|, x^2 (input rounding) and r_i |x|;
//   3. (probabilistic) the variance's per-row weights from 2;
//   4. R's column sums weighted by 2: reference_j, T_j, the variance;
//   5. C's column sums of x, |x| and x^2 (a narrower C): observed_j, S_j;
//   6. each column's threshold (abft_rule::Threshold) and the worst column.

namespace sdc::kernels {
namespace {

using abft_cuda_impl::ExtraLine;
using abft_cuda_impl::kSlots;
using abft_cuda_impl::Matrix;
using abft_cuda_impl::Weights;

constexpr int64_t kMaxBatch = 65535;
constexpr int64_t kTileRows = 32;
// Blocks a pass aims for: a few per SM of the largest GPUs.
constexpr int64_t kTargetBlocks = 2048;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One pass over a matrix: its rows and columns with the extra lines, and
// the row chunks its sums are cut into.
struct Pass {
  Matrix m;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t chunk_rows = kTileRows;
  int64_t chunks = 1;
  size_t partials = 0;  // Offset in doubles (chunks > 1 only).
  size_t out = 0;       // Offset of the folded sums: batch x kSlots x cols.
};

struct Plan {
  int64_t batch = 0, p = 0, q = 0, s = 0, terms = 0;
  bool probabilistic = false, input_rounding = false, empty = false;
  Pass lt, l, r, c;
  size_t blocks = 0;
  size_t doubles = 0;
};

ExtraLine Ones() {
  ExtraLine e;
  e.kind = ExtraLine::kOnes;
  return e;
}

Matrix MatrixOf(const MatrixRef& m, int64_t batch_stride) {
  Matrix out;
  out.data = m.data;
  out.rows = m.rows;
  out.cols = m.cols;
  out.row_stride = m.row_stride;
  out.col_stride = m.col_stride;
  out.batch_stride = batch_stride;
  out.dtype = static_cast<uint32_t>(m.dtype);
  return out;
}

void Size(Pass& pass, int64_t batch, size_t& doubles) {
  pass.rows = pass.m.rows + (pass.m.extra_row.kind != ExtraLine::kNone ? 1 : 0);
  pass.cols = pass.m.cols + (pass.m.extra_col.kind != ExtraLine::kNone ? 1 : 0);
  const int64_t tiles = std::max<int64_t>(1, CeilDiv(pass.cols, 32) * batch);
  const int64_t row_tiles = std::max<int64_t>(1, CeilDiv(pass.rows, kTileRows));
  const int64_t want = std::clamp<int64_t>(CeilDiv(kTargetBlocks, tiles), 1, row_tiles);
  pass.chunk_rows = CeilDiv(row_tiles, want) * kTileRows;
  pass.chunks = std::max<int64_t>(1, CeilDiv(pass.rows, pass.chunk_rows));
  // 16-byte aligned arrays: offsets in pairs of doubles.
  auto take = [&](int64_t n) {
    const size_t at = doubles;
    doubles += static_cast<size_t>(CeilDiv(n, 2) * 2);
    return at;
  };
  pass.out = take(batch * kSlots * pass.cols);
  if (pass.chunks > 1) pass.partials = take(batch * pass.chunks * kSlots * pass.cols);
}

absl::StatusOr<Plan> MakePlan(int64_t batch, const MatrixRef& a, const MatrixRef& b,
                              const MatrixRef& c, const BatchStrides& strides,
                              const MatrixRef* bias, const AbftOptions& options) {
  if (batch < 0 || batch > kMaxBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("abft (CUDA): batch is ", batch, "; 0 to ", kMaxBatch, " products"));
  }
  if (absl::Status st = internal::ValidateMatrixProduct(a, b, c, bias, options); !st.ok()) {
    return st;
  }
  if (options.axis != AbftAxis::kColumns) {
    return absl::InvalidArgumentError("abft (CUDA): only the column checksums are computed");
  }
  Plan plan;
  plan.batch = batch;
  plan.p = a.rows;
  plan.q = a.cols;
  plan.s = b.cols;
  plan.terms = plan.q + (bias != nullptr ? 1 : 0);
  plan.probabilistic = options.rule == AbftRule::kProbabilistic;
  plan.input_rounding = plan.probabilistic && options.input_unit_roundoff > 0.0;
  plan.empty = c.rows == 0 || c.cols == 0 || batch == 0;
  if (plan.empty) return plan;

  plan.l.m = MatrixOf(a, strides.a);
  if (bias != nullptr) plan.l.m.extra_col = Ones();
  plan.lt.m = MatrixOf(Transposed(a), strides.a);
  if (bias != nullptr) plan.lt.m.extra_row = Ones();
  plan.r.m = MatrixOf(b, strides.b);
  if (bias != nullptr) {
    ExtraLine e;
    e.kind = ExtraLine::kValues;
    e.data = bias->data;
    e.stride = bias->col_stride;
    e.batch_stride = strides.bias;
    e.dtype = static_cast<uint32_t>(bias->dtype);
    plan.r.m.extra_row = e;
  }
  plan.c.m = MatrixOf(c, strides.c);
  size_t doubles = 0;
  if (plan.probabilistic) Size(plan.lt, batch, doubles);
  Size(plan.l, batch, doubles);
  Size(plan.r, batch, doubles);
  Size(plan.c, batch, doubles);
  plan.blocks = doubles;
  doubles += static_cast<size_t>(8 * CeilDiv(batch * plan.s, 256));
  plan.doubles = doubles;
  return plan;
}

bool Aligned(const MatrixRef* m) {
  return m == nullptr || m->data == nullptr ||
         reinterpret_cast<uintptr_t>(m->data) % static_cast<uintptr_t>(DTypeSize(m->dtype)) == 0;
}

}  // namespace

absl::StatusOr<size_t> CudaProductCheckWorkspaceBytes(int64_t batch, const MatrixRef& a,
                                                      const MatrixRef& b, const MatrixRef& c,
                                                      const MatrixRef* bias,
                                                      const AbftOptions& options) {
  absl::StatusOr<Plan> plan = MakePlan(batch, a, b, c, BatchStrides{}, bias, options);
  if (!plan.ok()) return plan.status();
  return plan->doubles * sizeof(double);
}

AbftResult ResultOfRecord(const CudaAbftRecord& record) {
  AbftResult r;
  r.passed = record.failed == 0;
  r.worst_index = static_cast<int64_t>(record.column);
  r.worst_axis = AbftAxis::kColumns;
  r.worst_batch = static_cast<int64_t>(record.batch);
  r.discrepancy = record.discrepancy;
  r.threshold = record.threshold;
  r.reference = record.reference;
  return r;
}

#ifdef SDC_HAVE_CUDA

namespace {

// Runs one pass: its column sums into pass.out (through the partials when
// it has several chunks).
int RunPass(const Pass& pass, int64_t batch, const Weights& w, uint32_t slots, double* base,
            void* stream) {
  double* out = base + pass.out;
  double* partials = pass.chunks > 1 ? base + pass.partials : out;
  if (int e = abft_cuda_impl::LaunchColumnStats(pass.m, batch, w, slots, pass.chunk_rows,
                                                pass.chunks, partials, stream);
      e != 0) {
    return e;
  }
  if (pass.chunks == 1 || pass.cols == 0) return 0;
  return abft_cuda_impl::LaunchFoldChunks(partials, batch, pass.chunks, pass.cols, out, stream);
}

}  // namespace

absl::Status QueueMatrixProductCheckCuda(int64_t batch, const MatrixRef& a, const MatrixRef& b,
                                         const MatrixRef& c, const BatchStrides& strides,
                                         const MatrixRef* bias, const AbftOptions& options,
                                         int64_t op_id, bool poison, void* workspace,
                                         size_t workspace_bytes, CudaAbftRecord* record,
                                         CudaStream stream) {
  absl::StatusOr<Plan> made = MakePlan(batch, a, b, c, strides, bias, options);
  if (!made.ok()) return made.status();
  const Plan& plan = *made;
  if (workspace_bytes < plan.doubles * sizeof(double) ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0 || record == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "abft (CUDA): the workspace needs ", plan.doubles * sizeof(double),
        " bytes, 16-byte aligned, and a record; got ", workspace_bytes, " bytes"));
  }
  if (!Aligned(&a) || !Aligned(&b) || !Aligned(&c) || !Aligned(bias)) {
    return absl::InvalidArgumentError("abft (CUDA): an operand is not aligned to its elements");
  }
  double* base = static_cast<double*>(workspace);
  auto* device_record = reinterpret_cast<abft_cuda_impl::Record*>(record);
  static_assert(sizeof(abft_cuda_impl::Record) == sizeof(CudaAbftRecord));
  auto fail = [](int e) {
    return absl::InternalError(
        absl::StrCat("abft (CUDA): a launch failed: CUDA error ", e, ": ", abft_cuda_impl::ErrorString(e)));
  };
  const abft_rule::Constants rule = abft_rule::MakeConstants(
      plan.p, plan.q, plan.terms, options.accumulate_unit_roundoff, options.input_unit_roundoff,
      AbftOutputUnitRoundoff(c.dtype), internal::AbftOutputUnderflow(c.dtype), plan.probabilistic,
      options.lambda);
  const double op = static_cast<double>(op_id);
  if (plan.empty) {
    if (int e = abft_cuda_impl::LaunchFinish(nullptr, nullptr, 0, 0, rule, op, base,
                                             device_record, Matrix{}, false, stream);
        e != 0) {
      return fail(e);
    }
    return absl::OkStatus();
  }
  constexpr uint32_t kSum = 1, kAbs = 2, kSq = 4, kAbs2 = 8;
  // 1. Each row's absolute sum (slot 1 of L^T's columns).
  if (plan.probabilistic) {
    if (int e = RunPass(plan.lt, batch, Weights{}, kAbs, base, stream); e != 0) return fail(e);
  }
  // 2. L's columns.
  Weights lw;
  if (plan.probabilistic) {
    lw.w[3] = base + plan.lt.out + plan.p;  // Row i's weight: r_i.
    lw.batch_stride = kSlots * plan.lt.cols;
  }
  const uint32_t l_slots =
      kSum | kAbs | (plan.input_rounding ? kSq : 0u) | (plan.probabilistic ? kAbs2 : 0u);
  if (int e = RunPass(plan.l, batch, lw, l_slots, base, stream); e != 0) return fail(e);
  double* l = base + plan.l.out;
  // 3. The variance's weights, into slot 2.
  if (plan.probabilistic) {
    const double u = options.accumulate_unit_roundoff, u_in = options.input_unit_roundoff;
    if (int e = abft_cuda_impl::LaunchSquareWeights(l, batch, plan.terms, plan.q,
                                                    static_cast<double>(plan.terms) * u * u,
                                                    2.0 * u_in * u_in, plan.input_rounding,
                                                    stream);
        e != 0) {
      return fail(e);
    }
  }
  // 4. R's columns weighted by L's sums.
  Weights rw;
  rw.w[0] = l;
  rw.w[1] = l + plan.terms;
  rw.w[2] = l + 2 * plan.terms;
  rw.batch_stride = kSlots * plan.terms;
  if (int e = RunPass(plan.r, batch, rw, kSum | kAbs | (plan.probabilistic ? kSq : 0u), base,
                      stream);
      e != 0) {
    return fail(e);
  }
  // 5. C's columns.
  if (int e = RunPass(plan.c, batch, Weights{}, kSum | kAbs | (rule.c_squares ? kSq : 0u), base,
                      stream);
      e != 0) {
    return fail(e);
  }
  // 6. The thresholds and the record.
  if (int e = abft_cuda_impl::LaunchFinish(base + plan.r.out, base + plan.c.out, batch, plan.s,
                                           rule, op, base + plan.blocks, device_record,
                                           plan.c.m, poison, stream);
      e != 0) {
    return fail(e);
  }
  return absl::OkStatus();
}

#else  // !SDC_HAVE_CUDA

absl::Status QueueMatrixProductCheckCuda(int64_t, const MatrixRef&, const MatrixRef&,
                                         const MatrixRef&, const BatchStrides&, const MatrixRef*,
                                         const AbftOptions&, int64_t, bool, void*, size_t,
                                         CudaAbftRecord*, CudaStream) {
  return absl::FailedPreconditionError(
      "built without CUDA: the CUDA product checks need --define=sdc_cuda=1");
}

#endif  // SDC_HAVE_CUDA

}  // namespace sdc::kernels
