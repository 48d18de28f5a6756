"""Checkpoints kept apart until sdc-guard confirms them.

A checkpoint the guard allows is provisional: a GPU that corrupts an
unaudited step now and then may already be in it. It becomes final when the
next checkpoint is allowed, and is revoked if a GPU of the job is found
faulty first. ProvisionalCheckpoints writes each checkpoint under a
``.provisional`` name, renames it when the guard says it is final and
deletes it when revoked; resume only from final ones (``latest_final``).

The one call at a checkpoint step (after ``guard.optimizer_step``):
``checkpoint(step, state)`` asks the guard's gate (a collective), saves
``state`` with ``torch.distributed.checkpoint`` when allowed (its values
may be ``Stateful`` objects: ``TrainingState(model, optimizer, scaler)``
holds what a restart needs), and reconciles. ``finish()`` at the end asks
sdcd once more; ``restore(state)`` loads the newest final checkpoint.

The parts, for loops that checkpoint their own way:
  * ``save(step, obj)``: ``torch.save`` of ``obj`` to ``step-N.pt`` (rank
    ``writer_rank`` writes; the others return None);
  * ``save_distributed(step, state_dict)``: ``torch.distributed.checkpoint``
    into the directory ``step-N.dcp`` (every rank writes its shard: a
    collective).
``reconcile()`` (after each may_checkpoint, and at the end after
``guard.refresh_checkpoints()``) applies the guard's answers; rank
``writer_rank`` renames and deletes.

Provisional checkpoints already in the directory when it is opened belong
to an earlier run, whose guard this run never heard: they are reported
(``earlier_provisional``, and one line on stderr from the writing rank) and
never judged by this run's ledger; resume only from final ones, and delete
or keep the others knowingly.
"""

import os
import re
import shutil
import sys

import torch
import torch.distributed as dist

_NAME = re.compile(r"^step-(\d+)\.(pt|dcp)(\.provisional)?$")
PROVISIONAL = ".provisional"


