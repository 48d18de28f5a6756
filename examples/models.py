"""The example's models and data: a small byte-level transformer language
model on the licence texts in /usr/share/common-licenses, and a tiny MLP
with BatchNorm and dropout (the layers a replay must get exactly right).
The same shapes as the C++ demo's (demo/model.h)."""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


class TinyTransformer(nn.Module):
    """``checkpointing``: None, or "reentrant" / "non-reentrant" to run each
    block under torch.utils.checkpoint (activation checkpointing: the block
    is recomputed in backward)."""

    vocab = 256  # Bytes.
    context = 64

    def __init__(self, width=64, heads=4, layers=2, dropout=0.1, checkpointing=None):
        super().__init__()
        if checkpointing not in (None, "reentrant", "non-reentrant"):
            raise ValueError(f"checkpointing={checkpointing!r}")
        self.checkpointing = checkpointing
        self.width, self.heads = width, heads
        self.token = nn.Embedding(self.vocab, width)
        self.position = nn.Embedding(self.context, width)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "norm1": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width),
                "proj": nn.Linear(width, width), "norm2": nn.LayerNorm(width),
                "fc1": nn.Linear(width, 4 * width), "fc2": nn.Linear(4 * width, width),
            }))
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, self.vocab)
        self.dropout = nn.Dropout(dropout)
        self.fault_hook = None  # A FaultPoint (sdc_guard.Guard.fault_point) for tests and demos.
        # qkv's output read head-major, (heads, 3, head width), so that a
        # contiguous split of its rows (tensor parallel's ColwiseParallel)
        # gives each tp rank whole heads, each with its q, k and v
        # (examples/layouts.py, --layout=tp). The same model up to a
        # permutation of qkv's rows; the heads of the local shard are counted
        # from its width.
        self.head_major = False

    def block(self, i, x):
        blk = self.blocks[i]
        b, t, w = x.shape
        h = self.heads
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        qkv = blk["qkv"](blk["norm1"](x))
        if self.head_major:  # This rank's heads only, under tensor parallel.
            qkv = qkv.view(b, t, -1, 3, w // h)
            q, k, v = (qkv.select(3, j).transpose(1, 2) for j in range(3))
        else:
            qkv = qkv.view(b, t, 3, h, w // h)
            q, k, v = (qkv.select(2, j).transpose(1, 2) for j in range(3))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(w // h)
        attn = self.dropout(torch.softmax(scores.masked_fill(mask, -1e9), -1))
        y = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.dropout(blk["proj"](y))
        # Where activation faults land: the residual stream, after dropout,
        # so a corrupted value always reaches the loss.
        if i == 0 and self.fault_hook is not None:
            x = self.fault_hook(x)
        return x + self.dropout(blk["fc2"](F.gelu(blk["fc1"](blk["norm2"](x)))))

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.token(tokens) + self.position(torch.arange(t, device=tokens.device))
        for i in range(len(self.blocks)):
            if self.checkpointing is None:
                x = self.block(i, x)
            else:
                # Recomputed in backward, with the RNG state of the forward
                # (dropout draws the same masks).
                x = torch.utils.checkpoint.checkpoint(
                    self.block, i, x, use_reentrant=self.checkpointing == "reentrant")
        return self.head(self.final_norm(x))


class RunningCenter(nn.Module):
    """Subtracts a running mean it keeps in a buffer, then updates that mean
    with the batch: a forward that reads the buffer it also writes (as some
    normalisers and EMA layers do). A replay must start from the buffer as
    the subject's forward read it."""

    def __init__(self, width, momentum=0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(width))

    def forward(self, x):
        out = x - self.running_mean
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(1 - self.momentum).add_(x.mean(0), alpha=self.momentum)
        return out


class BnMlp(nn.Module):
    """The BatchNorm MLP; ``center=True`` adds a RunningCenter before it;
    ``nondeterministic=True`` builds a mask with ``put_``, an op that has no
    deterministic implementation (the values are the same either way)."""

    def __init__(self, center=False, nondeterministic=False):
        super().__init__()
        self.nondeterministic = nondeterministic
        self.fc1 = nn.Linear(16, 32)
        self.center = RunningCenter(32) if center else None
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 1)
        self.dropout = nn.Dropout(0.2)
        self.fault_hook = None

    def forward(self, x):
        h = self.fc1(x)
        if self.center is not None:
            h = self.center(h)
        if self.nondeterministic:
            mask = torch.ones(h.shape[1], device=h.device)
            mask.put_(torch.zeros(1, dtype=torch.long, device=h.device),
                      torch.ones(1, device=h.device))
            h = h * mask
        h = self.dropout(torch.relu(self.bn(h)))
        if self.fault_hook is not None:
            h = self.fault_hook(h)  # After dropout: an injected error always counts.
        return self.fc2(h)


def load_corpus(directory, min_bytes=1 << 16):
    """The concatenated files of `directory`, as a uint8 tensor."""
    data = bytearray()
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not name.startswith(".") and os.path.isfile(path):
            with open(path, "rb") as f:
                data += f.read()
    if len(data) < min_bytes:
        raise SystemExit(f"{directory} holds {len(data)} bytes of text; at least {min_bytes} needed")
    return torch.frombuffer(data, dtype=torch.uint8)


def text_batch(corpus, batch, context, seed, padded=False):
    """(inputs, targets), each [batch, context] int64: windows at positions
    drawn with `seed`. ``padded``: each sequence's last few targets are
    -100 (cross_entropy's ignore_index), as padding leaves them, so
    micro-batches hold different numbers of tokens."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, corpus.numel() - context - 1, (batch,), generator=g)
    windows = torch.stack([corpus[s:s + context + 1] for s in starts.tolist()]).long()
    targets = windows[:, 1:].contiguous()
    if padded:
        pads = torch.randint(0, context // 2, (batch,), generator=g)
        for row, n in enumerate(pads.tolist()):
            if n:
                targets[row, -n:] = -100
    return windows[:, :-1].contiguous(), targets


def regression_batch(batch, seed):
    """(x [batch, 16], y [batch, 1]): a synthetic regression for the BatchNorm model."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 16, generator=g)
    return x, (x[:, :4].sum(1, keepdim=True) * 0.5).tanh()
