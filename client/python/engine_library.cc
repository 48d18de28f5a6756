// sdc_guard's engine library: the C++ trainer client (client::GuardEngine,
// its kernels, its link to sdcd) as the libtorch custom class
// torch.classes.sdc.Engine and the operators torch.ops.sdc.*, loaded by
// sdc_guard/_C.py with torch.ops.load_library. It uses libtorch's C++ API
// and never CPython's, so one build per torch version serves every Python
// (docs/ARCHITECTURE.md, "The Python package").
//
// Calls from Python: torch's binding of custom classes converts each
// argument by the method's schema and releases the GIL for the whole call,
// so the engine's collectives and its waits for sdcd never hold it.
//
// Calls into Python: the engine needs the trainer's loss of a batch (a
// replay) and the optimizer's state. It calls the operators
// sdc::replay_loss and sdc::optimizer_state through the dispatcher; their
// kernels are Python functions that sdc_guard/_C.py registers
// (CompositeImplicitAutograd, so a replay's graph is recorded for the
// engine's torch::autograd::grad), and torch's Python kernel takes the GIL.
// Both carry the engine's handle, which _C.py maps to its Guard's callbacks.
//
// Errors: a Status that is not OK is thrown as std::runtime_error
// "sdc_guard:CODE: message", which _C.py raises as ValueError (for
// INVALID_ARGUMENT, the message alone) or sdc_guard.GuardError("CODE:
// message"). A libtorch error surfaces as RuntimeError; a Python exception
// raised in a callback comes back as itself.
//
// Every method of Engine is one line in TORCH_LIBRARY below; sdc_guard/_C.py
// forwards any method by name.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/guard_engine.h"
#include "client/options.h"
#include "client/product_checks.h"
#include "client/python/product_checks.h"
#include "client/fault_injection.h"
#include "kernels/abft.h"
#include "kernels/fingerprint.h"
#include "kernels/model_digest.h"

namespace sdc::client {
namespace {

// What sdc_guard/_C.py recognises as this library's own error.
constexpr char kErrorMark[] = "sdc_guard:";

[[noreturn]] void Raise(const absl::Status& s) {
  throw std::runtime_error(
      absl::StrCat(kErrorMark, absl::StatusCodeToString(s.code()), ": ", s.message()));
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Value(absl::StatusOr<T> s) {
  if (!s.ok()) Raise(s.status());
  return *std::move(s);
}

using Dict = c10::Dict<std::string, c10::IValue>;

// A str -> Any dict (Python gets a dict of bool, int, float and str).
Dict MakeDict(std::vector<std::pair<std::string, c10::IValue>> items) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  for (auto& [key, value] : items) d.insert(std::move(key), std::move(value));
  return c10::impl::toTypedDict<std::string, c10::IValue>(std::move(d));
}

c10::IValue Count(uint64_t n) { return static_cast<int64_t>(n); }

Dict DecisionDict(const StepDecision& d) {
  return MakeDict({{"apply", d.apply},
                   {"reason", d.reason},
                   {"overflow", d.overflow},
                   {"grad_norm", d.grad_norm},
                   {"clip_coef", d.clip_coef},
                   {"audited", d.audited},
                   {"audit_unverified", d.audit_unverified},
                   {"audit_outcome", d.audit_outcome},
                   {"repaired", d.repaired},
                   {"check1_ms", d.check1_ms},
                   {"agreement_ms", d.agreement_ms},
                   {"audit_ms", d.audit_ms}});
}

Dict SummaryDict(const GuardSummary& s) {
  return MakeDict({{"steps", Count(s.steps)},
                   {"skipped", Count(s.skipped)},
                   {"audits", Count(s.audits)},
                   {"audits_unverified", Count(s.audits_unverified)},
                   {"audit_mismatches", Count(s.audit_mismatches)},
                   {"weight_checks", Count(s.weight_checks)},
                   {"repairs", Count(s.repairs)},
                   {"checkpoints_allowed", Count(s.checkpoints_allowed)},
                   {"checkpoints_vetoed", Count(s.checkpoints_vetoed)},
                   {"reports_sent", Count(s.reports_sent)},
                   {"reports_acked", Count(s.reports_acked)},
                   {"reports_dropped", Count(s.reports_dropped)},
                   {"coordinator_connected", s.coordinator_connected},
                   {"last_veto", s.last_veto},
                   {"audits_off", s.audits_off}});
}

const char* StandingName(protocol::CheckpointLedger::Standing s) {
  switch (s) {
    case protocol::CheckpointLedger::Standing::kFinal:
      return "final";
    case protocol::CheckpointLedger::Standing::kProvisional:
      return "provisional";
    case protocol::CheckpointLedger::Standing::kRevoked:
      return "revoked";
  }
  return "provisional";
}

std::map<std::string, std::string> ToMap(const c10::Dict<std::string, std::string>& d) {
  std::map<std::string, std::string> out;
  for (const auto& entry : d) out[entry.key()] = entry.value();
  return out;
}

// The Python callbacks, through the dispatcher (see the top of this file).
std::vector<at::Tensor> CallOptimizerState(int64_t handle) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sdc::optimizer_state", "")
                             .typed<std::vector<at::Tensor>(int64_t)>();
  return op.call(handle);
}

at::Tensor CallReplayLoss(int64_t handle, const std::vector<at::Tensor>& batch) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sdc::replay_loss", "")
                             .typed<at::Tensor(int64_t, const std::vector<at::Tensor>&)>();
  return op.call(handle, batch);
}

