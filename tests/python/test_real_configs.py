"""The guard under the configurations real jobs use (issue 40): bf16
autocast, fp16 under a GradScaler (its overflow steps included), activation
checkpointing (reentrant and not), torch.compile, DDP communication hooks
(bf16 compression, PowerSGD). Each is a 6-rank Gloo job of
examples/ddp_train.py against a real sdcd, with a fault injected on rank 3
at the last step (an audit step): every clean step trains bit for bit as the
same configuration unguarded, the audit before the fault passes, and the
fault is detected, the step skipped on every rank and rank 3 named, with no
other incident."""

import pytest

from conftest import run_job

STEPS = 6  # Audits at 3 and 6; the fault at 6.
FAULT = "activation-scale:3:step=6"

# name -> (flags, fault spec)
CONFIGS = {
    "bf16-autocast": (["--amp=bf16"], FAULT),
    # fp16 under a GradScaler, from a scale so high that the first steps
    # overflow on every rank; at step 4 only rank 1's data overflows (a
    # replay on another node reproduces it: the data, not the GPU); at step
    # 6 rank 3 returns a NaN that a replay shows finite.
    "fp16-grad-scaler": (["--model=bn-mlp", "--amp=fp16", f"--grad_scaler={2.0 ** 19}",
                          "--overflow_at=1:4"], "nan-gradient:3:step=6"),
    "checkpointing-reentrant": (["--checkpointing=reentrant"], FAULT),
    "checkpointing-non-reentrant": (["--checkpointing=non-reentrant"], FAULT),
    # aot_eager: dynamo and AOTAutograd's graphs, eager kernels (inductor's
    # code generation takes minutes on this machine; the benchmark runs it).
    # The fault point breaks the graph only at rank 3's step 6 (fault_point).
    "compile": (["--compile=aot_eager"], FAULT),
    "bf16-compress-hook": (["--comm_hook=bf16"], FAULT),
    "powersgd-hook": (["--comm_hook=powersgd"], FAULT),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_configuration_trains_unchanged_and_its_fault_is_named(tmp_path, sdcd, name):
    flags, fault = CONFIGS[name]
    job = f"config-{name}"
    env = {"SDC_JOB_ID": job, "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_AUDIT_EVERY": "3", "SDC_WEIGHT_CHECK_EVERY": "3", "SDC_VERDICT_WAIT_MS": "3000",
           "SDC_INJECT_FAULT": fault, "SDC_ALLOW_FAULT_INJECTION": "yes-i-am-testing"}
    guarded, guarded_final = run_job(str(tmp_path / "guarded"), 6, [f"--steps={STEPS}", *flags],
                                     env)
    # Unguarded, the same configuration stops before the faulty step: the
    # guarded job skips it on every rank, so both end with the same weights.
    plain, plain_final = run_job(str(tmp_path / "plain"), 6,
                                 [f"--steps={STEPS - 1}", "--unguarded", *flags])
    for rank in range(6):
        steps = {s["step"]: s for s in guarded[rank]}
        assert sorted(steps) == list(range(1, STEPS + 1)), rank
        # json keeps a float's every bit: equal text is equal bits.
        assert [steps[s]["loss"] for s in range(1, STEPS)] == \
            [p["loss"] for p in plain[rank]], rank
        assert steps[3]["audited"] and steps[3]["outcome"] == "pass", steps[3]
        assert not steps[STEPS]["apply"], steps[STEPS]
        clean = [s for s in range(1, STEPS) if steps[s]["apply"] or steps[s].get("overflow")]
        assert clean == list(range(1, STEPS)), [steps[s] for s in range(1, STEPS)]
    assert len({f["weights_digest"] for f in guarded_final}) == 1, "the replicas diverged"
    assert {f["weights_digest"] for f in plain_final} == \
        {guarded_final[0]["weights_digest"]}, "other weights than unguarded"
    incidents = sdcd.sdcctl("get", "incidents", f"--job={job}")["incidents"]
    assert incidents, "the fault was detected"
    assert all(i.get("ranks", []) in ([], [3]) for i in incidents), incidents
    assert any(i["outcome"] == "faulty" and i["ranks"] == [3] for i in incidents), incidents
    assert all(i["step"] == str(STEPS) or i["step"] == STEPS for i in incidents), incidents
    if name == "fp16-grad-scaler":
        overflows = [s["step"] for s in guarded[0] if s.get("overflow")]
        assert overflows[:2] == [1, 2] and 4 in overflows, overflows
        # Every overflow backed the scale off, as without the guard; the
        # faulty NaN at step 6 too (the scaler cannot tell it from its own).
        assert guarded_final[0]["scale"] == plain_final[0]["scale"] / 2, (guarded_final,
                                                                         plain_final)
        assert plain_final[0]["scale"] < 2.0 ** 22


def test_a_lone_overflow_under_accumulation_names_nobody(tmp_path, sdcd):
    # With two micro-batches a rank's NaN/Inf cannot be replayed as it ran:
    # under a scaler it is the scaler's overflow, never a suspect.
    env = {"SDC_JOB_ID": "overflow-accumulate", "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_AUDIT_EVERY": "0", "SDC_REPORT_LINGER_MS": "0"}
    steps, finals = run_job(str(tmp_path / "job"), 6,
                            ["--steps=3", "--model=bn-mlp", "--amp=fp16", "--grad_scaler=1024",
                             "--micro_batches=2", "--overflow_at=4:2"], env)
    for rank in range(6):
        assert [s.get("overflow", False) for s in steps[rank]] == [False, True, False], steps[rank]
        assert "rank 4" in steps[rank][1]["reason"], steps[rank][1]
    assert finals[0]["scale"] == 512, finals[0]  # Backed off once.
    assert sdcd.sdcctl("get", "incidents", "--job=overflow-accumulate")["incidents"] == []
    assert sdcd.sdcctl("get", "suspects").get("suspects", []) == []
