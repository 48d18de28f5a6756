"""sdc_guard.Guard in one process: a one-rank Gloo group of the test process
itself (and subprocesses where a test needs a fresh interpreter). What it
refuses, what it registers, where check 1 runs, and a real gRPC exchange with
sdcd beside torch in one process."""

import os
import socket
import subprocess
import sys
import textwrap
import urllib.request

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import sdc_guard
from conftest import python_env


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    store = tmp_path_factory.mktemp("group") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def job_env(monkeypatch):
    for v in ("SDC_COORDINATOR", "SDC_INJECT_FAULT", "SDC_ALLOW_FAULT_INJECTION"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("SDC_JOB_ID", "pytest")
    monkeypatch.setenv("SDC_NODE_NAME", "node-a")


def mlp(deep=False):
    torch.manual_seed(0)
    if not deep:
        return DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 4)))
    # Eight 256 KiB weights: after DDP rebuilds its buckets (at the end of the
    # first backward) the first bucket takes 1 MiB, every later one 256 KiB.
    layers = [torch.nn.Linear(32, 256)]
    for _ in range(8):
        layers += [torch.nn.ReLU(), torch.nn.Linear(256, 256)]
    return DDP(torch.nn.Sequential(*layers, torch.nn.Linear(256, 4)), bucket_cap_mb=0.25)


def mse(model, batch):
    return F.mse_loss(model(batch[0]), batch[1])


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)


def test_refuses_a_model_not_wrapped_in_ddp(group):
    net = torch.nn.Linear(4, 2)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        sdc_guard.Guard(net, torch.optim.SGD(net.parameters(), 0.1), mse)


def test_refuses_bad_options_and_registers_nothing(group):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    with pytest.raises(ValueError, match="audit_every=-1"):
        sdc_guard.Guard(model, opt, mse, audit_every=-1)
    with pytest.raises(ValueError, match="SDC_CHECKPOINT_FALLBACK"):
        sdc_guard.Guard(model, opt, mse, checkpoint_fallback="sometimes")
    with pytest.raises(TypeError, match="unknown option"):
        sdc_guard.Guard(model, opt, mse, audit_evry=5)
    with pytest.raises(TypeError, match="loss_fn"):
        sdc_guard.Guard(model, opt, "not callable")
    # DDP takes one communication hook only: a guard on the same model now
    # works, so none of the refused ones left theirs behind.
    guard = sdc_guard.Guard(model, opt, mse, audit_every=0)
    guard.shutdown(0)


