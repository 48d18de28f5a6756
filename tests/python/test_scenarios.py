"""Every scenario of the demo with Python trainers: the demo's launcher
(sdc-demo --trainer python) starts a real sdcd and 6 torch.distributed Gloo
ranks of examples/ddp_train.py guarded by sdc_guard (3 nodes x 2), injects
the scenario's fault, and writes what happened (--facts). The right rank is
blamed, no healthy rank ever is, every rank took the same decisions, and no
checkpoint on disk holds corrupted weights."""

import json
import os
import subprocess

import pytest

from conftest import binary, python_env

FAULT_RANK = 3  # On node-b.
FAULT_STEP = 15
STEPS = 24


def run_demo(tmp_path, scenario, fault_rank=FAULT_RANK, fault_step=FAULT_STEP, layout="ddp"):
    run_dir = tmp_path / "run"
    facts = tmp_path / "facts.json"
    out = subprocess.run(
        [binary("demo/sdc-demo"), "--trainer=python", f"--scenario={scenario}",
         f"--steps={STEPS}", "--audit_every=5", "--weight_check_every=5",
         "--checkpoint_every=10", f"--fault_rank={fault_rank}",
         f"--fault_step={fault_step}", "--restart_at=8", f"--run_dir={run_dir}",
         f"--layout={layout}", "--quiet", "--nokeep_coordinator", f"--facts={facts}"],
        capture_output=True, text=True, timeout=600, env=python_env())
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    f = json.loads(facts.read_text())
    ranks = []
    world = len(list(run_dir.glob("progress-*.jsonl")))
    for r in range(world):
        lines = [json.loads(l) for l in open(run_dir / f"progress-{r}.jsonl")]
        ranks.append({l["step"]: l for l in lines if "final" not in l})
    return f, ranks, out.stdout


def same_decisions(ranks):
    for r, steps in enumerate(ranks):
        assert sorted(steps) == list(range(1, STEPS + 1)), f"rank {r} steps"
        for step, line in steps.items():
            assert line["apply"] == ranks[0][step]["apply"], f"rank {r} step {step}"
            assert line["checkpoint"] == ranks[0][step]["checkpoint"], f"rank {r} step {step}"
    return ranks[0]


def common(f):
    assert f["false_alarms"] == 0, f["incidents"]
    assert f["bad_checkpoints"] == [], f
    assert f["weights_identical"], "replicas ended with different weights"


# scenario -> (blamed ranks, the step skipped on every rank or None)
ATTRIBUTED = {
    "nan-gradient": ([FAULT_RANK], FAULT_STEP),
    "activation-x10000": ([FAULT_RANK], FAULT_STEP),
    "mantissa-bitflip": ([FAULT_RANK], FAULT_STEP),
    "weight-corruption": ([FAULT_RANK], None),
    "faulty-replayer": ([FAULT_RANK], FAULT_STEP),
    "coordinator-restart": ([FAULT_RANK], FAULT_STEP),
}


def test_clean(tmp_path):
    f, ranks, _ = run_demo(tmp_path, "clean")
    steps = same_decisions(ranks)
    common(f)
    assert f["incidents"] == [] and f["blamed"] == [] and f["requests"] == []
    assert f["skipped_steps"] == []
    assert all(line["apply"] for line in steps.values())
    assert all(line["outcome"] == "pass" for line in steps.values() if line["audited"])
    assert f["checkpoints_allowed"] == [10, 20]
    assert f["checkpoints_final"] == [10] and f["checkpoints_provisional"] == [20]
    assert f["last_loss"] < f["first_loss"]


@pytest.mark.parametrize("scenario", sorted(ATTRIBUTED))
def test_fault_is_attributed_to_the_faulty_rank(tmp_path, scenario):
    blamed, skipped = ATTRIBUTED[scenario]
    f, ranks, _ = run_demo(tmp_path, scenario)
    steps = same_decisions(ranks)
    common(f)
    assert f["detected"], f
    assert f["blamed"] == blamed, f["incidents"]
    assert f["attributed_correctly"]
    assert f["requests"] == ["node-b"]
    if skipped is not None:
        assert not steps[skipped]["apply"]
        assert skipped in f["skipped_steps"]
    assert steps[20]["checkpoint"] == "vetoed", "the faulty GPU is still in the job"
    assert f["checkpoints_final"] == [] and f["checkpoints_provisional"] == []
    # Checkpoint 10 predates the fault: revoked once it is attributed (or,
    # with sdcd down at step 10, vetoed then).
    assert 10 in f["checkpoints_revoked"] + f["checkpoints_vetoed"], f
    if scenario == "coordinator-restart":
        assert f["coordinator_restarts"] == 1
    if scenario == "weight-corruption":
        assert any(line["repaired"] for step, line in steps.items() if step > FAULT_STEP)


