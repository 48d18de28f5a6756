"""sdc_guard.Guard: the C++ engine around a DistributedDataParallel model
or an HSDP module (FSDP2 on a replicate x shard DeviceMesh; sharded.py).

What runs where:
  * check 1 (non-finite gradients) inside a DDP communication hook
    (hooks.py): each gradient bucket is scanned before its all-reduce (and
    before the trainer's own hook, which runs inside the guard's) and handed
    to the engine after it, so communication overlaps backward as in plain
    DDP; on an HSDP module in FSDP's reduce-scatter (local gradients) and
    all-reduce hook (the reduced shard), sharded.py;
  * check 2 (ring replay audit) and the agreement collective in
    ``Step.__exit__``, after backward and before the optimizer step; the
    agreement runs only at audit steps and at steps whose reduced gradients
    hold NaN/Inf, so an ordinary step issues DDP's collectives and no
    other (docs/ARCHITECTURE.md, "Ordinary steps issue no collective");
  * the optimizer step, applied or skipped as ``GradScaler.step`` does
    (``optimizer_step``, amp.py), then check 3 (weight fingerprints),
    asynchronous, before the next step or checkpoint;
  * the checkpoint gate in ``may_checkpoint``.
The decisions, kernels and reports are the engine's (client/guard_engine.h).
"""

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

from sdc_guard import _C, amp, buddy, checksums, hooks, notices, shard_replay, sharded
from sdc_guard import options as guard_options
from sdc_guard._C import GuardError

# How libtorch words a warn-only deterministic-algorithms alert.
_NO_DETERMINISTIC = " does not have a deterministic implementation"