def test_refuses_a_job_without_a_process_group():
    code = textwrap.dedent("""
        import torch, sdc_guard
        from torch.nn.parallel import DistributedDataParallel as DDP
        net = torch.nn.Linear(4, 2)
        class Fake(DDP):
            def __init__(self, m):
                torch.nn.Module.__init__(self)
                self.module = m
        try:
            sdc_guard.Guard(Fake(net), torch.optim.SGD(net.parameters(), 0.1), lambda m, b: 0)
        except RuntimeError as e:
            print("RuntimeError:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=python_env({"SDC_JOB_ID": "x"}))
    assert "RuntimeError: torch.distributed is not initialised" in out.stdout, out.stdout + out.stderr


def test_refuses_a_batch_the_exchange_cannot_carry(group):
    model = mlp()
    guard = sdc_guard.Guard(model, torch.optim.SGD(model.parameters(), 0.1), mse, audit_every=0)
    try:
        with pytest.raises(ValueError, match="tensors only"):
            guard.step(1, (torch.zeros(2, 32), "labels"))
        with pytest.raises(ValueError, match="at most 6"):
            guard.step(1, torch.zeros([1] * 7))
        with pytest.raises(ValueError, match="carries a tensor"):
            guard.step(1, 42)
        with pytest.raises(ValueError, match="1 to 6"):
            guard.step(1, [torch.zeros(1)] * 7)
        with pytest.raises(ValueError, match="step=0"):
            guard.step(0, batch())
        with pytest.raises(ValueError, match="micro_batches=0"):
            guard.step(1, batch(), micro_batches=0)
        # A step without Step.backward cannot be audited: refused, named.
        with pytest.raises(sdc_guard.GuardError, match="s.backward"):
            with guard.step(1, batch()):
                mse(model, batch()).backward()
    finally:
        guard.shutdown(0)


def test_check_one_runs_in_the_hook_for_each_bucket_during_backward(group):
    model = mlp(deep=True)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    guard = sdc_guard.Guard(model, opt, mse, audit_every=0, weight_check_every=0)
    calls_during_backward = []
    try:
        for step in (1, 2, 3):
            b = batch(step)
            with guard.step(step, b) as s:
                before = guard.hook_calls
                s.backward(mse(model, b))
                calls_during_backward.append(guard.hook_calls - before)
            assert s.apply
            opt.step()
        # Every bucket went through the hook, each once, inside backward().
        buckets = model._get_ddp_logging_data()["num_buckets_reduced"]
        assert buckets >= 4
        assert calls_during_backward[1:] == [buckets] * 2, calls_during_backward
        assert guard.summary()["steps"] == 3
    finally:
        guard.shutdown(0)


def test_a_nan_gradient_skips_the_step_and_zeroes_the_gradients(group):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    guard = sdc_guard.Guard(model, opt, mse, audit_every=0, weight_check_every=0)
    try:
        before = [p.detach().clone() for p in model.parameters()]
        x, y = batch()
        x[0, 0] = float("nan")
        with guard.step(1, (x, y)) as s:
            s.backward(mse(model, (x, y)))
        assert not s.apply
        assert "NaN/Inf" in s.reason
        assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
        opt.step()  # What a loop that ignored s.apply would do: zero gradients change nothing.
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    finally:
        guard.shutdown(0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sample(port, series):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split(" ")[1])
    return None


@pytest.mark.parametrize("form", ["environment", "keyword"])
def test_metrics_listen_serves_the_ranks_metrics_from_the_extension(group, monkeypatch, form):
    # The Python extension runs the C++ engine, so SDC_METRICS_LISTEN (or
    # Guard's metrics_listen=) works here too, offset by LOCAL_RANK (0 here).
    port = _free_port()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("SDC_METRICS_LISTEN", raising=False)
    extra = {}
    if form == "environment":
        monkeypatch.setenv("SDC_METRICS_LISTEN", f"127.0.0.1:{port}")
    else:
        extra["metrics_listen"] = f"127.0.0.1:{port}"
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    guard = sdc_guard.Guard(model, opt, mse, audit_every=0, weight_check_every=0, **extra)
    labels = '{rank="0",sdc_job="pytest"}'
    try:
        assert _sample(port, "sdc_trainer_steps_checked_total" + labels) == 0
        for step in (1, 2):
            with guard.step(step, batch(step)) as s:
                s.backward(mse(model, batch(step)))
            opt.step()
        x, y = batch(3)
        x[0, 0] = float("nan")
        with guard.step(3, (x, y)) as s:
            s.backward(mse(model, (x, y)))
        assert not s.apply
        assert _sample(port, "sdc_trainer_steps_checked_total" + labels) == 3
        assert _sample(port, "sdc_trainer_steps_skipped_total" + labels) == 1
        assert _sample(port, "sdc_trainer_nonfinite_steps_total" + labels) == 1
        assert _sample(port, "sdc_trainer_link_up" + labels) == 0
    finally:
        guard.shutdown(0)


def test_reports_reach_a_real_sdcd_over_grpc_beside_torch(group, sdcd):
    """torch's libraries and the bundled gRPC/protobuf/Abseil in one process:
    a guarded step's reports are sent, acknowledged, and the job shows in sdcd."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    guard = sdc_guard.Guard(model, opt, mse, coordinator=sdcd.trainer_address, job_id="grpc",
                            audit_every=0, weight_check_every=1, report_linger_ms=0)
    try:
        for step in (1, 2):
            with guard.step(step, batch(step)) as s:
                s.backward(mse(model, batch(step)))
            opt.step()
            guard.after_optimizer_step()
        guard.shutdown(flush_seconds=10)
        summary = guard.summary()
        assert summary["reports_sent"] == 4  # A step report and a weight report per step.
        assert summary["reports_acked"] == 4, summary
        assert summary["reports_dropped"] == 0
        jobs = sdcd.sdcctl("get", "jobs")
        assert "grpc" in str(jobs), jobs
        assert torch.equal(torch.ones(3) + 1, torch.full((3,), 2.0))
    finally:
        guard.shutdown(0)


def test_provisional_checkpoints_are_promoted_when_the_next_one_is_allowed(group, tmp_path):
    """In-band fallback (no sdcd): an allowed checkpoint is provisional until
    the next is allowed; ProvisionalCheckpoints renames it then, for
    torch.save files and torch.distributed.checkpoint directories alike."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 0.01)
    guard = sdc_guard.Guard(model, opt, mse, audit_every=0, weight_check_every=0,
                            checkpoint_fallback="in-band")
    checkpoints = sdc_guard.ProvisionalCheckpoints(guard, str(tmp_path / "ckpt"))
    try:
        for step in (1, 2, 3):
            with guard.step(step, batch(step)) as s:
                s.backward(mse(model, batch(step)))
            opt.step()
            guard.after_optimizer_step(checkpoint=True)
            assert guard.may_checkpoint()
            if step == 2:
                checkpoints.save_distributed(step, {"model": model.module.state_dict()})
            else:
                checkpoints.save(step, model.module.state_dict())
            checkpoints.reconcile()
        assert checkpoints.steps() == {1: ("pt", False), 2: ("dcp", False), 3: ("pt", True)}
        assert guard.checkpoint_standing(3) == "provisional"
        assert checkpoints.latest_final().endswith("step-2.dcp")
        restored = torch.load(checkpoints.path(1, provisional=False))
        assert set(restored) == set(model.module.state_dict())
    finally:
        guard.shutdown(0)


def test_may_checkpoint_needs_the_checkpoint_weight_check(group):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    guard = sdc_guard.Guard(model, opt, mse, audit_every=0, checkpoint_fallback="in-band")
    try:
        with guard.step(1, batch()) as s:
            s.backward(mse(model, batch()))
        opt.step()
        guard.after_optimizer_step()
        with pytest.raises(sdc_guard.GuardError, match="FAILED_PRECONDITION"):
            guard.may_checkpoint()
    finally:
        guard.shutdown(0)
