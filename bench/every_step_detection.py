"""./sdc bench detection --every-step: the detection curve of the every-step
product checksums (issue 45 item 3): the share of steps carrying one wrong
product element that the guard catches, against the element's relative
error (2^0 ... 2^-20, every second power) and the dtype (fp32; bf16 autocast), with and
without ``Guard(every_step=True)``, and what the replay audit would catch of
the same faults at ``audit_every`` 100 and 10.

One process, a one-rank Gloo group, a small example transformer
(examples/models.py, dropout off) trained with SGD on this repository's
docs. For each dtype and relative error REL, three loops with their own
copies of one model take turns a step at a time, ``--trials`` steps each:

- **with checksums**: ``Guard(every_step=True)`` under
  ``SDC_INJECT_FAULT=product:0:from=2:REL``: from step 2 on, every step one
  element of one product's output (a random mm/addmm/bmm of the forward or
  backward, a random element) is multiplied by 1 + REL before the check
  sees it. A step counts as caught when every rank skipped it for a
  checksum alarm (the summary's ``checksum_skips``).
- **clean**: the same guard without a fault, a step after each faulted
  one (each ``--clean_every``-th): it must raise 0 alarms.
- **without checksums**: the guard without ``every_step`` (its per-step
  checks: the non-finite scan and, with replicas, the weight vote), the same
  fault applied by this bench (a TorchDispatchMode multiplies one element of
  one product's output by 1 + REL, chosen alike). A step counts as caught
  when the guard skipped it. The same step is then recomputed from the same
  weights without a fault, as a replay audit's peer would, and compared bit
  for bit (loss and every gradient): the share of faulted steps that differ
  is what a replay catches of the steps it audits.

The replay audit runs on the steps divisible by ``audit_every``
(protocol/replay_plan.h), so a fault on a random step falls on an audited
step with probability 1/audit_every; its catch rate is the measured share
of faults that changed the step's bits, over audit_every (stated, not run:
a replay needs a peer rank and sdcd).

Before printing any figure the bench asserts: 0 alarms on the clean steps;
every counted catch a faulted step's; the unfaulted first step of each
without-loop recomputed bit for bit (so the replay emulation compares like
with like); the mode saw as many products a step as the checksums checked.
Prints a table, then one JSON line last: {"trials", "rel_exponents",
"dtypes", "clean_steps", "clean_alarms", "products_per_step", "width",
"tokens", "rows": [{"dtype", "rel_exp", "caught_with", "rate_with",
"rate_with_low", "rate_with_high", "caught_without", "rate_without",
"element_changed", "step_changed", "replay_rate_audit100",
"replay_rate_audit10"}...]}; rates are fractions, the interval 95% Wilson.
"""

import argparse
import copy
import json
import os
import random
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

import every_step_common as common

import sdc_guard  # noqa: E402

_aten = torch.ops.aten
PRODUCTS = (_aten.mm.default, _aten.addmm.default, _aten.bmm.default)
AUDIT_EVERY = (100, 10)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="./sdc bench detection --every-step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--every-step", action="store_true", required=True,
                   help="this benchmark (the flag ./sdc routes on)")
    p.add_argument("--trials", type=int, default=100,
                   help="faulted steps per (dtype, relative error) point")
    p.add_argument("--exponents", default="0,-2,-4,-6,-8,-10,-12,-14,-16,-18,-20",
                   help="the relative errors' powers of two, comma-separated")
    p.add_argument("--dtypes", default="fp32,bf16", help="fp32 and/or bf16 (autocast)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--clean_every", type=int, default=1,
                   help="a clean step after every Nth faulted step (default: after each)")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    p.add_argument("--seed", type=int, default=45)
    a = p.parse_args(argv)
    try:
        a.exponents = [int(x) for x in a.exponents.split(",") if x.strip()]
    except ValueError:
        p.error(f"--exponents {a.exponents!r}: integers, comma-separated")
    a.dtypes = [x.strip() for x in a.dtypes.split(",") if x.strip()]
    if not a.exponents or any(e > 4 or e < -60 for e in a.exponents):
        p.error("--exponents: one or more integers in -60..4")
    if not a.dtypes or any(d not in common.DTYPES for d in a.dtypes):
        p.error(f"--dtypes: one or more of {','.join(common.DTYPES)}")
    if min(a.trials, a.threads, a.layers, a.batch, a.clean_every) < 1:
        p.error("--trials, --clean_every, --threads, --layers and --batch must be >= 1")
    common.check_shape(p, a)
    return a


