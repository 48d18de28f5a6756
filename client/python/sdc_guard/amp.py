"""Mixed precision under the guard: a GradScaler's scale for replays, and the
optimizer step that applies or skips a guarded step as ``GradScaler.step``
does (``Guard.optimizer_step``).

How a guarded step ends, by what the guard decided:
  * applied: ``optimizer.step()``, or under a scaler ``scaler.step`` (which
    unscales first, unless the trainer did) and ``scaler.update()``;
  * the scaler's overflow (NaN/Inf under a scaler, ``s.overflow``): the
    gradients keep their NaN/Inf, ``scaler.step`` finds them and skips the
    optimizer, ``scaler.update()`` backs the scale off, exactly as without
    the guard (no incident: sdcd is told the step ran under a scaler);
  * a failed check (or an error on some rank): the gradients are zero and
    the optimizer does not step; the scaler learned nothing about its
    scale, so ``scaler.update(new_scale=<its scale>)`` keeps the scale and
    growth count as they were and clears what it recorded this step (an
    ``unscale_`` inside the step, say), so its next step starts clean and
    never raises "No inf checks were recorded".
"""

import torch


def check_scaler(scaler):
    """TypeError unless ``scaler`` behaves as a ``torch.amp.GradScaler``."""
    for name in ("scale", "step", "update", "get_scale", "is_enabled"):
        if not callable(getattr(scaler, name, None)):
            raise TypeError(
                f"grad_scaler: expected a torch.amp.GradScaler, got {type(scaler).__name__} "
                f"(no {name}())")


def loss_scale(scaler):
    """The scaler's current scale as a float32 tensor, or None without an
    enabled scaler (what a replay multiplies its loss by)."""
    if scaler is None or not scaler.is_enabled():
        return None
    get = getattr(scaler, "_get_scale_async", None)
    scale = get() if get is not None else None
    if scale is None:  # Not initialised yet, or an older torch.
        scale = torch.tensor(float(scaler.get_scale()), dtype=torch.float32)
    return scale


def _optimizers(optimizer):
    items = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for o in items:
        if not isinstance(o, torch.optim.Optimizer):
            raise TypeError(f"optimizer: expected a torch.optim.Optimizer, got {type(o).__name__}")
    if not items:
        raise ValueError("optimizer: no optimizer given")
    return items


def finish_step(step, optimizer, scaler):
    """Steps ``optimizer`` (one, or a list) after the guarded ``step`` as the
    module docstring says; returns whether the optimizers stepped."""
    optimizers = _optimizers(optimizer)
    if scaler is None or not scaler.is_enabled():
        if step.apply:
            for o in optimizers:
                o.step()
        return step.apply
    if step.apply or step.overflow:
        for o in optimizers:
            scaler.step(o)  # After an overflow it finds the NaN/Inf and skips.
        scaler.update()
        return step.apply
    scale = loss_scale(scaler)
    scaler.update(new_scale=scale.detach().clone())
    return False
