// sdc_guard._C: the C++ trainer client (client::GuardEngine, its kernels,
// its link to sdcd) as a Python extension module. sdc_guard/guard.py wraps
// it around a DistributedDataParallel model; nothing of the protocol is
// written again in Python.
//
// Errors: an absl::Status that is not OK becomes ValueError for
// InvalidArgument and sdc_guard.GuardError (a RuntimeError) otherwise, with
// the status code in the message. Long calls (collectives, waits for sdcd)
// release the GIL; the loss function and the optimizer-state callback take
// it back.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/extension.h>

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/guard_engine.h"
#include "client/options.h"
#include "kernels/fingerprint.h"
#include "kernels/model_digest.h"

namespace sdc::client {
namespace {

namespace py = pybind11;

PyObject* guard_error = nullptr;  // sdc_guard._C.GuardError, set at import.

[[noreturn]] void Raise(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kInvalidArgument) throw py::value_error(std::string(s.message()));
  PyErr_SetString(guard_error,
                  absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message()).c_str());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Value(absl::StatusOr<T> s) {
  if (!s.ok()) Raise(s.status());
  return *std::move(s);
}

py::dict DecisionDict(const StepDecision& d) {
  py::dict out;
  out["apply"] = d.apply;
  out["reason"] = d.reason;
  out["grad_norm"] = d.grad_norm;
  out["clip_coef"] = d.clip_coef;
  out["audited"] = d.audited;
  out["audit_unverified"] = d.audit_unverified;
  out["audit_outcome"] = d.audit_outcome;
  out["repaired"] = d.repaired;
  out["check1_ms"] = d.check1_ms;
  out["agreement_ms"] = d.agreement_ms;
  out["audit_ms"] = d.audit_ms;
  return out;
}

py::dict SummaryDict(const GuardSummary& s) {
  py::dict out;
  out["steps"] = s.steps;
  out["skipped"] = s.skipped;
  out["audits"] = s.audits;
  out["audits_unverified"] = s.audits_unverified;
  out["audit_mismatches"] = s.audit_mismatches;
  out["weight_checks"] = s.weight_checks;
  out["repairs"] = s.repairs;
  out["checkpoints_allowed"] = s.checkpoints_allowed;
  out["checkpoints_vetoed"] = s.checkpoints_vetoed;
  out["reports_sent"] = s.reports_sent;
  out["reports_acked"] = s.reports_acked;
  out["reports_dropped"] = s.reports_dropped;
  out["coordinator_connected"] = s.coordinator_connected;
  out["last_veto"] = s.last_veto;
  out["audits_off"] = s.audits_off;
  return out;
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

// The engine, owned by the Python object. Python callbacks are held as
// py::object and only touched with the GIL.
class Engine {
 public:
  Engine(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<std::string> param_names,
         std::vector<at::Tensor> params, std::vector<std::string> buffer_names,
         std::vector<at::Tensor> buffers, py::object optimizer_state, py::object loss_fn,
         std::map<std::string, std::string> variables, std::vector<std::string> frozen_names,
         std::vector<at::Tensor> frozen)
      : optimizer_state_(std::make_shared<py::object>(std::move(optimizer_state))),
        loss_fn_(std::make_shared<py::object>(std::move(loss_fn))) {
    GuardOptions options = Value(OptionsFromVariables(variables));
    std::shared_ptr<py::object> state = optimizer_state_, loss = loss_fn_;
    OptimizerStateFn state_fn = [state]() {
      py::gil_scoped_acquire gil;
      return (*state)().cast<std::vector<at::Tensor>>();
    };
    LossFn loss_fn_cpp = [loss](const std::vector<at::Tensor>& batch) {
      py::gil_scoped_acquire gil;
      py::object out = (*loss)(batch);
      if (!THPVariable_Check(out.ptr())) {
        throw py::type_error("sdc_guard: the loss function must return a tensor");
      }
      return out.cast<at::Tensor>();
    };
    absl::StatusOr<std::unique_ptr<GuardEngine>> engine;
    {
      py::gil_scoped_release release;  // Create is a collective.
      engine = GuardEngine::Create(std::move(options), std::move(group),
                                   {std::move(param_names), std::move(params)},
                                   {std::move(buffer_names), std::move(buffers)},
                                   std::move(state_fn), std::move(loss_fn_cpp),
                                   {std::move(frozen_names), std::move(frozen)});
    }
    engine_ = Value(std::move(engine));
  }

  ~Engine() {
    if (engine_ != nullptr) {
      py::gil_scoped_release release;
      engine_.reset();
    }
  }

  GuardEngine& engine() {
    if (engine_ == nullptr) Raise(absl::FailedPreconditionError("the guard was shut down"));
    return *engine_;
  }

  void Shutdown(double flush_seconds) {
    if (engine_ == nullptr) return;
    py::gil_scoped_release release;
    engine_->Shutdown(absl::Seconds(flush_seconds));
  }

 private:
  std::shared_ptr<py::object> optimizer_state_;
  std::shared_ptr<py::object> loss_fn_;
  std::unique_ptr<GuardEngine> engine_;
};

PYBIND11_MODULE(_C, m) {
  m.doc() = "sdc-guard's trainer client (C++), for sdc_guard.Guard";
  guard_error = PyErr_NewExceptionWithDoc(
      "sdc_guard._C.GuardError",
      "sdc-guard could not do what was asked (the message starts with the status code).",
      PyExc_RuntimeError, nullptr);
  m.attr("GuardError") = py::handle(guard_error);

  py::class_<Engine>(m, "Engine")
      .def(py::init<c10::intrusive_ptr<c10d::ProcessGroup>, std::vector<std::string>,
                    std::vector<at::Tensor>, std::vector<std::string>, std::vector<at::Tensor>,
                    py::object, py::object, std::map<std::string, std::string>,
                    std::vector<std::string>, std::vector<at::Tensor>>(),
           py::arg("process_group"), py::arg("param_names"), py::arg("params"),
           py::arg("buffer_names"), py::arg("buffers"), py::arg("optimizer_state"),
           py::arg("loss_fn"), py::arg("variables"),
           py::arg("frozen_names") = std::vector<std::string>{},
           py::arg("frozen") = std::vector<at::Tensor>{})
      .def("begin_step",
           [](Engine& e, uint64_t step, std::vector<at::Tensor> batch, int64_t micro_batches) {
             Check(e.engine().BeginStep(step, std::move(batch), micro_batches));
           })
      .def("record_first_micro_batch",
           [](Engine& e, const at::Tensor& loss, std::optional<at::Tensor> loss_scale) {
             e.engine().RecordFirstMicroBatch(loss, loss_scale.value_or(at::Tensor()));
           },
           py::arg("loss"), py::arg("loss_scale") = py::none())
      .def("capture_forward_buffers", [](Engine& e) { e.engine().CaptureForwardBuffers(); })
      .def("note_nondeterministic",
           [](Engine& e, const std::string& what) { e.engine().NoteNondeterministic(what); })
      .def("record_original_gradients",
           [](Engine& e, const std::vector<size_t>& indices, const std::vector<at::Tensor>& grads) {
             e.engine().RecordOriginalGradients(indices, grads);
           })
      .def("record_original_gradients_from_parameters",
           [](Engine& e) { e.engine().RecordOriginalGradientsFromParameters(); })
      .def("scan_local_bucket",
           [](Engine& e, const at::Tensor& local) { e.engine().ScanLocalBucket(local); })
      .def("add_reduced_bucket", [](Engine& e, size_t index,
                                    const at::Tensor& reduced) {
        e.engine().AddReducedBucket(index, reduced);
      })
      .def("finish",
           [](Engine& e) {
             GuardEngine& engine = e.engine();
             absl::StatusOr<StepDecision> d;
             {
               py::gil_scoped_release release;
               d = engine.Finish();
             }
             return DecisionDict(Value(std::move(d)));
           })
      .def("after_optimizer_step",
           [](Engine& e, bool checkpoint) {
             GuardEngine& engine = e.engine();
             absl::StatusOr<double> ms;
             {
               py::gil_scoped_release release;
               ms = engine.AfterOptimizerStep(checkpoint);
             }
             return Value(std::move(ms));
           })
      .def("may_checkpoint",
           [](Engine& e) {
             GuardEngine& engine = e.engine();
             absl::StatusOr<bool> allowed;
             {
               py::gil_scoped_release release;
               allowed = engine.MayCheckpoint();
             }
             return Value(std::move(allowed));
           })
      .def("checkpoint_standing",
           [](Engine& e, uint64_t step) { return StandingName(e.engine().Checkpoints().Of(step)); })
      .def("refresh_checkpoints",
           [](Engine& e, double timeout_seconds) {
             GuardEngine& engine = e.engine();
             absl::StatusOr<protocol::CheckpointLedger> ledger;
             {
               py::gil_scoped_release release;
               ledger = engine.RefreshCheckpoints(absl::Seconds(timeout_seconds));
             }
             Check(ledger.status());
           })
      .def("fault_point", [](Engine& e, const at::Tensor& x) { return e.engine().FaultPoint(x); })
      .def("summary", [](Engine& e) { return SummaryDict(e.engine().Summary()); })
      .def("summary_line", [](Engine& e) { return e.engine().Summary().ToString(); })
      .def_property_readonly("rank", [](Engine& e) { return e.engine().rank(); })
      .def_property_readonly("world_size", [](Engine& e) { return e.engine().world_size(); })
      .def_property_readonly("step", [](Engine& e) { return e.engine().step(); })
      .def_property_readonly("auditing", [](Engine& e) { return e.engine().auditing(); })
      .def_property_readonly("coordinator",
                             [](Engine& e) { return e.engine().options().coordinator; })
      .def_property_readonly("job_id", [](Engine& e) { return e.engine().options().job_id; })
      .def_property_readonly("audit_every",
                             [](Engine& e) { return e.engine().options().audit_every; })
      .def_property_readonly("weight_check_every",
                             [](Engine& e) { return e.engine().options().weight_check_every; })
      .def("shutdown", &Engine::Shutdown, py::arg("flush_seconds") = 5.0);

  // The job id as the options would resolve it from `variables` (overrides)
  // and the environment: (id, source), or ("", why) when nothing names it.
  m.def("job_id", [](const std::map<std::string, std::string>& variables) {
    absl::StatusOr<JobId> id = JobIdFromVariables(variables);
    if (!id.ok()) return std::make_pair(std::string(), std::string(id.status().message()));
    return std::make_pair(id->id, id->source);
  });

  // The weight fingerprint of the kernels (the wire definition), for tests
  // and tools that compare replicas. The key's seed defaults to the fixed
  // one, so separate processes agree (a guarded job uses its own key).
  m.def(
      "fingerprint",
      [](const at::Tensor& t, uint64_t seed) {
        const kernels::FingerprintKey key = kernels::FingerprintKey::FromSeed(seed);
        const at::Tensor c = t.detach().contiguous().cpu();
        const kernels::ByteSpan span{c.data_ptr(),
                                     static_cast<uint64_t>(c.numel()) * c.element_size()};
        kernels::Fingerprint fp;
        Check(kernels::FingerprintTensors({&span, 1}, key, {&fp, 1}));
        return py::make_tuple(fp.byte_length, fp.s1, fp.s2);
      },
      py::arg("tensor"), py::arg("seed") = kernels::kFixedFingerprintSeed);
  // The model digest sdcd's weight vote compares: a stable hash of the
  // ordered (name, fingerprint) list, fingerprints under the seed's key.
  m.def(
      "model_digest",
      [](const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors,
         uint64_t seed) {
        if (names.size() != tensors.size()) {
          Raise(absl::InvalidArgumentError(absl::StrCat(names.size(), " names for ",
                                                        tensors.size(), " tensors")));
        }
        const kernels::FingerprintKey key = kernels::FingerprintKey::FromSeed(seed);
        kernels::ModelDigestBuilder digest;
        for (size_t i = 0; i < names.size(); ++i) {
          const at::Tensor c = tensors[i].detach().contiguous().cpu();
          const kernels::ByteSpan span{c.data_ptr(),
                                       static_cast<uint64_t>(c.numel()) * c.element_size()};
          kernels::Fingerprint fp;
          Check(kernels::FingerprintTensors({&span, 1}, key, {&fp, 1}));
          digest.Add(names[i], fp);
        }
        return digest.Finish();
      },
      py::arg("names"), py::arg("tensors"), py::arg("seed") = kernels::kFixedFingerprintSeed);
}

}  // namespace
}  // namespace sdc::client