class Engine : public torch::CustomClassHolder {
 public:
  // A collective, as GuardEngine::Create. `handle` names this engine's
  // callbacks in sdc_guard/_C.py.
  Engine(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<std::string> param_names,
         std::vector<at::Tensor> params, std::vector<std::string> buffer_names,
         std::vector<at::Tensor> buffers, int64_t handle,
         c10::Dict<std::string, std::string> variables, std::vector<std::string> frozen_names,
         std::vector<at::Tensor> frozen) {
    GuardOptions options = Value(OptionsFromVariables(ToMap(variables)));
    engine_ = Value(GuardEngine::Create(
        std::move(options), std::move(group), {std::move(param_names), std::move(params)},
        {std::move(buffer_names), std::move(buffers)},
        [handle] { return CallOptimizerState(handle); },
        [handle](const std::vector<at::Tensor>& batch) { return CallReplayLoss(handle, batch); },
        {std::move(frozen_names), std::move(frozen)}));
  }

  void BeginStep(int64_t step, std::vector<at::Tensor> batch, int64_t micro_batches) {
    Check(engine_->BeginStep(static_cast<uint64_t>(step), std::move(batch), micro_batches));
  }
  void RecordFirstMicroBatch(at::Tensor loss, std::optional<at::Tensor> loss_scale) {
    engine_->RecordFirstMicroBatch(loss, loss_scale.value_or(at::Tensor()));
  }
  void CaptureForwardBuffers() { engine_->CaptureForwardBuffers(); }
  void NoteNondeterministic(std::string what) { engine_->NoteNondeterministic(what); }
  void RecordOriginalGradients(std::vector<int64_t> indices, std::vector<at::Tensor> grads) {
    engine_->RecordOriginalGradients(std::vector<size_t>(indices.begin(), indices.end()), grads);
  }
  void RecordOriginalGradientsFromParameters() {
    engine_->RecordOriginalGradientsFromParameters();
  }
  void ScanLocalBucket(at::Tensor local) { engine_->ScanLocalBucket(local); }
  void NoteFailure(std::string what) { engine_->NoteFailure(what); }
  // The every-step product checks of this engine's rank (product_checks.h):
  // their alarms are this engine's failures of the step.
  c10::intrusive_ptr<ProductChecks> MakeProductChecks(std::string rule, double lambda) {
    c10::intrusive_ptr<Engine> self = c10::intrusive_ptr<Engine>::reclaim_copy(this);
    return Value(ProductChecks::Create(
        Rank(), rule, lambda, [self](const std::string& what) { self->NoteFailure(what); }));
  }
  void AbortStep() { engine_->AbortStep(); }
  void AddReducedBucket(int64_t index, at::Tensor reduced) {
    engine_->AddReducedBucket(static_cast<size_t>(index), reduced);
  }
  Dict Finish() { return DecisionDict(Value(engine_->Finish())); }
  double AfterOptimizerStep(bool checkpoint) {
    return Value(engine_->AfterOptimizerStep(checkpoint));
  }
  bool MayCheckpoint() { return Value(engine_->MayCheckpoint()); }
  std::string CheckpointStanding(int64_t step) {
    return StandingName(engine_->Checkpoints().Of(static_cast<uint64_t>(step)));
  }
  void RefreshCheckpoints(double timeout_seconds) {
    Check(engine_->RefreshCheckpoints(absl::Seconds(timeout_seconds)).status());
  }
  at::Tensor FaultPoint(at::Tensor x) { return engine_->FaultPoint(x); }
  Dict Summary() { return SummaryDict(engine_->Summary()); }
  std::string SummaryLine() { return engine_->Summary().ToString(); }
  void Shutdown(double flush_seconds) { engine_->Shutdown(absl::Seconds(flush_seconds)); }

