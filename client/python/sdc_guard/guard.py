"""sdc_guard.Guard: the C++ engine around a DistributedDataParallel model.

What runs where:
  * check 1 (non-finite gradients) inside a DDP communication hook: each
    gradient bucket is scanned before its all-reduce and handed to the engine
    after it, so communication overlaps backward as in plain DDP;
  * check 2 (ring replay audit) and the one agreement collective in
    ``Step.__exit__``, after backward and before ``optimizer.step()``;
  * check 3 (weight fingerprints) in ``after_optimizer_step``, asynchronous;
  * the checkpoint gate in ``may_checkpoint``.
The decisions, kernels and reports are the engine's (client/guard_engine.h).
"""

import math
import numbers
import os
import secrets
import socket
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from sdc_guard import _C
from sdc_guard._C import GuardError

# Keyword arguments of Guard and the SDC_* variable each overrides, with the
# check applied before the C++ side validates the value again.
_OPTIONS = {
    "job_id": ("SDC_JOB_ID", "text"),
    "coordinator": ("SDC_COORDINATOR", "text"),
    "node_name": ("SDC_NODE_NAME", "text"),
    "gpu_uuid": ("SDC_GPU_UUID", "text"),
    "local_rank": ("LOCAL_RANK", "count"),
    "replica_group": ("SDC_REPLICA_GROUP", "count"),
    "audit_every": ("SDC_AUDIT_EVERY", "count"),
    "weight_check_every": ("SDC_WEIGHT_CHECK_EVERY", "count"),
    "verdict_wait_ms": ("SDC_VERDICT_WAIT_MS", "count"),
    "checkpoint_wait_ms": ("SDC_CHECKPOINT_WAIT_MS", "count"),
    "checkpoint_fallback": ("SDC_CHECKPOINT_FALLBACK", "text"),
    "report_linger_ms": ("SDC_REPORT_LINGER_MS", "count"),
    "report_buffer": ("SDC_REPORT_BUFFER", "count"),
    "report_buffer_mb": ("SDC_REPORT_BUFFER_MB", "count"),
    "reconnect_max_ms": ("SDC_RECONNECT_MAX_MS", "count"),
    "small_collectives": ("SDC_SMALL_COLLECTIVES", "text"),
    "max_grad_norm": ("SDC_MAX_GRAD_NORM", "number"),
    "parameter_fingerprints": ("SDC_PARAMETER_FINGERPRINTS", "flag"),
    "vote_buffers": ("SDC_VOTE_BUFFERS", "flag"),
    "metrics_listen": ("SDC_METRICS_LISTEN", "text"),
}

# How libtorch words a warn-only deterministic-algorithms alert.
_NO_DETERMINISTIC = " does not have a deterministic implementation"

# What the peer exchange carries: at most this many tensors of at most this
# many dimensions (the engine's header, client/guard_engine.cc).
_MAX_BATCH_TENSORS = 6
_MAX_DIMS = 6


def _variables(options):
    """SDC_* overrides from Guard's keyword arguments; ValueError names the argument."""
    out = {}
    for name, value in options.items():
        if value is None:
            continue
        variable, kind = _OPTIONS[name]
        if kind == "count":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"{name}={value!r}: expected a non-negative integer")
            out[variable] = str(int(value))
        elif kind == "number":
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"{name}={value!r}: expected a non-negative finite number")
            out[variable] = repr(float(value))
        elif kind == "flag":
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r}: expected True or False")
            out[variable] = "1" if value else "0"
        else:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name}={value!r}: expected a non-empty string")
            out[variable] = value
    return out