# What the peer exchange carries: at most this many tensors of at most this
# many dimensions (the engine's header, client/guard_engine.cc).
_MAX_BATCH_TENSORS = 6
_MAX_DIMS = 6


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
        self.overflow = False  # The loss scaler's overflow: see Guard.optimizer_step.
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
        g._run_weight_check(checkpoint=False)  # The previous step's check 3, if still due.
        self._deterministic_before = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        engine = g._engine()
        engine.begin_step(self.step, self._tensors, self.micro_batches)
        g._fault_now = engine.activation_fault(self.step)  # Read by fault_point, eagerly.
        if g._buddy is not None:
            finding = g._buddy.take_pending()
            if finding is not None:  # Every rank skips this step with it as the reason.
                engine.note_failure(finding)
        if engine.auditing:
            # Deterministic algorithms run warn-only on audit steps: an op
            # without a deterministic implementation warns, and the engine
            # turns audits off for the job instead of training stopping.
            catcher = warnings.catch_warnings(record=True)
            self._warnings = (catcher, catcher.__enter__())
            warnings.simplefilter("always")
        if g._shard_replay is not None:  # What a peer's replay starts from.
            g._shard_replay.begin(self)
        if g._reduced_shards is not None:
            # FSDP accumulates into a sharded .grad it finds; the engine's
            # BeginStep cleared only the local tensors' (which FSDP never sets).
            for p in g._sharded_params:
                p.grad = None
            g._reduced_shards.index = 0
        g._current = self
        g._rebuild = self._rebuild
        if g._checks is not None:  # Every-step checksums of the forward and backward.
            g._checks.begin(self.step)
            g._checks.__enter__()
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
            if g._shard_replay is not None:
                g._shard_replay.first_loss(self.loss, amp.loss_scale(g.grad_scaler))
            try:
                engine.record_first_micro_batch(self.loss, amp.loss_scale(g.grad_scaler))
                if engine.auditing and not g._original_from_hook:
                    # Accumulated locally (no_sync): .grad holds this micro-batch's own gradients.
                    engine.record_original_gradients_from_parameters()
            except Exception as e:  # noqa: BLE001  (fails the step on every rank, at its end)
                engine.note_failure(f"recording the first micro-batch: {type(e).__name__}: {e}")
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

    def _abandon(self):
        """Leaves a step that never reaches the engine's end: the process's
        deterministic setting (and the engine's warning handler) as before."""
        self._guard._engine().abort_step()
        if self._guard._shard_replay is not None:
            self._guard._shard_replay.abandon()
        torch.use_deterministic_algorithms(
            self._deterministic_before[0], warn_only=self._deterministic_before[1])

    def __exit__(self, exc_type, exc, tb):
        g = self._guard
        g._current = None
        if g._checks is not None:  # Before Finish: peers' replays are not checked.
            g._checks.__exit__(None, None, None)
        self._end_warnings()
        if exc_type is not None:
            # The trainer's own error: this rank leaves the step (as it would
            # leave plain DDP's); the process is put back as it was.
            self.apply, self.reason = False, f"{exc_type.__name__} inside the guarded step"
            self._abandon()
            return False
        if self._backwards == 0:
            self._abandon()
            raise GuardError(
                "FAILED_PRECONDITION: no Step.backward(loss) in a guarded step (the audit needs "
                "the loss the rank trained on: call s.backward(loss) instead of loss.backward())")
        if g._hook_calls_this_step == 0:
            self._abandon()
            raise GuardError(
                "FAILED_PRECONDITION: the gradients were not all-reduced in this step (every "
                "micro-batch ran under no_sync()?): the last micro-batch's backward must sync")
        g.last_step = self
        g._stepped = False
        sharded_outcome = None  # A sharded layout's replay audit of this step.
        if g._shard_replay is not None and g._shard_replay.active:
            # Before the agreement: a finding fails this very step everywhere.
            try:
                finding, sharded_outcome = g._shard_replay.run(self.step)
            except GuardError:  # ABORTED: the collectives diverged (shard_replay.py).
                self.apply, self.reason = False, "the sharded replay audit aborted"
                self._abandon()
                raise
            self.audited, self.audit_outcome = True, sharded_outcome
            if finding:  # This rank's finding, or its replay's error: the step fails.
                g._engine().note_failure(finding)
        try:
            d = g._engine().finish()
        except GuardError as e:
            # Every rank raises this same error at this step (a rank's check
            # failed, or the preflight): the step is skipped everywhere, and
            # a trainer that catches it may train on.
            self.apply, self.reason = False, str(e)
            if g._reduced_shards is not None:
                g._zero_sharded_gradients()
            if checksums.ALARM_MARK in str(e):
                # A rank's product checksum failed: every rank has this same
                # error, so every rank skips the step here and trains on.
                g.checksum_skips += 1
                return False
            if buddy.MARK in str(e):
                # The buddy check's finding of the last check (every rank
                # holds it): the carrier step is skipped everywhere.
                return False
            raise
        self.apply = d["apply"]
        self.reason = d["reason"]
        if not self.apply and not d["overflow"] and g._reduced_shards is not None:
            g._zero_sharded_gradients()
        self.overflow = d["overflow"]
        self.audited = d["audited"] or sharded_outcome is not None
        self.audit_outcome = sharded_outcome or d["audit_outcome"]
        self.audit_unverified = d["audit_unverified"]
        self.repaired = d["repaired"]
        self.grad_norm = d["grad_norm"]
        self.timings_ms = {k: d[k] for k in ("check1_ms", "agreement_ms", "audit_ms")}
        return False


