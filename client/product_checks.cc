#include "client/product_checks.h"

#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/fault_injection.h"

namespace sdc::client {
namespace {

using Op = ProductChecks::Op;

// The strided view of the last two dims of `t`.
kernels::MatrixRef MatrixOf(const at::Tensor& t, kernels::DType dtype) {
  const int64_t d = t.dim();
  return kernels::MatrixRef{t.data_ptr(), t.size(d - 2), t.size(d - 1), t.stride(d - 2),
                            t.stride(d - 1), dtype};
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kMm:
      return "aten::mm";
    case Op::kAddmm:
      return "aten::addmm";
    default:
      return "aten::bmm";
  }
}

std::string Shapes(const at::Tensor& a, const at::Tensor& b) {
  return absl::StrCat(c10::str(a.sizes()), " x ", c10::str(b.sizes()));
}

std::string Phase() {
  const std::shared_ptr<torch::autograd::Node> node = torch::autograd::get_current_node();
  return node != nullptr ? absl::StrCat("backward (", node->name(), ")") : "forward";
}

// The ProductChecks entered now (null: the kernels compute and return).
std::atomic<ProductChecks*> g_active{nullptr};

// The kernels registered at the CPU key: aten's CPU kernel, then the check.
at::Tensor MmKernel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::cpu::mm(a, b);
  if (ProductChecks* c = g_active.load()) c->Observe(Op::kMm, a, b, nullptr, out, false);
  return out;
}

at::Tensor AddmmKernel(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                       const at::Scalar& beta, const at::Scalar& alpha) {
  at::Tensor out = at::cpu::addmm(bias, a, b, beta, alpha);
  if (ProductChecks* c = g_active.load()) {
    const bool unit = !beta.isComplex() && !alpha.isComplex() && beta.toDouble() == 1.0 &&
                      alpha.toDouble() == 1.0;
    c->Observe(Op::kAddmm, a, b, &bias, out, !unit);
  }
  return out;
}

at::Tensor BmmKernel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::cpu::bmm(a, b);
  if (ProductChecks* c = g_active.load()) c->Observe(Op::kBmm, a, b, nullptr, out, false);
  return out;
}

// The product again, by aten's kernel directly (not checked again).
at::Tensor Recompute(Op op, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias) {
  switch (op) {
    case Op::kMm:
      return at::cpu::mm(a, b);
    case Op::kAddmm:
      return at::cpu::addmm(*bias, a, b);
    default:
      return at::cpu::bmm(a, b);
  }
}

// A warning handler that drops what it is given.
struct Silent : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

}  // namespace

std::optional<kernels::DType> CheckedDType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return kernels::DType::kFloat32;
    case at::kBFloat16:
      return kernels::DType::kBFloat16;
    case at::kHalf:
      return kernels::DType::kFloat16;
    default:
      return std::nullopt;
  }
}

std::optional<double> ProductFaultAt(const GuardOptions& options, uint32_t rank, uint64_t step) {
  const FaultPlan plan = FaultFor(options.faults, rank);
  if (plan.kind != FaultKind::kProduct || !plan.FiresAt(rank, step)) return std::nullopt;
  return plan.magnitude;
}

absl::StatusOr<kernels::AbftOptions> AbftOptionsFor(const std::string& rule, double lambda) {
  kernels::AbftOptions options;
  if (rule == "guaranteed") {
    options.rule = kernels::AbftRule::kGuaranteed;
  } else if (rule == "probabilistic") {
    options.rule = kernels::AbftRule::kProbabilistic;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("rule '", rule, "': expected guaranteed or probabilistic"));
  }
  if (!std::isfinite(lambda) || lambda < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lambda_ ", lambda, ": expected a finite value >= 0"));
  }
  options.lambda = lambda;
  return options;
}

absl::StatusOr<c10::intrusive_ptr<ProductChecks>> ProductChecks::Create(
    int64_t rank, const std::string& rule, double lambda, NoteFailure note_failure) {
  absl::StatusOr<kernels::AbftOptions> options = AbftOptionsFor(rule, lambda);
  if (!options.ok()) return options.status();
  return c10::make_intrusive<ProductChecks>(rank, *options, std::move(note_failure));
}

ProductChecks::ProductChecks(int64_t rank, kernels::AbftOptions options, NoteFailure note_failure)
    : rank_(rank), note_failure_(std::move(note_failure)), options_(options) {}

ProductChecks::~ProductChecks() { Exit(); }

void ProductChecks::Begin(int64_t step, std::optional<double> fault) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
  last_step_products_ = std::max(last_step_products_, in_step_.load());
  in_step_ = 0;
  step_alarmed_ = false;
  fault_.reset();
  fault_target_ = -1;
  if (fault) {
    std::mt19937_64 rng(static_cast<uint64_t>(1000003 * (rank_ + 1) + step));
    const uint64_t products = static_cast<uint64_t>(std::max<int64_t>(1, last_step_products_));
    fault_target_ = static_cast<int64_t>(rng() % products);
    fault_ = Fault{*fault, rng()};
  }
}