class ProvisionalCheckpoints:
    def __init__(self, guard, directory, writer_rank=0):
        self.guard = guard
        self.directory = directory
        self.writer_rank = writer_rank
        os.makedirs(directory, exist_ok=True)
        self._written = set()  # The steps this run saved: the only ones reconcile judges.
        self.last_path = None
        self.earlier_provisional = sorted(s for s, (_, p) in self.steps().items() if p)
        if self.earlier_provisional and self._rank() == self.writer_rank:
            print(f"sdc_guard: {len(self.earlier_provisional)} provisional checkpoint(s) of an "
                  f"earlier run in {directory} (steps "
                  f"{', '.join(map(str, self.earlier_provisional))}): this run's guard never "
                  "allowed them and will not judge them; resume only from final ones, and keep "
                  "or delete these yourself", file=sys.stderr, flush=True)

    def _rank(self):
        return dist.get_rank() if dist.is_initialized() else 0

    def path(self, step, kind="pt", provisional=True):
        return os.path.join(self.directory, f"step-{step}.{kind}" + (PROVISIONAL if provisional else ""))

    def save(self, step, obj):
        """torch.save(obj) as the provisional checkpoint of ``step``; returns its
        path on the writing rank, None elsewhere."""
        if self._rank() != self.writer_rank:
            return None
        final = self.path(step)
        tmp = final + ".tmp"
        torch.save(obj, tmp)
        os.replace(tmp, final)  # Never a half-written checkpoint under the name.
        self._written.add(step)
        return final

    def save_distributed(self, step, state_dict):
        """torch.distributed.checkpoint.save of ``state_dict`` into the
        provisional directory of ``step`` (a collective); returns its path."""
        import torch.distributed.checkpoint as dcp

        target = self.path(step, kind="dcp")
        dcp.save(state_dict, checkpoint_id=target)
        self._written.add(step)
        return target

    def steps(self):
        """{step: (kind, provisional)} of the checkpoints in the directory."""
        out = {}
        for name in os.listdir(self.directory):
            m = _NAME.match(name)
            if m:
                out[int(m.group(1))] = (m.group(2), m.group(3) is not None)
        return out

    def reconcile(self):
        """Renames the provisional checkpoints the guard now calls final and
        deletes the revoked ones. Returns (promoted, deleted) step lists (on
        the writing rank; empty elsewhere)."""
        promoted, deleted = [], []
        if self._rank() != self.writer_rank:
            return promoted, deleted
        for step, (kind, provisional) in sorted(self.steps().items()):
            if step not in self._written:
                continue  # An earlier run's: reported, never judged.
            standing = self.guard.checkpoint_standing(step)
            source = self.path(step, kind, provisional)
            if standing == "revoked":
                if os.path.isdir(source):
                    shutil.rmtree(source)
                else:
                    os.remove(source)
                deleted.append(step)
            elif standing == "final" and provisional:
                os.replace(source, self.path(step, kind, provisional=False))
                promoted.append(step)
        return promoted, deleted

    def checkpoint(self, step, state, format="dcp"):
        """At a checkpoint step, after ``guard.optimizer_step``: the guard's
        gate (a collective, with the weight check it needs), then, when
        allowed, ``state`` saved as the provisional checkpoint of ``step``,
        then ``reconcile()``. ``format="dcp"``: ``torch.distributed.checkpoint``
        (every rank writes its shard, a collective); ``state`` is what
        ``dcp.save`` takes, a dict whose values may be ``Stateful``
        (``TrainingState``). ``format="torch"``: ``torch.save`` by the writing
        rank (Stateful values as their ``state_dict()``). Returns whether it
        was allowed and saved, the same on every rank; ``last_path`` is
        where (``guard.summary()["last_veto"]`` says why not)."""
        if format not in ("dcp", "torch"):
            raise ValueError(f"format={format!r}: 'dcp' or 'torch'")
        self.last_path = None
        allowed = self.guard.may_checkpoint()
        if allowed and format == "dcp":
            self.last_path = self.save_distributed(step, state)
        elif allowed:
            self.last_path = self.save(step, _materialized(state))
        self.reconcile()
        return allowed

    def finish(self, timeout_seconds=5.0):
        """At the end of training, after every rank's reports are in (after
        ``guard.shutdown()`` and a barrier): asks sdcd once more where the
        checkpoints stand, so a revocation after the last one is not missed,
        and reconciles. Returns False when sdcd could not be asked."""
        import sdc_guard

        asked = True
        try:
            self.guard.refresh_checkpoints(timeout_seconds=timeout_seconds)
        except sdc_guard.GuardError as e:
            print(f"sdc_guard: checkpoint standings unknown at the end: {e}", file=sys.stderr)
            asked = False
        self.reconcile()
        return asked

    def restore(self, state):
        """Loads the newest final ``torch.distributed.checkpoint`` checkpoint
        into ``state`` (as ``dcp.load``; a collective) and returns its step,
        or None when there is none."""
        import torch.distributed.checkpoint as dcp

        finals = [s for s, (k, p) in self.steps().items() if not p and k == "dcp"]
        if not finals:
            return None
        step = max(finals)
        dcp.load(state, checkpoint_id=self.path(step, kind="dcp", provisional=False))
        return step

    def latest_final_step(self):
        """The step of the newest final checkpoint, or None: the ``resume_step``
        of the guard of a restarted run."""
        return latest_final_step(self.directory)

    def latest_final(self):
        """The path of the newest final checkpoint, or None: where to resume."""
        finals = [(s, k) for s, (k, p) in self.steps().items() if not p]
        if not finals:
            return None
        step, kind = max(finals)
        return self.path(step, kind, provisional=False)


def latest_final_step(directory):
    """The step of the newest final checkpoint in ``directory`` (None when
    there is none): usable before the guard exists, to pass it as
    ``Guard(..., resume_step=...)``."""
    if not os.path.isdir(directory):
        return None
    steps = [int(m.group(1)) for m in map(_NAME.match, os.listdir(directory))
             if m and m.group(3) is None]
    return max(steps) if steps else None


