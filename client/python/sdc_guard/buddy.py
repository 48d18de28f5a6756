"""Buddy verification of a sharded optimizer step (issue 44, item 3).

Under FSDP2 without a replicate dim every rank holds a shard no other rank
holds, so no vote can check its optimizer update: the update of each shard is
computed once. On weight-check steps the guard has it computed twice:

  * before ``optimizer.step()`` each rank (the *owner*) copies this check's
    *slice* of its shard's inputs: the parameters' pre-step values, their
    reduced gradients, the optimizer state of those elements and the step's
    hyper-parameters (its parameter group's settings, foreach/fused
    included); after the step it fingerprints the slice's new values;
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

*Rotation.* Each rank's local parameters, concatenated in the module's
parameter order, are cut into windows of ``slice_elements`` elements
(``SDC_BUDDY_SLICE``, default 2^20); check c verifies window c mod W, so
every element is verified once every W = ceil(local elements / slice) checks.

*At rest.* After the optimizer step of a check the owner fingerprints its
whole local shard; before the next step's optimizer step it fingerprints it
again: a difference is a stored shard corrupted at rest (nothing legitimate
writes the parameters between the two), named to this rank.

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


class BuddyCheck:
    """The buddy check of one guard (FSDP2 without replicas). Every method
    that communicates is called on every rank at the same step."""

    def __init__(self, engine, optimizer, params, group, node_name, slice_elements):
        self._engine = engine
        self.optimizer = optimizer
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.params = params  # The optimizer's parameters (DTensors), module order.
        self.off_reason = not_elementwise_reason(optimizer)
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
        for g, group_ in enumerate(optimizer.param_groups):
            for p in group_["params"]:
                self._group_of[id(p)] = g

    @property
    def enabled(self):
        return not self.off_reason

    def _locals(self):
        return [sharded.local(p) for p in self.params]

    def _global(self, r):
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    # -- at rest --------------------------------------------------------------

    def _shard_digest(self):
        with torch.no_grad():
            return slice_digest([t.detach().reshape(-1) for t in self._locals()])

    # -- the step ---------------------------------------------------------------

    def around_step(self, step, apply_step, check):
        """Runs ``apply_step()`` (the real optimizer step; returns whether it
        stepped), with the at-rest comparison before it and, when ``check``,
        the buddy check around it. Returns what apply_step returned."""
        start = time.perf_counter()
        at_rest = self._at_rest
        self._at_rest = None
        rested = 0
        if at_rest is not None and self._shard_digest() != at_rest[1]:
            rested = 1
        package = None
        if check:
            package = self._package(step)
        stepped = time.perf_counter()
        applied = apply_step()
        resumed = time.perf_counter()
        owner_digest = 0
        if check and applied:
            fires, rel = self._engine.shard_update_fault(step)
            if fires:
                self._inject(package, rel, step)
            owner_digest = slice_digest(
                [self._locals()[i].detach().reshape(-1)[a:b] for i, a, b, _ in
                 package["segments"]])
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
                grad = sharded.local(p.grad) if p.grad is not None else None
                if grad is None:
                    continue  # No gradient: the optimizer leaves it as it is.
                out["segments"].append((i, a, b, g))
                out["params"].append(local[a:b].clone())
                out["grads"].append(grad.detach().reshape(-1)[a:b].clone())
                state = {}
                for key, value in self.optimizer.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        value = sharded.local(value).detach()
                        if value.numel() == local.numel() and value.dim() > 0:
                            value = value.reshape(-1)[a:b]
                        value = value.clone()
                    state[key] = value
                out["state"].append(state)
                if g not in out["groups"]:
                    out["groups"][g] = {k: v for k, v in self.optimizer.param_groups[g].items()
                                        if k != "params"}
        return out

    def _inject(self, package, rel, step):
        """The shard-update fault: one element of this check's slice of the
        update, multiplied by 1 + rel right after optimizer.step()."""
        if not package["segments"]:
            return
        i, a, b, _ = package["segments"][len(package["segments"]) // 2]
        with torch.no_grad():
            flat = self._locals()[i].reshape(-1)
            k = (a + b) // 2
            flat[k] = flat[k] * (1 + rel)
        print(f"sdc-guard rank {self.rank}: INJECTED a shard-update fault (element {k} of "
              f"parameter {i}'s local shard, relative {rel}) at step {step}",
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
                    f"{MARK} (suspect): rank {r}'s stored shard changed at rest between step "
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
        what = f"rank {r}'s optimizer update of its shard at step {step}"
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
