#ifndef SDC_KERNELS_ABFT_CUDA_H_
#define SDC_KERNELS_ABFT_CUDA_H_

// The matrix-product checksums of kernels/abft.h for operands in GPU
// memory: the same check (column checksums of C = A B (+ a bias row) in
// fp64 against (e^T A) B) and the same threshold rule, evaluated by one
// function (kernels/abft_rule.h) on both sides.
//
// A check only queues work on the caller's stream: a few passes over A, B
// and C (column sums through 32 x 32 tiles read in the operand's memory
// order, summed down fixed row chunks and then the chunks in order, so a
// check gives the same bits from run to run) and a last kernel that writes
// the product's result into a 64-byte record in device memory. Nothing is
// allocated (the caller passes the workspace) and the host never waits: the
// caller reads its records once per step (client/product_checks.cc).
//
// Where it differs from the CPU check: the fp64 sums run in another order
// (the threshold's fp64 term covers any order, so the rule's guarantee is
// unchanged), so discrepancies agree with the CPU's to the check's own
// rounding, not bit for bit; only the column axis (AbftAxis::kColumns)
// is computed; a batch is at most 65,535 products.
//
// Built with --define=sdc_cuda=1; without it every call returns
// FailedPrecondition. Thread-safe (no shared state).

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/abft.h"
#include "kernels/cuda.h"

namespace sdc::kernels {

// One product's result, as the device writes it (8 doubles, so a step's
// records are one array of doubles).
struct CudaAbftRecord {
  double failed = 0;       // Columns over their threshold (0: passed).
  double ratio = -1;       // The worst column's |discrepancy| / threshold.
  double discrepancy = 0;  // Its observed - reference,
  double threshold = 0;    // threshold,
  double reference = 0;    // and reference checksum.
  double column = -1;      // Its column (-1: C is empty).
  double batch = 0;        // The product of the batch that holds it.
  double op_id = 0;        // The caller's id for the product.
};
static_assert(sizeof(CudaAbftRecord) == 8 * sizeof(double));

// The check's working memory in bytes for this product (device memory,
// 16-byte aligned, any contents). InvalidArgument as
// CheckBatchedMatrixProduct, for an axis other than kColumns, or a batch
// above 65,535.
absl::StatusOr<size_t> CudaProductCheckWorkspaceBytes(int64_t batch, const MatrixRef& a,
                                                      const MatrixRef& b, const MatrixRef& c,
                                                      const MatrixRef* bias,
                                                      const AbftOptions& options);

// Queues the check of `batch` products C_i = A_i B_i (+ bias_i) on
// `stream` (the operands and `workspace` in device memory; the strides as
// CheckBatchedMatrixProduct's) and returns once queued; `*record` (device
// memory) holds the result when the stream reaches it, `op_id` in it.
// The operands must keep their values until then (stream order). With
// `poison`, a failed check also sets the first element of C's worst
// column to NaN (in stream order, before any later work reads C), so what
// a training step computes from a wrong product is NaN: its gradients
// then carry the failure to every rank without the host reading anything.
// InvalidArgument as CudaProductCheckWorkspaceBytes, or for a workspace
// smaller than it says or not 16-byte aligned, or an operand not aligned
// to its element size; Internal with CUDA's message when a launch fails;
// FailedPrecondition when built without CUDA.
absl::Status QueueMatrixProductCheckCuda(int64_t batch, const MatrixRef& a, const MatrixRef& b,
                                         const MatrixRef& c, const BatchStrides& strides,
                                         const MatrixRef* bias, const AbftOptions& options,
                                         int64_t op_id, bool poison, void* workspace,
                                         size_t workspace_bytes, CudaAbftRecord* record,
                                         CudaStream stream);

// The record as CheckBatchedMatrixProduct's result.
AbftResult ResultOfRecord(const CudaAbftRecord& record);

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_ABFT_CUDA_H_
