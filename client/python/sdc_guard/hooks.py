"""The guard's DDP communication hook, with the trainer's own hook inside it.

DDP takes one communication hook. The guard's scans each gradient bucket
(check 1) and, on audit steps, fingerprints the first micro-batch's local
gradients, before anything touches the bucket; then the trainer's hook
(``Guard(comm_hook=(state, hook))``: fp16/bf16 compression, PowerSGD, any
hook of DDP's form) reduces it, or, without one, an all-reduce that
averages as DDP's own reducer does. What that hook's future returns is what
DDP writes into ``.grad`` and the optimizer sees, so that is what the guard
hands the engine as the reduced bucket (the reduced NaN/Inf check and the
cross-rank digest vote).

A hook's errors in the guard's own part are kept by the engine and fail the
step on every rank at its end; raising here would leave the other ranks
waiting in the all-reduce.
"""

import torch.distributed as dist

from sdc_guard._C import GuardError


def registered_hook(model):
    """The name of the communication hook ``model`` (DDP) already has, or None."""
    try:
        name = model._get_ddp_logging_data().get("comm_hook")
    except Exception:  # noqa: BLE001  (an older or newer DDP: fall back to the list)
        name = None
    if not name and getattr(model, "_comm_hooks", None):
        hook = model._comm_hooks[0][0]
        name = getattr(hook, "__qualname__", repr(hook))
    return name or None


def check_user_hook(comm_hook):
    """``(state, hook)`` from ``Guard``'s ``comm_hook=``; TypeError otherwise."""
    if comm_hook is None:
        return None, None
    if not (isinstance(comm_hook, tuple) and len(comm_hook) == 2 and callable(comm_hook[1])):
        raise TypeError(
            "comm_hook: expected (state, hook) as DistributedDataParallel.register_comm_hook "
            "takes them, e.g. (None, default_hooks.bf16_compress_hook) or "
            f"(PowerSGDState(...), powerSGD_hook), got {comm_hook!r}")
    return comm_hook


class GuardHook:
    """The hook the guard registers on the DDP model."""

    def __init__(self, guard, state=None, hook=None):
        self._guard = guard
        self._state = state
        self._hook = hook
        # What DDP reads of a hook (its checks and its logging data).
        self.__name__ = self.__qualname__ = "sdc_guard_comm_hook"

    @property
    def name(self):
        """What runs inside the guard's check: the trainer's hook or DDP's average."""
        if self._hook is None:
            return "allreduce (average)"
        return getattr(self._hook, "__qualname__", repr(self._hook))

    def __call__(self, state, bucket):
        guard = self._guard
        engine = guard._engine()
        if guard._current is None or guard._closed:
            raise GuardError(
                "FAILED_PRECONDITION: backward() ran outside guard.step(): a guarded DDP model "
                "trains inside `with guard.step(...)`")
        buffer = bucket.buffer()
        try:
            # Before the trainer's hook: compression and PowerSGD's error
            # feedback change the bucket in place.
            if guard._first_backward and engine.auditing:
                indices = [guard._index[id(p)] for p in bucket.parameters()]
                engine.record_original_gradients(indices, bucket.gradients())
                guard._original_from_hook = True
            engine.scan_local_bucket(buffer)
        except Exception as e:  # noqa: BLE001  (any error fails the step on every rank)
            engine.note_failure(f"the guard's communication hook: {type(e).__name__}: {e}")
        guard._hook_calls_this_step += 1
        guard.hook_calls += 1
        if self._hook is None:
            # As DDP's reducer: each gradient times 1/world, then SUM (bit for
            # bit what plain DDP computes; a division afterwards is not).
            buffer.mul_(1.0 / guard._world)
            future = dist.all_reduce(buffer, group=guard.process_group,
                                     async_op=True).get_future()
        else:
            future = self._hook(self._state, bucket)
        index = bucket.index()

        def reduced(fut):
            value = fut.value()
            tensor = value[0] if isinstance(value, (list, tuple)) else value
            try:
                engine.add_reduced_bucket(index, tensor)
            except Exception as e:  # noqa: BLE001
                engine.note_failure(f"the guard's communication hook: {type(e).__name__}: {e}")
            return tensor

        return future.then(reduced)
