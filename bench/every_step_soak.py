"""./sdc bench soak --every-step: a long clean run of ``Guard(every_step=True)``
(issue 45 item 4), counting false alarms of the product checksums.

One process, a one-rank Gloo group, the example transformer
(examples/models.py: attention, layer norms, an MLP per block) trained with
AdamW on this repository's docs (real text: the loss falls and the weights
move as in training, so the products' operands change over the run),
dropout on, under ``sdc_guard.Guard`` with audits and weight checks off and
``every_step=True``: every mm/addmm/bmm of every step's forward and backward
is checked. No fault is injected, so every alarm is a false one.

``--dtype fp32`` or ``bf16`` (the forward under bf16 autocast: bf16
products, checked against the bf16 threshold). The defaults for bf16 are a
smaller model: this CPU has no bf16 units and runs bf16 products about 35x
slower than fp32.

Prints a progress line every ``--progress_every`` steps, then one JSON line
last: {"steps", "dtype", "checksum_alarms", "checksum_skips",
"steps_skipped", "products_checked", "products_unchecked",
"products_per_step", "width", "heads", "layers", "tokens", "seconds",
"steps_per_s", "first_loss", "last_loss", "load_avg_start", "load_avg_end"}.
Before printing it, the bench checks that every step ran guarded and
checked its products (a soak that checked nothing would prove nothing);
it exits 1 after printing when there was any alarm or skipped step.
"""

import argparse
import json
import math
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import every_step_common as common

import sdc_guard  # noqa: E402

# The published clean sample the soak must reach (issue 45 item 4).
PUBLISHED_STEPS = 15320

# (width, heads, layers, batch, seq) per dtype: 15,320 steps take about 4 - 5
# minutes of CPU each here (16 - 19 ms a step; 52 minutes of wall time at
# nice 10 on a loaded machine: docs/benchmarks.md).
DEFAULTS = {"fp32": (64, 4, 2, 2, 64), "bf16": (32, 4, 2, 2, 32)}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="./sdc bench soak --every-step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--every-step", action="store_true", required=True,
                   help="this benchmark (the flag ./sdc routes on)")
    p.add_argument("--steps", type=int, default=PUBLISHED_STEPS,
                   help=f"guarded steps (default {PUBLISHED_STEPS}, the published clean sample)")
    p.add_argument("--dtype", choices=common.DTYPES, default="fp32")
    p.add_argument("--width", type=int, help="model width (default: 64 fp32, 32 bf16)")
    p.add_argument("--heads", type=int, help="attention heads (default 4)")
    p.add_argument("--layers", type=int, help="transformer blocks (default 2)")
    p.add_argument("--batch", type=int, help="sequences per step (default 2)")
    p.add_argument("--seq", type=int, help="tokens per sequence, at most 64 (default: 64 fp32, "
                   "32 bf16)")
    p.add_argument("--progress_every", type=int, default=500)
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    p.add_argument("--seed", type=int, default=45)
    a = p.parse_args(argv)
    width, heads, layers, batch, seq = DEFAULTS[a.dtype]
    a.width = width if a.width is None else a.width
    a.heads = heads if a.heads is None else a.heads
    a.layers = layers if a.layers is None else a.layers
    a.batch = batch if a.batch is None else a.batch
    a.seq = seq if a.seq is None else a.seq
    if a.steps < 1 or a.progress_every < 1 or a.threads < 1 or a.layers < 1 or a.batch < 1:
        p.error("--steps, --progress_every, --threads, --layers and --batch must be >= 1")
    common.check_shape(p, a)
    return a


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    with common.one_rank_group():
        return run(a)


def run(a):
    text = common.corpus()
    model = DDP(common.model(a.width, a.heads, a.layers, dropout=0.1, seed=a.seed))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = sdc_guard.Guard(model, opt, common.loss_fn(a.dtype), audit_every=0,
                            weight_check_every=0, every_step=True)
    tokens = a.batch * a.seq
    print(f"soak: {a.steps} steps, {a.dtype}, width {a.width}, {a.heads} heads, {a.layers} "
          f"layers, {tokens} tokens a step, every product checked", flush=True)
    load_start = common.load_average()
    start = time.monotonic()
    skipped = 0
    first_loss = last_loss = None
    for step in range(1, a.steps + 1):
        batch = common.batch_for(text, step, a.batch, a.seq, seed=a.seed)
        with guard.step(step, batch) as s:
            loss = guard.loss_fn(model, batch)
            s.backward(loss)
        guard.optimizer_step(opt)
        if not s.apply:
            skipped += 1
            print(f"soak: step {step} skipped: {s.reason}", file=sys.stderr, flush=True)
        last_loss = float(loss.detach())
        if first_loss is None:
            first_loss = last_loss
        if step % a.progress_every == 0 or step == a.steps:
            sm = guard.summary()
            elapsed = time.monotonic() - start
            print(f"soak: step {step}/{a.steps}  loss {last_loss:.3f}  alarms "
                  f"{sm['checksum_alarms']}  products checked {sm['products_checked']}  "
                  f"{step / elapsed:.1f} steps/s  load {common.load_average()}", flush=True)
    seconds = time.monotonic() - start
    sm = guard.summary()

    # The harness's own correctness first: every step ran guarded and
    # checked products (the same number each step: the model does not change).
    problems = []
    if sm["products_checked"] == 0 or sm["products_checked"] % a.steps:
        problems.append(f"{sm['products_checked']} products checked in {a.steps} steps "
                        "(expected the same number > 0 each step)")
    if not math.isfinite(last_loss):
        problems.append(f"the loss is {last_loss}")
    if problems:
        for p in problems:
            print(f"every_step_soak: {p}", file=sys.stderr)
        return 1

    alarms, skips = sm["checksum_alarms"], sm["checksum_skips"]
    print(f"\nsoak {a.dtype}: {a.steps} steps, {alarms} checksum alarms, {skipped} steps skipped, "
          f"{sm['products_checked']} products checked ({sm['products_checked'] // a.steps} a "
          f"step, {sm['products_unchecked']} unchecked), loss {first_loss:.3f} -> "
          f"{last_loss:.3f}, {seconds / 60:.1f} min ({a.steps / seconds:.1f} steps/s), load "
          f"{load_start} -> {common.load_average()}")
    print(json.dumps({
        "steps": a.steps,
        "dtype": "bf16-autocast" if a.dtype == "bf16" else "fp32",
        "checksum_alarms": alarms,
        "checksum_skips": skips,
        "steps_skipped": skipped,
        "products_checked": sm["products_checked"],
        "products_unchecked": sm["products_unchecked"],
        "products_per_step": sm["products_checked"] // a.steps,
        "width": a.width,
        "heads": a.heads,
        "layers": a.layers,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "steps_per_s": round(a.steps / seconds, 2),
        "first_loss": round(first_loss, 4),
        "last_loss": round(last_loss, 4),
        "load_avg_start": load_start,
        "load_avg_end": common.load_average(),
    }))
    if alarms or skipped:
        print(f"every_step_soak: {alarms} false alarms, {skipped} skipped steps on a clean run",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
