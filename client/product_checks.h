#ifndef SDC_CLIENT_PRODUCT_CHECKS_H_
#define SDC_CLIENT_PRODUCT_CHECKS_H_

// The every-step product checksums (issue 45) of both front ends: C++
// kernels for aten::mm, aten::addmm and aten::bmm at the dispatcher's CPU
// key (and, built with --define=sdc_cuda=1, its CUDA key), registered while
// a guarded step's forward and backward run (Enter) and removed after
// (Exit), which puts aten's own kernels back. Each product is computed by
// aten's own kernel (at::cpu::mm / addmm / bmm, at::cuda::... on a GPU: the
// function the key held before, called directly, so it cannot dispatch
// back here and its result bits are aten's) and then checked with
// kernels/abft.h on the CPU, or kernels/abft_cuda.h on the GPU, with no
// Python call per product. Products the checksums cannot take (other
// dtypes, addmm with beta or alpha other than 1 or a full input) are
// counted as unchecked.
//
// On a GPU the check is queued on the current stream behind the product
// and writes its result into a record in device memory; the host never
// waits for it. Exit reads the step's records (one device-to-host copy and
// one wait per step) and raises the alarms of the failed ones there. A
// failed check also sets one element of its product's output to NaN on the
// device, so the step's gradients carry the failure to every rank even
// when Exit comes after they were all-reduced (DDP's buckets). Options
// differ from the CPU's where the GPU's arithmetic does (CudaOptionsFor).
//
// Users: sdc::Guard (client/guard.h, GuardOptions::every_step) enters it from
// BeginStep to AllReduceAndCheck; the Python package binds it as
// torch.classes.sdc.ProductChecks (client/python/product_checks.h, made by
// Engine.product_checks, driven by sdc_guard/checksums.py).
//
// A failed checksum: the product is computed once more from the same
// operands (the same bits: "persistent", a fault the inputs reproduce;
// other bits: "transient"; on a GPU, at Exit, when its operands are still
// alive and unwritten: checked again, failing again is "persistent"), the
// alarm is written on stderr with the op,
// phase, shapes, discrepancy and threshold, and the step's first alarm goes
// at once to `note_failure` (GuardEngine::NoteFailure: the step's gradient
// buckets carry it to every rank, which all skip the step). Its text starts
// with kChecksumAlarmMark ("checksum alarm at step S on rank R"), which
// sdcd parses (daemon/core/step_checks.cc) and the front ends recognise in
// the error every rank's Finish returns.
//
// One ProductChecks is entered at a time in a process (Enter returns
// FAILED_PRECONDITION for a second); the kernels are process-wide, so a
// product another thread computes during the step is checked too (the
// counters are atomic; the fault and the step's alarm are under a mutex
// taken only at an injection or an alarm).

#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/options.h"
#include "kernels/abft.h"

namespace sdc::client {

// What a failed checksum's note to the engine starts with.
inline constexpr char kChecksumAlarmMark[] = "checksum alarm";

// This rank's injected product fault at `step` (fault_injection.h, kinds
// `product` and `product-column`), or none.
struct ProductFault {
  double magnitude = 0;        // The error, relative to the element or to T_j.
  bool column_scaled = false;  // product-column: MAGNITUDE x T_j.
};
std::optional<ProductFault> ProductFaultAt(const GuardOptions& options, uint32_t rank,
                                           uint64_t step);

// The checksums' dtype of a tensor (float32, bfloat16, float16), or nullopt
// for one they do not take.
std::optional<kernels::DType> CheckedDType(const at::Tensor& t);

// The kernels' options for `rule` ("guaranteed" or "probabilistic",
// kernels/abft.h) and `lambda` (the probabilistic rule's standard
// deviations); InvalidArgument for another rule or a lambda not finite and
// >= 0.
absl::StatusOr<kernels::AbftOptions> AbftOptionsFor(const std::string& rule, double lambda);

class ProductChecks : public torch::CustomClassHolder {
 public:
  using NoteFailure = std::function<void(const std::string&)>;

  // `rule`: "guaranteed" or "probabilistic" (kernels/abft.h); `lambda`: the
  // probabilistic rule's standard deviations. InvalidArgument for another
  // rule or a lambda not finite and >= 0.
  static absl::StatusOr<c10::intrusive_ptr<ProductChecks>> Create(int64_t rank,
                                                                  const std::string& rule,
                                                                  double lambda,
                                                                  NoteFailure note_failure);
  ProductChecks(int64_t rank, kernels::AbftOptions options, NoteFailure note_failure);
  ~ProductChecks() override;

