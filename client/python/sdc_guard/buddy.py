"""Buddy verification of a sharded optimizer step (issue 44, item 3).

Under FSDP2 without a replicate dim every rank holds a shard no other rank
holds, and under ZeRO-1 (``ZeroRedundancyOptimizer`` around a DDP model)
every rank updates a partition of the parameters no other rank updates and
broadcasts it; either way no vote can check the optimizer update, which is
computed once (after ZeRO's broadcast every replica holds the same wrong
bits). What differs between the two is the ``Partition`` (which tensors this
rank alone updates, where their optimizer state and step settings live);
everything else is one check. On weight-check steps the guard has each
partition's update computed twice:

  * before ``optimizer.step()`` each rank (the *owner*) copies this check's
    *slice* of its shard's inputs: the parameters' pre-step values, their
    reduced gradients, the optimizer state of those elements and the step's
    hyper-parameters (its parameter group's settings, foreach/fused
    included); as its optimizer's ``step`` returns (a step post-hook) it
    fingerprints the slice's new values;
  * its *buddy*, a rank on another node (``SDC_NODE_NAME``), receives those
    inputs and runs the same optimizer class's own ``step`` on them (fresh
    tensors of the slice, the same settings), and fingerprints the result;
  * the two fingerprints are compared bit for bit (an all-reduce every rank
    takes part in); on a mismatch a third rank on a third node recomputes
    from the same inputs and says which of the two is wrong (the replay
    audit's three-node rule): the third agreeing with the buddy names the
    owner (its real update is wrong, so the shard it trains on is corrupted:
    every later checkpoint of the job is vetoed), agreeing with the owner
    names the buddy (its recomputation is wrong; the weights are sound), and
    agreeing with neither, or no third node, names both as undecided (vetoed).

The recomputation is bit-identical to the real step on healthy hardware only
for optimizers whose update of an element reads that element's parameter,
gradient and state alone (elementwise): SGD (momentum, Nesterov, weight
decay), Adam and AdamW (tests/python/test_fsdp_buddy.py checks the slice's
result against the full step's bit for bit at unaligned offsets). Any other
optimizer (Adafactor's row and column factors, LAMB's and LARS's per-tensor
trust ratios, Muon's orthogonalisation) updates an element from statistics
of the whole tensor, which a slice cannot reproduce: the buddy check is off
for it, and the guard says so once.

*Rotation.* Each rank's local parameters (its shards in the module's
parameter order; its ZeRO partition in the local optimizer's order),
concatenated, are cut into windows of ``slice_elements`` elements
(``SDC_BUDDY_SLICE``, default 2^20); check c verifies window c mod W, so
every element is verified once every W = ceil(local elements / slice) checks.

*At rest.* After the optimizer step of a check the owner fingerprints its
whole local shard (ZeRO: its partition); before the next step's optimizer step it fingerprints it
again: a difference is a stored shard corrupted at rest (nothing legitimate
writes the parameters between the two), named to this rank.

*ZeRO-1.* ``ZeroRedundancyOptimizer.step`` runs the local optimizer on this
rank's partition and then broadcasts every partition from its owner. The
owner fingerprints its slice in a step post-hook of the local optimizer
(``register_step_post_hook``, public API), which runs inside ``zero.step()``
after the local step and before the broadcast: the digest is of the bits
the broadcast then sends (a broadcast reads its source and leaves it as it
was), so the verdict, decided after the step returns, is the one a check
before the broadcast would give. What deciding first would add is keeping
a wrong update off the other ranks, which gains nothing: an update computed
once has no sound copy to repair from, so the finding vetoes every later
checkpoint either way. A broadcast corrupted in flight or on arrival leaves
one receiver's copy different from the owner's and every other replica's:
the DDP weight vote, which stays on (every rank holds the whole model after
the broadcast), names that minority and repairs it. The partition's
optimizer state is this rank's alone, so it is left out of the engine's
checkpoint digest and repair.

A finding is decided the same on every rank; the named rank hands it to the
engine at the next guarded step (``note_failure``), which skips that step on
every rank with the finding as its reason, and sdcd records it.
"""

import io
import sys
import time

import torch
import torch.distributed as dist

from sdc_guard import _C, sharded

# What a finding's note to the engine starts with; guard.py knows a skipped
# step by it.
MARK = "buddy check"

# Optimizers whose update of an element reads only that element's parameter,
# gradient and state: a slice's recomputation is the full step's, bit for bit.
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)

DEFAULT_SLICE = 1 << 20

