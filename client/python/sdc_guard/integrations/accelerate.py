"""sdc-guard for an Accelerate loop: the loop stays as it is, with its
backward inside ``guard.step``::

    from sdc_guard.integrations.accelerate import AcceleratedGuard
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    guard = AcceleratedGuard(accelerator, model, optimizer, loss_fn)
    for step, batch in enumerate(loader, 1):
        with guard.step(step, batch):
            accelerator.backward(loss_fn(model, batch))
        optimizer.step()                      # applies or skips
        optimizer.zero_grad()
        if step % 1000 == 0:
            guard.save_state(step, f"ckpt/step-{step}")  # gated, provisional
    guard.finish()

What it hooks, on the objects Accelerate prepared (a DDP job):
  * ``guard.step(n, batch)``: a guarded step; inside it
    ``accelerator.backward`` runs the guard's ``Step.backward`` (the loss
    divided by the accumulation steps, as Accelerate does). Under
    ``accelerator.accumulate(model)`` the step opens at the first
    micro-batch and closes after the one that syncs gradients;
  * ``optimizer.step()``: applies or skips as the guard decided, the same on
    every rank; a step on gradients no guarded step checked raises;
    ``accelerator.optimizer_step_was_skipped`` reports a skip;
  * ``save_state(step, dir)``: the guard's gate (a collective), then
    ``accelerator.save_state(dir + ".provisional")``, renamed ``dir`` once
    sdcd calls it final and deleted when revoked; ``finish()`` at the end.

``loss_fn(model.module, batch)`` must compute the micro-batch's loss as the
loop does (the guard replays it). fp16 under Accelerate's GradScaler is not
carried (use bf16 or fp32).
"""

import contextlib

import sdc_guard
from sdc_guard.integrations import _common


class AcceleratedGuard:
    """The guard of an Accelerate job (see the module). ``options``: keyword
    arguments of ``sdc_guard.Guard``. Creating it is a collective."""

    def __init__(self, accelerator, model, optimizer, loss_fn, **options):
        _common.check_accelerator(accelerator)
        self.accelerator = accelerator
        self.guard = sdc_guard.Guard(model, optimizer, loss_fn, **options)
        self._open = _common.OpenStep(self.guard)
        _common.guard_optimizer_step(self.guard, optimizer,
                                     accumulating=lambda: not accelerator.sync_gradients)
        accelerator.backward = _common.guarded_backward(accelerator, self._open)
        self.checkpoints = _common.ProvisionalPaths(self.guard)

    @contextlib.contextmanager
    def step(self, number, batch):
        """The guarded step ``number`` (grows by one per optimizer step);
        ``batch`` is its first micro-batch, as ``loss_fn`` takes it. Yields
        the ``sdc_guard.Step`` (after the block: ``apply``, ``reason``...)."""
        if not self._open.open:
            self._open.begin(number, batch, self.accelerator.gradient_accumulation_steps)
        s = self._open.step
        try:
            yield s
        except BaseException as e:
            self._open.abort(e)
            raise
        if self.accelerator.sync_gradients:
            self._open.end()

    def save_state(self, step, output_dir, **kwargs):
        """At a checkpoint step, after ``optimizer.step()``: the guard's gate
        (every rank calls it), then ``accelerator.save_state`` into
        ``output_dir + ".provisional"`` when allowed. Returns whether it was
        allowed and saved, the same on every rank."""
        if not self.guard.may_checkpoint():
            self.checkpoints.veto(step)
            self.checkpoints.reconcile()
            return False
        self.accelerator.save_state(self.checkpoints.provisional(output_dir), **kwargs)
        self.accelerator.wait_for_everyone()
        self.checkpoints.add(step, output_dir)
        self.checkpoints.reconcile()
        return True

    def finish(self, flush_seconds=10.0):
        """At the end: the last reports, sdcd asked once more, checkpoints
        reconciled. Returns the guard's summary."""
        return self.checkpoints.finish(flush_seconds)

    def __getattr__(self, name):
        # fault_point, summary, last_step, rank...: the Guard's.
        return getattr(self.guard, name)