def _materialized(state):
    """``state`` for torch.save: Stateful values as their state dicts."""
    if isinstance(state, dict):
        return {k: v.state_dict() if hasattr(v, "state_dict") and hasattr(v, "load_state_dict")
                else v for k, v in state.items()}
    return state.state_dict() if hasattr(state, "state_dict") else state


class TrainingState:
    """What a restart needs, as one ``torch.distributed.checkpoint`` Stateful:
    the model's and optimizer's state dicts (``get_state_dict``, so DDP's
    ``module.`` prefix and sharded optimizers are handled), the loss
    scaler's, and any other Stateful or state-dict object given by name.

        state = {"train": sdc_guard.TrainingState(model, optimizer, scaler)}
        checkpoints.checkpoint(step, state)   # at a checkpoint step
        step = checkpoints.restore(state)     # at start: the newest final one

    Sharded layouts: an FSDP2 or HSDP module's parameters and optimizer
    state are DTensors, which every rank saves its own shard of (a shard's
    replicas write it once) and loads back into the same storage. A
    ``ZeroRedundancyOptimizer`` holds each rank's partition state only
    (ZeRO-1): the model (replicated, written once) is saved as DDP's, and
    each rank saves its own local optimizer's state dict (its partition,
    with the settings of its parameter groups) under its own key, pickled
    whole (``zero_key``), with no consolidation on one rank; a restore
    needs the same world size and the same parameters in the same order,
    so ZeRO assigns each rank the same partition.
    """

    def __init__(self, model, optimizer, scaler=None, **extra):
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.extra = extra

    def _zero(self):
        from sdc_guard import buddy

        return buddy.zero_optimizer(self.optimizer)

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self._zero():
            out = {"model": get_model_state_dict(self.model),
                   "optimizer": {zero_key(self.optimizer): _zero_blob(self.optimizer)}}
        else:
            model, optimizer = get_state_dict(self.model, self.optimizer)
            out = {"model": model, "optimizer": optimizer}
        if self.scaler is not None:
            out["scaler"] = self.scaler.state_dict()
        for name, obj in self.extra.items():
            out[name] = obj.state_dict()
        return out

    def load_state_dict(self, state):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self._zero():
            set_model_state_dict(self.model, state["model"])
            _load_zero_blob(self.optimizer, state["optimizer"][zero_key(self.optimizer)])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        for name, obj in self.extra.items():
            obj.load_state_dict(state[name])


def zero_key(zero):
    """The key of this rank's ZeRO partition state in a checkpoint:
    ``rank-R-of-W`` of the ZeRO's process group."""
    group = zero.process_group
    return f"rank-{dist.get_rank(group)}-of-{dist.get_world_size(group)}"


def _zero_blob(zero):
    """This rank's local optimizer's state dict and the settings of ZeRO's
    own parameter groups (a scheduler changes those; ZeRO copies them into
    the local optimizer's at its next step), pickled: one opaque value,
    which torch.distributed.checkpoint writes as this rank's own bytes."""
    import io

    settings = [{k: v for k, v in g.items() if k != "params"} for g in zero.param_groups]
    buffer = io.BytesIO()
    torch.save({"local": zero.optim.state_dict(), "groups": settings}, buffer)
    return buffer.getvalue()


def _load_zero_blob(zero, blob):
    """Loads a ``_zero_blob`` into ZeRO's local optimizer and ZeRO's groups."""
    import io

    if not isinstance(blob, bytes):
        raise ValueError(
            f"checkpoint: this rank's ZeRO partition state ({zero_key(zero)}) is missing or "
            f"not what TrainingState saved ({type(blob).__name__}); restore with the world size "
            "the checkpoint was written with")
    saved = torch.load(io.BytesIO(blob), weights_only=False)
    if len(saved["groups"]) != len(zero.param_groups):
        raise ValueError(
            f"checkpoint: {len(saved['groups'])} ZeRO parameter group(s) saved, "
            f"{len(zero.param_groups)} now")
    zero.optim.load_state_dict(saved["local"])
    for mine, settings in zip(zero.param_groups, saved["groups"]):
        mine.update(settings)
