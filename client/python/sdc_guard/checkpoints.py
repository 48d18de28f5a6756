"""Checkpoints kept apart until sdc-guard confirms them.

A checkpoint the guard allows is provisional: a GPU that corrupts an
unaudited step now and then may already be in it. It becomes final when the
next checkpoint is allowed, and is revoked if a GPU of the job is found
faulty first. ProvisionalCheckpoints writes each checkpoint under a
``.provisional`` name, renames it when the guard says it is final and
deletes it when revoked; resume only from final ones (``latest_final``).

Two forms:
  * ``save(step, obj)``: ``torch.save`` of ``obj`` to ``step-N.pt`` (rank
    ``writer_rank`` writes; the others return None);
  * ``save_distributed(step, state_dict)``: ``torch.distributed.checkpoint``
    into the directory ``step-N.dcp`` (every rank writes its shard: a
    collective).
``reconcile()`` (after each may_checkpoint, and at the end after
``guard.refresh_checkpoints()``) applies the guard's answers; rank
``writer_rank`` renames and deletes.
"""

import os
import re
import shutil

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
        return final

    def save_distributed(self, step, state_dict):
        """torch.distributed.checkpoint.save of ``state_dict`` into the
        provisional directory of ``step`` (a collective); returns its path."""
        import torch.distributed.checkpoint as dcp

        target = self.path(step, kind="dcp")
        dcp.save(state_dict, checkpoint_id=target)
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

    def latest_final(self):
        """The path of the newest final checkpoint, or None: where to resume."""
        finals = [(s, k) for s, (k, p) in self.steps().items() if not p]
        if not finals:
            return None
        step, kind = max(finals)
        return self.path(step, kind, provisional=False)
