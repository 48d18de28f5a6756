#!/usr/bin/env python3
"""./sdc compat: the sdc_guard wheel on every CPython and torch it supports.

    compat.py venvs [--full]
        Makes the virtual environments of the matrix below under
        ~/.cache/sdc-guard/compat/venvs (pip downloads each torch the first
        time: about 1 GB per cell, 3 GB more per CUDA library set; 23 GB on
        disk for the 8 cells), then
        prints one line "TORCH_VERSION VENV" per torch version that has an
        environment: what ./sdc builds that torch's engine library against.
    compat.py run --wheel WHEEL --bin BAZEL_BIN [--full]
        Installs WHEEL (the file, with pip, never the source tree) into every
        environment and runs a guarded smoke job in each: 3 Gloo ranks of
        examples/ddp_train.py with a real sdcd and an injected fault. Prints
        the matrix; exits 1 when a cell failed or when fewer than 2 Python
        versions or 2 torch versions ran.

Without --full, both take the CI matrix (CI_CELLS: every Python once, on
torch 2.9 and 2.11); with it, the full one (FULL_CELLS, torch 2.10 too). Every child has a
time limit (the LIMIT_* constants); SIGTERM (timeout(1)) stops the cell's
processes before this script exits.

A cell whose interpreter this machine lacks is skipped and says so (pyenv's
3.10, 3.12 and 3.13 are on the project's image; a fresh Debian 12 has only
its own 3.11). Standard library only: ./sdc runs it with any Python 3.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")
CACHE = os.path.join(os.environ.get("SDC_CACHE", os.path.expanduser("~/.cache/sdc-guard")),
                     "compat")
VENVS = os.path.join(CACHE, "venvs")

# (Python, torch) cells. The full matrix: every Python with the project's
# torch (2.11.0), the oldest supported torch on the oldest and newest Python,
# and 2.10 once. The CI matrix (what ./sdc compat runs by default, after
# ./sdc test in CI): each Python once, on the oldest and the newest torch
# (the oldest on the oldest and newest Python). Two torch versions, not
# three: after a change to the client each extra torch's engine is a
# rebuild of every torch-including file (15 - 25 minutes on this loaded
# 2-core machine), and 4 environments to make on a fresh one, not 8.
# The first cell of a torch version is the one its engine is built with
# (torch 2.11.0's is built with the project's own environment): the same
# cell in both matrices, so switching matrix does not rebuild an engine.
FULL_CELLS = [
    ("3.11", "2.11.0"), ("3.10", "2.11.0"), ("3.12", "2.11.0"), ("3.13", "2.11.0"),
    ("3.11", "2.10.0"),
    ("3.10", "2.9.1"), ("3.11", "2.9.1"), ("3.13", "2.9.1"),
]
CI_CELLS = [("3.10", "2.9.1"), ("3.11", "2.11.0"), ("3.12", "2.11.0"), ("3.13", "2.9.1")]

# Time limits (seconds) of the children: pip installing torch (about 1 GB,
# 3 GB more with a fresh CUDA library set), creating an environment, pip
# installing the wheel offline, a short Python probe, the smoke job.
LIMIT_TORCH_INSTALL = 1800
LIMIT_VENV = 300
LIMIT_WHEEL_INSTALL = 300
LIMIT_PROBE = 120

# The smoke job: rank FAULT_RANK's activations are scaled at FAULT_STEP.
RANKS, STEPS, FAULT_RANK, FAULT_STEP, EVERY = 3, 9, 1, 6, 3
JOB_TIMEOUT_S = 420


def log(message):
    print(f"compat: {message}", file=sys.stderr, flush=True)


def key(python, torch):
    return f"py{python}-torch{torch}"


def venv_python(python, torch):
    return os.path.join(VENVS, key(python, torch), "bin", "python3")


def find_interpreter(version):
    """The CPython `version` ("3.12") of this machine, or None: Debian's own
    first, then pyenv's (its versions folder, never its shims), then PATH."""
    candidates = [f"/usr/bin/python{version}"]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin",
                                                f"python{version}")), reverse=True)
    on_path = shutil.which(f"python{version}")
    if on_path and "/shims/" not in on_path:
        candidates.append(on_path)
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    return None