class ProductFault(TorchDispatchMode):
    """The product fault applied from outside the guard (the without-checksums
    loop): at product `target` of the step, one element (random; the largest
    when the drawn one is 0, as the ``product`` fault kind does) times 1 + rel.
    Counts the step's products; `changed` says whether the element's value
    changed (a small REL rounds away in a bf16 output)."""

    def __init__(self, rel, target, rng):
        super().__init__()
        self.rel, self.target, self.rng = rel, target, rng
        self.products = 0
        self.changed = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in PRODUCTS:
            if self.products == self.target and out.is_contiguous() and out.numel():
                flat = out.view(-1)
                i = self.rng.randrange(flat.numel())
                if flat[i].item() == 0:
                    i = int(flat.abs().argmax())
                before = flat[i].clone()
                flat[i] = before * (1.0 + self.rel)
                self.changed = not torch.equal(flat[i], before)
            self.products += 1
        return out


def guarded(base, dtype, every_step, fault=None):
    """(DDP model, optimizer, guard) on a copy of `base`; `fault` the
    SDC_INJECT_FAULT spec its engine reads when it is made."""
    model = DDP(copy.deepcopy(base))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if fault is not None:
        os.environ["SDC_ALLOW_FAULT_INJECTION"] = "yes-i-am-testing"
        os.environ["SDC_INJECT_FAULT"] = fault
    try:
        guard = sdc_guard.Guard(model, opt, common.loss_fn(dtype), audit_every=0,
                                weight_check_every=0, every_step=every_step)
    finally:
        os.environ.pop("SDC_INJECT_FAULT", None)
        os.environ.pop("SDC_ALLOW_FAULT_INJECTION", None)
    return model, opt, guard


def guarded_step(model, opt, guard, step, batch, mode=None):
    """One guarded step (under `mode` when given); (applied, loss, grads
    before the optimizer step)."""
    with guard.step(step, batch) as s:
        if mode is None:
            loss = guard.loss_fn(model, batch)
            s.backward(loss)
        else:
            with mode:
                loss = guard.loss_fn(model, batch)
                s.backward(loss)
    grads = [None if p.grad is None else p.grad.clone() for p in model.module.parameters()]
    guard.optimizer_step(opt)
    return s.apply, loss.detach(), grads


def replay_differs(reference, weights, dtype, batch, loss, grads):
    """Recomputes the step from `weights` (the step's starting state dict) on
    `reference` without a fault, as a replay would; True when the loss or a
    gradient differs in a bit from the step's."""
    reference.load_state_dict(weights)
    reference.zero_grad(set_to_none=True)
    again = common.loss_fn(dtype)(reference, batch)
    again.backward()
    if not torch.equal(again.detach(), loss):
        return True
    for p, g in zip(reference.parameters(), grads):
        if (p.grad is None) != (g is None) or (g is not None and not torch.equal(p.grad, g)):
            return True
    return False


