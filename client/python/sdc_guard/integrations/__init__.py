"""sdc-guard inside the training frameworks that own the loop, each in its
own module (imported on demand, so sdc_guard needs none of them):

  * ``sdc_guard.integrations.hf``: ``GuardedTrainer`` / ``GuardMixin`` for
    ``transformers.Trainer``, with a checkpoint gate (a TrainerCallback);
  * ``sdc_guard.integrations.lightning``: ``GuardedDDPStrategy``;
  * ``sdc_guard.integrations.accelerate``: ``AcceleratedGuard``.

Each keeps the guard's guarantees: a step's gradients are checked before the
optimizer applies them, a skipped step is skipped on every rank, and a
checkpoint stays provisional until sdcd calls it final (_common.py).
"""
