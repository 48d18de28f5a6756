"""What a newcomer runs first: the example's own documented command, under
torchrun, with no SDC_* variable set. The job id then comes from the
launcher (or is drawn by rank 0 and logged), never an error on every rank."""

import os
import socket
import subprocess
import sys

from conftest import EXAMPLE, python_env

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, *torchrun_flags):
    env = {k: v for k, v in python_env().items()
           if not k.startswith("SDC_") and k not in ("TORCHELASTIC_RUN_ID", "PET_RDZV_ID",
                                                     "SLURM_JOB_ID")}
    env["PYTHONPATH"] = python_env()["PYTHONPATH"]
    return subprocess.run(
        [TORCHRUN, "--nproc_per_node=2", f"--master_port={_free_port()}", *torchrun_flags,
         EXAMPLE, "--steps=3"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240)


def test_the_documented_torchrun_command_runs_and_names_its_job_id(tmp_path):
    out = _torchrun(tmp_path)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "SDC_JOB_ID: not set" not in log
    lines = [l for l in log.splitlines() if l.startswith("sdc_guard: job id 'torchrun-")]
    assert len(lines) == 1, log[-4000:]  # Rank 0 says it once.
    assert "drawn by rank 0" in lines[0] and "--rdzv_id" in lines[0]
    assert log.count("summary: {'steps': 3") == 2, log[-4000:]


def test_torchruns_rendezvous_id_is_the_job_id(tmp_path):
    out = _torchrun(tmp_path, "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0",
                    "--rdzv_id=nightly-42")
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "sdc_guard: job id 'nightly-42' (TORCHELASTIC_RUN_ID)" in log, log[-4000:]
