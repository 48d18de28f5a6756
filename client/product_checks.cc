#include "client/product_checks.h"

#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>

#ifdef SDC_HAVE_CUDA
#include <ATen/ops/addmm_cuda_dispatch.h>
#include <ATen/ops/bmm_cuda_dispatch.h>
#include <ATen/ops/mm_cuda_dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

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
#include "kernels/abft_cuda.h"

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

#ifdef SDC_HAVE_CUDA
// The kernels registered at the CUDA key: aten's CUDA kernel, then the
// check queued on the current stream.
at::Tensor MmCudaKernel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::cuda::mm(a, b);
  if (ProductChecks* c = g_active.load()) c->Observe(Op::kMm, a, b, nullptr, out, false);
  return out;
}

at::Tensor AddmmCudaKernel(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                           const at::Scalar& beta, const at::Scalar& alpha) {
  at::Tensor out = at::cuda::addmm(bias, a, b, beta, alpha);
  if (ProductChecks* c = g_active.load()) {
    const bool unit = !beta.isComplex() && !alpha.isComplex() && beta.toDouble() == 1.0 &&
                      alpha.toDouble() == 1.0;
    c->Observe(Op::kAddmm, a, b, &bias, out, !unit);
  }
  return out;
}

at::Tensor BmmCudaKernel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::cuda::bmm(a, b);
  if (ProductChecks* c = g_active.load()) c->Observe(Op::kBmm, a, b, nullptr, out, false);
  return out;
}
#endif  // SDC_HAVE_CUDA

// The product again, by aten's kernel directly (not checked again).
at::Tensor Recompute(Op op, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias) {
#ifdef SDC_HAVE_CUDA
  if (a.is_cuda()) {
    switch (op) {
      case Op::kMm:
        return at::cuda::mm(a, b);
      case Op::kAddmm:
        return at::cuda::addmm(*bias, a, b);
      default:
        return at::cuda::bmm(a, b);
    }
  }
#endif
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

using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

[[maybe_unused]] std::optional<WeakTensor> Weak(const at::Tensor* t) {
  if (t == nullptr || !t->defined()) return std::nullopt;
  return WeakTensor(t->getIntrusivePtr());
}

// A tensor's version counter (in-place writes advance it); -1 where it has
// none (an inference tensor).
[[maybe_unused]] int64_t Version(const at::Tensor* t) {
  return t == nullptr || !t->defined() || t->is_inference() ? -1 : t->_version();
}

// The checks' view of one product's operands: dtypes, and the bias as a
// 1 x n row (a 1-D bias, or a 2-D one broadcast over the rows). nullopt
// when the checksums do not take it.
struct Operands {
  kernels::DType a, b, c;
  std::optional<kernels::MatrixRef> bias;
};

std::optional<Operands> OperandsOf(const at::Tensor& a, const at::Tensor& b,
                                   const at::Tensor* bias, const at::Tensor& out, bool scaled) {
  const std::optional<kernels::DType> da = CheckedDType(a), db = CheckedDType(b),
                                      dc = CheckedDType(out);
  if (scaled || !da || !db || !dc) return std::nullopt;
  Operands o{*da, *db, *dc, std::nullopt};
  if (bias != nullptr) {
    const at::Tensor& v = *bias;
    const int64_t n = out.size(1);
    const std::optional<kernels::DType> dv = CheckedDType(v);
    if (dv && v.dim() == 1 && v.size(0) == n) {
      o.bias = kernels::MatrixRef{v.data_ptr(), 1, n, 0, v.stride(0), *dv};
    } else if (dv && v.dim() == 2 && v.size(1) == n && (v.size(0) == 1 || v.stride(0) == 0)) {
      o.bias = kernels::MatrixRef{v.data_ptr(), 1, n, 0, v.stride(1), *dv};
    } else {
      return std::nullopt;  // A full (not row-broadcast) input.
    }
  }
  return o;
}

// Records per device chunk of the step's records (a chunk is added when a
// step has more products than the chunks hold).
[[maybe_unused]] constexpr int64_t kRecordsPerChunk = 256;
[[maybe_unused]] constexpr int64_t kRecordDoubles = sizeof(kernels::CudaAbftRecord) / sizeof(double);

}  // namespace

