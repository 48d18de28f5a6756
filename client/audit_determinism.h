#ifndef SDC_CLIENT_AUDIT_DETERMINISM_H_
#define SDC_CLIENT_AUDIT_DETERMINISM_H_

// Deterministic algorithms on audit steps, and what happens when an op has
// none. An audit step runs with libtorch's deterministic algorithms in
// warn-only mode: an op without a deterministic implementation warns
// instead of throwing (training must not stop for it). A warning handler,
// the training thread's while such a step runs, notes those warnings and
// passes every other one on; ops called from Python warn through Python's
// warnings instead, and sdc_guard passes them to Note. At the step's end
// the engine's audit gate (one small all-reduce, guard_engine.cc) tells
// every rank whether any rank saw one: then no replay can reproduce the
// step's gradients, and replay audits stop for the job, on every rank
// alike (ReplayAudit::TurnOff).
//
// Thread-compatible: the training thread's (libtorch's warning handler is
// per thread, and the deterministic setting process-wide).

#include <c10/util/Exception.h>

#include <string>

#include "client/engine_context.h"

namespace sdc::client {

class AuditDeterminism {
 public:
  // REQUIRES: `ctx` outlives this.
  explicit AuditDeterminism(const EngineContext& ctx);
  // Uninstalls the warning handler if a step left it installed.
  ~AuditDeterminism();
  AuditDeterminism(const AuditDeterminism&) = delete;
  AuditDeterminism& operator=(const AuditDeterminism&) = delete;

  // Saves the process's deterministic-algorithms setting and forgets the
  // previous step's alerts; on an audit step turns deterministic algorithms
  // on, warn-only, and installs the warning handler on this thread.
  void BeginStep(bool audit);

  // An op with no deterministic implementation ran on this rank (`what`
  // names it; the first of a step is kept, cut to 200 characters).
  void Note(const std::string& what);

  // This step's first alert (from libtorch's warnings or Note), or empty
  // when this rank ran no op without a deterministic implementation.
  std::string Noted();

  // Puts back the setting BeginStep saved and uninstalls the handler. Safe
  // to call more than once, and without a BeginStep (it then leaves the
  // setting as it is).
  void Restore();

 private:
  // Notes libtorch's "does not have a deterministic implementation"
  // warnings; passes every other warning to the handler it replaced.
  class Alerts : public c10::WarningHandler {
   public:
    void Install();
    void Uninstall();
    void process(const c10::Warning& warning) override;
    // The first alert since the last Take, or empty.
    std::string Take();

   private:
    bool installed_ = false;
    c10::WarningHandler* previous_ = nullptr;
    std::string first_;
  };

  const EngineContext& ctx_;
  Alerts alerts_;
  bool saved_ = false;             // BeginStep saved a setting that Restore has not put back.
  bool before_ = false;            // The deterministic setting before the step.
  bool warn_only_before_ = false;
  std::string noted_;              // This step's first alert, from either path.
};

}  // namespace sdc::client

#endif  // SDC_CLIENT_AUDIT_DETERMINISM_H_