def installed_torch(python_path):
    """The torch version installed for `python_path` ("2.9.1"), or None."""
    if not os.access(python_path, os.X_OK):
        return None
    try:
        out = subprocess.run(
            [python_path, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
            capture_output=True, text=True, timeout=LIMIT_PROBE)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout.strip().split("+")[0] if out.returncode == 0 else None


def site_packages(python_path):
    out = subprocess.run([python_path, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True, timeout=LIMIT_PROBE)
    return out.stdout.strip()


def seed_cuda_libraries(python_path, torch):
    """Copies, as hard links, the nvidia-* CUDA packages (pure binary wheels,
    the same for every Python) from another ready environment of the same
    torch, so pip finds them installed at exactly the versions torch pins
    and downloads only torch itself (saves 3 GB of download and disk per
    cell). torch's own libraries differ between its builds for each Python."""
    for python, t in FULL_CELLS:
        donor = venv_python(python, t)
        if t != torch or donor == python_path or installed_torch(donor) != torch:
            continue
        src, dst = site_packages(donor), site_packages(python_path)
        if os.path.exists(os.path.join(dst, "nvidia")):
            return
        subprocess.run(["cp", "-al", os.path.join(src, "nvidia"), dst], check=True,
                       timeout=LIMIT_VENV)
        for info in glob.glob(os.path.join(src, "nvidia_*.dist-info")):
            shutil.copytree(info, os.path.join(dst, os.path.basename(info)))
        return


def make_venv(python, torch, interpreter):
    path = os.path.join(VENVS, key(python, torch))
    py = os.path.join(path, "bin", "python3")
    if installed_torch(py) == torch:
        return True
    log(f"Python {python} + torch {torch}: making {path} (pip downloads torch, about 1 GB)")
    start = time.monotonic()
    shutil.rmtree(path, ignore_errors=True)
    try:
        subprocess.run([interpreter, "-m", "venv", path], check=True, stdout=sys.stderr,
                       timeout=LIMIT_VENV)
        seed_cuda_libraries(py, torch)
        rc = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-input",
                             "--disable-pip-version-check", f"torch=={torch}"],
                            stdout=sys.stderr, timeout=LIMIT_TORCH_INSTALL).returncode
    except subprocess.TimeoutExpired as e:
        log(f"Python {python} + torch {torch}: {e.cmd[1:4]} ran past {e.timeout:.0f} s")
        return False
    if rc != 0 or installed_torch(py) != torch:
        log(f"Python {python} + torch {torch}: pip install torch=={torch} failed")
        return False
    log(f"Python {python} + torch {torch}: ready in {time.monotonic() - start:.0f} s")
    return True


def cmd_venvs(cells):
    os.makedirs(VENVS, exist_ok=True)
    ready = {}
    for python, torch in cells:
        interpreter = find_interpreter(python)
        if interpreter is None:
            log(f"Python {python} + torch {torch}: skipped, no python{python} on this machine")
            continue
        if make_venv(python, torch, interpreter):
            ready.setdefault(torch, venv_python(python, torch)[:-len("/bin/python3")])
    for torch, path in ready.items():  # The only lines on standard output.
        print(torch, path)


# -- the smoke job ----------------------------------------------------------------