// What the checks keep of a CUDA product until the step's read: enough to
// name it in an alarm and to compute it again, by weak references (nothing
// is kept alive for it) and the version counters its operands had.
struct ProductChecks::CudaProduct {
  Op op = Op::kMm;
  std::optional<WeakTensor> a, b, bias, out;
  int64_t a_version = -1, b_version = -1, bias_version = -1;
  std::vector<int64_t> a_sizes, b_sizes;
  at::ScalarType dtype = at::kFloat;
  bool backward = false;
  std::weak_ptr<torch::autograd::Node> node;
  kernels::AbftOptions options;
};

// The step's CUDA products and their records in device memory.
struct ProductChecks::CudaState {
  std::vector<CudaProduct> products;  // This step's, by op id.
  std::vector<at::Tensor> records;    // Device chunks; kept across steps.
#ifdef SDC_HAVE_CUDA
  std::optional<c10::cuda::CUDAStream> stream;  // The latest product's.
#endif
};

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

std::optional<ProductFault> ProductFaultAt(const GuardOptions& options, uint32_t rank,
                                           uint64_t step) {
  const FaultPlan plan = FaultFor(options.faults, rank);
  const bool column = plan.kind == FaultKind::kProductColumn;
  if ((plan.kind != FaultKind::kProduct && !column) || !plan.FiresAt(rank, step)) {
    return std::nullopt;
  }
  return ProductFault{plan.magnitude, column};
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
    : rank_(rank),
      note_failure_(std::move(note_failure)),
      options_(options),
      cuda_(std::make_unique<CudaState>()) {}

ProductChecks::~ProductChecks() {
  // The kernels go; a step's unread records are dropped (the engine their
  // alarms would go to may be gone).
  RemoveKernels();
}

void ProductChecks::Begin(int64_t step, std::optional<double> fault, bool column_scaled) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
  last_step_products_ = std::max(last_step_products_, in_step_.load());
  in_step_ = 0;
  step_alarmed_ = false;
  fault_.reset();
  fault_target_ = -1;
  cuda_->products.clear();  // A step that never reached Exit.
  if (fault) {
    std::mt19937_64 rng(static_cast<uint64_t>(1000003 * (rank_ + 1) + step));
    const uint64_t products = static_cast<uint64_t>(std::max<int64_t>(1, last_step_products_));
    fault_target_ = static_cast<int64_t>(rng() % products);
    fault_ = Fault{*fault, rng(), column_scaled};
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
#ifdef SDC_HAVE_CUDA
  cuda_library_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                   c10::DispatchKey::CUDA, __FILE__, __LINE__);
  cuda_library_->impl("mm", TORCH_FN(MmCudaKernel));
  cuda_library_->impl("addmm", TORCH_FN(AddmmCudaKernel));
  cuda_library_->impl("bmm", TORCH_FN(BmmCudaKernel));
#endif
  return absl::OkStatus();
}

void ProductChecks::RemoveKernels() {
  ProductChecks* self = this;
  g_active.compare_exchange_strong(self, nullptr);
  library_.reset();
  cuda_library_.reset();
}

void ProductChecks::Exit() {
  RemoveKernels();
  CollectCuda();
}

void ProductChecks::Observe(Op op, const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor* bias, at::Tensor& out, bool scaled) {
  const std::optional<Operands> o = OperandsOf(a, b, bias, out, scaled);
  if (!o) {
    unchecked_.fetch_add(1);
    return;
  }
  const int64_t index = in_step_.fetch_add(1);
  if (fault_target_.load() == index) Inject(op, a, b, bias, out);
  if (out.is_cuda()) {
    ObserveCuda(op, a, b, bias, out, o->a, o->b, o->c, o->bias ? &*o->bias : nullptr);
    return;
  }
  absl::StatusOr<kernels::AbftResult> r;
  if (op == Op::kBmm) {
    // One call for the batch: the kernel reuses its arrays across it.
    r = kernels::CheckBatchedMatrixProduct(
        a.size(0), MatrixOf(a, o->a), MatrixOf(b, o->b), MatrixOf(out, o->c),
        {a.stride(0), b.stride(0), out.stride(0), 0}, nullptr, options_);
  } else {
    r = kernels::CheckMatrixProduct(MatrixOf(a, o->a), MatrixOf(b, o->b), MatrixOf(out, o->c),
                                    o->bias ? &*o->bias : nullptr, options_);
  }
  if (!r.ok()) {
    LeftUnchecked(op, a, b, r.status());
    return;
  }
  checked_.fetch_add(1);
  if (!r->passed) Alarm(op, a, b, bias, out, *r);
}

