// AuditDeterminism on a one-rank Gloo group: the process's setting on and
// off around audit steps (put back on every path), libtorch's alerts noted
// and other warnings passed on.

#include "client/audit_determinism.h"

#include <ATen/Context.h>

#include <string>
#include <vector>

#include "client/one_rank_group.h"
#include "gtest/gtest.h"

namespace sdc::client {
namespace {

GuardOptions Options() {
  GuardOptions o;
  o.job_id = "determinism";
  o.node_name = "node-a";
  return o;
}

// Records what reaches it (the handler the engine's replaces for a step).
class Recorder : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { seen.push_back(warning.msg()); }
  std::vector<std::string> seen;
};

TEST(AuditDeterminismTest, AuditStepsRunDeterministicWarnOnlyAndRestoreTheSetting) {
  EngineContext ctx(Options(), OneRankGroup("setting"));
  AuditDeterminism d(ctx);
  at::globalContext().setDeterministicAlgorithms(false, false);
  d.BeginStep(/*audit=*/false);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  d.Restore();
  d.BeginStep(/*audit=*/true);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_TRUE(at::globalContext().deterministicAlgorithmsWarnOnly());
  d.Restore();
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().deterministicAlgorithmsWarnOnly());
}

TEST(AuditDeterminismTest, AlertsAreNotedAndOtherWarningsPassOn) {
  EngineContext ctx(Options(), OneRankGroup("alerts"));
  Recorder recorder;
  c10::WarningUtils::WarningHandlerGuard outer(&recorder);
  {
    AuditDeterminism d(ctx);
    d.BeginStep(/*audit=*/true);
    TORCH_WARN("an unrelated warning");
    TORCH_WARN("index_add_cuda_ does not have a deterministic implementation, but you set "
               "'torch.use_deterministic_algorithms(True, warn_only=True)'");
    TORCH_WARN("scatter_add_ does not have a deterministic implementation");
    EXPECT_EQ(d.Noted(), "index_add_cuda_ has no deterministic implementation") << "the first";
    d.Restore();
    // After the step the handler is gone: an alert reaches the recorder.
    TORCH_WARN("gather does not have a deterministic implementation");
  }
  ASSERT_EQ(recorder.seen.size(), 2u);
  EXPECT_EQ(recorder.seen[0], "an unrelated warning");
  EXPECT_NE(recorder.seen[1].find("gather"), std::string::npos);
}

TEST(AuditDeterminismTest, NotesFromPythonCountAndEachStepStartsClean) {
  EngineContext ctx(Options(), OneRankGroup("notes"));
  AuditDeterminism d(ctx);
  d.BeginStep(/*audit=*/true);
  EXPECT_EQ(d.Noted(), "") << "no alert: audits go on";
  d.Restore();

  d.BeginStep(/*audit=*/true);
  d.Note(std::string(300, 'x'));
  d.Note("a later op");
  EXPECT_EQ(d.Noted(), std::string(200, 'x')) << "the first note, cut to 200 characters";
  d.Restore();

  d.BeginStep(/*audit=*/true);
  EXPECT_EQ(d.Noted(), "");
  d.Restore();
}

// Issue 40, item 3: a step that ends on an error path never calls Restore
// itself; the next BeginStep puts the setting back first, and a second
// Restore changes nothing.
TEST(AuditDeterminismTest, TheSettingComesBackOnEveryPath) {
  EngineContext ctx(Options(), OneRankGroup("paths"));
  at::globalContext().setDeterministicAlgorithms(false, false);
  {
    AuditDeterminism d(ctx);
    d.BeginStep(/*audit=*/true);
    d.BeginStep(/*audit=*/false);  // The audit step ended without Restore.
    EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
    d.Restore();
    d.Restore();
    EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
    d.BeginStep(/*audit=*/true);
    EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
    // The user switches the setting on between steps: kept.
    d.Restore();
    at::globalContext().setDeterministicAlgorithms(true, false);
    d.Restore();
    EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
    EXPECT_FALSE(at::globalContext().deterministicAlgorithmsWarnOnly());
  }
  at::globalContext().setDeterministicAlgorithms(false, false);
}

}  // namespace
}  // namespace sdc::client