def _flatten(batch):
    """(tensors, rebuild): the batch as the list of tensors a peer is sent, and
    a function that makes the same structure from such a list. ValueError for
    a batch the exchange cannot carry."""
    if isinstance(batch, torch.Tensor):
        tensors, rebuild = [batch], lambda ts: ts[0]
    elif isinstance(batch, (list, tuple)):
        tensors, kind = list(batch), type(batch)
        if kind is list:
            rebuild = list
        elif kind is tuple:
            rebuild = tuple
        else:  # A namedtuple.
            rebuild = lambda ts: kind(*ts)  # noqa: E731
    elif isinstance(batch, dict):
        keys = list(batch.keys())
        if not all(isinstance(k, str) for k in keys):
            raise ValueError("a batch dict needs string keys for the replay peer exchange")
        tensors = [batch[k] for k in keys]
        rebuild = lambda ts: dict(zip(keys, ts))  # noqa: E731
    else:
        raise ValueError(
            f"a batch of type {type(batch).__name__}: the replay peer exchange carries a tensor, "
            "a list or tuple of tensors, or a dict of str to tensor")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"batch element {i} is a {type(t).__name__}: the replay peer exchange carries "
                "tensors only")
        if t.dim() > _MAX_DIMS:
            raise ValueError(
                f"batch element {i} has {t.dim()} dimensions: the replay peer exchange carries at "
                f"most {_MAX_DIMS}")
    if not tensors or len(tensors) > _MAX_BATCH_TENSORS:
        raise ValueError(
            f"a batch of {len(tensors)} tensors: the replay peer exchange carries 1 to "
            f"{_MAX_BATCH_TENSORS}")
    return tensors, rebuild


def _resolve_job_id(variables, group):
    """Sets ``variables["SDC_JOB_ID"]`` when neither it nor the environment
    does: from the launcher (torchrun's TORCHELASTIC_RUN_ID, a PyTorchJob's
    PET_RDZV_ID, SLURM_JOB_ID), or, under torchrun's static rendezvous (run id
    "none"), one that the group's rank 0 draws and every rank receives (a
    collective, like the Guard's creation). Rank 0 says which on stderr.
    ValueError when nothing names the job outside torchrun."""
    job_id, source = _C.job_id(variables)
    if not job_id and os.environ.get("TORCHELASTIC_RUN_ID") == "none":
        drawn = [None]
        if dist.get_rank(group) == 0:
            drawn[0] = "torchrun-{}-{}-{}".format(
                socket.gethostname().split(".")[0], time.strftime("%Y%m%d-%H%M%S"),
                secrets.token_hex(3))
        dist.broadcast_object_list(drawn, src=dist.get_global_rank(group, 0), group=group)
        job_id = drawn[0]
        source = ("drawn by rank 0: torchrun without --rdzv_id names no job; set SDC_JOB_ID or "
                  "--rdzv_id so sdcd sees this job's restarts as one job")
    if not job_id:
        raise ValueError(source)
    if dist.get_rank(group) == 0 and source != "SDC_JOB_ID":
        print(f"sdc_guard: job id {job_id!r} ({source})", file=sys.stderr, flush=True)
    variables["SDC_JOB_ID"] = job_id