# Columns of the per-rank table every rank all-reduces (SUM; each cell is
# written by one rank only, the others leave it 0).
_OWNER, _BUDDY, _THIRD, _AT_REST, _ERROR = range(5)


def _to_bytes(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(tensor):
    return torch.load(io.BytesIO(tensor.numpy().tobytes()), weights_only=True)


def _signed(u64):
    return u64 - (1 << 64) if u64 >= (1 << 63) else u64


def not_elementwise_reason(optimizer):
    """Why the buddy check cannot run under ``optimizer`` (empty: it can)."""
    if type(optimizer) in ELEMENTWISE:
        return ""
    return (f"the buddy check of the sharded optimizer step is off: {type(optimizer).__name__} "
            "is not known to update each element from that element's parameter, gradient and "
            "state alone, so a slice's recomputation could differ from the full step without "
            "any fault (covered: SGD, Adam, AdamW)")


def pairs(nodes):
    """(buddy, third) per rank from the ranks' node names: the buddy of r is
    r + k for the smallest shift k that puts every rank's buddy on another
    node (each rank then checks exactly one owner), else the next rank on
    another node; the third is r + 2k when that is on a node that is
    neither's, else the next rank after the buddy on such a node (None:
    fewer than three nodes)."""
    world = len(nodes)
    shift = next((k for k in range(1, world)
                  if all(nodes[(r + k) % world] != nodes[r] for r in range(world))), None)
    buddy, third = [], []
    for r in range(world):
        if shift is not None:
            b = (r + shift) % world
        else:
            b = next(((r + k) % world for k in range(1, world)
                      if nodes[(r + k) % world] != nodes[r]), None)
        t = None
        if shift is not None and nodes[(r + 2 * shift) % world] not in (nodes[r], nodes[b]):
            t = (r + 2 * shift) % world  # Each rank then the third of one owner.
        elif b is not None:
            t = next(((b + k) % world for k in range(1, world)
                      if nodes[(b + k) % world] not in (nodes[r], nodes[b])), None)
        buddy.append(b)
        third.append(t)
    return buddy, third


def windows(sizes, slice_elements):
    """How many windows of ``slice_elements`` cover ``sizes`` (the local
    tensors' element counts, concatenated)."""
    total = sum(sizes)
    return max(1, -(-total // slice_elements))


def segments(sizes, slice_elements, check):
    """The (tensor index, start, end) pieces of window ``check`` mod W."""
    w = check % windows(sizes, slice_elements)
    lo, hi = w * slice_elements, (w + 1) * slice_elements
    out, base = [], 0
    for i, n in enumerate(sizes):
        a, b = max(lo, base), min(hi, base + n)
        if a < b:
            out.append((i, a - base, b - base))
        base += n
    return out


def recompute(package):
    """Runs the owner's optimizer class's own step on fresh tensors of the
    package's slice; returns the digest of the updated slice."""
    if not package["segments"]:
        return slice_digest([])
    cls = dict((c.__name__, c) for c in ELEMENTWISE)[package["optimizer"]]
    groups, params = {}, []
    for k, (_, _, _, group) in enumerate(package["segments"]):
        p = torch.nn.Parameter(package["params"][k].clone())
        p.grad = package["grads"][k].clone()
        params.append(p)
        groups.setdefault(group, []).append(p)
    settings = package["groups"]
    optimizer = cls([dict(settings[g], params=ps) for g, ps in sorted(groups.items())])
    for k, p in enumerate(params):
        state = package["state"][k]
        if state:
            optimizer.state[p] = {key: (v.clone() if isinstance(v, torch.Tensor) else v)
                                  for key, v in state.items()}
    optimizer.step()
    return slice_digest([p.detach() for p in params])


def slice_digest(tensors):
    return _C.model_digest([f"s{k}" for k in range(len(tensors))],
                           [t.contiguous() for t in tensors])


class Partition:
    """What this rank alone updates, the layout-specific part of the check.

    ``optimizer`` holds the state of ``params`` and its class steps them;
    ``settings`` are the parameter groups whose settings (lr, betas, ...)
    the step uses, indexed as ``optimizer.param_groups``; ``local`` maps a
    parameter, gradient or state tensor to the elements this rank holds;
    ``what`` names the partition in findings ("shard")."""

    def __init__(self, what, optimizer, params, settings, local):
        self.what = what
        self.optimizer = optimizer
        self.params = list(params)
        self.settings = settings
        self.local = local


def fsdp_partition(optimizer, params):
    """FSDP2 on a 1-D mesh: the local shards of the module's DTensor
    parameters, stepped by the trainer's optimizer itself."""
    return Partition("shard", optimizer, params, optimizer.param_groups, sharded.local)


def zero_optimizer(optimizer):
    """True for a ``ZeroRedundancyOptimizer``."""
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:  # pragma: no cover
        return False
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def zero_partition(zero, group):
    """ZeRO-1: the parameters ZeRO assigned to this rank, stepped by its
    local optimizer (``zero.optim``, the class the user named). The step's
    settings are ``zero.param_groups``: ZeRO copies them into the local
    optimizer's groups (same order) inside its step, so an LR scheduler's
    change made since the last step is in them and not yet in the local
    optimizer's. ValueError for ZeRO set up in a way the check cannot follow."""
    if getattr(zero, "_overlap_with_ddp", False):  # ZeRO keeps the argument only here.
        raise ValueError(
            "optimizer: ZeroRedundancyOptimizer(overlap_with_ddp=True) steps inside DDP's "
            "communication hook, where the guard's check 1 runs; use overlap_with_ddp=False")

    def ranks(g):
        return [dist.get_global_rank(g, r) for r in range(dist.get_world_size(g))]

    if ranks(zero.process_group) != ranks(group if group is not None else dist.group.WORLD):
        raise ValueError(
            "optimizer: the ZeroRedundancyOptimizer's process_group is not the model's: the "
            "guard checks each rank's partition against ranks of the model's group")
    params = [p for g in zero.optim.param_groups for p in g["params"]]
    return Partition("ZeRO partition", zero.optim, params, zero.param_groups, lambda t: t)


class BuddyCheck:
    """The buddy check of one guard (FSDP2 without replicas, or ZeRO-1), on
    its ``Partition``. Every method that communicates is called on every
    rank at the same step."""

    def __init__(self, engine, partition, group, node_name, slice_elements):
        self._engine = engine
        self.partition = partition
        self.optimizer = partition.optimizer
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.params = partition.params  # What this rank alone updates, in a fixed order.
        self.off_reason = not_elementwise_reason(self.optimizer)
        nodes = [None] * self.world
        dist.all_gather_object(nodes, node_name, group=group)
        self.nodes = nodes
        self.buddy, self.third = pairs(nodes)
        if self.buddy[self.rank] is None and not self.off_reason:
            self.off_reason = ("the buddy check of the sharded optimizer step is off: every "
                               "rank is on one node, and a buddy must be on another")
        self.slice_elements = slice_elements
        self.checks = 0  # Buddy checks run (the same count on every rank).
        self.bytes_sent = 0  # This rank's inputs sent to buddies and thirds.
        self.ms = 0.0  # This rank's time in the buddy check and at-rest comparisons.
        self.findings = []  # Every finding's text, in order.
        self.pending = None  # (named rank, text): for the engine at the next step.
        self.veto = ""  # Why every later checkpoint is vetoed (empty: none is).
        self._at_rest = None  # (step, digest) recorded after a check's optimizer step.
        self._group_of = {}
        for g, group_ in enumerate(self.optimizer.param_groups):
            for p in group_["params"]:
                self._group_of[id(p)] = g

    @property
    def enabled(self):
        return not self.off_reason

    def _locals(self):
        return [self.partition.local(p) for p in self.params]

    def _global(self, r):
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    # -- at rest --------------------------------------------------------------

    def _shard_digest(self):
        with torch.no_grad():
            return slice_digest([t.detach().reshape(-1) for t in self._locals()])

    # -- the step ---------------------------------------------------------------

    def around_step(self, step, apply_step, check, repaired=False):
        """Runs ``apply_step()`` (the real optimizer step; returns whether it
        stepped), with the at-rest comparison before it and, when ``check``,
        the buddy check around it. ``repaired``: the weight vote's repair
        rewrote this rank's weights in this step (DDP under ZeRO), so its
        partition changed legitimately; the comparison still runs (a
        collective) but finds nothing on this rank. Returns what apply_step
        returned."""
        start = time.perf_counter()
        at_rest = self._at_rest
        self._at_rest = None
        rested = 0
        if at_rest is not None and not repaired and self._shard_digest() != at_rest[1]:
            rested = 1
        package = None
        if check:
            package = self._package(step)
        owned = {}  # The owner's digest, taken the moment its optimizer's step returns.

        def updated(*_):
            # An optimizer step post-hook: under ZeRO it runs inside
            # zero.step(), after the local step and before the broadcast, so
            # the fault lands where a faulty update would (and spreads) and
            # the digest is of the bits the broadcast sends.
            took = time.perf_counter()
            fires, rel = self._engine.shard_update_fault(step)
            if fires:
                self._inject(package, rel, step)
            owned["digest"] = slice_digest(
                [self._locals()[i].detach().reshape(-1)[a:b] for i, a, b, _ in
                 package["segments"]])
            owned["ms"] = 1000 * (time.perf_counter() - took)

        def post_hook(*_):
            try:
                updated()
            except Exception as e:  # noqa: BLE001  (raising here would leave ZeRO's broadcast)
                owned.clear()
                print(f"sdc-guard rank {self.rank}: the buddy check's fingerprint of the update "
                      f"failed inside the step ({type(e).__name__}: {e}); retried after it",
                      file=sys.stderr, flush=True)

        hook = self.optimizer.register_step_post_hook(post_hook) if check else None
        stepped = time.perf_counter()
        try:
            applied = apply_step()
        finally:
            if hook is not None:
                hook.remove()
        resumed = time.perf_counter()
        owner_digest = 0
        if check and applied:
            if "digest" in owned:
                self.ms += owned["ms"]  # Inside apply_step's time, which is not counted.
            else:  # Stepped without the optimizer's own step(): after it (counted below).
                updated()
            owner_digest = owned["digest"]
        if at_rest is not None or check:
            self._decide(step, at_rest, rested, package if (check and applied) else None,
                         owner_digest)
        if check:
            self.checks += 1
            self._at_rest = (step, self._shard_digest())
        self.ms += 1000 * ((stepped - start) + (time.perf_counter() - resumed))
        return applied

    def _package(self, step):
        """This check's slice of the step's inputs, copied before the step."""
        locals_ = self._locals()
        sizes = [t.numel() for t in locals_]
        segs = segments(sizes, self.slice_elements, self.checks)
        out = {"optimizer": type(self.optimizer).__name__, "step": step, "segments": [],
               "params": [], "grads": [], "state": [], "groups": {}}
        with torch.no_grad():
            for i, a, b in segs:
                p = self.params[i]
                g = self._group_of[id(p)]
                local = locals_[i].detach().reshape(-1)
                grad = self.partition.local(p.grad) if p.grad is not None else None
                if grad is None:
                    continue  # No gradient: the optimizer leaves it as it is.
                out["segments"].append((i, a, b, g))
                out["params"].append(local[a:b].clone())
                out["grads"].append(grad.detach().reshape(-1)[a:b].clone())
                state = {}
                for key, value in self.optimizer.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        value = self.partition.local(value).detach()
                        if value.numel() == local.numel() and value.dim() > 0:
                            value = value.reshape(-1)[a:b]
                        value = value.clone()
                    state[key] = value
                out["state"].append(state)
                if g not in out["groups"]:
                    out["groups"][g] = {k: v for k, v in self.partition.settings[g].items()
                                        if k != "params"}
        return out

    def _inject(self, package, rel, step):
        """The shard-update fault: one element of this check's slice of the
        update, multiplied by 1 + rel as the optimizer's step returns (under
        ZeRO before its broadcast, which then spreads it to every replica)."""
        if not package["segments"]:
            return
        i, a, b, _ = package["segments"][len(package["segments"]) // 2]
        with torch.no_grad():
            flat = self._locals()[i].reshape(-1)
            k = (a + b) // 2
            flat[k] = flat[k] * (1 + rel)
        print(f"sdc-guard rank {self.rank}: INJECTED a shard-update fault (element {k} of "
              f"parameter {i} of its {self.partition.what}, relative {rel}) at step {step}",
              file=sys.stderr, flush=True)

    def _exchange(self, senders, package):
        """Sends ``package`` (this rank's, or None) to the ranks that need it
        and receives the packages of ``senders`` (dst -> list of owners):
        returns {owner: package} for the owners whose inputs this rank
        recomputes. ``senders`` maps each owner to the rank that recomputes."""
        mine = [(o, d) for o, d in senders.items() if d == self.rank]
        outgoing = [d for o, d in senders.items() if o == self.rank]
        payload = _to_bytes(package) if outgoing else None
        sizes = {o: torch.zeros(1, dtype=torch.int64) for o, _ in mine}
        works = [dist.irecv(sizes[o], src=self._global(o), group=self.group) for o, _ in mine]
        length = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
        for d in outgoing:
            works.append(dist.isend(length, dst=self._global(d), group=self.group))
        for w in works:
            w.wait()
        bodies = {o: torch.empty(int(sizes[o].item()), dtype=torch.uint8) for o, _ in mine}
        works = [dist.irecv(bodies[o], src=self._global(o), group=self.group) for o, _ in mine]
        for d in outgoing:
            works.append(dist.isend(payload, dst=self._global(d), group=self.group))
            self.bytes_sent += payload.numel()
        for w in works:
            w.wait()
        return {o: _from_bytes(t) for o, t in bodies.items()}

    def _table(self, cells):
        """The all-reduced per-rank table (SUM: every cell is one rank's)."""
        t = torch.zeros(self.world, 5, dtype=torch.int64)
        for (r, c), v in cells.items():
            t[r, c] = v
        dist.all_reduce(t, group=self.group)
        return t

    def _recompute_all(self, received, column, cells):
        for owner, package in received.items():
            try:
                cells[(owner, column)] = _signed(recompute(package))
            except Exception as e:  # noqa: BLE001  (every rank must reach the all-reduce)
                print(f"sdc-guard rank {self.rank}: the buddy recomputation of rank {owner}'s "
                      f"slice failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                cells[(owner, _ERROR)] = 1

    def _decide(self, step, at_rest, rested, package, owner_digest):
        cells = {(self.rank, _AT_REST): rested}
        checking = package is not None
        if checking:
            cells[(self.rank, _OWNER)] = _signed(owner_digest)
            received = self._exchange({r: self.buddy[r] for r in range(self.world)}, package)
            self._recompute_all(received, _BUDDY, cells)
        # A rank whose step did not apply (skipped everywhere) sent nothing:
        # `checking` is the same on every rank (the guard's decision).
        table = self._table(cells)
        found = []
        for r in range(self.world):
            if table[r, _AT_REST]:
                found.append((r, True, (
                    f"{MARK} (suspect): rank {r}'s stored {self.partition.what} changed at rest "
                    f"between step "
                    f"{at_rest[0]}'s and step {step}'s optimizer steps (its memory, or a write "
                    "outside optimizer.step)")))
        if checking:
            mismatched = [r for r in range(self.world)
                          if table[r, _OWNER] != table[r, _BUDDY] or table[r, _ERROR]]
            thirds = {r: self.third[r] for r in mismatched if self.third[r] is not None}
            table3 = None
            if mismatched:
                cells3 = {}
                received = self._exchange(thirds, package)
                self._recompute_all(received, _THIRD, cells3)
                table3 = self._table(cells3)
            for r in mismatched:
                found.append(self._verdict(step, r, table, table3))
        for r, vetoes, text in found:
            self.findings.append(text)
            if self.pending is None:
                self.pending = (r, text)
            if vetoes and not self.veto:
                self.veto = text
            if self.rank == 0:
                print(f"sdc-guard: {text}", file=sys.stderr, flush=True)

    def _verdict(self, step, r, table, table3):
        """(named rank, vetoes, text) for owner r whose buddy disagreed. The
        text leads with what sdcd parses (the engine keeps 200 characters of
        a skip reason): "buddy check (faulty|suspect): rank N..."."""
        b, t = self.buddy[r], self.third[r]
        what = f"rank {r}'s optimizer update of its {self.partition.what} at step {step}"
        if t is None:
            return (r, True, f"{MARK} (suspect): {what} differs from rank {b}'s "
                             "recomputation; no third node to decide")
        owner, buddy, third = int(table[r, _OWNER]), int(table[r, _BUDDY]), int(table3[r, _THIRD])
        if table[r, _ERROR] or table3[r, _ERROR]:
            return (r, True, f"{MARK} (suspect): {what} could not be recomputed by rank {b} "
                             f"or {t} (see their logs); undecided")
        if third == buddy:
            return (r, True, f"{MARK} (faulty): {what} is wrong; ranks {b} and {t} "
                             "recomputed it and agree")
        if third == owner:
            return (b, False, f"{MARK} (faulty): rank {b} recomputed {what} wrongly; rank {t} "
                              f"agrees with rank {r} (the weights are sound)")
        return (r, True, f"{MARK} (suspect): {what}: ranks {r}, {b} and {t} all differ; "
                         "undecided")

    def take_pending(self):
        """The finding this rank hands the engine at this step (or None);
        every rank clears it."""
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] == self.rank:
            return pending[1]
        return None

    def bound(self):
        """This rank's cost bound per check (for the docs and the summary)."""
        sizes = [t.numel() for t in self._locals()]
        return {"slice_elements": min(self.slice_elements, sum(sizes)),
                "windows": windows(sizes, self.slice_elements)}
