"""Every-step checksums of the guarded step's matrix products (issue 45).

``Guard(..., every_step=True)`` (or ``SDC_EVERY_STEP=1``) runs each guarded
step's forward and backward under ``ProductChecks``, which checks the
output of every ``aten.mm``, ``aten.addmm`` and ``aten.bmm`` on CPU against
its operands (the kernels of kernels/abft.h: fp64 column checksums, the
probabilistic lambda-sigma threshold by default). On CPU a ``Linear`` runs
as ``addmm`` (2-D input) or ``mm`` on the flattened input, its backward as
two ``mm``; ``matmul`` of batches as ``bmm``. Products of other dtypes or
devices, ``addmm`` with a full (not row-broadcast) input or scaling, and
fused kernels (``scaled_dot_product_attention``, convolutions) are not
checked; ``unchecked`` counts the first kind (and a check that failed to
run, said once on stderr: nothing raises on one rank inside backward).

How it attaches: while a ``ProductChecks`` is entered (the step's forward
and backward), C++ kernels for those three ops are registered at the
dispatcher's CPU key (client/product_checks.cc, the library the C++ front
end's ``GuardOptions::every_step`` uses too, bound here as
``torch.classes.sdc.ProductChecks``: a ``torch::Library`` created on entry
and destroyed on exit, which puts aten's own kernels back), below autograd, so
the products of the forward and of the backward formulas reach them, and no
other op does. Each computes its product with aten's own CPU kernel
(``at::cpu::mm`` and the like: the same function, the same bits) and checks
it in C++: no Python call per product. (The first attachments, a
``TorchDispatchMode`` and then Python kernels at the same key, cost a Python
call per aten op, then per product: docs/ARCHITECTURE.md, "Every-step
checksums".) The registration is process-wide: a product another thread
computes during the step is checked too.

A failed checksum: the product is computed once more from the same
operands (the same output: "persistent", a fault the inputs reproduce;
another: "transient"), the alarm is logged on stderr with the op, phase,
shapes, discrepancy and threshold, and the step's first alarm is handed to
the engine at once as this rank's failure of the step (``note_failure``,
from C++), which the step's gradient buckets carry to every rank: every
rank skips the step with the same reason (guard.py). The replays of peers'
micro-batches run after the kernels are removed (in the engine's Finish)
and are not checked.

Fault injection (``SDC_INJECT_FAULT=product:RANK:WHEN[:REL]``, for tests
and demos only, client/fault_injection.h): at a firing step one element of
one product's output (forward or backward, chosen by a generator seeded by
rank and step) is multiplied by 1 + REL before it is checked and used; with
``product-column:RANK:WHEN[:REL]`` REL times its column's checksum scale
(e^T |A| |B|)_j is added instead, above the column's threshold by
construction.
"""

# What a failed checksum's note to the engine starts with; guard.py knows a
# step skipped for it by this mark in the error every rank gets.
ALARM_MARK = "checksum alarm"


class ProductChecks:
    """The product checks of one guard; entered for each guarded step's
    forward and backward (``begin`` first). One is entered at a time in a
    process (entering a second raises RuntimeError)."""

    def __init__(self, engine, rank, rule="probabilistic", lambda_=10.0):
        self._engine = engine
        self.rank = rank
        self.rule = rule
        self.lambda_ = lambda_
        # ValueError for a rule or lambda_ the kernels do not take.
        self._checks = engine.product_checks(rule, float(lambda_))

    @property
    def checked(self):
        """Products checked, all steps."""
        return self._checks.checked

    @property
    def unchecked(self):
        """mm/addmm/bmm the checksums could not take, all steps."""
        return self._checks.unchecked

    @property
    def alarms(self):
        """Failed checksums, all steps."""
        return self._checks.alarms

    def __enter__(self):
        try:
            self._checks.enter()
        except RuntimeError as e:
            if "FAILED_PRECONDITION" in str(e):
                raise RuntimeError(
                    "another guard's every-step checksums are active in this process") from None
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        self._checks.exit()  # aten's own kernels again.
        return False

    def begin(self, step):
        """Before the step's forward: arms this step's injected fault, if any."""
        fires, rel, column_scaled = self._engine.product_fault(step)
        self._checks.begin(int(step), float(rel) if fires else None, bool(column_scaled))