void ProductChecks::LeftUnchecked(Op op, const at::Tensor& a, const at::Tensor& b,
                                  const absl::Status& why) {
  // Never raise on one rank inside a backward: count it, say it once.
  unchecked_.fetch_add(1);
  if (!warned_.exchange(true)) {
    std::fprintf(stderr, "sdc-guard rank %lld: a product left unchecked: %s %s: %s\n",
                 static_cast<long long>(rank_), OpName(op), Shapes(a, b).c_str(),
                 why.ToString().c_str());
    std::fflush(stderr);
  }
}

kernels::AbftOptions ProductChecks::CudaOptionsFor(kernels::DType a, kernels::DType b) const {
  kernels::AbftOptions o = options_;
  const bool half = a != kernels::DType::kFloat32 || b != kernels::DType::kFloat32;
#ifdef SDC_HAVE_CUDA
  const bool reduced_fp32 = !half && at::globalContext().float32MatmulPrecision() !=
                                         at::Float32MatmulPrecision::HIGHEST;
  const bool bf16_fp32 = reduced_fp32 && at::globalContext().float32MatmulPrecision() ==
                                             at::Float32MatmulPrecision::MEDIUM;
#else
  const bool reduced_fp32 = false, bf16_fp32 = false;
#endif
  if (half || reduced_fp32) {
    // Tensor cores: their fp32 accumulation may truncate (abft.h), whose
    // one-signed errors the probabilistic model excludes.
    o.rule = kernels::AbftRule::kGuaranteed;
    o.accumulate_unit_roundoff = 0x1p-23;
  }
  // fp32 operands rounded first: to TF32 ("high"), or bf16 ("medium").
  if (reduced_fp32) o.input_unit_roundoff = bf16_fp32 ? 0x1p-8 : 0x1p-11;
  return o;
}