class Step:
    """One guarded step, as ``with guard.step(n, batch) as s``.

    Inside the block call ``s.backward(loss)`` for each micro-batch (in place
    of ``loss.backward()``). After the block ``s.apply`` says whether to run
    ``optimizer.step()``: the same on every rank. A skipped step's gradients
    are zeroed already.
    """

    def __init__(self, guard, step, batch, micro_batches):
        self._guard = guard
        self.step = step
        self._tensors, self._rebuild = _flatten(batch)
        self.micro_batches = micro_batches
        self._backwards = 0
        self._forward_seen = False
        self._deterministic_before = None
        self._warnings = None  # On audit steps: (catch_warnings, its record list).
        # Set after the block:
        self.apply = True
        self.reason = ""
        self.audited = False
        self.audit_outcome = ""
        self.audit_unverified = False
        self.repaired = False
        self.grad_norm = 0.0
        self.loss = None  # The first micro-batch's loss, as passed to backward().
        self.timings_ms = {}

    def __enter__(self):
        g = self._guard
        if g._current is not None:
            raise GuardError("FAILED_PRECONDITION: a guarded step is already open")
        self._deterministic_before = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        engine = g._engine()
        engine.begin_step(self.step, self._tensors, self.micro_batches)
        if engine.auditing:
            # Deterministic algorithms run warn-only on audit steps: an op
            # without a deterministic implementation warns, and the engine
            # turns audits off for the job instead of training stopping.
            catcher = warnings.catch_warnings(record=True)
            self._warnings = (catcher, catcher.__enter__())
            warnings.simplefilter("always")
        g._current = self
        g._rebuild = self._rebuild
        g._hook_calls_this_step = 0
        g._original_from_hook = False
        return self

    def backward(self, loss, **backward_kwargs):
        """``loss.backward()`` for one micro-batch; the first one's loss is
        what a peer's replay of this rank's batch must reproduce bit for bit
        (``loss_fn(model, batch) / micro_batches``)."""
        g = self._guard
        if g._current is not self:
            raise GuardError("FAILED_PRECONDITION: Step.backward outside its `with` block")
        first = self._backwards == 0
        self._backwards += 1
        g._first_backward = first
        try:
            loss.backward(**backward_kwargs)
        finally:
            g._first_backward = False
        if first:
            self.loss = loss.detach()
            engine = g._engine()
            engine.record_first_micro_batch(self.loss, g._loss_scale())
            if engine.auditing and not g._original_from_hook:
                # Accumulated locally (no_sync): .grad holds this micro-batch's own gradients.
                engine.record_original_gradients_from_parameters()
        return loss

    def _end_warnings(self):
        """Stops recording warnings: a deterministic-algorithms alert goes to the
        engine, every other warning on to the trainer's own filters."""
        if self._warnings is None:
            return
        catcher, records = self._warnings
        self._warnings = None
        catcher.__exit__(None, None, None)
        for w in records:
            text = str(w.message)
            at = text.find(_NO_DETERMINISTIC)
            if at >= 0:
                self._guard._engine().note_nondeterministic(
                    text[:min(at, 48)] + " has no deterministic implementation")
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                       source=w.source)

    def __exit__(self, exc_type, exc, tb):
        g = self._guard
        g._current = None
        self._end_warnings()
        if exc_type is not None:
            torch.use_deterministic_algorithms(
                self._deterministic_before[0], warn_only=self._deterministic_before[1])
            return False
        if self._backwards == 0:
            torch.use_deterministic_algorithms(
                self._deterministic_before[0], warn_only=self._deterministic_before[1])
            raise GuardError(
                "FAILED_PRECONDITION: no Step.backward(loss) in a guarded step (the audit needs "
                "the loss the rank trained on: call s.backward(loss) instead of loss.backward())")
        if g._hook_calls_this_step == 0:
            torch.use_deterministic_algorithms(
                self._deterministic_before[0], warn_only=self._deterministic_before[1])
            raise GuardError(
                "FAILED_PRECONDITION: the gradients were not all-reduced in this step (every "
                "micro-batch ran under no_sync()?): the last micro-batch's backward must sync")
        d = g._engine().finish()
        self.apply = d["apply"]
        self.reason = d["reason"]
        self.audited = d["audited"]
        self.audit_outcome = d["audit_outcome"]
        self.audit_unverified = d["audit_unverified"]
        self.repaired = d["repaired"]
        self.grad_norm = d["grad_norm"]
        self.timings_ms = {k: d[k] for k in ("check1_ms", "agreement_ms", "audit_ms")}
        g.last_step = self
        return False