  int64_t Rank() { return engine_->rank(); }
  int64_t WorldSize() { return engine_->world_size(); }
  int64_t Step() { return static_cast<int64_t>(engine_->step()); }
  bool Auditing() { return engine_->auditing(); }
  std::string Coordinator() { return engine_->options().coordinator; }
  std::string JobIdOf() { return engine_->options().job_id; }
  int64_t AuditEvery() { return static_cast<int64_t>(engine_->options().audit_every); }
  // This rank's injected product fault at `step` (fault_injection.h):
  // (fires, relative error, relative to the column's checksum scale). The
  // Python front end's checksums inject it.
  std::tuple<bool, double, bool> ProductFault(int64_t step) {
    const std::optional<client::ProductFault> fault = ProductFaultAt(
        engine_->options(), static_cast<uint32_t>(Rank()), static_cast<uint64_t>(step));
    if (!fault) return {false, 0.0, false};
    return {true, fault->magnitude, fault->column_scaled};
  }
  // This rank's injected shard-update fault at `step`: (fires, relative
  // error). The Python front end's buddy check (sdc_guard/buddy.py) injects it.
  std::tuple<bool, double> ShardUpdateFault(int64_t step) {
    const FaultPlan plan = FaultFor(engine_->options().faults, static_cast<uint32_t>(Rank()));
    const bool fires = plan.kind == FaultKind::kShardUpdate &&
                       plan.FiresAt(static_cast<uint32_t>(Rank()), static_cast<uint64_t>(step));
    return {fires, plan.magnitude};
  }
  // Whether FaultPoint may change an activation at `step` on this rank (an
  // activation fault, or a replay fault while replaying). The Python front
  // end calls FaultPoint only then: dynamo cannot trace the call, and a
  // graph break would change how a compiled model computes on every step.
  // The kinds are StepPipeline::FaultPoint's (keep the two lists alike).
  bool ActivationFault(int64_t step) {
    const FaultPlan plan = FaultFor(engine_->options().faults, static_cast<uint32_t>(Rank()));
    const bool kind = plan.kind == FaultKind::kActivationScale ||
                      plan.kind == FaultKind::kMantissaBitflip ||
                      plan.kind == FaultKind::kSoftwareStack || plan.kind == FaultKind::kReplay;
    return kind && plan.FiresAt(static_cast<uint32_t>(Rank()), static_cast<uint64_t>(step));
  }
  int64_t WeightCheckEvery() {
    return static_cast<int64_t>(engine_->options().weight_check_every);
  }

 private:
  std::unique_ptr<GuardEngine> engine_;  // Never null: the constructor throws instead.
};

// The job id as the options would resolve it from `variables` (overrides)
// and the environment: (id, source), or ("", why) when nothing names it.
std::tuple<std::string, std::string> JobIdOp(c10::Dict<std::string, std::string> variables) {
  absl::StatusOr<JobId> id = JobIdFromVariables(ToMap(variables));
  if (!id.ok()) return {std::string(), std::string(id.status().message())};
  return {id->id, id->source};
}

// The key of `seed` (its 64 bits as int: TorchScript has no unsigned type);
// none is the fixed seed, so separate processes agree (a guarded job draws
// its own key).
kernels::FingerprintKey KeyOf(std::optional<int64_t> seed) {
  return kernels::FingerprintKey::FromSeed(seed ? static_cast<uint64_t>(*seed)
                                                : kernels::kFixedFingerprintSeed);
}

kernels::Fingerprint FingerprintOf(const at::Tensor& t, const kernels::FingerprintKey& key) {
  const at::Tensor c = t.detach().contiguous().cpu();
  const kernels::ByteSpan span{c.data_ptr(), static_cast<uint64_t>(c.numel()) * c.element_size()};
  kernels::Fingerprint fp;
  Check(kernels::FingerprintTensors({&span, 1}, key, {&fp, 1}));
  return fp;
}