def run_dtype(a, dtype, text, problems):
    """The rows of one dtype; appends what went wrong to `problems`."""
    base = common.model(a.width, a.heads, a.layers, dropout=0.0, seed=a.seed)
    reference = copy.deepcopy(base)
    clean = guarded(base, dtype, every_step=True)
    rows, clean_steps = [], 0
    products_per_step = None
    for e in a.exponents:
        rel = 2.0 ** e
        with_checks = guarded(base, dtype, every_step=True, fault=f"product:0:from=2:2^{e}")
        without = guarded(base, dtype, every_step=False)
        rng = random.Random(a.seed * 7919 + e)
        caught_with = caught_without = element_changed = step_changed = 0
        for step in range(1, a.trials + 2):  # Step 1 clean everywhere; then a fault a step.
            batch = common.batch_for(text, step, a.batch, a.seq, seed=a.seed + e)
            skips = with_checks[2].summary()["checksum_skips"]
            applied, _, _ = guarded_step(*with_checks, step, batch)
            caught = with_checks[2].summary()["checksum_skips"] - skips
            if step == 1 and (caught or not applied):
                problems.append(f"{dtype} 2^{e}: the unfaulted step 1 was skipped")
            elif step > 1:
                caught_with += caught
                if caught != (0 if applied else 1):
                    problems.append(f"{dtype} 2^{e} step {step}: skipped={not applied} but "
                                    f"{caught} checksum skips counted")
            if step % a.clean_every == 0:
                applied, _, _ = guarded_step(*clean, clean_steps + 1, batch)
                clean_steps += 1
                if not applied:
                    problems.append(f"{dtype}: clean step {clean_steps} was skipped")

            model = without[0]
            weights = copy.deepcopy(model.module.state_dict())
            target = rng.randrange(products_per_step) if step > 1 else -1
            mode = ProductFault(rel, target, random.Random(rng.random()))
            applied, loss, grads = guarded_step(*without, step, batch, mode)
            if products_per_step is None:
                products_per_step = mode.products
            elif mode.products != products_per_step:
                problems.append(f"{dtype}: {mode.products} products in a step, "
                                f"{products_per_step} before")
            differs = replay_differs(reference, weights, dtype, batch, loss, grads)
            if step == 1:
                if differs:
                    problems.append(f"{dtype}: an unfaulted step did not recompute bit for bit "
                                    "(the replay emulation would count noise)")
                continue
            caught_without += 0 if applied else 1
            element_changed += mode.changed
            step_changed += differs
        sm = with_checks[2].summary()
        if sm["checksum_skips"] != caught_with or sm["checksum_alarms"] < caught_with:
            problems.append(f"{dtype} 2^{e}: {caught_with} caught steps, summary says "
                            f"{sm['checksum_skips']} skips and {sm['checksum_alarms']} alarms")
        n = a.trials
        low, high = common.wilson(caught_with, n)
        rows.append({
            "dtype": "bf16-autocast" if dtype == "bf16" else "fp32",
            "rel_exp": e,
            "caught_with": caught_with,
            "rate_with": round(caught_with / n, 4),
            "rate_with_low": round(low, 4),
            "rate_with_high": round(high, 4),
            "caught_without": caught_without,
            "rate_without": round(caught_without / n, 4),
            "element_changed": round(element_changed / n, 4),
            "step_changed": round(step_changed / n, 4),
            "replay_rate_audit100": round(step_changed / n / 100, 5),
            "replay_rate_audit10": round(step_changed / n / 10, 5),
        })
        print(f"  {dtype} 2^{e}: with checksums {caught_with}/{n}, without {caught_without}/{n}, "
              f"step changed {step_changed}/{n}", file=sys.stderr, flush=True)
    sm = clean[2].summary()
    if sm["checksum_alarms"] or sm["checksum_skips"]:
        problems.append(f"{dtype}: {sm['checksum_alarms']} alarms on {clean_steps} clean steps")
    if sm["products_checked"] != products_per_step * clean_steps:
        problems.append(f"{dtype}: the checksums checked {sm['products_checked']} products in "
                        f"{clean_steps} steps, the mode saw {products_per_step} a step")
    return rows, clean_steps, sm["checksum_alarms"], products_per_step


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    with common.one_rank_group():
        return run(a)


def run(a):
    text = common.corpus()
    start = time.monotonic()
    problems, rows, clean_steps, clean_alarms, products = [], [], 0, 0, None
    for dtype in a.dtypes:
        r, c, alarms, products = run_dtype(a, dtype, text, problems)
        rows += r
        clean_steps += c
        clean_alarms += alarms
    if problems:
        for p in problems[:20]:
            print(f"every_step_detection: {p}", file=sys.stderr)
        return 1

    n = a.trials
    print(f"\ncaught of {n} faulted steps per row (one wrong element in one product of each "
          f"step); 95% Wilson interval; replay = steps whose bits changed / audit_every")
    print(f"{'dtype':<14} {'rel':>6} {'with checksums':>24} {'without':>8} {'changed':>8} "
          f"{'replay@100':>11} {'replay@10':>10}")
    for r in rows:
        with_ = (f"{100 * r['rate_with']:5.1f}% [{100 * r['rate_with_low']:5.1f}, "
                 f"{100 * r['rate_with_high']:5.1f}]")
        print(f"{r['dtype']:<14} {'2^' + str(r['rel_exp']):>6} {with_:>24} "
              f"{100 * r['rate_without']:7.1f}% {100 * r['step_changed']:7.1f}% "
              f"{100 * r['replay_rate_audit100']:10.2f}% {100 * r['replay_rate_audit10']:9.2f}%")
    print(f"\n{clean_steps} clean steps interleaved: {clean_alarms} alarms; {products} products a step; width "
          f"{a.width}, {a.batch * a.seq} tokens; {time.monotonic() - start:.0f} s, load "
          f"{common.load_average()}")
    print(json.dumps({
        "trials": n,
        "rel_exponents": a.exponents,
        "dtypes": ["bf16-autocast" if d == "bf16" else "fp32" for d in a.dtypes],
        "clean_steps": clean_steps,
        "clean_alarms": clean_alarms,
        "products_per_step": products,
        "width": a.width,
        "tokens": a.batch * a.seq,
        "rows": rows,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
