"""Every-step checksums of the guarded step's matrix products (issue 45).

``Guard(..., every_step=True)`` (or ``SDC_EVERY_STEP=1``) runs each guarded
step's forward and backward under ``ProductChecks``, which checks the
output of every ``aten.mm``, ``aten.addmm`` and ``aten.bmm`` on CPU against
its operands with ``torch.ops.sdc.check_matmul`` (the kernels of
kernels/abft.h: fp64 column checksums, the probabilistic lambda-sigma
threshold by default). On CPU a ``Linear`` runs as ``addmm`` (2-D input) or
``mm`` on the flattened input, its backward as two ``mm``; ``matmul`` of
batches as ``bmm``. Products of other dtypes or devices, ``addmm`` with a
full (not row-broadcast) input or scaling, and fused kernels
(``scaled_dot_product_attention``, convolutions) are not checked;
``unchecked`` counts the first kind (and a check that raised, said once on
stderr: nothing raises on one rank inside backward).

How it attaches: while a ``ProductChecks`` is entered (the step's forward
and backward), Python kernels for those three ops are registered at the
dispatcher's CPU key (a ``torch.library`` IMPL library, destroyed on exit,
which puts aten's own kernels back), below autograd, so the products of the
forward and of the backward formulas reach them, and no other op does. Each
computes its product with the op's ``out=`` overload (the same CPU kernel,
the same result), then checks it. A ``TorchDispatchMode`` (the first
attachment) saw the same products but ran a Python call for every aten op
of the step; this runs one per product, plus about 0.15 ms per step to
register and remove the kernels (docs/ARCHITECTURE.md, "Every-step
checksums"). The registration is process-wide: a product another thread
computes during the step is checked too.

A failed checksum: the product is computed once more from the same
operands (the same output: "persistent", a fault the inputs reproduce;
another: "transient"), the alarm is logged on stderr with the op, phase,
shapes, discrepancy and threshold, and handed to the engine as this rank's
failure of the step (``note_failure``), which the step's agreement carries
to every rank: every rank skips the step with the same reason (guard.py).
The replays of peers' micro-batches run after the kernels are removed (in the
engine's Finish) and are not checked.

Fault injection (``SDC_INJECT_FAULT=product:RANK:WHEN[:REL]``, for tests
and demos only, client/fault_injection.h): at a firing step one element of
one product's output (forward or backward, chosen by a generator seeded by
rank and step) is multiplied by 1 + REL before it is checked and used.
"""

import random
import sys
import warnings

import torch

from sdc_guard import _C

_aten = torch.ops.aten
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# What a failed checksum's note to the engine starts with; guard.py knows a
# step skipped for it by this mark in the error every rank gets.
ALARM_MARK = "checksum alarm"


def _operands(func, args, kwargs, out):
    """(A, B, bias) of a product op whose output is ``out``, or None when the
    checksums cannot take it."""
    if func is _aten.mm.default or func is _aten.bmm.default:
        a, b, bias = args[0], args[1], None
    elif func is _aten.addmm.default:
        bias, a, b = args[0], args[1], args[2]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        if beta != 1 or alpha != 1:
            return None
        n = out.shape[-1]
        row = (bias.dim() == 1 and bias.shape[0] == n) or (
            bias.dim() == 2 and bias.shape[1] == n and (bias.shape[0] == 1 or bias.stride(0) == 0))
        if not row:
            return None
    else:
        return None
    for t in (a, b, out) + ((bias,) if bias is not None else ()):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.dtype not in _DTYPES:
            return None
    return a, b, bias


# The ProductChecks entered now (None: aten's own kernels run).
_active = None


# Each computes into an empty tensor that the out= overload sizes (and
# checks the operands for, raising the op's own errors).
def _mm(a, b):
    out = _aten.mm.out(a, b, out=a.new_empty(0))
    return _observe(_aten.mm.default, (a, b), {}, out)


def _addmm(bias, a, b, *, beta=1, alpha=1):
    out = _aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty(0))
    return _observe(_aten.addmm.default, (bias, a, b), {"beta": beta, "alpha": alpha}, out)


def _bmm(a, b):
    out = _aten.bmm.out(a, b, out=a.new_empty(0))
    return _observe(_aten.bmm.default, (a, b), {}, out)


def _observe(func, args, kwargs, out):
    checks = _active
    return out if checks is None else checks.observe(func, args, kwargs, out)


def _install():
    """The product kernels registered at the CPU key (replacing aten's own
    until the returned library is destroyed)."""
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # "Overriding a previously registered kernel": that is the point.
        warnings.simplefilter("ignore")
        lib.impl("mm", _mm, "CPU")
        lib.impl("addmm", _addmm, "CPU")
        lib.impl("bmm", _bmm, "CPU")
    return lib