def test_fsdp_shard_update_is_named_by_the_buddy_check(tmp_path):
    # --layout=fsdp: FSDP2 on a 1-D mesh, no replica of any shard. Rank 3's
    # optimizer update of its own shard goes wrong at a weight-check step;
    # the buddy check on another node finds it (a third node decides), the
    # next step is skipped everywhere, nothing can repair the shard, so every
    # later checkpoint is vetoed and the fault counts as detected after it
    # was applied, never as caught.
    f, ranks, out = run_demo(tmp_path, "shard-update", layout="fsdp")
    steps = same_decisions(ranks)
    common(f)
    assert "layout fsdp" in out
    assert f["blamed"] == [FAULT_RANK] and f["attributed_correctly"], f["incidents"]
    assert f["requests"] == ["node-b"]
    assert [i["fate"] for i in f["injections"]] == ["detected after it was applied"], f
    assert f["incidents"][0]["step"] > FAULT_STEP and not steps[FAULT_STEP + 1]["apply"]
    assert steps[20]["checkpoint"] == "vetoed"
    assert 10 in f["checkpoints_revoked"] + f["checkpoints_vetoed"], f


def test_reduced_gradient_receiver_is_a_suspect_not_blamed(tmp_path):
    # The rank that received different reduced gradients need not hold the bad
    # hardware: the step is skipped everywhere, the rank becomes a suspect, and
    # targeted audits of its own (sound) computation open no request.
    f, ranks, _ = run_demo(tmp_path, "reduced-gradient")
    steps = same_decisions(ranks)
    common(f)
    assert f["detected"], f
    assert f["blamed"] == [] and f["requests"] == [], f["incidents"]
    first = f["incidents"][0]
    assert first["outcome"] == "suspect" and first["ranks"] == [FAULT_RANK], first
    assert not steps[FAULT_STEP]["apply"]


def test_intermittent_fault_never_blames_a_healthy_rank(tmp_path):
    f, ranks, _ = run_demo(tmp_path, "intermittent")
    same_decisions(ranks)
    common(f)
    assert set(f["blamed"]) <= {FAULT_RANK}, f["incidents"]
    assert f["detected"], "a 20% per-step fault over 24 steps is caught"


def test_two_nodes_detect_but_blame_nobody(tmp_path):
    f, ranks, _ = run_demo(tmp_path, "two-node")
    assert len(ranks) == 4
    steps = same_decisions(ranks)
    common(f)
    assert f["detected"]
    assert f["blamed"] == [] and f["requests"] == []
    assert f["incidents"][0]["outcome"] == "attribution_impossible"
    assert not steps[FAULT_STEP]["apply"]


def test_replace_and_resume_closes_the_loop(tmp_path):
    """Issue 42's whole loop with Python DDP ranks (shortened, the small MLP):
    caught and attributed at step 20, approved by the demo's operator, node-b
    replaced by node-d, every rank restarted as attempt 1 and resumed from
    step 8 (16 was revoked), trained to the end with no incident."""
    run_dir, facts = tmp_path / "run", tmp_path / "facts.json"
    out = subprocess.run(
        [binary("demo/sdc-demo"), "--trainer=python", "--scenario=replace-and-resume",
         "--model=bn-mlp", "--steps=60", "--fault_step=20", "--checkpoint_every=8",
         f"--run_dir={run_dir}", "--quiet", "--nokeep_coordinator", f"--facts={facts}"],
        capture_output=True, text=True, timeout=600, env=python_env())
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    f = json.loads(facts.read_text())
    assert f["detected"] and f["attributed_correctly"] and f["blamed"] == [FAULT_RANK]
    assert f["skipped_steps"] == [20] and f["checkpoints_revoked"] == [16]
    assert f["resume_request_state"] == "Done"
    a = f["resume"]
    assert a["approved_by"] == "demo-operator"
    assert (a["replaced_node"], a["replacement_node"]) == ("node-b", "node-d")
    assert a["resumed"] and a["attempt"] == 1 and a["resume_step"] == 8
    assert not a["from_corrupted"]
    assert a["steps"] == 52 and a["skipped_steps"] == [] and a["incidents_after"] == 0
    assert {24, 32, 40, 48} <= set(a["checkpoints_allowed"])
    assert f["weights_identical"] and f["bad_checkpoints"] == []
    # The attempt-1 ranks started from step 9, each on its new node's name.
    for r in range(6):
        steps = [json.loads(l)["step"] for l in open(run_dir / f"progress-{r}.attempt1.jsonl")
                 if "final" not in json.loads(l)]
        assert steps == list(range(9, 61)), (r, steps[:3])
    assert "resuming from step 8" in (run_dir / "trainer-0.attempt1.log").read_text()
    assert "The whole loop (times UTC):" in out.stdout
