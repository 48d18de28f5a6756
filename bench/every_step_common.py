"""What ``./sdc bench detection --every-step`` and ``./sdc bench soak
--every-step`` share (bench/every_step_detection.py, bench/every_step_soak.py):
the one-rank Gloo group, the training text, the loss under fp32 or bf16
autocast, and the 95% interval of a measured rate."""

import contextlib
import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
import models  # noqa: E402  (examples/models.py)

DTYPES = ("fp32", "bf16")


@contextlib.contextmanager
def one_rank_group():
    """A one-rank Gloo group (the guard needs a process group), with the
    guard's identity set and no coordinator, fault or every-step setting
    inherited from the caller's environment."""
    os.environ.setdefault("SDC_JOB_ID", "bench-every-step")
    os.environ.setdefault("SDC_NODE_NAME", "bench")
    for v in ("SDC_COORDINATOR", "SDC_INJECT_FAULT", "SDC_EVERY_STEP"):
        os.environ.pop(v, None)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def corpus():
    """The bytes the models learn from: this repository's docs and README
    (real text, so the loss falls and the weights move as in training)."""
    parts = []
    for rel in ("README.md", "docs/ARCHITECTURE.md", "docs/benchmarks.md", "docs/operations.md"):
        path = os.path.join(ROOT, rel)
        if os.path.exists(path):
            with open(path, "rb") as f:
                parts.append(f.read())
    data = b"\n".join(parts)
    if len(data) < 4096:
        raise RuntimeError(f"the training text under {ROOT} is missing ({len(data)} bytes)")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batch_for(text, step, batch, seq, seed=0):
    """Step `step`'s micro-batch: `batch` windows of `seq` + 1 bytes at
    seeded random offsets; (tokens, next tokens)."""
    g = torch.Generator().manual_seed(1000003 * seed + step)
    starts = torch.randint(0, text.numel() - seq - 1, (batch,), generator=g)
    rows = torch.stack([text[s:s + seq + 1] for s in starts.tolist()])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def model(width, heads, layers, dropout, seed):
    if width % heads or width < heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")
    torch.manual_seed(seed)
    return models.TinyTransformer(width=width, heads=heads, layers=layers, dropout=dropout)


def loss_fn(dtype):
    """The guard's loss_fn(module, batch): next-byte cross entropy, the
    forward under bf16 autocast for "bf16"."""
    autocast = dtype == "bf16"

    def loss(module, batch):
        tokens, targets = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = module(tokens)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss


def check_shape(p, a):
    """argparse errors for a transformer shape the model cannot take:
    --width a multiple of --heads, --seq within the model's context."""
    if a.heads < 1 or a.width % a.heads:
        p.error(f"--width {a.width} must be a multiple of --heads {a.heads}")
    if not 2 <= a.seq <= models.TinyTransformer.context:
        p.error(f"--seq must be in 2..{models.TinyTransformer.context}")


def wilson(k, n, z=1.96):
    """The 95% Wilson score interval of a rate k/n, as (low, high)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def load_average():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
