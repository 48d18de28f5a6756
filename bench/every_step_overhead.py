"""./sdc bench overhead --every-step: what the every-step product checksums
(``Guard(every_step=True)``, issue 45) cost a training step.

One process, a one-rank Gloo group, the example transformer
(examples/models.py: width 64, 4 heads, 2 layers, 8 x 64 tokens; dropout
off, so the three loops compute the same products) in three loops with their
own copies of the same model:

- ``unguarded``: DDP, backward, optimizer step;
- ``guarded``: the same under ``sdc_guard.Guard`` (no coordinator, audits and
  weight checks off: the guard's every-step work only);
- ``every_step``: the same guard with ``every_step=True``.

The loops take turns one step at a time (the order rotating each step), so
the machine's load falls on all three alike; each step is timed alone and
the figure is the median over the steps after the warm-up. Before printing
any figure the bench asserts that the every-step loop checked products,
raised 0 checksum alarms and skipped no step, and that the three loops'
losses agree (they compute the same thing). Prints a table, then one JSON
line last: {"overhead_pct_vs_guarded", "overhead_pct_vs_unguarded",
"guard_overhead_pct", "step_ms_unguarded", "step_ms_guarded",
"step_ms_every_step", "products_per_step", "unchecked_per_step",
"checksum_alarms", "steps", "warmup", "threads", "dtype", "width",
"tokens"}.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import models  # noqa: E402  (examples/models.py)

import sdc_guard  # noqa: E402

import every_step_common as common  # noqa: E402  (bench/: the one-rank group)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="./sdc bench overhead --every-step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--every-step", action="store_true", required=True,
                   help="this benchmark (the flag ./sdc routes on)")
    p.add_argument("--steps", type=int, default=60, help="steps per loop, warm-up included")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (default fp32)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.warmup >= a.steps:
        p.error("--steps >= 1 and 0 <= --warmup < --steps")
    if a.width < 4 or a.width % 4 or a.batch < 1 or a.threads < 1:
        p.error("--width a multiple of 4, --batch >= 1, --threads >= 1")
    return a


def batch_for(step, batch, vocab, context):
    g = torch.Generator().manual_seed(step)
    seq = torch.randint(0, vocab, (batch, context + 1), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class Loop:
    """One training loop: its own model copy, optimizer and (maybe) guard."""

    def __init__(self, name, base, autocast, guard_options):
        self.name = name
        self.model = DDP(copy.deepcopy(base))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.loss = common.loss_fn("bf16" if autocast else "fp32")
        self.guard = None
        if guard_options is not None:
            self.guard = sdc_guard.Guard(self.model, self.opt, self.loss, audit_every=0,
                                         weight_check_every=0, **guard_options)
        self.times = []
        self.losses = []
        self.skipped = 0

    def step(self, step, batch):
        start = time.perf_counter()
        if self.guard is None:
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss(self.model, batch)
            loss.backward()
            self.opt.step()
            value = loss.detach()
        else:
            with self.guard.step(step, batch) as s:
                loss = self.guard.loss_fn(self.model, batch)
                s.backward(loss)
            self.guard.optimizer_step(self.opt)
            if not s.apply:
                self.skipped += 1
            value = loss.detach()
        self.times.append(time.perf_counter() - start)
        self.losses.append(float(value))


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    with common.one_rank_group():
        return run(a)


def run(a):
    torch.manual_seed(45)
    base = models.TinyTransformer(width=a.width, heads=4, layers=2, dropout=0.0)
    loops = [Loop("unguarded", base, a.bf16, None),
             Loop("guarded", base, a.bf16, {}),
             Loop("every_step", base, a.bf16, {"every_step": True})]
    vocab, context = models.TinyTransformer.vocab, models.TinyTransformer.context
    for step in range(1, a.steps + 1):
        batch = batch_for(step, a.batch, vocab, context)
        k = step % len(loops)
        for loop in loops[k:] + loops[:k]:  # Rotated: none always runs first.
            loop.step(step, batch)

    checked = loops[2].guard.summary()
    checks = loops[2].guard._checks
    # Correctness first: the checksums ran, found nothing, skipped nothing,
    # and the three loops trained the same.
    problems = []
    if checks is None or checks.checked == 0:
        problems.append("the every_step loop checked no product")
    if checked.get("checksum_alarms", 0) != 0 or checked.get("checksum_skips", 0) != 0:
        problems.append(f"checksum alarms {checked.get('checksum_alarms')}, "
                        f"skips {checked.get('checksum_skips')} on a healthy run")
    for loop in loops:
        if loop.skipped:
            problems.append(f"{loop.name} skipped {loop.skipped} steps")
    tolerance = 1e-2 if a.bf16 else 1e-4
    for loop in loops[1:]:
        worst = max(abs(x - y) / max(1e-6, abs(y)) for x, y in zip(loop.losses, loops[0].losses))
        if worst > tolerance:
            problems.append(f"{loop.name}'s losses differ from unguarded's by {worst:.3g} "
                            f"(relative; allowed {tolerance:g})")
    if problems:
        for p in problems:
            print(f"every_step_overhead: {p}", file=sys.stderr)
        return 1

    med = {loop.name: statistics.median(loop.times[a.warmup:]) * 1e3 for loop in loops}
    u, g, e = med["unguarded"], med["guarded"], med["every_step"]
    products = checks.checked / a.steps
    unchecked = checks.unchecked / a.steps
    tokens = a.batch * context
    print(f"{'loop':<12} {'ms/step (median)':>17}")
    for name in ("unguarded", "guarded", "every_step"):
        print(f"{name:<12} {med[name]:>17.2f}")
    print(f"\nevery-step checksums: {100 * (e / g - 1):+.1f}% of the guarded step, "
          f"{100 * (e / u - 1):+.1f}% of the unguarded step (the guard alone: "
          f"{100 * (g / u - 1):+.1f}%); {products:.0f} products checked per step, "
          f"{unchecked:.0f} unchecked; 0 alarms; width {a.width}, {tokens} tokens, "
          f"{'bf16 autocast' if a.bf16 else 'fp32'}, {a.threads} thread(s), "
          f"median of {a.steps - a.warmup} interleaved steps")
    print(json.dumps({
        "overhead_pct_vs_guarded": round(100 * (e / g - 1), 2),
        "overhead_pct_vs_unguarded": round(100 * (e / u - 1), 2),
        "guard_overhead_pct": round(100 * (g / u - 1), 2),
        "step_ms_unguarded": round(u, 3),
        "step_ms_guarded": round(g, 3),
        "step_ms_every_step": round(e, 3),
        "products_per_step": round(products, 1),
        "unchecked_per_step": round(unchecked, 1),
        "checksum_alarms": 0,
        "steps": a.steps,
        "warmup": a.warmup,
        "threads": a.threads,
        "dtype": "bf16-autocast" if a.bf16 else "fp32",
        "width": a.width,
        "tokens": tokens,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