class Guard:
    """sdc-guard around a DistributedDataParallel model.

    ``loss_fn(module, batch)`` computes one micro-batch's loss; the guard calls
    it with the model's wrapped module (``model.module``) to replay a peer's
    micro-batch, so it must be a pure function of the module's parameters and
    buffers, the batch and the RNG state. Creating a Guard is a collective
    (every rank of the process group calls it). Raises TypeError for a model
    that is not DDP, RuntimeError when torch.distributed is not initialised,
    ValueError for options out of range; nothing is registered on the model
    unless the guard is fully created.

    With mixed precision under ``torch.amp.GradScaler``, pass it as
    ``grad_scaler`` and call ``s.backward(scaler.scale(loss))``: a peer's
    replay then multiplies the loss by the same scale. Module buffers join
    the weight vote as each step's forward reads them (after DDP's buffer
    broadcast); with ``broadcast_buffers=False`` every replica keeps its own
    running statistics, so they are left out of the vote (``vote_buffers``
    overrides) and only the replay audit checks how a forward updates them.
    """

    def __init__(self, model, optimizer, loss_fn, *, process_group=None, grad_scaler=None,
                 **options):
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                "sdc_guard.Guard needs the model wrapped in "
                "torch.nn.parallel.DistributedDataParallel, got "
                f"{type(model).__module__}.{type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not callable(loss_fn):
            raise TypeError("loss_fn: expected a callable loss_fn(module, batch) -> loss tensor")
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(unknown)} (known: {', '.join(_OPTIONS)})")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: call torch.distributed.init_process_group() "
                "before creating the guard (torchrun sets the environment it needs)")
        if grad_scaler is not None and not hasattr(grad_scaler, "get_scale"):
            raise TypeError(
                f"grad_scaler: expected a torch.amp.GradScaler, got {type(grad_scaler).__name__}")
        variables = _variables(options)
        if options.get("vote_buffers") is None and "SDC_VOTE_BUFFERS" not in os.environ:
            variables["SDC_VOTE_BUFFERS"] = "1" if model.broadcast_buffers else "0"
        self.grad_scaler = grad_scaler
        self.model = model
        self.module = model.module
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.process_group = process_group if process_group is not None else model.process_group
        self._world = dist.get_world_size(self.process_group)
        _resolve_job_id(variables, self.process_group)
        params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        # Frozen parameters (a frozen backbone, LoRA's base weights) are most
        # of what a checkpoint stores: the weight vote checks them too.
        frozen = [(n, p) for n, p in self.module.named_parameters() if not p.requires_grad]
        buffers = list(self.module.named_buffers())
        self._index = {id(p): i for i, (_, p) in enumerate(params)}
        self._current = None
        self._rebuild = None
        self._first_backward = False
        self._original_from_hook = False
        self._hook_calls_this_step = 0
        self.hook_calls = 0
        self.last_step = None
        self._closed = False
        self._core = _C.Engine(
            self.process_group,
            [n for n, _ in params], [p for _, p in params],
            [n for n, _ in buffers], [b for _, b in buffers],
            self._optimizer_state, self._replay_loss, variables,
            [n for n, _ in frozen], [p for _, p in frozen])
        try:
            model.register_comm_hook(None, self._comm_hook)
            # After DDP's buffer broadcast, before the module's own forward
            # (BeginStep's copy serves a model without buffers: no hook).
            self._forward_hook = (self.module.register_forward_pre_hook(self._before_forward)
                                  if buffers else None)
        except Exception:
            self._core.shutdown(0.0)
            self._closed = True
            raise

    # -- the step -------------------------------------------------------------

    def step(self, step, batch, micro_batches=1):
        """The context manager of step ``step`` (a positive integer that grows by
        one each step). ``batch`` is the first micro-batch (the one a peer
        replays on audit steps): a tensor, a list or tuple of tensors, or a dict
        of str to tensor, as ``loss_fn`` takes it. ``micro_batches`` is how many
        micro-batches the step accumulates (each micro-batch's loss divided by it)."""
        if self._closed:
            raise GuardError("FAILED_PRECONDITION: the guard was shut down")
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 1:
            raise ValueError(f"step={step!r}: expected a positive integer")
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, numbers.Integral) \
                or micro_batches < 1:
            raise ValueError(f"micro_batches={micro_batches!r}: expected a positive integer")
        return Step(self, int(step), batch, int(micro_batches))

    def after_optimizer_step(self, checkpoint=False):
        """Check 3 after ``optimizer.step()`` (or after a skipped step):
        fingerprints the weights on weight-check steps, and always with
        ``checkpoint=True`` (then the optimizer state too). Training does not
        wait for the verdict. Returns the milliseconds it took."""
        return self._engine().after_optimizer_step(bool(checkpoint))

    def may_checkpoint(self):
        """True when sdcd allows a checkpoint of this step; the same on every
        rank (a collective). Needs ``after_optimizer_step(checkpoint=True)``
        at this step. An allowed checkpoint is provisional: see
        ProvisionalCheckpoints."""
        return self._engine().may_checkpoint()

    def checkpoint_standing(self, step):
        """'final', 'provisional' or 'revoked': where the checkpoint of ``step``
        stands, as of the last may_checkpoint or refresh_checkpoints."""
        return self._engine().checkpoint_standing(int(step))

    def refresh_checkpoints(self, timeout_seconds=5.0):
        """Asks sdcd where the checkpoints stand (not a collective)."""
        self._engine().refresh_checkpoints(float(timeout_seconds))

    def fault_point(self, activation):
        """A point in the model's forward where tests and demos inject faults;
        returns ``activation`` unchanged unless fault injection is armed."""
        return self._engine().fault_point(activation)

    def summary(self):
        """Counters of this rank's guard (steps, skips, audits, reports...)."""
        return self._engine().summary()

    @property
    def rank(self):
        return self._engine().rank

    @property
    def world_size(self):
        return self._engine().world_size

    def shutdown(self, flush_seconds=5.0):
        """Flushes this rank's reports to sdcd (up to ``flush_seconds``) and
        stops the link. summary(), refresh_checkpoints() and the checkpoint
        standings still answer; a new step is refused. The communication hook
        stays registered (DDP cannot remove one) and fails a backward pass."""
        if not self._closed:
            self._closed = True
            self._core.shutdown(float(flush_seconds))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

    # -- what the engine and DDP call -----------------------------------------

    def _engine(self):
        return self._core

    def _before_forward(self, module, args):
        """The buffers as the first micro-batch's forward reads them (a replay of
        this rank's batch starts from them). Replays run outside a step."""
        s = self._current
        if s is not None and not s._forward_seen:
            s._forward_seen = True
            self._engine().capture_forward_buffers()

    def _loss_scale(self):
        """The grad scaler's current scale as a float32 tensor, or None."""
        scaler = self.grad_scaler
        if scaler is None or not scaler.is_enabled():
            return None
        get = getattr(scaler, "_get_scale_async", None)
        scale = get() if get is not None else None
        if scale is None:  # Not initialised yet, or an older torch.
            scale = torch.tensor(float(scaler.get_scale()), dtype=torch.float32)
        return scale

    def _replay_loss(self, tensors):
        return self.loss_fn(self.module, self._rebuild(tensors))

    def _optimizer_state(self):
        """Every tensor of the optimizer's state (any optimizer: its ``state``
        holds them, amsgrad's ``max_exp_avg_sq`` included), in parameter-group
        order. Tensors on another device than their parameter (Adam's CPU
        ``step`` counters beside GPU weights) are host state and left out."""
        out = []
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if not state:
                    continue
                for key in sorted(state):
                    value = state[key]
                    if isinstance(value, torch.Tensor) and value.device == p.device:
                        out.append(value)
        return out

    def _comm_hook(self, state, bucket):
        """DDP's all-reduce of one gradient bucket, with check 1 on both sides.
        Averages as DDP's own reducer does (sum of gradients each multiplied by
        1/world), so a clean guarded run trains bit for bit as unguarded."""
        engine = self._engine()
        if self._current is None or self._closed:
            raise GuardError(
                "FAILED_PRECONDITION: backward() ran outside guard.step(): a guarded DDP model "
                "trains inside `with guard.step(...)`")
        buffer = bucket.buffer()
        if self._first_backward and engine.auditing:
            indices = [self._index[id(p)] for p in bucket.parameters()]
            engine.record_original_gradients(indices, bucket.gradients())
            self._original_from_hook = True
        engine.scan_local_bucket(buffer)
        self._hook_calls_this_step += 1
        self.hook_calls += 1
        buffer.mul_(1.0 / self._world)
        index = bucket.index()
        future = dist.all_reduce(buffer, group=self.process_group, async_op=True).get_future()

        def reduced(fut):
            tensor = fut.value()[0]
            engine.add_reduced_bucket(index, tensor)
            return tensor

        return future.then(reduced)