void ProductChecks::ObserveCuda(Op op, const at::Tensor& a, const at::Tensor& b,
                                const at::Tensor* bias, const at::Tensor& out, kernels::DType da,
                                kernels::DType db, kernels::DType dc,
                                const kernels::MatrixRef* bias_ref) {
#ifdef SDC_HAVE_CUDA
  const kernels::AbftOptions options = CudaOptionsFor(da, db);
  const bool batched = op == Op::kBmm;
  const int64_t batch = batched ? a.size(0) : 1;
  const kernels::BatchStrides strides =
      batched ? kernels::BatchStrides{a.stride(0), b.stride(0), out.stride(0), 0}
              : kernels::BatchStrides{};
  const kernels::MatrixRef ma = MatrixOf(a, da), mb = MatrixOf(b, db), mc = MatrixOf(out, dc);
  absl::StatusOr<size_t> bytes =
      kernels::CudaProductCheckWorkspaceBytes(batch, ma, mb, mc, bias_ref, options);
  if (!bytes.ok()) {
    LeftUnchecked(op, a, b, bytes.status());
    return;
  }
  try {
    const c10::cuda::CUDAGuard device(out.device());
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(out.device().index());
    // From torch's caching allocator, on this stream: freed when this
    // returns, reused only by work queued after the check.
    const at::Tensor workspace = at::empty(
        {static_cast<int64_t>(std::max<size_t>(*bytes, 16))}, out.options().dtype(at::kByte));
    std::lock_guard<std::mutex> lock(mu_);
    CudaState& st = *cuda_;
    const int64_t id = static_cast<int64_t>(st.products.size());
    const size_t chunk = static_cast<size_t>(id / kRecordsPerChunk);
    if (chunk < st.records.size() && st.records[chunk].device() != out.device()) {
      LeftUnchecked(op, a, b,
                    absl::UnimplementedError("CUDA products on several devices in one step"));
      return;
    }
    if (chunk == st.records.size()) {
      st.records.push_back(
          at::empty({kRecordsPerChunk * kRecordDoubles}, out.options().dtype(at::kDouble)));
    }
    if (st.stream.has_value() && *st.stream != stream) {
      // The step's records are read on its last product's stream: each
      // check is ordered after the ones before it (the host never waits).
      c10::cuda::CUDAEvent event;
      event.record(*st.stream);
      event.block(stream);
    }
    st.stream = stream;
    auto* record = reinterpret_cast<kernels::CudaAbftRecord*>(
                       st.records[chunk].data_ptr<double>()) +
                   id % kRecordsPerChunk;
    const absl::Status queued = kernels::QueueMatrixProductCheckCuda(
        batch, ma, mb, mc, strides, bias_ref, options, id, /*poison=*/true,
        workspace.data_ptr(), static_cast<size_t>(workspace.numel()), record, stream.stream());
    if (!queued.ok()) {
      LeftUnchecked(op, a, b, queued);
      return;
    }
    CudaProduct p;
    p.op = op;
    p.a = Weak(&a);
    p.b = Weak(&b);
    p.bias = Weak(bias);
    p.out = Weak(&out);
    p.a_version = Version(&a);
    p.b_version = Version(&b);
    p.bias_version = Version(bias);
    p.a_sizes = a.sizes().vec();
    p.b_sizes = b.sizes().vec();
    p.dtype = out.scalar_type();
    p.node = torch::autograd::get_current_node();
    p.backward = !p.node.expired();
    p.options = options;
    st.products.push_back(std::move(p));
    checked_.fetch_add(1);
  } catch (const c10::Error& e) {
    LeftUnchecked(op, a, b, absl::InternalError(e.what_without_backtrace()));
  }
#else
  (void)bias;
  (void)da;
  (void)db;
  (void)dc;
  (void)bias_ref;
  LeftUnchecked(op, a, b, absl::FailedPreconditionError("built without CUDA"));
#endif
}

void ProductChecks::CollectCuda() {
#ifdef SDC_HAVE_CUDA
  std::vector<CudaProduct> products;
  std::vector<at::Tensor> chunks;
  std::optional<c10::cuda::CUDAStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    products = std::exchange(cuda_->products, {});
    stream = cuda_->stream;
    cuda_->stream.reset();
    const size_t used = (products.size() + kRecordsPerChunk - 1) / kRecordsPerChunk;
    chunks.assign(cuda_->records.begin(), cuda_->records.begin() + used);
  }
  if (products.empty()) return;
  at::Tensor host;
  try {
    // The step's one read: the records, on the last product's stream.
    const c10::cuda::CUDAStreamGuard on(*stream);
    at::Tensor all = chunks.size() == 1 ? chunks[0] : at::cat(chunks);
    host = all.narrow(0, 0, static_cast<int64_t>(products.size()) * kRecordDoubles)
               .to(at::kCPU)
               .contiguous();
  } catch (const c10::Error& e) {
    // Counted as unchecked; the step's checks are lost, not its training.
    unchecked_.fetch_add(static_cast<int64_t>(products.size()));
    checked_.fetch_sub(static_cast<int64_t>(products.size()));
    std::fprintf(stderr, "sdc-guard rank %lld: reading the step's CUDA checksums failed: %s\n",
                 static_cast<long long>(rank_), e.what_without_backtrace());
    std::fflush(stderr);
    return;
  }
  const auto* records = reinterpret_cast<const kernels::CudaAbftRecord*>(host.data_ptr<double>());
  for (size_t i = 0; i < products.size(); ++i) {
    if (records[i].failed == 0) continue;
    AlarmCuda(products[i], kernels::ResultOfRecord(records[i]));
  }
#endif
}