// The weight fingerprint of the kernels (the wire definition) under the
// seed's key, for tests and tools that compare replicas: (byte_length, s1,
// s2), each 64 bits as int (_C.py reads them unsigned).
std::tuple<int64_t, int64_t, int64_t> FingerprintOp(at::Tensor t, std::optional<int64_t> seed) {
  const kernels::Fingerprint fp = FingerprintOf(t, KeyOf(seed));
  return {static_cast<int64_t>(fp.byte_length), static_cast<int64_t>(fp.s1),
          static_cast<int64_t>(fp.s2)};
}

// The model digest sdcd's weight vote compares: a stable hash of the ordered
// (name, fingerprint) list, fingerprints under the seed's key (64 bits as
// int).
int64_t ModelDigestOp(std::vector<std::string> names, std::vector<at::Tensor> tensors,
                      std::optional<int64_t> seed) {
  if (names.size() != tensors.size()) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat(names.size(), " names for ", tensors.size(), " tensors")));
  }
  const kernels::FingerprintKey key = KeyOf(seed);
  kernels::ModelDigestBuilder digest;
  for (size_t i = 0; i < names.size(); ++i) digest.Add(names[i], FingerprintOf(tensors[i], key));
  return static_cast<int64_t>(digest.Finish());
}

kernels::DType AbftDType(const at::Tensor& t, const char* name) {
  if (const std::optional<kernels::DType> d = CheckedDType(t)) return *d;
  Raise(absl::InvalidArgumentError(absl::StrCat(
      name, " is ", c10::toString(t.scalar_type()),
      ": the product checksums take float32, bfloat16 or float16")));
}

// The strided view of the last two dims of `t` (a matrix, or each matrix of
// a batch).
kernels::MatrixRef MatrixOf(const at::Tensor& t, const char* name) {
  const int64_t d = t.dim();
  return kernels::MatrixRef{t.data_ptr(), t.size(d - 2), t.size(d - 1), t.stride(d - 2),
                            t.stride(d - 1), AbftDType(t, name)};
}

// The checksum test of one product C = A B (+ bias), or of a batch of them
// (A, B, C 3-D: bmm), on CPU tensors as stored (any strides): (passed,
// worst index, discrepancy, threshold, batch of the worst). `bias`: n
// values broadcast over C's rows (a 1-D tensor, or a 2-D one whose rows
// repeat it with stride 0, as addmm's expanded input). `rule`: "guaranteed"
// or "probabilistic" (abft.h). ValueError for shapes, dtypes, devices or a
// rule the kernel does not take.
std::tuple<bool, int64_t, double, double, int64_t> CheckMatmulOp(
    at::Tensor a, at::Tensor b, at::Tensor c, std::optional<at::Tensor> bias, std::string rule,
    double lambda) {
  auto invalid = [](auto&&... parts) {
    Raise(absl::InvalidArgumentError(absl::StrCat(parts...)));
  };
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&a, "A"},
                                {&b, "B"},
                                {&c, "C"}}) {
    if (!t->device().is_cpu()) {
      invalid(name, " is on ", t->device().str(),
              ": the product checksums run on CPU tensors only for now");
    }
  }
  if (bias && !bias->device().is_cpu()) {
    invalid("bias is on ", bias->device().str(),
            ": the product checksums run on CPU tensors only for now");
  }
  absl::StatusOr<kernels::AbftOptions> checked = AbftOptionsFor(rule, lambda);
  if (!checked.ok()) Raise(checked.status());
  const kernels::AbftOptions options = *checked;
  const int64_t dims = a.dim();
  if (dims < 2 || dims > 3 || b.dim() != dims || c.dim() != dims) {
    invalid("A, B and C are ", a.dim(), "-D, ", b.dim(), "-D and ", c.dim(),
            "-D: expected three matrices or three batches of them (3-D)");
  }
  std::optional<kernels::MatrixRef> bias_ref;
  if (bias) {
    const at::Tensor& v = *bias;
    const int64_t n = c.size(dims - 1);
    if (dims != 2) invalid("a bias with batched products is not supported");
    if (v.dim() == 1 && v.size(0) == n) {
      bias_ref = kernels::MatrixRef{v.data_ptr(), 1, n, 0, v.stride(0), AbftDType(v, "bias")};
    } else if (v.dim() == 2 && v.size(1) == n && (v.size(0) == 1 || v.stride(0) == 0)) {
      bias_ref = kernels::MatrixRef{v.data_ptr(), 1, n, 0, v.stride(1), AbftDType(v, "bias")};
    } else {
      invalid("bias of shape ", c10::str(v.sizes()), ": expected ", n,
              " values broadcast over C's rows");
    }
  }
  absl::StatusOr<kernels::AbftResult> r;
  if (dims == 2) {
    r = kernels::CheckMatrixProduct(MatrixOf(a, "A"), MatrixOf(b, "B"), MatrixOf(c, "C"),
                                    bias_ref ? &*bias_ref : nullptr, options);
  } else {
    if (b.size(0) != a.size(0) || c.size(0) != a.size(0)) {
      invalid("batches of ", a.size(0), ", ", b.size(0), " and ", c.size(0), " products");
    }
    r = kernels::CheckBatchedMatrixProduct(a.size(0), MatrixOf(a, "A"), MatrixOf(b, "B"),
                                           MatrixOf(c, "C"),
                                           {a.stride(0), b.stride(0), c.stride(0), 0}, nullptr,
                                           options);
  }
  const kernels::AbftResult result = Value(std::move(r));
  return {result.passed, result.worst_index, result.discrepancy, result.threshold,
          result.worst_batch};
}

}  // namespace
}  // namespace sdc::client

