"""What the Python package's tests share: the built binaries (SDC_BIN, set
by ./sdc pytest to bazel-bin), a real sdcd on free loopback ports, and a
launcher for multi-process torch.distributed (Gloo) jobs of
examples/ddp_train.py. Every process is killed at the end of its test; every
wait has a timeout."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")


def binary(relative):
    base = os.environ.get("SDC_BIN")
    if not base:
        pytest.exit("SDC_BIN is not set: run the suite with ./sdc pytest (or ./sdc test)", 2)
    path = os.path.join(base, relative)
    if not os.access(path, os.X_OK):
        pytest.exit(f"{path} is not built: run ./sdc pytest", 2)
    return path


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Sdcd:
    """A real sdcd in `directory`, on ports the kernel picks (read from its log).
    Another Sdcd in the same directory is the same coordinator restarted on
    its database (on new ports). It runs --insecure_dev_mode (loopback only):
    these tests are about the trainer and the link, so a rank's placement is
    taken at its word; node identities are tested in tests/*_test.cc."""

    def __init__(self, directory, flags=()):
        self.directory = directory
        self.db = os.path.join(directory, "sdcd.db")
        self.token_file = os.path.join(directory, "admin.token")
        self.log = os.path.join(directory, "sdcd.log")
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [binary("daemon/sdcd"), f"--db={self.db}", f"--admin_token_file={self.token_file}",
                 "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                 "--metrics_listen=127.0.0.1:0", "--report_deadline=30s", "--insecure_dev_mode",
                 *flags],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        line = wait_for(self._serving_line, 30, "sdcd to start")
        ports = re.findall(r"\(port (\d+)\)", line)
        self.trainer_address = f"127.0.0.1:{ports[0]}"
        self.admin_address = f"127.0.0.1:{ports[1]}"

    def _serving_line(self):
        if self.process.poll() is not None:
            raise AssertionError(f"sdcd exited: {open(self.log).read()}")
        for line in open(self.log):
            if "serving trainers on" in line:
                return line
        return None

    def sdcctl(self, *args):
        """sdcctl's JSON output (-o json) of a command."""
        out = subprocess.run(
            [binary("ctl/sdcctl"), f"--server={self.admin_address}",
             f"--token_file={self.token_file}", *args, "-o", "json"],
            capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout) if out.stdout.strip() else {}

    def trainer_port(self):
        return int(self.trainer_address.rsplit(":", 1)[1])

    def kill(self):
        """kill -9: a crash, as far as sdcd can tell."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


class Proxy:
    """demo/tcp-proxy: the name trainers dial in front of sdcd. target(port)
    moves it to another sdcd (open connections close), cut() closes every
    connection and refuses new ones until restore()."""

    def __init__(self, target_port=0):
        self.process = subprocess.Popen(
            [binary("demo/tcp-proxy"), str(target_port)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self.process.stdout.readline()
        assert line.startswith("listening "), line
        self.address = "127.0.0.1:" + line.split()[1]

    def _command(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer == "ok", answer

    def target(self, port):
        self._command(f"target {port}")

    def cut(self):
        self._command("cut")

    def restore(self):
        self._command("restore")

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@pytest.fixture
def sdcd(tmp_path):
    d = Sdcd(str(tmp_path))
    yield d
    d.stop()


def python_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.environ.get("SDC_PYTHONPATH", ""), env.get("PYTHONPATH", "")] if p)
    env.update(extra or {})
    return env


def start_job(directory, world, flags=(), env=None, nodes=3, rank_env=None, script=EXAMPLE):
    """Starts `script` (examples/ddp_train.py) on `world` ranks (Gloo, a
    FileStore rendezvous), rank r on node (r // (world / nodes)), with `env`
    and `rank_env(r)` (a dict) added to the environment. Returns (processes,
    log paths); a rank that fails to start kills the ones started before."""
    os.makedirs(directory, exist_ok=True)
    store = os.path.join(directory, "rendezvous")
    if os.path.exists(store):
        os.remove(store)
    per_node = max(1, world // nodes)
    procs, logs = [], []
    try:
        for r in range(world):
            progress = os.path.join(directory, f"progress-{r}.jsonl")
            if os.path.exists(progress):
                os.remove(progress)
            proc_env = python_env({
                "SDC_NODE_NAME": f"node-{chr(ord('a') + r // per_node)}",
                "LOCAL_RANK": str(r % per_node),
                **(env or {}),
                **(rank_env(r) if rank_env else {}),
            })
            log_path = os.path.join(directory, f"rank-{r}.log")
            logs.append(log_path)
            with open(log_path, "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, script, f"--rank={r}", f"--world_size={world}",
                     f"--rendezvous={store}", f"--progress={progress}", *flags],
                    stdout=log, stderr=subprocess.STDOUT, env=proc_env, start_new_session=True))
    except BaseException:
        wait_job(procs, 0)
        raise
    return procs, logs


def wait_job(procs, timeout):
    """Waits for every process up to `timeout` seconds in all, kills what is
    left (whatever happened, no rank outlives the call); returns whether
    every process ended by itself."""
    deadline = time.monotonic() + timeout
    ended = True
    try:
        for p in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        ended = False
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return ended


def progress_lines(directory, rank):
    path = os.path.join(directory, f"progress-{rank}.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path)]


def run_job(directory, world, flags=(), env=None, nodes=3, timeout=300, rank_env=None,
            script=EXAMPLE):
    """Runs `script` (examples/ddp_train.py) on `world` ranks (start_job).
    Returns ([per-rank step records], [per-rank final lines]); raises with
    the logs when a rank fails or the job outlives `timeout`."""
    procs, logs = start_job(directory, world, flags, env, nodes, rank_env, script)
    wait_job(procs, timeout)
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise AssertionError("rank(s) %s failed:\n%s" % (
            failed, "\n".join(f"--- rank {r}\n{open(logs[r]).read()[-3000:]}" for r in failed)))
    steps, finals = [], []
    for r in range(world):
        lines = progress_lines(directory, r)
        steps.append([l for l in lines if "final" not in l and "note" not in l])
        finals.append(next(l for l in lines if l.get("final")))
    return steps, finals
