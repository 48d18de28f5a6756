"""Every-step product checksums in a 6-rank Gloo job of examples/ddp_train.py
(its transformer) against a real sdcd (issue 45): a product error injected
on one rank at a step the replay audit does not cover is caught there, and
every rank skips that step alike and trains on with identical replicas; a
clean run raises no alarm. Collectives time out after PG_TIMEOUT_S; the
test's own timeout is shorter, so a hang shows as this test failing."""

from conftest import progress_lines, start_job, wait_job

PG_TIMEOUT_S = 300
TEST_TIMEOUT_S = 150
assert TEST_TIMEOUT_S < PG_TIMEOUT_S
STEPS = 6


def _run(tmp_path, sdcd, job, fault=None):
    env = {"SDC_JOB_ID": job, "SDC_COORDINATOR": sdcd.trainer_address, "SDC_EVERY_STEP": "1",
           "SDC_AUDIT_EVERY": "4"}
    if fault:
        env.update({"SDC_INJECT_FAULT": fault, "SDC_ALLOW_FAULT_INJECTION": "yes-i-am-testing"})
    directory = str(tmp_path / job)
    procs, logs = start_job(directory, 6, [f"--pg_timeout_s={PG_TIMEOUT_S}", f"--steps={STEPS}"],
                            env)
    ended = wait_job(procs, TEST_TIMEOUT_S)
    text = [open(l).read() for l in logs]
    assert ended, "a rank hung:\n" + "\n".join(f"--- rank {r}\n{t[-2000:]}"
                                                for r, t in enumerate(text))
    assert all(p.returncode == 0 for p in procs), "\n".join(t[-2000:] for t in text)
    steps, finals = [], []
    for rank in range(6):
        lines = progress_lines(directory, rank)
        steps.append({l["step"]: l for l in lines if "step" in l and not l.get("note")
                      and not l.get("final")})
        finals.append(next(l for l in lines if l.get("final")))
    return steps, finals, text


def test_a_product_error_on_an_unaudited_step_is_caught_and_skipped_on_every_rank(tmp_path,
                                                                                 sdcd):
    steps, finals, logs = _run(tmp_path, sdcd, "every-step-fault", "product:2:step=3:2^-6")
    reasons = set()
    for rank in range(6):
        assert sorted(steps[rank]) == list(range(1, STEPS + 1))
        assert [steps[rank][s]["apply"] for s in range(1, STEPS + 1)] == \
            [s != 3 for s in range(1, STEPS + 1)], rank
        assert not steps[rank][3]["audited"]  # Audits at 4: the replay never saw step 3.
        reasons.add(steps[rank][3]["reason"])
        g = finals[rank]["guard"]
        assert g["checksum_alarms"] == (1 if rank == 2 else 0), (rank, g)
        assert g["checksum_skips"] == 1 and g["skipped"] == 1, (rank, g)
        assert g["products_checked"] > 0
    assert len(reasons) == 1, reasons  # The same reason, word for word, on every rank.
    reason = reasons.pop()
    assert "step 3 failed on rank 2" in reason and "checksum alarm at step 3 on rank 2" in reason
    assert "sdc-guard rank 2: INJECTED a product error (relative 0.015625" in logs[2]
    assert "at step 3" in logs[2]
    assert "sdc-guard rank 2: checksum alarm at step 3" in logs[2]
    # sdcd reads the alarm from the reason: rank 2 a suspect (its targeted
    # replays judge it), the NaN that carried the alarm no all-reduce fault.
    incidents = sdcd.sdcctl("get", "incidents", "--job=every-step-fault")["incidents"]
    suspects = [i for i in incidents if i.get("outcome") == "suspect" and i.get("ranks") == [2]]
    assert len(suspects) == 1, incidents
    assert "discrepancy" in suspects[0]["explanation"], suspects
    assert not any(i.get("outcome") == "allreduce" for i in incidents), incidents
    assert len({f["weights_digest"] for f in finals}) == 1, "the replicas diverged"


def test_a_clean_job_raises_no_checksum_alarm(tmp_path, sdcd):
    steps, finals, _ = _run(tmp_path, sdcd, "every-step-clean")
    for rank in range(6):
        assert all(steps[rank][s]["apply"] for s in range(1, STEPS + 1)), steps[rank]
        g = finals[rank]["guard"]
        assert (g["checksum_alarms"], g["checksum_skips"], g["skipped"]) == (0, 0, 0), g
        assert g["products_checked"] > 0
    assert len({f["weights_digest"] for f in finals}) == 1
