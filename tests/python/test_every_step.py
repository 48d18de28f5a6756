"""The every-step product checksums of the Python front end (issue 45), in
one process: torch.ops.sdc.check_matmul on the tensors torch holds, no false
alarm over hundreds of steps of a small transformer in fp32 and in bf16
autocast, and an injected product error caught, its step skipped."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import sdc_guard
from sdc_guard import _C


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    store = tmp_path_factory.mktemp("group") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def one_thread():
    # Small products on a shared machine: torch's thread pool only contends.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def job_env(monkeypatch):
    for v in ("SDC_COORDINATOR", "SDC_INJECT_FAULT", "SDC_ALLOW_FAULT_INJECTION",
              "SDC_EVERY_STEP"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("SDC_JOB_ID", "pytest")
    monkeypatch.setenv("SDC_NODE_NAME", "node-a")


def test_check_matmul_takes_strided_views_and_finds_a_wrong_element():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(24, 40, generator=g)
    w = torch.randn(16, 40, generator=g)
    bias = torch.randn(16, generator=g)
    c = torch.addmm(bias, a, w.t())  # A Linear's forward: B is a transposed view.
    passed, worst, discrepancy, threshold, batch = _C.check_matmul(a, w.t(), c, bias)
    assert passed and abs(discrepancy) <= threshold
    assert _C.check_matmul(a, w.t(), c, bias.expand(24, 16))[0]  # addmm's expanded input.
    c[5, 11] *= 1 + 2 ** -6
    passed, worst, discrepancy, threshold, _ = _C.check_matmul(a, w.t(), c, bias)
    assert not passed and worst == 11 and abs(discrepancy) > threshold
    # The guaranteed rule is looser, never tighter.
    clean = torch.addmm(bias, a, w.t())
    assert _C.check_matmul(a, w.t(), clean, bias, "guaranteed")[3] >= \
        _C.check_matmul(a, w.t(), clean, bias)[3]
    # bf16 products and batches (bmm), product 2 of 3 wrong.
    x = torch.randn(3, 8, 32, generator=g).bfloat16()
    y = torch.randn(3, 32, 8, generator=g).bfloat16()
    z = torch.bmm(x, y)
    assert _C.check_matmul(x, y, z)[0]
    z[2, 1, 3] = z[2, 1, 3].float() * 1.25
    passed, worst, _, _, batch = _C.check_matmul(x, y, z)
    assert not passed and (worst, batch) == (3, 2)


def test_check_matmul_refuses_what_it_cannot_check():
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        _C.check_matmul(a.double(), b.double(), (a @ b).double())
    with pytest.raises(ValueError, match="on meta: the product checksums run on CPU tensors only"):
        _C.check_matmul(a.to("meta"), b, a @ b)
    with pytest.raises(ValueError, match="rule 'loose'"):
        _C.check_matmul(a, b, a @ b, None, "loose")
    with pytest.raises(ValueError):
        _C.check_matmul(a, b, torch.randn(4, 4))


class TinyTransformer(torch.nn.Module):
    """Embedding, causal attention (two bmm), layer norms, an MLP, a head."""

    def __init__(self, vocab=48, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, d)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.emb(tokens)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        dh = q.shape[-1] // self.heads

        def split(z):
            return z.reshape(b, t, self.heads, dh).transpose(1, 2).reshape(b * self.heads, t, dh)

        q, k, v = split(q), split(k), split(v)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(dh)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = torch.bmm(scores.masked_fill(mask, float("-inf")).softmax(-1), v)
        x = x + self.proj(att.reshape(b, self.heads, t, dh).transpose(1, 2).reshape(b, t, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def loss_fn(autocast):
    def loss(module, batch):
        tokens, targets = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = module(tokens)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss


def tokens(step):
    g = torch.Generator().manual_seed(step)
    seq = torch.randint(0, 48, (4, 17), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def train(guard, model, opt, steps, first=1):
    skipped = []
    for step in range(first, first + steps):
        batch = tokens(step)
        with guard.step(step, batch) as s:
            s.backward(guard.loss_fn(model, batch))  # Through DDP: its all-reduce.
        guard.optimizer_step(opt)
        if not s.apply:
            skipped.append((step, s.reason))
    return skipped


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_no_false_alarm_over_hundreds_of_steps(group, autocast):
    torch.manual_seed(0)
    model = DDP(TinyTransformer())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = sdc_guard.Guard(model, opt, loss_fn(autocast), audit_every=0, weight_check_every=0,
                            every_step=True)
    try:
        assert train(guard, model, opt, 400) == []
        s = guard.summary()
        assert s["every_step"] and s["checksum_alarms"] == 0 and s["checksum_skips"] == 0
        # Per step: 7 forward (5 Linear addmm, 2 bmm), 14 backward (dx and dW
        # mm per Linear, 2 bmm per forward bmm): at least 16 whatever torch fuses.
        assert s["products_checked"] >= 400 * 16, s
        assert s["products_unchecked"] == 0
    finally:
        guard.shutdown(0)


# fp32 outputs: a 2^-6 relative error of one element is caught. bf16 outputs
# carry their own rounding (2^-8 of each element, summed down the column
# into the threshold), so one element must move by a sizeable share of the
# column's typical magnitude: here a relative error of 2^2 (x5).
@pytest.mark.parametrize("autocast,rel", [(False, "2^-6"), (True, "2^2")],
                         ids=["fp32", "bf16-autocast"])
def test_an_injected_product_error_is_caught_and_the_step_skipped(
        group, monkeypatch, capfd, autocast, rel):
    monkeypatch.setenv("SDC_INJECT_FAULT", f"product:0:step=4:{rel}")
    monkeypatch.setenv("SDC_ALLOW_FAULT_INJECTION", "yes-i-am-testing")
    monkeypatch.setenv("SDC_EVERY_STEP", "1")
    torch.manual_seed(0)
    model = DDP(TinyTransformer())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = sdc_guard.Guard(model, opt, loss_fn(autocast), audit_every=0, weight_check_every=0)
    try:
        assert train(guard, model, opt, 3) == []
        before = [p.detach().clone() for p in model.parameters()]
        skipped = train(guard, model, opt, 1, first=4)
        assert [step for step, _ in skipped] == [4]
        assert "checksum alarm at step 4 on rank 0" in skipped[0][1]
        assert "transient" in skipped[0][1]  # Recomputed, the product came out right.
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
        assert train(guard, model, opt, 5, first=5) == []
        s = guard.summary()
        assert (s["checksum_alarms"], s["checksum_skips"], s["skipped"]) == (1, 1, 1)
        err = capfd.readouterr().err
        assert f"sdc-guard rank 0: INJECTED a product error (relative {2.0 ** int(rel[2:]):g}" \
            in err
        assert "at step 4" in err
    finally:
        guard.shutdown(0)


def test_every_step_option_is_checked(group, monkeypatch):
    model = DDP(TinyTransformer())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    with pytest.raises(ValueError, match="every_step=1: expected True or False"):
        sdc_guard.Guard(model, opt, loss_fn(False), every_step=1)
    monkeypatch.setenv("SDC_EVERY_STEP", "yes")
    with pytest.raises(ValueError, match="SDC_EVERY_STEP='yes': expected 0 or 1"):
        sdc_guard.Guard(model, opt, loss_fn(False))


def test_the_checks_attach_for_the_step_only_and_keep_torchs_errors(group):
    # The products are checked by kernels registered at the dispatcher's CPU
    # key while a guarded step runs: only there, with aten's own errors.
    torch.manual_seed(0)
    model = DDP(TinyTransformer())
    opt = torch.optim.SGD(model.parameters(), 0.1)
    guard = sdc_guard.Guard(model, opt, loss_fn(False), audit_every=0, weight_check_every=0,
                            every_step=True)
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    bias, x, y = torch.randn(4), torch.randn(3, 7, 5), torch.randn(3, 5, 6)
    try:
        assert train(guard, model, opt, 1) == []
        checked = guard.summary()["products_checked"]
        assert checked >= 16
        # Outside the step: aten's own kernels, not checked.
        aten = [torch.mm(a, b), torch.addmm(bias, a, b), torch.bmm(x, y),
                torch.mm(a.bfloat16(), b.bfloat16())]
        assert guard.summary()["products_checked"] == checked
        batch = tokens(2)
        with guard.step(2, batch) as s:
            # The checked kernels compute with aten's own CPU kernels: the same bits.
            ours = [torch.mm(a, b), torch.addmm(bias, a, b), torch.bmm(x, y),
                    torch.mm(a.bfloat16(), b.bfloat16())]
            assert all(torch.equal(p, q) for p, q in zip(ours, aten))
            assert guard.summary()["products_checked"] == checked + 4
            want = torch.mm(a.double(), b.double()).float()  # Not checked: fp64.
            assert guard.summary()["products_unchecked"] == 1
            assert torch.allclose(aten[0], want, atol=1e-6)
            with pytest.raises(RuntimeError, match="self must be a matrix"):
                torch.mm(torch.randn(3), b)
            with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied \(5x3 and 4x4\)"):
                torch.mm(a, torch.randn(4, 4))
            s.backward(guard.loss_fn(model, batch))
        guard.optimizer_step(opt)
        assert s.apply
        assert guard.summary()["products_checked"] >= 2 * checked + 4
        assert guard.summary()["checksum_alarms"] == 0
    finally:
        guard.shutdown(0)


def test_the_overhead_bench_checks_itself_and_prints_its_json():
    # ./sdc bench overhead --every-step at a smoke size, in its own process
    # (it makes its own one-rank group).
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "bench", "every_step_overhead.py")
    env = dict(os.environ)
    for v in ("SDC_COORDINATOR", "SDC_INJECT_FAULT", "SDC_EVERY_STEP"):
        env.pop(v, None)
    run = subprocess.run([sys.executable, bench, "--every-step", "--steps=4", "--warmup=1",
                          "--width=16", "--batch=2"], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(out) >= {"overhead_pct_vs_guarded", "overhead_pct_vs_unguarded",
                        "guard_overhead_pct", "step_ms_unguarded", "step_ms_guarded",
                        "step_ms_every_step", "products_per_step", "checksum_alarms"}
    assert out["checksum_alarms"] == 0 and out["products_per_step"] == 39
    assert out["unchecked_per_step"] == 0 and out["steps"] == 4
    assert min(out["step_ms_unguarded"], out["step_ms_guarded"], out["step_ms_every_step"]) > 0
    bad = subprocess.run([sys.executable, bench, "--every-step", "--steps=2", "--warmup=2"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--warmup < --steps" in bad.stderr