class Guard:
    """sdc-guard around a DistributedDataParallel model, or an HSDP module
    (``fully_shard`` over a 2-D DeviceMesh whose parameters are placed
    ``(Replicate(), Shard(d))``): the ranks that hold one shard are that
    shard's replica group, voted on and compared among themselves
    (sharded.py). On FSDP2 and HSDP replay audits replay every rank's ring
    partner at once (shard_replay.py), and ``comm_hook``, ``max_grad_norm`` and ``replica_group`` are refused; a
    module's buffers are each rank's own (FSDP does not broadcast them), so
    they leave the weight vote unless ``vote_buffers=True``. FSDP2 on a 1-D
    mesh (no replicas) gets the buddy check of its optimizer step instead of
    a vote (buddy.py; ``buddy_slice=`` elements per check), and so does a
    DDP model whose optimizer is a ``ZeroRedundancyOptimizer`` (ZeRO-1,
    ``overlap_with_ddp=False``), found from ``optimizer``: each rank's
    partition update is verified, while check 1, the weight vote and replay
    audits run as for DDP. A tensor-parallel model replicated over a dp dim
    gets the weight vote per tp shard and replay audits of whole tp groups
    (tensor_parallel.py); other layouts raise TypeError.

    ``loss_fn(module, batch)`` computes one micro-batch's loss; the guard calls
    it with the model's wrapped module (``model.module``) to replay a peer's
    micro-batch, so it must be a pure function of the module's parameters and
    buffers, the batch and the RNG state. Creating a Guard is a collective
    (every rank of the process group calls it). Raises TypeError for a model
    that is not DDP, RuntimeError when torch.distributed is not initialised,
    ValueError for options out of range; nothing is registered on the model
    unless the guard is fully created.

    With mixed precision, autocast goes inside ``loss_fn`` (replays must run
    it too). Under ``torch.amp.GradScaler``, pass it as ``grad_scaler``,
    call ``s.backward(scaler.scale(loss))`` and end each step with
    ``guard.optimizer_step(optimizer)``: a peer's replay multiplies the loss
    by the same scale, and an overflow is the scaler's (skipped and backed
    off, no incident). A DDP communication hook of the trainer's
    (compression, PowerSGD) goes in ``comm_hook=(state, hook)``: it runs
    inside the guard's, after check 1 has seen the local bucket. Module buffers join
    the weight vote as each step's forward reads them (after DDP's buffer
    broadcast); with ``broadcast_buffers=False`` every replica keeps its own
    running statistics, so they are left out of the vote (``vote_buffers``
    overrides) and only the replay audit checks how a forward updates them.

    After a restart, pass ``resume_step=`` the step of the checkpoint the
    run resumed from (``ProvisionalCheckpoints.latest_final_step()``): sdcd
    takes every launcher restart of the whole job as a new attempt (torchrun's
    ``TORCHELASTIC_RESTART_COUNT``, after ``attempt=``/``SDC_ATTEMPT`` or
    Slurm's ``SLURM_RESTART_COUNT`` for a launcher that starts torchrun again) and
    warns about, or refuses, a resume from a checkpoint it never called final.
    """

    def __init__(self, model, optimizer, loss_fn, *, process_group=None, grad_scaler=None,
                 comm_hook=None, **options):
        sharded.check_kind(model)  # TypeError for a model neither DDP nor FSDP2, first.
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        zero = buddy.zero_optimizer(optimizer)
        if zero and not isinstance(model, DistributedDataParallel):
            raise TypeError(
                "optimizer: a ZeroRedundancyOptimizer is covered around a "
                "DistributedDataParallel model (ZeRO-1); an FSDP2 module shards its optimizer "
                "state itself: pass it a torch.optim optimizer")
        if not callable(loss_fn):
            raise TypeError("loss_fn: expected a callable loss_fn(module, batch) -> loss tensor")
        every_step = guard_options.every_step(options.pop(guard_options.EVERY_STEP[0], None))
        buddy_slice = guard_options.buddy_slice(options.pop(guard_options.BUDDY_SLICE[0], None))
        unknown = sorted(set(options) - set(guard_options.KNOWN))
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(unknown)} (known: {', '.join(guard_options.names())})")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised: call torch.distributed.init_process_group() "
                "before creating the guard (torchrun sets the environment it needs)")
        if grad_scaler is not None:
            amp.check_scaler(grad_scaler)
        layout = sharded.layout_of(model, process_group)
        hook_state, hook = hooks.check_user_hook(comm_hook)
        variables = guard_options.variables(options)
        if layout.sharded:
            guard_options.check_sharded(layout, options, hook)
            audit_every = int(variables.get("SDC_AUDIT_EVERY",
                                            os.environ.get("SDC_AUDIT_EVERY", "") or 100))
            variables.update(layout.variables())
        else:
            if hook is not None:
                model._check_comm_hook(hook)  # DDP's own checks of the hook (bf16's needs NCCL).
            existing = hooks.registered_hook(model)
            if existing is not None:
                raise ValueError(
                    f"the model already has a DDP communication hook ({existing}), and DDP takes "
                    "one: register none and pass it to the guard instead, Guard(..., comm_hook="
                    "(state, hook)), which runs it inside its own after check 1 has seen the "
                    "local bucket")
        if options.get("vote_buffers") is None and "SDC_VOTE_BUFFERS" not in os.environ:
            broadcast = not layout.sharded and model.broadcast_buffers
            variables["SDC_VOTE_BUFFERS"] = "1" if broadcast else "0"
        self.layout = layout
        self.grad_scaler = grad_scaler
        self.model = model
        self.module = layout.module
        self.optimizer = optimizer
        self._zero = zero
        self.loss_fn = loss_fn
        self.process_group = layout.process_group
        self._world = dist.get_world_size(self.process_group)
        _resolve_job_id(variables, self.process_group)
        # On HSDP each rank holds its shard of every parameter: the engine
        # checks and votes on those local tensors (the same storage).
        params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        self._sharded_params = [p for _, p in params] if layout.sharded else []
        params = [(n, sharded.local(p)) for n, p in params]
        # Frozen parameters (a frozen backbone, LoRA's base weights) are most
        # of what a checkpoint stores: the weight vote checks them too.
        frozen = [(n, sharded.local(p)) for n, p in self.module.named_parameters()
                  if not p.requires_grad]
        buffers = list(self.module.named_buffers())
        self._index = {id(p): i for i, (_, p) in enumerate(params)}
        self._current = None
        self._rebuild = None
        self._first_backward = False
        self._fault_now = False  # An injected activation fault may fire in this step.
        self._original_from_hook = False
        self._hook_calls_this_step = 0
        self.hook_calls = 0
        self.last_step = None
        self._stepped = True  # No step waits for its optimizer step.
        self._weight_check_due = False
        self.weight_check_total_ms = 0.0  # Check 3's time so far (its calls are lazy).
        self._closed = False
        self._checks = None
        self.checksum_skips = 0  # Steps skipped on every rank for a failed checksum.
        self.buddy_vetoes = 0  # Checkpoints the buddy check's findings vetoed.
        self._reduced_shards = None  # HSDP: FSDP's all-reduce hook (sharded.ReducedShards).
        self._buddy = None  # FSDP without replicas, or ZeRO: the buddy check (buddy.py).
        self._shard_replay = None  # Sharded layouts: replay audits (shard_replay.py).
        self._engine_replaying = False  # While the engine runs loss_fn for a replay.
        partition = None  # What the buddy check verifies; refused here, before any hook.
        if layout.kind == "fsdp":
            partition = buddy.fsdp_partition(optimizer, self._sharded_params)
        elif zero:
            partition = buddy.zero_partition(optimizer, self.process_group)
        self._core = _C.Engine(
            self.process_group,
            [n for n, _ in params], [p for _, p in params],
            [n for n, _ in buffers], [b for _, b in buffers],
            self._optimizer_state, self._replay_loss, variables,
            [n for n, _ in frozen], [p for _, p in frozen])
        try:
            if every_step:
                self._checks = checksums.ProductChecks(self._core, self._core.rank)
            if layout.sharded:
                self.comm_hook = None
                self._reduced_shards = sharded.install(self, layout)
            else:
                self.comm_hook = hooks.GuardHook(self, hook_state, hook)
                model.register_comm_hook(None, self.comm_hook)
            if zero:
                notices.say_once("zero", (
                    f"sdc_guard: ZeRO-1 ({type(optimizer.optim).__name__} partitioned over "
                    f"{self._world} ranks): the buddy check verifies each rank's partition "
                    "update on weight-check steps; check 1, the weight vote and replay audits "
                    "run as for DDP; the optimizer state (each rank's own) is left out of the "
                    "checkpoint digest"), self.rank)
            node = variables.get("SDC_NODE_NAME") or os.environ.get("SDC_NODE_NAME") or \
                socket.gethostname()
            if layout.sharded and audit_every > 0:
                self._shard_replay = shard_replay.ShardReplay(self, audit_every, node)
                if self._shard_replay.off_reason:
                    notices.say_once("replay-off", self._shard_replay.off_reason, self.rank)
            if partition is not None:
                self._buddy = buddy.BuddyCheck(self._core, partition, self.process_group, node,
                                               buddy_slice)
                if grad_scaler is not None and self._buddy.enabled:
                    self._buddy.off_reason = (
                        "the buddy check of the sharded optimizer step is off under a loss "
                        "scaler: scaler.step unscales the gradients inside the step")
                if self._buddy.off_reason:
                    notices.say_once("buddy-off", self._buddy.off_reason, self.rank)
            # After DDP's buffer broadcast, before the module's own forward
            # (BeginStep's copy serves a model without buffers: no hook).
            self._forward_hook = (self.module.register_forward_pre_hook(self._before_forward)
                                  if buffers else None)
        except Exception:
            self._core.shutdown(0.0)
            self._closed = True
            raise
        fallback = variables.get("SDC_CHECKPOINT_FALLBACK",
                                 os.environ.get("SDC_CHECKPOINT_FALLBACK", "veto"))
        notices.say_once("checkpoint-gate", notices.checkpoint_notice(self._core.coordinator,
                                                                      fallback), self.rank)

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

    def optimizer_step(self, optimizer=None, scaler=None, *, apply=None):
        """Ends the guarded step as ``GradScaler.step`` ends an iteration:
        steps ``optimizer`` (the guard's by default; or a list) when the step
        applies, and under a loss scaler (the guard's ``grad_scaler``) runs
        ``scaler.step`` and always ``scaler.update()``, so an overflow backs
        the scale off and a step the guard skipped leaves the scale as it
        was (amp.py). ``apply``: a callable that steps the optimizer the
        framework's own way (a precision plugin, a wrapped optimizer), called
        in place of ``optimizer.step()`` only when the step applies (not with
        a loss scaler: the framework's then owns the step). Check 3 then runs
        before the next step or checkpoint. Returns whether the optimizer
        stepped (the same on every rank)."""
        s = self.last_step
        if s is None or self._stepped:
            raise GuardError("FAILED_PRECONDITION: optimizer_step() needs a guarded step that "
                             "has not been stepped yet (`with guard.step(...)` first)")
        if scaler is not None and scaler is not self.grad_scaler:
            raise ValueError("scaler: not the guard's grad_scaler (pass the GradScaler to "
                             "Guard(grad_scaler=...), whose scale replays multiply by)")
        if apply is not None and not callable(apply):
            raise TypeError(f"apply: expected a callable, got {type(apply).__name__}")
        if apply is not None and self.grad_scaler is not None:
            raise ValueError("apply: not with the guard's grad_scaler (its step and update are "
                             "the guard's to run)")
        self._stepped = True
        self._weight_check_due = True
        if apply is not None:
            def run():
                if s.apply:
                    apply()
                return s.apply
        else:
            def run():
                return amp.finish_step(s, self.optimizer if optimizer is None else optimizer,
                                       self.grad_scaler)
        b = self._buddy
        if b is None:
            return run()
        every = self._engine().weight_check_every
        check = (b.enabled and s.apply and every > 0 and s.step % every == 0
                 and (optimizer is None or optimizer is self.optimizer))
        return b.around_step(s.step, run, check, repaired=s.repaired)

    def _run_weight_check(self, checkpoint):
        """Check 3 of the step optimizer_step ended, if still due."""
        if not self._weight_check_due:
            return 0.0
        return self.after_optimizer_step(checkpoint)

    def after_optimizer_step(self, checkpoint=False):
        """Check 3 after ``optimizer.step()`` (or after a skipped step), for
        loops that step the optimizer themselves (``optimizer_step`` does
        this on its own): fingerprints the weights on weight-check steps,
        and always with ``checkpoint=True`` (then the optimizer state too).
        Training does not wait for the verdict. Returns the milliseconds it
        took."""
        self._weight_check_due = False
        ms = self._engine().after_optimizer_step(bool(checkpoint))
        self.weight_check_total_ms += ms
        return ms

    def may_checkpoint(self):
        """True when sdcd allows a checkpoint of this step; the same on every
        rank (a collective). After ``optimizer_step`` it runs the step's
        weight check with the optimizer state itself; a loop that steps on
        its own calls ``after_optimizer_step(checkpoint=True)`` first. An
        allowed checkpoint is provisional: see ProvisionalCheckpoints."""
        self._run_weight_check(checkpoint=True)
        if self._buddy is not None and self._buddy.veto:
            # Every rank holds the same finding: the shard carries a corrupted
            # update or a corruption at rest, which no later checkpoint may keep.
            self.buddy_vetoes += 1
            return False
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
        returns ``activation`` unchanged unless fault injection is armed (and
        never in a sharded layout's replays, shard_replay.py). The engine is
        called only on a step where this rank's fault fires: torch.compile
        cannot trace that call, and the graph break it makes changes a
        compiled model's last bits on every step (dynamo then guards on the
        flag and compiles the faulty step apart)."""
        if not self._fault_now or (self._shard_replay is not None and
                                   self._shard_replay.replaying):
            return activation
        return self._engine().fault_point(activation)

    def summary(self):
        """Counters of this rank's guard (steps, skips, audits, reports...),
        and the every-step checksums': ``checksum_alarms`` (this rank's failed
        product checksums), ``checksum_skips`` (steps every rank skipped for
        any rank's), ``products_checked`` and ``products_unchecked`` (0 without
        ``every_step``)."""
        out = dict(self._engine().summary())
        c = self._checks
        out["every_step"] = c is not None
        out["checksum_alarms"] = c.alarms if c is not None else 0
        out["checksum_skips"] = self.checksum_skips
        out["products_checked"] = c.checked if c is not None else 0
        out["products_unchecked"] = c.unchecked if c is not None else 0
        b = self._buddy
        out["buddy_checks"] = b.checks if b is not None else 0
        out["buddy_findings"] = len(b.findings) if b is not None else 0
        out["buddy_bytes_sent"] = b.bytes_sent if b is not None else 0
        out["buddy_ms"] = b.ms if b is not None else 0.0
        out["buddy_vetoes"] = self.buddy_vetoes
        a = self._shard_replay
        out["sharded_audits"] = a.audits if a is not None else 0
        out["sharded_audit_mismatches"] = a.mismatches if a is not None else 0
        out["sharded_audit_ms"] = a.ms if a is not None else 0.0
        return out

    @property
    def step_pending(self):
        """True between a guarded step's end and its ``optimizer_step``: the
        gradients the guard checked, waiting to be applied or skipped."""
        return self.last_step is not None and not self._stepped

    @property
    def replaying(self):
        """True while the guard runs loss_fn on a batch only to check it (a
        replay audit, the preflight), not to train: a loss_fn or hook may
        leave out side effects (logging, counters) then."""
        a = self._shard_replay
        return self._engine_replaying or (a is not None and a.replaying)

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
            try:
                self._run_weight_check(checkpoint=False)  # The last step's, if still due.
            finally:
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

    def _zero_sharded_gradients(self):
        """A skipped step's sharded gradients, zeroed as the engine zeroes DDP's."""
        with torch.no_grad():
            for p in self._sharded_params:
                if p.grad is not None:
                    p.grad.zero_()

    def _replay_loss(self, tensors):
        self._engine_replaying = True
        try:
            return self.loss_fn(self.module, self._rebuild(tensors))
        finally:
            self._engine_replaying = False

    def _optimizer_state(self):
        """Every tensor of the optimizer's state (any optimizer: its ``state``
        holds them, amsgrad's ``max_exp_avg_sq`` included), in parameter-group
        order. Tensors on another device than their parameter (Adam's CPU
        ``step`` counters beside GPU weights) are host state and left out.
        Under ZeRO none: each rank holds the state of its own partition, which
        no replica could match or repair (the buddy check reads it)."""
        out = []
        if self._zero:
            return out
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if not state:
                    continue
                for key in sorted(state):
                    value = state[key]
                    if isinstance(value, torch.Tensor) and value.device == p.device:
                        out.append(sharded.local(value))
        return out