class Sdcd:
    """A real sdcd on loopback ports the kernel picks, in `directory`."""

    def __init__(self, bin_dir, directory):
        self.bin_dir, self.directory = bin_dir, directory
        self.token = os.path.join(directory, "admin.token")
        self.log = os.path.join(directory, "sdcd.log")
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [os.path.join(bin_dir, "daemon", "sdcd"), f"--db={directory}/sdcd.db",
                 f"--admin_token_file={self.token}", "--listen=127.0.0.1:0",
                 "--admin_listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        line = None
        while line is None and time.monotonic() < deadline and self.process.poll() is None:
            line = next((l for l in open(self.log) if "serving trainers on" in l), None)
            time.sleep(0.1)
        if line is None:
            self.stop()
            raise RuntimeError(f"sdcd did not start: {open(self.log).read()[-500:]}")
        ports = re.findall(r"\(port (\d+)\)", line)
        self.trainer_address = f"127.0.0.1:{ports[0]}"
        self.admin_address = f"127.0.0.1:{ports[1]}"

    def incidents(self):
        out = subprocess.run(
            [os.path.join(self.bin_dir, "ctl", "sdcctl"), f"--server={self.admin_address}",
             f"--token_file={self.token}", "get", "incidents", "-o", "json"],
            capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"sdcctl get incidents: {out.stderr.strip()}")
        found = json.loads(out.stdout) if out.stdout.strip() else []
        return found.get("incidents", []) if isinstance(found, dict) else found

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def clean_env(extra):
    """The environment of a process that must see only the installed wheel."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "SDC_PYTHONPATH", "VIRTUAL_ENV")
           and not k.startswith("SDC_")}
    env.update(extra)
    return env


def install(py, wheel, work):
    """pip installs the wheel file offline (torch must already satisfy its
    requirements) and returns what the package says about itself, imported
    from outside the source tree."""
    subprocess.run([py, "-m", "pip", "uninstall", "--quiet", "--yes", "sdc-guard"],
                   capture_output=True, timeout=LIMIT_WHEEL_INSTALL)
    out = subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-input", "--no-index",
                          "--disable-pip-version-check", wheel],
                         capture_output=True, text=True, cwd=work, env=clean_env({}),
                         timeout=LIMIT_WHEEL_INSTALL)
    if out.returncode != 0:
        raise RuntimeError(f"pip install of the wheel failed: {(out.stdout + out.stderr)[-600:]}")
    probe = ("import json, sys, torch, sdc_guard, sdc_guard._C as c;"
             "print(json.dumps({'file': sdc_guard.__file__, 'library': c.LIBRARY,"
             "'python': sys.version.split()[0], 'torch': torch.__version__}))")
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=work,
                         env=clean_env({}), timeout=LIMIT_PROBE)
    if out.returncode != 0:
        raise RuntimeError(f"import sdc_guard failed: {out.stderr.strip()[-600:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    if not info["file"].startswith(os.path.dirname(os.path.dirname(py))):
        raise RuntimeError(f"sdc_guard was imported from {info['file']}, not the environment")
    return info


def smoke_job(py, bin_dir, work):
    """The guarded job; returns a short description, raises when a check fails."""
    sdcd = Sdcd(bin_dir, work)
    procs, logs = [], []
    try:
        for r in range(RANKS):
            env = clean_env({
                "SDC_JOB_ID": "compat", "SDC_COORDINATOR": sdcd.trainer_address,
                "SDC_NODE_NAME": f"node-{r}", "LOCAL_RANK": "0",
                "SDC_AUDIT_EVERY": str(EVERY), "SDC_WEIGHT_CHECK_EVERY": str(EVERY),
                "SDC_VERDICT_WAIT_MS": "5000",
                "SDC_INJECT_FAULT": f"activation-scale:{FAULT_RANK}:step={FAULT_STEP}:10000",
                "SDC_ALLOW_FAULT_INJECTION": "yes-i-am-testing",
            })
            logs.append(os.path.join(work, f"rank-{r}.log"))
            with open(logs[-1], "w") as out:
                procs.append(subprocess.Popen(
                    [py, EXAMPLE, f"--rank={r}", f"--world_size={RANKS}",
                     f"--rendezvous={work}/rendezvous", f"--steps={STEPS}",
                     f"--checkpoint_every={EVERY}", f"--progress={work}/progress-{r}.jsonl"],
                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work,
                    start_new_session=True))
        deadline = time.monotonic() + JOB_TIMEOUT_S
        for p in procs:
            try:
                p.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        timed_out = any(p.poll() is None for p in procs)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            tail = open(logs[failed[0]]).read()[-800:]
            raise RuntimeError(f"rank(s) {failed} {'timed out' if timed_out else 'failed'}: {tail}")
        incidents = sdcd.incidents()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        sdcd.stop()
    return check_job(work, incidents)


def check_job(work, incidents):
    ranks = [[json.loads(l) for l in open(f"{work}/progress-{r}.jsonl")] for r in range(RANKS)]
    steps = [[l for l in lines if not l.get("final")] for lines in ranks]
    finals = [next(l for l in lines if l.get("final")) for lines in ranks]
    problems = []
    for r in range(RANKS):
        g = finals[r]["guard"]
        if [s["step"] for s in steps[r]] != list(range(1, STEPS + 1)) or g.get("steps") != STEPS:
            problems.append(f"rank {r} guarded {g.get('steps')} of {STEPS} steps")
        if [s["apply"] for s in steps[r]] != [s["apply"] for s in steps[0]]:
            problems.append(f"rank {r} took other decisions than rank 0")
        if g["audits"] < 1:
            problems.append(f"rank {r} ran no replay audit")
        if not 0 < g["reports_acked"] == g["reports_sent"] or g["reports_dropped"]:
            problems.append(f"rank {r}: {g['reports_acked']} of {g['reports_sent']} reports "
                            f"acknowledged, {g['reports_dropped']} dropped")
    skipped = sorted(s["step"] for s in steps[0] if not s["apply"])
    if skipped != [FAULT_STEP]:
        problems.append(f"skipped steps {skipped}, want [{FAULT_STEP}]")
    checkpoints = {s["step"]: s["checkpoint"] for s in steps[0] if s["checkpoint"] != "none"}
    if checkpoints.get(FAULT_STEP) != "vetoed":
        problems.append(f"checkpoints {checkpoints}: step {FAULT_STEP}'s not vetoed")
    if len({f["weights_digest"] for f in finals}) != 1:
        problems.append("the replicas ended with different weights")
    blamed = sorted({r for i in incidents if i.get("confirmed") for r in i.get("ranks", [])})
    if blamed != [FAULT_RANK]:
        problems.append(f"sdcd blamed ranks {blamed}, want [{FAULT_RANK}]")
    if problems:
        raise RuntimeError("; ".join(problems))
    acked = sum(f["guard"]["reports_acked"] for f in finals)
    return (f"{STEPS} steps x {RANKS} ranks guarded, step {FAULT_STEP} skipped, rank "
            f"{FAULT_RANK} blamed, {acked} reports acknowledged")


def cmd_run(args, cells):
    wheel = os.path.abspath(args.wheel)
    results = {}  # (python, torch) -> (status, detail, seconds)
    for python, torch in cells:
        py = venv_python(python, torch)
        if installed_torch(py) != torch:
            why = (f"no python{python} on this machine" if find_interpreter(python) is None
                   else "its environment is not ready (compat.py venvs)")
            results[(python, torch)] = ("skipped", why, 0)
            continue
        start = time.monotonic()
        work = tempfile.mkdtemp(prefix=f"sdc-compat-{key(python, torch)}-")
        try:
            info = install(py, wheel, work)
            detail = smoke_job(py, args.bin, work)
            detail += (f"; Python {info['python']}, torch {info['torch']}, engine "
                       f"{os.path.basename(os.path.dirname(info['library']))}")
            results[(python, torch)] = ("pass", detail, time.monotonic() - start)
            shutil.rmtree(work, ignore_errors=True)
        except Exception as e:  # noqa: BLE001 (the cell fails, the matrix goes on)
            results[(python, torch)] = ("FAIL", f"{e} (logs: {work})", time.monotonic() - start)
        status, detail, seconds = results[(python, torch)]
        log(f"Python {python} + torch {torch}: {status} in {seconds:.0f} s: {detail}")
    return report(wheel, results, cells)


def by_version(versions):
    return sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".")))


def report(wheel, results, cells):
    pythons = by_version({p for p, _ in cells})
    torches = by_version({t for _, t in cells})
    print(f"sdc_guard wheel {os.path.basename(wheel)}: guarded smoke job per Python and torch")
    print("%-12s" % "" + "".join("%-16s" % f"torch {t}" for t in torches))
    for p in pythons:
        row = []
        for t in torches:
            status, _, seconds = results.get((p, t), ("", "", 0))
            row.append({"pass": f"pass ({seconds:.0f} s)", "FAIL": "FAIL", "skipped": "skipped",
                        "": "-"}[status])
        print("%-12s" % f"Python {p}" + "".join("%-16s" % c for c in row))
    for (p, t), (status, detail, _) in results.items():
        if status != "pass":
            print(f"  Python {p} + torch {t}: {status}: {detail}")
    passed = [cell for cell, (status, _, _) in results.items() if status == "pass"]
    failed = [cell for cell, (status, _, _) in results.items() if status == "FAIL"]
    ran_pythons = {p for p, _ in passed}
    ran_torches = {t for _, t in passed}
    print(f"{len(passed)} passed, {len(failed)} failed, "
          f"{sum(1 for s, _, _ in results.values() if s == 'skipped')} skipped; "
          f"Python {', '.join(by_version(ran_pythons))}; torch {', '.join(by_version(ran_torches))}")
    if failed:
        return 1
    if len(ran_pythons) < 2 or len(ran_torches) < 2:
        print("compat: fewer than 2 Python versions or 2 torch versions ran: not enough",
              file=sys.stderr)
        return 1
    return 0


def stop_on_sigterm(signum, _frame):
    """timeout(1) sends SIGTERM: unwind, so each cell's `finally` kills its
    sdcd and ranks (their own sessions, which the signal does not reach)."""
    raise SystemExit(128 + signum)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    venvs = sub.add_parser("venvs", help="make the environments; print 'TORCH VENV' lines")
    run = sub.add_parser("run", help="install the wheel in each environment, run the smoke job")
    run.add_argument("--wheel", required=True)
    run.add_argument("--bin", required=True, help="where daemon/sdcd and ctl/sdcctl are built")
    for p in (venvs, run):
        p.add_argument("--full", action="store_true",
                       help=f"the full matrix ({len(FULL_CELLS)} cells), not CI's "
                            f"({len(CI_CELLS)})")
    args = parser.parse_args()
    cells = FULL_CELLS if args.full else CI_CELLS
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    if args.command == "venvs":
        cmd_venvs(cells)
        return 0
    return cmd_run(args, cells)


if __name__ == "__main__":
    sys.exit(main())
