"""No extra collective on ordinary steps (issue 43, items 2 and 3): a guarded
DDP step that is no audit issues exactly the collectives plain DDP issues
for the same model and data, weight-check steps included. The count is
torch's profiler's (--count_collectives): one c10d operator per call into
the process group, whoever makes it (the C++ engine's calls pass the same
dispatcher), so the guard's own collectives show
wherever it issues them: at audit steps, and at a step whose reduced
gradients hold NaN (the agreement then runs on every rank, since every rank
sees the same reduced NaN). The job has collectives timing out after
PG_TIMEOUT_S and the test's own timeout is shorter."""

from conftest import run_job

PG_TIMEOUT_S = 300
TEST_TIMEOUT_S = 150
assert TEST_TIMEOUT_S < PG_TIMEOUT_S

STEPS = 6
AUDITS = {3, 6}  # SDC_AUDIT_EVERY=3
NAN_STEP = 5     # A NaN in rank 1's local gradients.


def _counts(tmp_path, name, sdcd, guarded):
    env = {"SDC_JOB_ID": "collectives-" + name, "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_AUDIT_EVERY": "3", "SDC_WEIGHT_CHECK_EVERY": "2",
           "SDC_INJECT_FAULT": f"nan-gradient:1:step={NAN_STEP}",
           "SDC_ALLOW_FAULT_INJECTION": "yes-i-am-testing"}
    flags = [f"--steps={STEPS}", "--model=bn-mlp", "--count_collectives",
             f"--pg_timeout_s={PG_TIMEOUT_S}"]
    if not guarded:
        flags.append("--unguarded")
    steps, _ = run_job(str(tmp_path / name), 2, flags, env, nodes=2, timeout=TEST_TIMEOUT_S)
    return steps


def test_an_ordinary_guarded_step_issues_the_collectives_plain_ddp_does(tmp_path, sdcd):
    plain = _counts(tmp_path, "plain", sdcd, guarded=False)
    guarded = _counts(tmp_path, "guarded", sdcd, guarded=True)
    for rank in range(2):
        p = {l["step"]: l for l in plain[rank]}
        g = {l["step"]: l for l in guarded[rank]}
        assert sorted(p) == sorted(g) == list(range(1, STEPS + 1))
        for step in range(1, STEPS + 1):
            assert p[step]["collectives"] > 0, "the counter saw no bucket all-reduce"
            if step in AUDITS or step == NAN_STEP:
                # The guard's own exchange: the counter does see it.
                assert g[step]["collectives"] > p[step]["collectives"], (rank, step, g[step])
            else:
                assert g[step]["collectives"] == p[step]["collectives"], (rank, step, g[step])
        # The NaN reached every rank through the buckets' own all-reduce, and
        # the agreement it set off names the rank, the same on both.
        assert not g[NAN_STEP]["apply"]
        assert g[NAN_STEP]["reason"] == "NaN/Inf in the local gradients of rank 1", g[NAN_STEP]
        assert all(g[s]["apply"] for s in g if s != NAN_STEP), g
        assert all(g[s]["audited"] for s in AUDITS), g
