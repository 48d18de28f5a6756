"""sdc-guard for Lightning: train with ``GuardedDDPStrategy`` in place of
``"ddp"``::

    from sdc_guard.integrations.lightning import GuardedDDPStrategy
    trainer = L.Trainer(strategy=GuardedDDPStrategy(), ...)
    trainer.fit(model, loader)

A Strategy, not a Callback, because a callback cannot skip an optimizer
step or cancel a checkpoint write; the strategy owns both, and wraps the
model in DDP, so the guard sits where Lightning already does that work:
  * ``training_step``: the guard (a collective) is created at the first one,
    on the DDP model and the one optimizer; a guarded step opens at a
    step's first micro-batch (``accumulate_grad_batches`` of them);
  * ``backward``: the precision plugin's hooks around the guard's
    ``Step.backward`` (a LightningModule's own ``backward()`` override is
    not called);
  * ``optimizer_step``: runs Lightning's closure (forward and backward),
    closes the guarded step (the checks, before any update), then steps
    through the precision plugin (gradient clipping, on_before_optimizer_step)
    only when the guard applies the step: the same on every rank;
  * ``save_checkpoint``: the guard's gate (a collective; every rank saves);
    an allowed checkpoint is written as ``PATH.provisional`` and renamed
    ``PATH`` once sdcd calls it final, deleted when revoked; a vetoed one is
    not written. ``on_train_end`` asks sdcd once more.

The replayed loss is ``training_step(batch, 0)``'s (its "loss" when it
returns a dict), under the precision plugin's autocast, with its ``self.log``
calls dropped: pass ``loss_fn`` when training_step has other side effects or
reads ``batch_idx``. One optimizer; fp16 with a GradScaler
("16-mixed") is not carried (use "bf16-mixed" or 32). Guard options go in
``guard_options``.
"""

from lightning.pytorch.strategies import DDPStrategy

import sdc_guard
from sdc_guard.integrations import _common


def _no_log(*args, **kwargs):
    pass


def _loss_of(output):
    if isinstance(output, dict):
        return output["loss"]
    return output


class GuardedDDPStrategy(DDPStrategy):
    """``DDPStrategy`` under sdc-guard (see the module). After ``fit``,
    ``sdc_guard`` is the guard (shut down), ``sdc_summary`` its counters and
    ``sdc_checkpoints`` the checkpoint ledger."""

    strategy_name = "sdc_guard_ddp"

    def __init__(self, *args, guard_options=None, loss_fn=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sdc_guard = None
        self.sdc_summary = None
        self.sdc_checkpoints = None
        self._sdc_options = dict(guard_options or {})
        self._sdc_loss_fn = loss_fn
        self._sdc_open = None

    def _sdc_start(self):
        if len(self.optimizers) != 1:
            raise ValueError(f"sdc_guard: {len(self.optimizers)} optimizers; the Lightning adapter "
                             "guards one (automatic optimization)")
        if getattr(self.precision_plugin, "scaler", None) is not None:
            raise ValueError("sdc_guard: fp16 under a GradScaler ('16-mixed') is not carried by the "
                             "Lightning adapter; use 'bf16-mixed' or 32")
        guard = sdc_guard.Guard(self.model, self.optimizers[0],
                                self._sdc_loss_fn or self._sdc_replay_loss, **self._sdc_options)
        self._sdc_open = _common.OpenStep(guard)
        self.sdc_checkpoints = _common.ProvisionalPaths(guard)
        self.sdc_guard = guard

    def _sdc_replay_loss(self, module, batch):
        # A replay (of a peer's batch, or this rank's own) is no training step
        # of this rank: what its training_step logs is dropped.
        module.log = module.log_dict = _no_log
        try:
            with self.precision_plugin.train_step_context():
                return _loss_of(module.training_step(batch, 0))
        finally:
            del module.log, module.log_dict

    def training_step(self, *args, **kwargs):
        if self.sdc_guard is None:
            self._sdc_start()
        opened = self._sdc_open
        if not opened.open:
            trainer = self.lightning_module.trainer
            opened.begin(trainer.global_step + 1, args[0], trainer.accumulate_grad_batches)
        try:
            return super().training_step(*args, **kwargs)
        except BaseException as e:
            opened.abort(e)
            raise

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        if self._sdc_open is None or not self._sdc_open.open:
            raise sdc_guard.GuardError("FAILED_PRECONDITION: a backward pass outside a guarded "
                                       "step (manual optimization is not guarded)")
        module = self.lightning_module
        self.pre_backward(closure_loss)
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        try:
            self._sdc_open.backward(closure_loss, **kwargs)
        except BaseException as e:
            self._sdc_open.abort(e)
            raise
        closure_loss = self.precision_plugin.post_backward(closure_loss, module)
        self.post_backward(closure_loss)
        return closure_loss

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        result = closure()  # training_step and backward: the guarded step's inside.
        if self._sdc_open is not None and self._sdc_open.open:
            self._sdc_open.end()  # The checks and the agreement, before any update.
        guard = self.sdc_guard
        if guard is None or not guard.step_pending:
            raise sdc_guard.GuardError("FAILED_PRECONDITION: an optimizer step with no guarded "
                                       "step (training_step returned no loss?)")
        parent = super()

        def apply():
            parent.optimizer_step(optimizer, lambda: result, model, **kwargs)

        guard.optimizer_step(optimizer, apply=apply)
        return result

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        guard = self.sdc_guard
        if guard is None or self.sdc_checkpoints.finished:  # Before training, or after it.
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        step = guard.last_step.step if guard.last_step is not None else 0
        if not guard.may_checkpoint():  # A collective: every rank saves.
            self.sdc_checkpoints.veto(step)
            self.sdc_checkpoints.reconcile()
            return None
        super().save_checkpoint(checkpoint, self.sdc_checkpoints.provisional(str(filepath)),
                                storage_options)
        self.sdc_checkpoints.add(step, str(filepath))
        self.sdc_checkpoints.reconcile()
        return None

    def remove_checkpoint(self, filepath):
        """ModelCheckpoint's rotation: the file, or its provisional name (a
        vetoed checkpoint has neither)."""
        if self.is_global_zero:
            path = str(filepath)
            _common.remove(path)
            _common.remove(_common.ProvisionalPaths.provisional(path))

    def on_train_end(self):
        super().on_train_end()
        if self.sdc_checkpoints is not None and not self.sdc_checkpoints.finished:
            self.sdc_summary = self.sdc_checkpoints.finish()