void ProductChecks::AlarmCuda(const CudaProduct& p, const kernels::AbftResult& r) {
#ifdef SDC_HAVE_CUDA
  alarms_.fetch_add(1);
  auto lock = [](const std::optional<WeakTensor>& w) -> std::optional<at::Tensor> {
    if (!w) return at::Tensor();
    c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> t = w->lock();
    if (!t) return std::nullopt;
    return at::Tensor(std::move(t));
  };
  const std::optional<at::Tensor> a = lock(p.a), b = lock(p.b), bias = lock(p.bias);
  // Its output was poisoned, so the product is computed again and checked
  // again: a failure again is what the inputs reproduce ("persistent").
  std::string kind = "not recomputed: its operands were freed or written since";
  if (a && b && bias && Version(&*a) == p.a_version && Version(&*b) == p.b_version &&
      Version(bias->defined() ? &*bias : nullptr) == p.bias_version) {
    try {
      const at::Tensor* bias_ptr = bias->defined() ? &*bias : nullptr;
      const at::Tensor again = Recompute(p.op, *a, *b, bias_ptr);
      const std::optional<Operands> o = OperandsOf(*a, *b, bias_ptr, again, false);
      TORCH_CHECK(o.has_value(), "the recomputed product has other dtypes");
      const bool batched = p.op == Op::kBmm;
      const kernels::MatrixRef ma = MatrixOf(*a, o->a), mb = MatrixOf(*b, o->b),
                               mc = MatrixOf(again, o->c);
      const kernels::BatchStrides strides =
          batched ? kernels::BatchStrides{a->stride(0), b->stride(0), again.stride(0), 0}
                  : kernels::BatchStrides{};
      const int64_t batch = batched ? a->size(0) : 1;
      const kernels::MatrixRef* bias_ref = o->bias ? &*o->bias : nullptr;
      absl::StatusOr<size_t> bytes =
          kernels::CudaProductCheckWorkspaceBytes(batch, ma, mb, mc, bias_ref, p.options);
      const at::Tensor workspace =
          at::empty({static_cast<int64_t>(std::max<size_t>(bytes.ok() ? *bytes : 0, 16))},
                    again.options().dtype(at::kByte));
      const at::Tensor record = at::empty({kRecordDoubles}, again.options().dtype(at::kDouble));
      const absl::Status queued =
          bytes.ok() ? kernels::QueueMatrixProductCheckCuda(
                           batch, ma, mb, mc, strides, bias_ref, p.options, 0, /*poison=*/false,
                           workspace.data_ptr(), static_cast<size_t>(workspace.numel()),
                           reinterpret_cast<kernels::CudaAbftRecord*>(record.data_ptr<double>()),
                           c10::cuda::getCurrentCUDAStream(again.device().index()).stream())
                     : bytes.status();
      if (queued.ok()) {
        const at::Tensor h = record.to(at::kCPU);
        kind = h.data_ptr<double>()[0] != 0 ? "persistent: recomputed, it fails again"
                                            : "transient: recomputed, it passes";
      } else {
        kind = absl::StrCat("not recomputed: ", queued.message());
      }
    } catch (const c10::Error& e) {
      kind = absl::StrCat("not recomputed: ", e.what_without_backtrace());
    }
  }
  std::string phase = "forward";
  if (p.backward) {
    const std::shared_ptr<torch::autograd::Node> node = p.node.lock();
    phase = node != nullptr ? absl::StrCat("backward (", node->name(), ")") : "backward";
  }
  const std::string where = absl::StrCat(
      "column ", r.worst_index, p.op == Op::kBmm ? absl::StrCat(" of product ", r.worst_batch) : "");
  const std::string what = absl::StrFormat(
      "%s at step %d on rank %d: %s %s x %s %s (CUDA) in the %s, %s: discrepancy %.6g > "
      "threshold %.6g (%s)",
      kChecksumAlarmMark, step_, rank_, OpName(p.op), c10::str(c10::IntArrayRef(p.a_sizes)),
      c10::str(c10::IntArrayRef(p.b_sizes)), c10::toString(p.dtype), phase, where,
      r.discrepancy, r.threshold, kind);
  NoteAlarm(what);
#else
  (void)p;
  (void)r;
#endif
}

