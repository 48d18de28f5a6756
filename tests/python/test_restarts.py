"""Issue 42: a guarded job's restarts are attempts. Real torchrun (Gloo, 6
worker processes, --standalone rendezvous on a free port) around
examples/ddp_train.py --resume, against a real sdcd; what sdcd kept is read
from its SQLite file and through sdcctl. Every run has a timeout (the
process group's collectives time out first)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import Sdcd, python_env, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "restart_worker.py")
JOB = "restart-job"
RUN_TIMEOUT = 240  # Seconds per torchrun launch; --pg_timeout_s is 60.


def torchrun(directory, sdcd, nproc, steps, max_restarts=0, env=None, flags=()):
    """Starts torchrun (its own process group) with `nproc` workers of
    restart_worker.py; returns the Popen and its log path."""
    os.makedirs(directory, exist_ok=True)
    log_path = os.path.join(directory, f"torchrun-{time.monotonic_ns()}.log")
    proc_env = python_env({
        "SDC_COORDINATOR": sdcd.trainer_address, "SDC_JOB_ID": JOB,
        "SDC_AUDIT_EVERY": "10", "SDC_WEIGHT_CHECK_EVERY": "5",
        "RESTART_TEST_PIDS": directory, "OMP_NUM_THREADS": "1", **(env or {}),
    })
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
             "--monitor-interval=0.5", WORKER, f"--steps={steps}", "--model=bn-mlp",
             "--checkpoint_every=5", f"--checkpoint_dir={os.path.join(directory, 'ckpt')}",
             "--resume", "--pg_timeout_s=60",
             f"--progress={os.path.join(directory, 'progress.jsonl')}", *flags],
            stdout=log, stderr=subprocess.STDOUT, env=proc_env, start_new_session=True)
    return proc, log_path


def finish(proc, log_path, expect_ok=True):
    """Waits for torchrun (killing its process group past RUN_TIMEOUT) and
    returns its log."""
    try:
        proc.wait(RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("torchrun outlived its timeout:\n" + open(log_path).read()[-4000:])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # No worker outlives its launcher.
        except ProcessLookupError:
            pass
    log = open(log_path).read()
    if expect_ok:
        assert proc.returncode == 0, log[-6000:]
    return log


def progress(directory):
    path = os.path.join(directory, "progress.jsonl")
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def steps_by_rank(lines):
    out = {}
    for l in lines:
        if "step" in l and "final" not in l and "note" not in l:
            out.setdefault(l["rank"], []).append(l["step"])
    return out


def query(sdcd, sql, *args):
    with sqlite3.connect(f"file:{sdcd.db}?mode=ro", uri=True, timeout=10) as db:
        return db.execute(sql, args).fetchall()


def start_sdcd(directory, flags=()):
    os.makedirs(directory, exist_ok=True)
    return Sdcd(directory, flags)


def job_of(sdcd):
    jobs = sdcd.sdcctl("get", "jobs").get("jobs", [])
    return next(j for j in jobs if j["job_id"] == JOB)


def assert_clean(sdcd, first_step, last_step):
    """Every step from first_step to last_step has one passing check-1
    verdict, no incident and no request exists, and sdcd refused no report
    as a conflicting resend."""
    rows = query(sdcd, "SELECT step, failed FROM step_verdicts WHERE job_id = ? AND "
                 "check_kind = 'nonfinite' ORDER BY step", JOB)
    assert [s for s, _ in rows] == list(range(first_step, last_step + 1)), rows
    assert all(failed == 0 for _, failed in rows), rows
    assert sdcd.sdcctl("get", "incidents").get("incidents", []) == []
    assert sdcd.sdcctl("get", "requests").get("requests", []) == []
    log = open(sdcd.log).read()
    for refusal in ("out-of-order step", "already received"):
        assert refusal not in log, refusal


def test_a_rank_killed_mid_run_restarts_the_job_as_a_new_attempt(tmp_path):
    sdcd = start_sdcd(str(tmp_path / "sdcd"))
    directory = str(tmp_path / "job")
    proc, log_path = torchrun(directory, sdcd, 6, steps=25, max_restarts=1)
    try:
        # Checkpoint 5 is final once 10 is allowed; kill rank 3 after step 12.
        wait_for(lambda: any(l.get("rank") == 3 and l.get("step", 0) >= 12
                             for l in progress(directory)), 180, "rank 3 at step 12")
        pid = int(open(os.path.join(directory, "rank-3-restart-0")).read())
        os.kill(pid, signal.SIGKILL)
        log = finish(proc, log_path)
    finally:
        sdcd.stop()
    assert "rank 3: resuming from step 10" in log or "rank 3: resuming from step 5" in log, log
    resumed = 10 if "rank 3: resuming from step 10" in log else 5
    by_rank = steps_by_rank(progress(directory))
    assert sorted(by_rank) == list(range(6))
    for r, steps in by_rank.items():
        back = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
        assert steps[back:] == list(range(resumed + 1, 26)), (r, steps)
    finals = [l for l in progress(directory) if l.get("final")]
    assert len(finals) == 6, "only the second attempt's ranks end"
    assert len({f["weights_digest"] for f in finals}) == 1, "replicas agree after the resume"
    for f in finals:
        g = f["guard"]
        assert g["reports_sent"] == g["reports_acked"] and g["reports_dropped"] == 0, g

    sdcd = start_sdcd(str(tmp_path / "sdcd"))  # Read what it kept after a restart of its own.
    try:
        assert job_of(sdcd)["attempt"] in (1, "1")
        attempts = query(sdcd, "SELECT attempt, world_size, resume_step, note FROM attempts "
                         "WHERE job_id = ?", JOB)
        assert [(a, w, s) for a, w, s, _ in attempts] == [(1, 6, resumed)], attempts
        assert "replaces attempt 0" in attempts[0][3]
        # Steps before the resume keep attempt 0's verdicts; the rest are
        # attempt 1's, each once: nothing double-counted.
        assert_clean(sdcd, 1, 25)
        allowed = [s for s, in query(sdcd, "SELECT step FROM checkpoint_decisions WHERE "
                                     "job_id = ? AND allowed = 1 ORDER BY id", JOB)]
        expected = [s for s in (10, 15, 20, 25) if s > resumed]
        assert allowed[-len(expected):] == expected, allowed
    finally:
        sdcd.stop()


def test_the_world_shrinks_and_grows_between_attempts(tmp_path):
    """torchrun --nnodes=MIN:MAX needs several nodes; here the next launch
    of the job under the same job id with another --nproc-per-node (6, then
    4, then 6) stands for it, each launch a new attempt (SDC_ATTEMPT)."""
    sdcd = start_sdcd(str(tmp_path / "sdcd"))
    directory = str(tmp_path / "job")
    try:
        finish(*torchrun(directory, sdcd, 6, steps=10))
        # Checkpoint 5 is final, 10 provisional: attempt 1 resumes from 5.
        log = finish(*torchrun(directory, sdcd, 4, steps=15, env={"SDC_ATTEMPT": "1"}))
        assert "rank 0: resuming from step 5" in log, log
        job = job_of(sdcd)
        assert (job["world_size"], int(job["attempt"])) == (4, 1000000)
        log = finish(*torchrun(directory, sdcd, 6, steps=20, env={"SDC_ATTEMPT": "2"}))
        assert "rank 5: resuming from step 10" in log, log
        job = job_of(sdcd)
        assert (job["world_size"], int(job["attempt"])) == (6, 2000000)
        attempts = query(sdcd, "SELECT attempt, world_size, resume_step FROM attempts WHERE "
                         "job_id = ? ORDER BY attempt", JOB)
        assert attempts == [(1000000, 4, 5), (2000000, 6, 10)], attempts
        assert_clean(sdcd, 1, 20)
        # Each attempt abandoned the provisional checkpoint after its resume
        # step: attempt 0's 10, then attempt 1's 15 (its own 10 was confirmed).
        abandoned = query(sdcd, "SELECT step FROM checkpoint_decisions WHERE job_id = ? AND "
                          "abandoned = 1 ORDER BY id", JOB)
        assert abandoned == [(10,), (15,)], abandoned
    finally:
        sdcd.stop()


def test_a_resume_from_a_provisional_checkpoint_is_warned_or_refused(tmp_path):
    sdcd = start_sdcd(str(tmp_path / "sdcd"))
    directory = str(tmp_path / "job")
    try:
        finish(*torchrun(directory, sdcd, 6, steps=5))  # Checkpoint 5: provisional.
        assert os.path.exists(os.path.join(directory, "ckpt", "step-5.pt.provisional"))
        # A resume from it (said by hand: latest_final_step() finds none): warned.
        log = finish(*torchrun(directory, sdcd, 6, steps=5, flags=("--first_step=6",),
                               env={"SDC_ATTEMPT": "1", "SDC_RESUME_STEP": "5"}))
        assert ("sdcd warns about attempt 1000000 of this job: it resumes from step 5, whose "
                "checkpoint is provisional") in log, log
        note = query(sdcd, "SELECT note FROM attempts WHERE job_id = ?", JOB)[0][0]
        assert "warning: it resumes from step 5, whose checkpoint is provisional" in note
    finally:
        sdcd.stop()
    # The same sdcd (its database) restarted with --resume_policy=refuse.
    sdcd = start_sdcd(str(tmp_path / "sdcd"), flags=("--resume_policy=refuse",))
    try:
        log = finish(*torchrun(directory, sdcd, 6, steps=5, flags=("--first_step=11",),
                               env={"SDC_ATTEMPT": "2", "SDC_RESUME_STEP": "7",
                                    "SDC_CHECKPOINT_WAIT_MS": "2000"}), expect_ok=False)
        assert "is refused (sdcd --resume_policy=refuse)" in log, log[-6000:]
        assert int(job_of(sdcd)["attempt"]) == 1000000, "the refused attempt never started"
        # Its checkpoints are vetoed: sdcd never welcomed it.
        outcomes = {l["checkpoint"] for l in progress(directory)
                    if l.get("step") in (15,) and "final" not in l}
        assert outcomes == {"vetoed"}, outcomes
    finally:
        sdcd.stop()