absl::Status ProductChecks::Enter() {
  ProductChecks* none = nullptr;
  if (!g_active.compare_exchange_strong(none, this) && none != this) {
    return absl::FailedPreconditionError(
        "another guard's every-step checksums are active in this process");
  }
  if (library_ != nullptr) return absl::OkStatus();
  // "Overriding a previously registered kernel": that is the point.
  Silent silent;
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  library_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::CPU, __FILE__, __LINE__);
  library_->impl("mm", TORCH_FN(MmKernel));
  library_->impl("addmm", TORCH_FN(AddmmKernel));
  library_->impl("bmm", TORCH_FN(BmmKernel));
  return absl::OkStatus();
}

void ProductChecks::Exit() {
  ProductChecks* self = this;
  g_active.compare_exchange_strong(self, nullptr);
  library_.reset();
}

void ProductChecks::Observe(Op op, const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor* bias, at::Tensor& out, bool scaled) {
  const std::optional<kernels::DType> da = CheckedDType(a), db = CheckedDType(b),
                                      dc = CheckedDType(out);
  std::optional<kernels::MatrixRef> bias_ref;
  bool takes = !scaled && da && db && dc;
  if (takes && bias != nullptr) {
    const at::Tensor& v = *bias;
    const int64_t n = out.size(1);
    const std::optional<kernels::DType> dv = CheckedDType(v);
    if (dv && v.dim() == 1 && v.size(0) == n) {
      bias_ref = kernels::MatrixRef{v.data_ptr(), 1, n, 0, v.stride(0), *dv};
    } else if (dv && v.dim() == 2 && v.size(1) == n && (v.size(0) == 1 || v.stride(0) == 0)) {
      bias_ref = kernels::MatrixRef{v.data_ptr(), 1, n, 0, v.stride(1), *dv};
    } else {
      takes = false;  // A full (not row-broadcast) input.
    }
  }
  if (!takes) {
    unchecked_.fetch_add(1);
    return;
  }
  const int64_t index = in_step_.fetch_add(1);
  if (fault_target_.load() == index) Inject(op, out);
  absl::StatusOr<kernels::AbftResult> r;
  if (op == Op::kBmm) {
    // One call for the batch: the kernel reuses its arrays across it.
    r = kernels::CheckBatchedMatrixProduct(
        a.size(0), MatrixOf(a, *da), MatrixOf(b, *db), MatrixOf(out, *dc),
        {a.stride(0), b.stride(0), out.stride(0), 0}, nullptr, options_);
  } else {
    r = kernels::CheckMatrixProduct(MatrixOf(a, *da), MatrixOf(b, *db), MatrixOf(out, *dc),
                                    bias_ref ? &*bias_ref : nullptr, options_);
  }
  if (!r.ok()) {
    // Never raise on one rank inside a backward: count it, say it once.
    unchecked_.fetch_add(1);
    if (!warned_.exchange(true)) {
      std::fprintf(stderr, "sdc-guard rank %lld: a product left unchecked: %s %s: %s\n",
                   static_cast<long long>(rank_), OpName(op), Shapes(a, b).c_str(),
                   r.status().ToString().c_str());
      std::fflush(stderr);
    }
    return;
  }
  checked_.fetch_add(1);
  if (!r->passed) Alarm(op, a, b, bias, out, *r);
}

void ProductChecks::Inject(Op op, at::Tensor& out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fault_) return;
  const Fault f = *fault_;
  fault_.reset();
  fault_target_ = -1;
  if (!out.is_contiguous() || out.numel() == 0) return;
  at::Tensor flat = out.view(-1);
  int64_t i = static_cast<int64_t>(f.element % static_cast<uint64_t>(flat.numel()));
  if (flat[i].item<double>() == 0.0) i = flat.abs().argmax().item<int64_t>();
  const double before = flat[i].item<double>();
  flat[i].fill_(before * (1.0 + f.relative));
  const double after = flat[i].item<double>();
  const std::string what = absl::StrFormat(
      "sdc-guard rank %d: INJECTED a product error (relative %g, %.6g -> %.6g) into %s output "
      "%s element %d in the %s at step %d\n",
      rank_, f.relative, before, after, OpName(op), c10::str(out.sizes()), i, Phase(), step_);
  std::fputs(what.c_str(), stderr);
  std::fflush(stderr);
}

void ProductChecks::Alarm(Op op, const at::Tensor& a, const at::Tensor& b,
                          const at::Tensor* bias, const at::Tensor& out,
                          const kernels::AbftResult& r) {
  alarms_.fetch_add(1);
  const bool persistent = at::equal(Recompute(op, a, b, bias), out);
  const std::string where = absl::StrCat(
      "column ", r.worst_index, out.dim() == 3 ? absl::StrCat(" of product ", r.worst_batch) : "");
  const std::string what = absl::StrFormat(
      "%s at step %d on rank %d: %s %s %s in the %s, %s: discrepancy %.6g > "
      "threshold %.6g (%s: recomputed %s)",
      kChecksumAlarmMark, step_, rank_, OpName(op), Shapes(a, b), c10::toString(out.scalar_type()), Phase(), where,
      r.discrepancy, r.threshold, persistent ? "persistent" : "transient",
      persistent ? "the same" : "differently");
  std::fprintf(stderr, "sdc-guard rank %lld: %s\n", static_cast<long long>(rank_), what.c_str());
  std::fflush(stderr);
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = !std::exchange(step_alarmed_, true);
  }
  // The step's first alarm: this rank's failure of the step.
  if (first && note_failure_) note_failure_(what);
}

}  // namespace sdc::client