class ProductChecks:
    """The product checks of one guard; entered for each guarded step's
    forward and backward (``begin`` first). One is entered at a time in a
    process (entering a second raises RuntimeError)."""

    CHECKED = (_aten.mm.default, _aten.addmm.default, _aten.bmm.default)

    def __init__(self, engine, rank, rule="probabilistic", lambda_=10.0):
        self._engine = engine
        self.rank = rank
        self.rule = rule
        self.lambda_ = lambda_
        self.checked = 0      # Products checked, all steps.
        self.unchecked = 0    # mm/addmm/bmm the checksums could not take.
        self.alarms = 0       # Failed checksums, all steps.
        self.step = 0
        self._in_step = 0     # Products seen this step.
        self._last_step_products = 0
        self._fault = None    # (relative error, target product index) at a firing step.
        self._step_alarmed = False
        self._warned = False  # Said once that a check raised.
        self._library = None  # The CPU kernels while entered.

    def __enter__(self):
        global _active
        if _active is not None and _active is not self:
            raise RuntimeError("another guard's every-step checksums are active in this process")
        if self._library is None:
            self._library = _install()
        _active = self
        return self

    def __exit__(self, exc_type, exc, tb):
        global _active
        if _active is self:
            _active = None
        if self._library is not None:
            self._library._destroy()  # aten's own kernels again.
            self._library = None
        return False

    def begin(self, step):
        """Before the step's forward: arms this step's injected fault, if any."""
        self.step = step
        self._last_step_products = max(self._last_step_products, self._in_step)
        self._in_step = 0
        self._step_alarmed = False
        fires, rel = self._engine.product_fault(step)
        self._fault = None
        if fires:
            rng = random.Random(1000003 * (self.rank + 1) + step)
            self._fault = (rel, rng.randrange(max(1, self._last_step_products)), rng)

    def observe(self, func, args, kwargs, out):
        """Checks one product ``out = func(*args, **kwargs)``; returns ``out``."""
        ops = _operands(func, args, kwargs, out)
        if ops is None:
            self.unchecked += 1
            return out
        index = self._in_step
        self._in_step += 1
        if self._fault is not None and self._fault[1] == index:
            self._inject(func, out)
        a, b, bias = ops
        try:
            passed, worst, discrepancy, threshold, batch = _C.check_matmul(
                a, b, out, bias, self.rule, self.lambda_)
        except Exception as e:  # noqa: BLE001  (never raise on one rank inside backward)
            self.unchecked += 1
            if not self._warned:
                self._warned = True
                print(f"sdc-guard rank {self.rank}: a product left unchecked: {func.__name__} "
                      f"{self._shapes(a, b)}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return out
        self.checked += 1
        if not passed:
            self._alarm(func, args, kwargs, out, ops, worst, discrepancy, threshold, batch)
        return out

    @staticmethod
    def _phase():
        node = torch._C._current_autograd_node()
        return f"backward ({node.name()})" if node is not None else "forward"

    @staticmethod
    def _shapes(a, b):
        return f"{list(a.shape)} x {list(b.shape)}"

    def _inject(self, func, out):
        rel, _, rng = self._fault
        self._fault = None
        flat = out.view(-1) if out.is_contiguous() else None
        if flat is None or flat.numel() == 0:
            return
        i = rng.randrange(flat.numel())
        if flat[i].item() == 0:
            i = int(flat.abs().argmax())
        before = flat[i].item()
        flat[i] = before * (1.0 + rel)
        after = flat[i].item()
        print(f"sdc-guard rank {self.rank}: INJECTED a product error (relative {rel:g}, "
              f"{before:.6g} -> {after:.6g}) into {func.__name__} output {list(out.shape)} "
              f"element {i} in the {self._phase()} at step {self.step}",
              file=sys.stderr, flush=True)

    def _alarm(self, func, args, kwargs, out, ops, worst, discrepancy, threshold, batch):
        self.alarms += 1
        global _active
        _active = None  # The recomputation is not checked again.
        try:
            again = func(*args, **kwargs)
        finally:
            _active = self
        kind = "persistent" if torch.equal(again, out) else "transient"
        a, b, _ = ops
        where = f"column {worst}" + (f" of product {batch}" if out.dim() == 3 else "")
        what = (f"{ALARM_MARK} at step {self.step} on rank {self.rank}: {func.__name__} "
                f"{self._shapes(a, b)} {out.dtype} in the {self._phase()}, {where}: "
                f"discrepancy {discrepancy:.6g} > threshold {threshold:.6g} ({kind}: "
                f"recomputed {'the same' if kind == 'persistent' else 'differently'})")
        print(f"sdc-guard rank {self.rank}: {what}", file=sys.stderr, flush=True)
        if not self._step_alarmed:
            self._step_alarmed = True
            self._engine.note_failure(what)