  // Before the step's forward: the step's product count and alarm start
  // afresh; `fault`: a relative error to put into one element of one
  // product of this step (chosen by a generator seeded by rank and step;
  // tests and demos only), or none; with `column_scaled` the error is
  // `fault` times the element's column's checksum scale T_j instead
  // (fault kind product-column).
  void Begin(int64_t step, std::optional<double> fault, bool column_scaled = false);
  // Registers the kernels (replacing aten's own at the CPU key, and the
  // CUDA key in a CUDA build, until Exit). FailedPrecondition while another
  // ProductChecks is entered.
  absl::Status Enter();
  // Removes the kernels: aten's own again. Then, when the step checked
  // products on a GPU, reads their records (waiting for the device once)
  // and raises their alarms (note_failure for the step's first). A no-op
  // when not entered and nothing is unread.
  void Exit();

  int64_t Checked() const { return checked_.load(); }      // All steps, CPU and GPU.
  int64_t Unchecked() const { return unchecked_.load(); }  // All steps.
  int64_t Alarms() const { return alarms_.load(); }        // Failed checksums, all steps.
  int64_t Rank() const { return rank_; }

  enum class Op { kMm, kAddmm, kBmm };
  // Checks out = a b (+ bias broadcast over out's rows), after injecting
  // the step's fault when this is its product; the kernels call it.
  // `scaled`: an addmm with beta or alpha other than 1. On a GPU it only
  // queues the check (Exit reads it).
  void Observe(Op op, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias,
               at::Tensor& out, bool scaled);

  // The options of a CUDA product with operands of dtypes a and b: the
  // configured ones for fp32 products at torch's "highest" fp32 matmul
  // precision; otherwise (tensor cores: bf16/fp16 operands, TF32 or bf16
  // rounding of fp32 ones) the guaranteed rule with accumulate_unit_roundoff
  // 2^-23 (tensor cores' fp32 accumulation may truncate) and, for rounded
  // fp32 operands, input_unit_roundoff 2^-11 (TF32) or 2^-8 (bf16).
  kernels::AbftOptions CudaOptionsFor(kernels::DType a, kernels::DType b) const;

 private:
  struct Fault {
    double relative;
    uint64_t element;  // The draw that picks the element.
    bool column_scaled;
  };
  struct CudaProduct;
  struct CudaState;

  void Inject(Op op, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias,
              at::Tensor& out);
  void Alarm(Op op, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias,
             const at::Tensor& out, const kernels::AbftResult& r);
  // Writes the alarm on stderr; the step's first goes to note_failure.
  void NoteAlarm(const std::string& what);
  void LeftUnchecked(Op op, const at::Tensor& a, const at::Tensor& b, const absl::Status& why);
  void RemoveKernels();
  void ObserveCuda(Op op, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias,
                   const at::Tensor& out, kernels::DType da, kernels::DType db,
                   kernels::DType dc, const kernels::MatrixRef* bias_ref);
  // The step's one read of its CUDA records, and their alarms.
  void CollectCuda();
  void AlarmCuda(const CudaProduct& p, const kernels::AbftResult& r);

  const int64_t rank_;
  const NoteFailure note_failure_;
  kernels::AbftOptions options_;
  std::unique_ptr<torch::Library> library_;
  std::unique_ptr<torch::Library> cuda_library_;  // CUDA builds only.
  std::atomic<int64_t> checked_{0}, unchecked_{0}, alarms_{0}, in_step_{0};
  // The index among the step's products of the one the fault goes into (-1:
  // none); read without the lock by every product.
  std::atomic<int64_t> fault_target_{-1};
  std::atomic<bool> warned_{false};  // Said once that a check failed to run.
  std::mutex mu_;
  int64_t step_ = 0;                // Written by Begin only.
  int64_t last_step_products_ = 0;  // The most products a step has had.
  std::optional<Fault> fault_;      // Guarded by mu_.
  bool step_alarmed_ = false;       // Guarded by mu_.
  std::unique_ptr<CudaState> cuda_;  // Its contents guarded by mu_.
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_PRODUCT_CHECKS_H_
