"""sdc-guard for ``transformers.Trainer``: replace ``Trainer`` by
``GuardedTrainer`` (or mix ``GuardMixin`` into your own subclass)::

    from sdc_guard.integrations.hf import GuardedTrainer
    trainer = GuardedTrainer(model=model, args=args, train_dataset=data)
    trainer.train()

How it hooks the Trainer (its DDP job: a multi-process launch):
  * ``training_step``: the guard (a collective) is created at the first
    one, on the DDP model Accelerate wrapped and the Trainer's optimizer; a
    guarded step opens at a step's first micro-batch, the Trainer's
    ``accelerator.backward`` runs the guard's ``Step.backward`` inside it,
    and the step closes after the last micro-batch's backward: the
    gradients are checked before the optimizer sees them;
  * ``optimizer.step()``: applies or skips as the guard decided, the same on
    every rank (a skip counts as Accelerate's skipped step: no scheduler step);
  * ``CheckpointGate``, a TrainerCallback the Trainer gets: at a save step
    it asks the guard's gate (a collective) and cancels the save when
    vetoed; a saved ``checkpoint-N`` is renamed ``checkpoint-N.provisional``
    (which ``get_last_checkpoint`` never resumes from) until sdcd calls it
    final, and deleted when revoked.

The replayed loss is ``compute_loss(model.module, inputs)``: each
micro-batch's mean loss, divided by the accumulation steps. The Trainer is
run without ``num_items_in_batch`` (a token count across micro-batches and
ranks that a replay of one micro-batch cannot know), so a model that
normalises by it trains on the per-micro-batch mean instead. Guard options
(``audit_every=...``, or the SDC_* variables) go in ``guard_options``.
"""

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainerCallback

import sdc_guard
from sdc_guard.integrations import _common


class CheckpointGate(TrainerCallback):
    """The guard's veto over the Trainer's checkpoints (see the module)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.ledger = None  # A ProvisionalPaths once the guard exists.
        self.outcomes = {}  # step -> "allowed" or "vetoed"

    def on_step_end(self, args, state, control, **kwargs):
        guard = self.trainer.sdc_guard
        if guard is None or not control.should_save:
            return control
        # Every rank reaches this with the same should_save: a collective.
        allowed = guard.may_checkpoint()
        self.outcomes[state.global_step] = "allowed" if allowed else "vetoed"
        if not allowed:
            control.should_save = False
            self.ledger.veto(state.global_step)
        self.ledger.reconcile()
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.ledger is None:
            return control
        dist.barrier()  # Every rank wrote its part (its RNG state) of checkpoint-N.
        path = f"{args.output_dir}/checkpoint-{state.global_step}"
        self.ledger.hold(path)
        self.ledger.add(state.global_step, path)
        self.ledger.reconcile()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.ledger is not None:
            self.trainer.sdc_summary = self.ledger.finish()
        return control


class GuardMixin:
    """sdc-guard for a ``transformers.Trainer`` subclass: ``class
    MyTrainer(GuardMixin, Trainer)``. ``guard_options``: keyword arguments of
    ``sdc_guard.Guard``. After training ``sdc_guard`` is the guard (shut
    down), ``sdc_summary`` its counters, ``sdc_checkpoints`` the gate."""

    def __init__(self, *args, guard_options=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sdc_guard = None
        self.sdc_summary = None
        self._sdc_options = dict(guard_options or {})
        self._sdc_open = None
        self.sdc_checkpoints = CheckpointGate(self)
        self.add_callback(self.sdc_checkpoints)

    def _sdc_start(self, model):
        if not isinstance(model, DistributedDataParallel):
            raise TypeError("sdc_guard: the Trainer's model is not DistributedDataParallel (got "
                            f"{type(model).__name__}): run it as a multi-process DDP job "
                            "(torchrun, accelerate launch)")
        _common.check_accelerator(self.accelerator)
        guard = sdc_guard.Guard(model, self.optimizer, self._sdc_replay_loss, **self._sdc_options)
        _common.guard_optimizer_step(guard, self.optimizer)
        self._sdc_open = _common.OpenStep(guard)
        self.accelerator.backward = _common.guarded_backward(self.accelerator, self._sdc_open)
        self.sdc_checkpoints.ledger = _common.ProvisionalPaths(guard)
        self.sdc_guard = guard

    def _sdc_replay_loss(self, module, inputs):
        with self.compute_loss_context_manager():
            return self.compute_loss(module, inputs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.sdc_guard is None:
            self._sdc_start(model)
        inputs = self._prepare_inputs(inputs)
        opened = self._sdc_open
        if not opened.open:
            opened.begin(self.state.global_step + 1, inputs,
                         self.args.gradient_accumulation_steps)
        try:
            loss = super().training_step(model, inputs, None)
        except BaseException as e:
            opened.abort(e)
            raise
        if self.accelerator.sync_gradients:  # The step's last micro-batch.
            opened.end()
        return loss


class GuardedTrainer(GuardMixin, Trainer):
    """``transformers.Trainer`` under sdc-guard (see the module)."""