void ProductChecks::NoteAlarm(const std::string& what) {
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

void ProductChecks::Inject(Op op, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor* bias, at::Tensor& out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fault_) return;
  const Fault f = *fault_;
  fault_.reset();
  fault_target_ = -1;
  if (!out.is_contiguous() || out.numel() == 0) return;
  at::Tensor flat = out.view(-1);
  int64_t i = static_cast<int64_t>(f.element % static_cast<uint64_t>(flat.numel()));
  std::string what;
  if (f.column_scaled) {
    // Column j's checksum scale T_j = (e^T |A| |B|)_j (+ m |bias_j|) of the
    // element's product, in fp64, from elementwise ops only (a product here
    // would come back to these kernels); a zero column: the largest T_j; a
    // product of zeros (every T_j 0, a saturated tanh's gradient, say): the
    // error is MAGNITUDE itself, far above such a column's threshold (its
    // underflow terms).
    const int64_t n = out.size(-1), m = out.size(-2), batch = i / (m * n), row = (i / n) % m;
    const at::Tensor aa = op == Op::kBmm ? a.select(0, batch) : a;
    const at::Tensor bb = op == Op::kBmm ? b.select(0, batch) : b;
    at::Tensor t =
        (aa.abs().to(at::kDouble).sum(0).unsqueeze(1) * bb.abs().to(at::kDouble)).sum(0);
    if (bias != nullptr) {
      const at::Tensor v = bias->dim() == 2 ? bias->select(0, 0) : *bias;
      t = t + static_cast<double>(m) * v.abs().to(at::kDouble);
    }
    const at::Tensor j = at::full({1}, i % n, t.options().dtype(at::kLong));
    const at::Tensor col = at::where(t.index_select(0, j).gt(0), j, t.argmax().reshape({1}));
    const at::Tensor pick = col + (batch * m + row) * n;
    const at::Tensor scale = t.index_select(0, col);
    const at::Tensor before = flat.index_select(0, pick);
    const at::Tensor delta =
        at::where(scale.gt(0), scale * f.relative, at::full_like(scale, f.relative));
    flat.index_copy_(0, pick, (before.to(at::kDouble) + delta).to(out.scalar_type()));
    if (out.is_cuda()) {
      what = absl::StrFormat(
          "sdc-guard rank %d: INJECTED a product error (%g x its column's checksum scale T_j) "
          "into %s output %s element %d (or its product's largest-T_j column, when T_j is 0) "
          "on the GPU in the %s at step %d\n",
          rank_, f.relative, OpName(op), c10::str(out.sizes()), i, Phase(), step_);
    } else {
      what = absl::StrFormat(
          "sdc-guard rank %d: INJECTED a product error (%g x its column's checksum scale T_j = "
          "%.6g, %.6g -> %.6g) into %s output %s element %d in the %s at step %d\n",
          rank_, f.relative, scale.item<double>(), before.item<double>(),
          flat.index_select(0, pick).item<double>(), OpName(op), c10::str(out.sizes()),
          pick.item<int64_t>(), Phase(), step_);
    }
  } else if (out.is_cuda()) {
    // On the device, without reading it: element i, or the largest when
    // element i is zero.
    const at::Tensor at_i = flat.narrow(0, i, 1);
    const at::Tensor pick = at::where(at_i.ne(0), at::full({1}, i, flat.options().dtype(at::kLong)),
                                      flat.abs().argmax().reshape({1}));
    flat.index_copy_(0, pick, flat.index_select(0, pick) * (1.0 + f.relative));
    what = absl::StrFormat(
        "sdc-guard rank %d: INJECTED a product error (relative %g) into %s output %s element %d "
        "(or its largest, when that is zero) on the GPU in the %s at step %d\n",
        rank_, f.relative, OpName(op), c10::str(out.sizes()), i, Phase(), step_);
  } else {
    if (flat[i].item<double>() == 0.0) i = flat.abs().argmax().item<int64_t>();
    const double before = flat[i].item<double>();
    flat[i].fill_(before * (1.0 + f.relative));
    const double after = flat[i].item<double>();
    what = absl::StrFormat(
        "sdc-guard rank %d: INJECTED a product error (relative %g, %.6g -> %.6g) into %s output "
        "%s element %d in the %s at step %d\n",
        rank_, f.relative, before, after, OpName(op), c10::str(out.sizes()), i, Phase(), step_);
  }
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
  NoteAlarm(what);
}

}  // namespace sdc::client
