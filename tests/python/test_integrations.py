"""The framework adapters (sdc_guard.integrations) with the real libraries:
the demo's launcher (sdc-demo --trainer hf|lightning|accelerate) starts a
real sdcd and 6 torch.distributed Gloo ranks (3 nodes x 2) of
examples/framework_train.py, a tiny transformer built in code and trained
by transformers.Trainer, Lightning or Accelerate, with the demo's fault
injection. A fault is caught and blamed on the faulty rank, the step is
skipped on every rank, the checkpoint after it is vetoed and the one before
it revoked; a clean run opens no incident and keeps its checkpoints."""

import json
import os
import signal
import subprocess

import pytest

from conftest import binary, python_env

FRAMEWORKS = ("hf", "lightning", "accelerate")
FAULT_RANK = 3  # On node-b.
FAULT_STEP = 6  # An audit step (audit_every 3).
STEPS = 10
CHECKPOINT_EVERY = 4
TIMEOUT_S = 300  # Under the demo's own cluster timeout (20 min): never a hang.


def run_demo(tmp_path, framework, scenario):
    run_dir = tmp_path / "run"
    facts = tmp_path / "facts.json"
    proc = subprocess.Popen(
        [binary("demo/sdc-demo"), f"--trainer={framework}", f"--scenario={scenario}",
         f"--steps={STEPS}", "--audit_every=3", "--weight_check_every=3",
         f"--checkpoint_every={CHECKPOINT_EVERY}", f"--fault_rank={FAULT_RANK}",
         f"--fault_step={FAULT_STEP}", f"--run_dir={run_dir}", "--quiet",
         "--nokeep_coordinator", f"--facts={facts}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=python_env(),
        start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # The demo and every rank it started.
        proc.communicate()
        raise AssertionError(f"sdc-demo --trainer={framework} outlived {TIMEOUT_S}s")
    logs = "".join(f"--- {p.name}\n{p.read_text()[-2500:]}"
                   for p in sorted(run_dir.glob("trainer-*.log"))[:2])
    assert proc.returncode == 0, out[-4000:] + logs
    f = json.loads(facts.read_text())
    ranks, finals = [], []
    for r in range(6):
        lines = [json.loads(l) for l in open(run_dir / f"progress-{r}.jsonl")]
        ranks.append({l["step"]: l for l in lines if "final" not in l})
        finals.append(next(l for l in lines if l.get("final")))
    return f, ranks, finals, run_dir


def same_decisions(ranks):
    for r, steps in enumerate(ranks):
        assert sorted(steps) == list(range(1, STEPS + 1)), f"rank {r} steps {sorted(steps)}"
        for step, line in steps.items():
            assert line["apply"] == ranks[0][step]["apply"], f"rank {r} step {step}"
            assert line["checkpoint"] == ranks[0][step]["checkpoint"], f"rank {r} step {step}"
    return ranks[0]


def checkpoints_on_disk(run_dir):
    return sorted(n for n in os.listdir(run_dir)
                  if n.startswith(("checkpoint-", "step-")))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fault_caught_blamed_and_checkpoint_vetoed(tmp_path, framework):
    f, ranks, finals, run_dir = run_demo(tmp_path, framework, "activation-x10000")
    steps = same_decisions(ranks)
    assert f["false_alarms"] == 0, f["incidents"]
    assert f["detected"], f
    assert f["blamed"] == [FAULT_RANK], f["incidents"]
    assert f["attributed_correctly"]
    assert f["requests"] == ["node-b"]
    assert not steps[FAULT_STEP]["apply"] and FAULT_STEP in f["skipped_steps"]
    assert all(line["apply"] for step, line in steps.items() if step != FAULT_STEP)
    # The framework's optimizer never applied the skipped step, on any rank.
    assert [x["optimizer_steps"] for x in finals] == [STEPS - 1] * 6, finals
    assert f["weights_identical"], "replicas ended with different weights"
    # Checkpoint 4 predates the fault: revoked once attributed (deleted);
    # 8 comes with the faulty GPU still in the job: vetoed, never written.
    assert steps[8]["checkpoint"] == "vetoed"
    assert 4 in f["checkpoints_revoked"], f
    assert f["bad_checkpoints"] == [], f
    assert f["checkpoints_final"] == [] and f["checkpoints_provisional"] == [], \
        checkpoints_on_disk(run_dir)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_clean_run_has_no_incident(tmp_path, framework):
    f, ranks, finals, run_dir = run_demo(tmp_path, framework, "clean")
    steps = same_decisions(ranks)
    assert f["incidents"] == [] and f["blamed"] == [] and f["requests"] == [], f["incidents"]
    assert f["false_alarms"] == 0 and f["skipped_steps"] == []
    assert all(line["apply"] for line in steps.values())
    assert [x["optimizer_steps"] for x in finals] == [STEPS] * 6, finals
    audited = [s for s, line in steps.items() if line["audited"]]
    assert audited and all(steps[s]["outcome"] == "pass" for s in audited), steps
    assert f["weights_identical"]
    assert {4, 8} <= set(f["checkpoints_allowed"]) and f["checkpoints_vetoed"] == []
    # Each allowed checkpoint is final once the next one is allowed; the last stays provisional.
    allowed = sorted(f["checkpoints_allowed"])
    assert f["checkpoints_final"] == allowed[:-1], checkpoints_on_disk(run_dir)
    assert f["checkpoints_provisional"] == allowed[-1:], checkpoints_on_disk(run_dir)
    assert f["last_loss"] < f["first_loss"]


def test_the_trainer_never_resumes_from_a_provisional_checkpoint(tmp_path):
    # What the Trainer adapter relies on: resume_from_checkpoint=True takes
    # get_last_checkpoint's answer, which must skip checkpoint-N.provisional.
    from transformers.trainer_utils import get_last_checkpoint

    for name in ("checkpoint-4", "checkpoint-8.provisional"):
        (tmp_path / name).mkdir()
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")