TORCH_LIBRARY(sdc, m) {
  using sdc::client::Engine;
  namespace ops = sdc::client;
  // Implemented in Python (sdc_guard/_C.py), called by the engine.
  m.def("replay_loss(int engine, Tensor[] batch) -> Tensor");
  m.def("optimizer_state(int engine) -> Tensor[]");

  m.def("job_id(Dict(str, str) variables) -> (str, str)", &ops::JobIdOp);
  m.def("fingerprint(Tensor tensor, int? seed=None) -> (int, int, int)", &ops::FingerprintOp);
  m.def("model_digest(str[] names, Tensor[] tensors, int? seed=None) -> int",
        &ops::ModelDigestOp);
  m.def("check_matmul(Tensor a, Tensor b, Tensor c, Tensor? bias=None, "
        "str rule=\"probabilistic\", float lambda_=10.0) -> (bool, int, float, float, int)",
        &ops::CheckMatmulOp);

  ops::RegisterProductChecks(m);  // Before Engine, whose product_checks returns one.
  m.class_<Engine>("Engine")
      .def(torch::init<c10::intrusive_ptr<c10d::ProcessGroup>, std::vector<std::string>,
                       std::vector<at::Tensor>, std::vector<std::string>, std::vector<at::Tensor>,
                       int64_t, c10::Dict<std::string, std::string>, std::vector<std::string>,
                       std::vector<at::Tensor>>())
      .def("begin_step", &Engine::BeginStep)
      .def("record_first_micro_batch", &Engine::RecordFirstMicroBatch, "",
           {torch::arg("loss"), torch::arg("loss_scale") = c10::IValue()})
      .def("capture_forward_buffers", &Engine::CaptureForwardBuffers)
      .def("note_nondeterministic", &Engine::NoteNondeterministic)
      .def("record_original_gradients", &Engine::RecordOriginalGradients)
      .def("record_original_gradients_from_parameters",
           &Engine::RecordOriginalGradientsFromParameters)
      .def("scan_local_bucket", &Engine::ScanLocalBucket)
      .def("note_failure", &Engine::NoteFailure)
      .def("abort_step", &Engine::AbortStep)
      .def("product_checks", &Engine::MakeProductChecks)
      .def("add_reduced_bucket", &Engine::AddReducedBucket)
      .def("finish", &Engine::Finish)
      .def("after_optimizer_step", &Engine::AfterOptimizerStep)
      .def("may_checkpoint", &Engine::MayCheckpoint)
      .def("checkpoint_standing", &Engine::CheckpointStanding)
      .def("refresh_checkpoints", &Engine::RefreshCheckpoints)
      .def("fault_point", &Engine::FaultPoint)
      .def("activation_fault", &Engine::ActivationFault)
      .def("product_fault", &Engine::ProductFault)
      .def("shard_update_fault", &Engine::ShardUpdateFault)
      .def("summary", &Engine::Summary)
      .def("summary_line", &Engine::SummaryLine)
      .def("shutdown", &Engine::Shutdown, "", {torch::arg("flush_seconds") = 5.0})
      .def_property("rank", &Engine::Rank)
      .def_property("world_size", &Engine::WorldSize)
      .def_property("step", &Engine::Step)
      .def_property("auditing", &Engine::Auditing)
      .def_property("coordinator", &Engine::Coordinator)
      .def_property("job_id", &Engine::JobIdOf)
      .def_property("audit_every", &Engine::AuditEvery)
      .def_property("weight_check_every", &Engine::WeightCheckEvery);
}
