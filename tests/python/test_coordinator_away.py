"""When sdcd is late, gone or restarted, nothing the trainers found is lost
(issue 37), with the real thing: 6 ranks of examples/ddp_train.py (DDP over
Gloo, 3 nodes x 2) guarded by sdc_guard, a fault injected on one rank, and a
real sdcd behind one local TCP proxy per node (demo/tcp-proxy, the name the
ranks dial). sdcd starts after the job's first steps; it is killed with -9
and comes back on its database at a new port behind the same name; one
node is cut off for a while. After each: the fault the ranks caught is a
confirmed incident naming the faulty rank, one request, every report sent
is acknowledged (or counted as dropped: none is here), and the database
passes PRAGMA integrity_check.

Few steps and short timeouts: each job is about half a minute on a 2-core
machine, mostly Python starting torch."""

import os
import sqlite3
import threading

from conftest import Proxy, Sdcd, run_job, wait_for

WORLD = 6
FAULT_RANK = 3  # node-b
FAULT_STEP = 15
STEPS = 30
FLAGS = [f"--steps={STEPS}", "--model=bn-mlp"]


def env_for(fault=f"mantissa-bitflip:{FAULT_RANK}:step={FAULT_STEP}"):
    return {
        "SDC_JOB_ID": "away",
        "SDC_AUDIT_EVERY": "5",
        "SDC_WEIGHT_CHECK_EVERY": "5",
        "SDC_RECONNECT_MAX_MS": "1000",
        "SDC_INJECT_FAULT": fault,
        "SDC_ALLOW_FAULT_INJECTION": "yes-i-am-testing",
    }


class Job:
    """The job in a thread; the test injects faults while it runs."""

    def __init__(self, directory, proxies, env):
        self.directory = directory
        self.result = None
        self.error = None

        def run():
            try:
                self.result = run_job(
                    directory, WORLD, flags=FLAGS, env=env, timeout=240,
                    rank_env=lambda r: {"SDC_COORDINATOR": proxies[r // 2].address})
            except BaseException as e:  # noqa: B902 (re-raised in join)
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def steps_done(self):
        """The step every rank has finished."""
        done = []
        for r in range(WORLD):
            path = os.path.join(self.directory, f"progress-{r}.jsonl")
            done.append(sum(1 for _ in open(path)) if os.path.exists(path) else 0)
        return min(done)

    def wait_step(self, step):
        wait_for(lambda: self.error is not None or self.steps_done() >= step, 240,
                 f"every rank past step {step}")
        if self.error is not None:
            raise self.error

    def join(self):
        self.thread.join(300)
        assert not self.thread.is_alive(), "the job did not end"
        if self.error is not None:
            raise self.error
        return self.result


def expect_nothing_lost(sdcd, result, faulty_rank=FAULT_RANK, fault_step=FAULT_STEP):
    steps, finals = result
    # The step was skipped on every rank: the ranks caught it in-band.
    for r in range(WORLD):
        skipped = [s["step"] for s in steps[r] if not s["apply"]]
        assert skipped == [fault_step], (r, skipped)
    # Every report sent is acknowledged or counted as dropped.
    for f in finals:
        g = f["guard"]
        assert g["reports_sent"] == g["reports_acked"] + g["reports_dropped"], f
        assert g["reports_dropped"] == 0, f
    incidents = sdcd.sdcctl("get", "incidents", "--job=away")["incidents"]
    confirmed = [i for i in incidents if i["confirmed"]]
    assert len(confirmed) == 1, incidents
    assert confirmed[0]["ranks"] == [faulty_rank] and int(confirmed[0]["step"]) == fault_step
    requests = sdcd.sdcctl("get", "requests")["requests"]
    node = f"node-{chr(ord('a') + faulty_rank // 2)}"
    assert [q["node_name"] for q in requests] == [node], requests
    sdcd.stop()
    assert sqlite3.connect(sdcd.db).execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def logs(directory):
    return "".join(open(os.path.join(directory, f"rank-{r}.log")).read() for r in range(WORLD))


def test_sdcd_starts_after_the_jobs_first_steps(tmp_path):
    run = str(tmp_path / "run")
    proxies = [Proxy() for _ in range(3)]  # Nothing behind them yet.
    try:
        job = Job(run, proxies, env_for())
        job.wait_step(6)
        sdcd = Sdcd(str(tmp_path))
        for p in proxies:
            p.target(sdcd.trainer_port())
        result = job.join()
        expect_nothing_lost(sdcd, result)
        text = logs(run)
        # Never silent: every rank said sdcd was unreachable, then that it
        # delivered what it held, then its summary.
        assert text.count("cannot connect to sdcd at") == WORLD, text[-3000:]
        assert text.count("reports held while it was away") == WORLD, text[-3000:]
        assert text.count("0 dropped;") == WORLD, text[-3000:]
    finally:
        for p in proxies:
            p.close()


def test_sdcd_killed_and_back_on_a_new_port_behind_the_same_name(tmp_path):
    run = str(tmp_path / "run")
    sdcd = Sdcd(str(tmp_path))
    proxies = [Proxy(sdcd.trainer_port()) for _ in range(3)]
    try:
        job = Job(run, proxies, env_for())
        for at in (8, FAULT_STEP - 1):  # The second just before the fault's audit.
            job.wait_step(at)
            sdcd.kill()
            sdcd = Sdcd(str(tmp_path))  # Its database, a new port.
            for p in proxies:
                p.target(sdcd.trainer_port())
        result = job.join()
        expect_nothing_lost(sdcd, result)
    finally:
        sdcd.stop()
        for p in proxies:
            p.close()


def test_one_nodes_ranks_cut_off_from_sdcd_for_a_while(tmp_path):
    run = str(tmp_path / "run")
    sdcd = Sdcd(str(tmp_path))
    proxies = [Proxy(sdcd.trainer_port()) for _ in range(3)]
    try:
        # The fault is on rank 4, on the node that is cut off.
        job = Job(run, proxies, env_for(f"mantissa-bitflip:4:step={FAULT_STEP}"))
        job.wait_step(8)
        proxies[2].cut()
        job.wait_step(FAULT_STEP + 3)
        proxies[2].restore()
        result = job.join()
        expect_nothing_lost(sdcd, result, faulty_rank=4)
        assert "link to sdcd went down" in logs(run)
    finally:
        sdcd.stop()
        for p in proxies:
            p.close()
