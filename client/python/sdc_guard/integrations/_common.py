"""What the framework adapters share.

A framework owns the loop: it calls the trainer's code for each micro-batch,
runs backward itself and steps the optimizer itself. The adapters keep the
guard's guarantees inside that loop with three pieces:
  * OpenStep: a guarded step opened at a step's first micro-batch and closed
    after its last backward, across the framework's calls (the ``with
    guard.step(...)`` block, split where the framework splits it);
  * guard_optimizer_step: the framework's optimizer, whose ``step()`` now
    applies or skips as the guard decided (``Guard.optimizer_step``), the
    same on every rank, and refuses gradients no guarded step checked;
  * ProvisionalPaths: checkpoints the framework writes under its own names,
    kept as NAME.provisional until sdcd calls them final, deleted when a GPU
    of the job is found faulty first.
"""

import os
import shutil
import sys

import torch.distributed as dist

from sdc_guard._C import GuardError

PROVISIONAL = ".provisional"


def rank():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class OpenStep:
    """One guarded step held open across a framework's calls."""

    def __init__(self, guard):
        self.guard = guard
        self.step = None

    @property
    def open(self):
        return self.step is not None

    def begin(self, number, batch, micro_batches=1):
        s = self.guard.step(number, batch, micro_batches)
        s.__enter__()
        self.step = s
        return s

    def backward(self, loss, **kwargs):
        if self.step is None:
            raise GuardError("FAILED_PRECONDITION: a backward pass outside a guarded step")
        return self.step.backward(loss, **kwargs)

    def end(self):
        """Closes the step: the checks and the agreement (a collective).
        GuardError on every rank alike when the step cannot be decided."""
        s, self.step = self.step, None
        s.__exit__(None, None, None)
        return s

    def abort(self, exc):
        """The framework's own error inside the step: leaves it on this rank."""
        s, self.step = self.step, None
        if s is not None:
            s.__exit__(type(exc), exc, exc.__traceback__)


def guarded_backward(accelerator, opened):
    """``accelerator.backward`` that runs ``Step.backward`` while a guarded
    step is open (the loss divided by the accumulation steps, as Accelerate
    does), and Accelerate's own otherwise (no optimizer step can take those
    gradients: see guard_optimizer_step)."""
    original = accelerator.backward

    def backward(loss, **kwargs):
        if not opened.open:
            return original(loss, **kwargs)
        opened.backward(loss / accelerator.gradient_accumulation_steps, **kwargs)

    return backward


def check_accelerator(accelerator):
    """ValueError for what the adapters do not carry: a loss scaler (fp16)
    or a non-DDP distributed type (DeepSpeed, FSDP, Megatron)."""
    if getattr(accelerator, "scaler", None) is not None:
        raise ValueError("sdc_guard: fp16 mixed precision under Accelerate's GradScaler is not "
                         "supported by the adapter (its scale must travel with replays); use bf16 "
                         "or fp32, or the plain loop with Guard(grad_scaler=...)")
    kind = str(getattr(accelerator, "distributed_type", "")).rsplit(".", 1)[-1]
    if kind not in ("MULTI_CPU", "MULTI_GPU"):
        raise ValueError(f"sdc_guard: Accelerate's {kind} is not DistributedDataParallel; the "
                         "guard needs a DDP job of 2 or more processes")


def guard_optimizer_step(guard, optimizer, accumulating=lambda: False):
    """Makes ``optimizer.step()`` (this instance) apply or skip as the guard
    decided for the step just closed. ``accumulating()`` says when the
    framework's own step is a no-op (an accumulation micro-batch, where
    Accelerate's optimizer does not step). Raises GuardError for a step no
    guarded step checked. Accelerate's ``step_was_skipped`` reports a skip."""
    original = optimizer.step

    def step(closure=None, **kwargs):
        if not guard.step_pending:
            if accumulating():
                return original(closure, **kwargs)
            raise GuardError("FAILED_PRECONDITION: optimizer.step() on gradients no guarded step "
                             "checked (backward outside the guarded step?)")
        if closure is not None:
            raise ValueError("sdc_guard: optimizer.step(closure) under the guard: compute the "
                             "loss inside the guarded step instead")
        applied = guard.optimizer_step(optimizer, apply=lambda: original(**kwargs))
        if hasattr(optimizer, "_is_overflow"):
            optimizer._is_overflow = not applied  # AcceleratedOptimizer.step_was_skipped
        return None

    optimizer.step = step
    return optimizer


class ProvisionalPaths:
    """Checkpoints written by a framework under its own paths. ``add(step,
    path)`` after the framework saved ``path + ".provisional"`` (or after
    ``hold(path)`` renamed what it saved there); ``reconcile()`` renames the
    ones the guard calls final to ``path`` and deletes the revoked ones.
    Rank ``writer_rank`` touches the files; every rank keeps the ledger."""

    def __init__(self, guard, writer_rank=0):
        self.guard = guard
        self.writer_rank = writer_rank
        self.pending = {}  # step -> final path, saved and not yet final or revoked.
        self.allowed, self.vetoed, self.promoted, self.deleted = [], [], [], []
        self.finished = False  # finish() ran: the guard is shut down.

    @staticmethod
    def provisional(path):
        return path + PROVISIONAL

    def hold(self, path):
        """Renames what the framework saved at ``path`` to its provisional
        name (the writing rank; after every rank wrote its part)."""
        if rank() == self.writer_rank and os.path.exists(path):
            target = self.provisional(path)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(path, target)

    def add(self, step, path):
        self.pending[int(step)] = path
        self.allowed.append(int(step))

    def veto(self, step):
        self.vetoed.append(int(step))
        if rank() == self.writer_rank:
            print(f"sdc_guard: checkpoint of step {step} vetoed: "
                  f"{self.guard.summary().get('last_veto', '')}", file=sys.stderr, flush=True)

    def reconcile(self):
        for step, path in sorted(self.pending.items()):
            standing = self.guard.checkpoint_standing(step)
            if standing == "provisional":
                continue
            del self.pending[step]
            if standing == "final":
                self.promoted.append(step)
                if rank() == self.writer_rank and os.path.exists(self.provisional(path)):
                    os.replace(self.provisional(path), path)
            else:  # Revoked: a GPU of the job was found faulty since.
                self.deleted.append(step)
                if rank() == self.writer_rank:
                    remove(self.provisional(path))

    def finish(self, flush_seconds=10.0):
        """At the end of training: this rank's last reports to sdcd, a barrier
        (every rank's are in), sdcd asked once more, reconciled. Returns
        the guard's summary."""
        self.finished = True
        self.guard.shutdown(flush_seconds=flush_seconds)
        dist.barrier()
        try:
            self.guard.refresh_checkpoints()
        except GuardError as e:
            print(f"sdc_guard: checkpoint standings unknown at the end: {e}", file=sys.stderr)
        self.reconcile()
        return self.guard.summary()


def remove(path):
    """Deletes a checkpoint file or directory, if there."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
