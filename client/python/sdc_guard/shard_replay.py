"""Replay audits under sharding (issue 44, item 4): FSDP2 on a 1-D mesh and
HSDP.

Under DDP the engine's replay audit (client/replay_audit.h) has each
replayer recompute its subject's micro-batch alone. Under FSDP2 a forward
all-gathers every unit's parameters and a backward reduce-scatters every
unit's gradients, collectives over the whole shard group: a replay runs only
when every rank replays at the same time. So the audit of a sharded layout
runs here, in rounds in which every rank runs one forward and backward:

  * at an audit step (every ``audit_every`` steps) each rank keeps what its
    first micro-batch's forward started from (the batch, the RNG states,
    the module's buffers) and what it trained on: the first micro-batch's
    loss bits and, with one micro-batch a step, the fingerprint of each
    FSDP unit's *local* gradients, i.e. the input of that unit's
    reduce-scatter before any reduction (``GuardedReduceScatter``,
    sharded.py: the guard's custom reduce-scatter, a public FSDP2 API);
  * after the step's backward every rank sends that micro-batch to its
    *replayer*, a rank on another node (``buddy.pairs``: the same shifted
    ring as the buddy check), and all ranks replay at once; a replay's
    reduce-scatter inputs are fingerprinted the same way, its reduced result
    discarded (the step's own sharded gradients are set aside and put back:
    a replay leaves no trace on training);
  * the originals' and replays' fingerprints are all-reduced in one small
    table; a subject whose replay differs is replayed by a *third* rank on a
    third node in a further round (every other rank replays its own batch
    alongside, results discarded, so FSDP's collectives line up), and the
    three-node rule names the rank: the third agreeing with the replayer
    names the subject (its forward or backward was wrong: the step is
    skipped and sdcd vetoes checkpoints), agreeing with the subject names
    the replayer, agreeing with neither names the subject a suspect.

A finding is decided the same on every rank, and the rank it names hands it
to the engine (``note_failure``) before the step's agreement, so that very
step is skipped on every rank. The finding's text leads with what sdcd
already parses for the buddy check's findings ("buddy check (faulty|
suspect): rank N ..."): a separate audit role for sharded replays would be a
wire change.

Not covered here: gradient fingerprints with gradient accumulation (the
reduce-scatter runs once, after the last micro-batch: the loss alone is
compared then), faults of kind ``replay`` (the guard's fault point passes
activations through during these replays), sdcd's targeted audit plans and
the confirmation replay of a lone NaN (they replay one rank alone, which
FSDP's collectives cannot). A replay that raises on one rank leaves the
others in FSDP's collective until the process group's timeout.
"""

import sys
import time

import torch
import torch.distributed as dist

from sdc_guard import _C, buddy, tensor_parallel

# Columns of the per-subject table (SUM all-reduce; each cell one rank's).
_ORIG_LOSS, _ORIG_GRADS, _REPLAY_LOSS, _REPLAY_GRADS, _REPLAY_ERROR, \
    _THIRD_LOSS, _THIRD_GRADS, _THIRD_ERROR = range(8)
_COLUMNS = 8


def digest(tensors):
    """The kernels' fingerprint digest of ``tensors``' bits (a signed int64)."""
    d = _C.model_digest([f"t{k}" for k in range(len(tensors))],
                        [t.detach().contiguous().reshape(-1) for t in tensors])
    return buddy._signed(d)


def rounds(assignments, world):
    """The (replayer, subject) pairs cut into rounds in which each rank
    replays at most one subject, in order; the same on every rank."""
    out, pending = [], list(assignments)
    while pending:
        busy, this, rest = set(), [], []
        for replayer, subject in pending:
            (rest if replayer in busy else this).append((replayer, subject))
            busy.add(replayer)
        out.append(this)
        pending = rest
    return out


class ShardReplay:
    """The replay audit of one guard on a sharded layout. ``run`` and every
    method it calls communicate: every rank calls them at the same step."""

    def __init__(self, guard, every, node_name):
        self.guard = guard
        self.every = every
        self.group = guard.process_group
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        nodes = [None] * self.world
        dist.all_gather_object(nodes, node_name, group=self.group)
        self.replayer, self.third = buddy.pairs(nodes)
        self.tp_group = None  # Tensor parallel: every rank's tp group, which replays as one.
        if guard.layout.kind == "tp":
            self.replayer, self.third, self.tp_group = tensor_parallel.replay_pairs(
                guard.layout, self.group, nodes)
        self.off_reason = ""
        if self.replayer[self.rank] is None:
            self.off_reason = ("replay audits are off: every rank is on one node, and a "
                               "replayer must be on another") if self.tp_group is None else (
                "replay audits are off: a dp replica's tp group has no partner replica on "
                "nodes of its own (a replay of a tp group runs on another replica's nodes)")
        self.audits = 0  # Audits run (the same count on every rank).
        self.mismatches = 0
        self.findings = []
        self.ms = 0.0
        self.replaying = False  # While a replay's forward and backward run.
        self._units = None  # Per-unit digests being recorded (original or replay).
        self._record = None  # This step's: batch, RNG, buffers, loss, unit digests.
        self._deterministic_before = None
        self._devices = []

    def due(self, step):
        return not self.off_reason and self.every > 0 and step % self.every == 0

    # -- the original ---------------------------------------------------------

    def begin(self, s):
        """At an audit step's start: what the first micro-batch's forward
        starts from. Deterministic algorithms on (warn-only) until ``run``."""
        self._record = None
        if not self.due(s.step):
            return
        buffers = [b.detach().clone() for _, b in self.guard.module.named_buffers()]
        self._devices = [t.device for t in s._tensors]  # Peers' batches go there too.
        self._record = {"tensors": [t.detach().cpu() for t in s._tensors],
                        "micro_batches": s.micro_batches, "rng": torch.get_rng_state(),
                        "buffers": [b.cpu() for b in buffers], "scale": 1.0,
                        "cuda_rng": self._cuda_rng()}
        self._units = []
        self._deterministic_before = (torch.are_deterministic_algorithms_enabled(),
                                      torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True, warn_only=True)

    def _device(self):
        params = self.guard._sharded_params
        return params[0].device if params else torch.device("cpu")

    def _cuda_rng(self):
        """The model's CUDA generator state (None on the CPU)."""
        d = self._device()
        return torch.cuda.get_rng_state(d) if d.type == "cuda" else None

    def seen_reduce_scatter(self, input_tensor):
        """A reduce-scatter's input (one FSDP unit's local gradients): kept
        during the audit step's first micro-batch's backward and during
        replays."""
        if self._units is not None and (self.replaying or self.guard._first_backward):
            self._units.append(digest([input_tensor]))

    def first_loss(self, loss, scale):
        if self._record is not None:
            self._record["loss"] = digest([loss])
            self._record["scale"] = float(scale.item()) if scale is not None else 1.0
            if self._record["micro_batches"] == 1:
                self._record["units"] = digest([torch.tensor(self._units, dtype=torch.int64)])
            self._units = None

    def abandon(self):
        """A step left before its end: no audit, deterministic algorithms as
        they were."""
        if self._record is not None:
            self._record = self._units = None
            torch.use_deterministic_algorithms(self._deterministic_before[0],
                                               warn_only=self._deterministic_before[1])

    @property
    def active(self):
        return self._record is not None

    # -- the audit ------------------------------------------------------------

    def run(self, step):
        """The audit of ``step`` (REQUIRES: active). Returns the finding
        this rank hands the engine (None: none names it)."""
        start = time.perf_counter()
        record, self._record = self._record, None
        try:
            return self._audit(step, record)
        finally:
            torch.use_deterministic_algorithms(self._deterministic_before[0],
                                               warn_only=self._deterministic_before[1])
            self.audits += 1
            self.ms += 1000 * (time.perf_counter() - start)

    def _audit(self, step, record):
        cells = {(self.rank, _ORIG_LOSS): record.get("loss", 0),
                 (self.rank, _ORIG_GRADS): record.get("units", 0)}
        pairs = [(self.replayer[s], s) for s in range(self.world)]
        self._round(pairs, record, (_REPLAY_LOSS, _REPLAY_GRADS, _REPLAY_ERROR), cells)
        table = self._table(cells)
        mismatched = [s for s in range(self.world) if table[s, _REPLAY_ERROR] or
                      (table[s, _ORIG_LOSS], table[s, _ORIG_GRADS]) !=
                      (table[s, _REPLAY_LOSS], table[s, _REPLAY_GRADS])]
        if not mismatched:
            return None
        self.mismatches += 1
        cells = {}
        again = mismatched if self.tp_group is None else \
            sorted({r for s in mismatched for r in self.tp_group[s]})  # Whole tp groups.
        thirds = [(self.third[s], s) for s in again if self.third[s] is not None]
        self._round(thirds, record, (_THIRD_LOSS, _THIRD_GRADS, _THIRD_ERROR), cells)
        table3 = self._table(cells)
        mine = None
        for s in mismatched:
            named, text = self._verdict(step, s, table, table3)
            if self.tp_group is not None:
                text = tensor_parallel.verdict(text, s, mismatched, self.tp_group)
            self.findings.append(text)
            if self.rank == 0:
                print(f"sdc-guard: {text}", file=sys.stderr, flush=True)
            if named == self.rank and mine is None:
                mine = text
        return mine

    def _round(self, pairs, record, columns, cells):
        """Every round of ``pairs`` (replayer, subject): the subjects' batches
        sent, and every rank replaying one at a time (its own, discarded,
        when it has none in a round)."""
        for this in rounds(pairs, self.world):
            received = self._exchange(this, record)
            subject = next((s for r, s in this if r == self.rank), None)
            package = received if subject is not None else record
            loss, units, error = self._replay(package)
            if subject is not None:
                cells[(subject, columns[0])] = loss
                cells[(subject, columns[1])] = units
                cells[(subject, columns[2])] = error

    def _exchange(self, pairs, record):
        """Sends this rank's record to the replayers that need it; returns
        the package of the subject this rank replays (or None)."""
        mine = next((s for r, s in pairs if r == self.rank), None)
        outgoing = [r for r, s in pairs if s == self.rank and r != self.rank]
        payload = buddy._to_bytes({k: record[k] for k in
                                   ("tensors", "micro_batches", "rng", "cuda_rng", "buffers",
                                    "scale")}) \
            if outgoing else None
        glob = lambda r: dist.get_global_rank(self.group, r)  # noqa: E731
        size = torch.zeros(1, dtype=torch.int64)
        works = [dist.irecv(size, src=glob(mine), group=self.group)] if mine is not None else []
        length = torch.tensor([payload.numel() if payload is not None else 0])
        works += [dist.isend(length, dst=glob(r), group=self.group) for r in outgoing]
        for w in works:
            w.wait()
        body = torch.empty(int(size.item()), dtype=torch.uint8) if mine is not None else None
        works = [dist.irecv(body, src=glob(mine), group=self.group)] if mine is not None else []
        works += [dist.isend(payload, dst=glob(r), group=self.group) for r in outgoing]
        for w in works:
            w.wait()
        return buddy._from_bytes(body) if mine is not None else None

    def _replay(self, package):
        """(loss digest, unit digests' digest, error) of a replay of
        ``package``; this rank's gradients, buffers and RNG as they were after."""
        g = self.guard
        params = g._sharded_params
        stashed = [p.grad for p in params]
        buffers = [b for _, b in g.module.named_buffers()]
        own = [b.detach().clone() for b in buffers]
        own_rng, own_cuda_rng = torch.get_rng_state(), self._cuda_rng()
        self._units = []
        self.replaying = True
        try:
            for p in params:
                p.grad = None  # FSDP would accumulate the replay into the step's own.
            torch.set_rng_state(package["rng"])
            if package.get("cuda_rng") is not None and own_cuda_rng is not None:
                torch.cuda.set_rng_state(package["cuda_rng"], self._device())
            with torch.no_grad():
                for b, v in zip(buffers, package["buffers"]):
                    b.copy_(v)
            tensors = [t.to(d) for t, d in zip(package["tensors"], self._devices)]
            loss = g.loss_fn(g.module, g._rebuild(tensors)) / package["micro_batches"]
            if package["scale"] != 1.0:
                loss = loss * torch.tensor(package["scale"], dtype=torch.float32,
                                           device=loss.device)
            loss_digest = digest([loss])
            loss.backward()
            units = 0
            if package["micro_batches"] == 1:
                units = digest([torch.tensor(self._units, dtype=torch.int64)])
            return loss_digest, units, 0
        except Exception as e:  # noqa: BLE001  (every rank must reach the all-reduce)
            print(f"sdc-guard rank {self.rank}: a sharded replay failed: {type(e).__name__}: "
                  f"{e}", file=sys.stderr, flush=True)
            return 0, 0, 1
        finally:
            self.replaying = False
            self._units = None
            for p, grad in zip(params, stashed):
                p.grad = grad
            with torch.no_grad():
                for b, v in zip(buffers, own):
                    b.copy_(v)
            torch.set_rng_state(own_rng)
            if own_cuda_rng is not None:
                torch.cuda.set_rng_state(own_cuda_rng, self._device())

    def _table(self, cells):
        t = torch.zeros(self.world, _COLUMNS, dtype=torch.int64)
        for (r, c), v in cells.items():
            t[r, c] = v
        dist.all_reduce(t, group=self.group)
        return t

    def _verdict(self, step, s, table, table3):
        """(named rank, text) for subject s whose replay differed; the text
        leads with what sdcd parses ("buddy check (faulty|suspect): rank N")."""
        r, t = self.replayer[s], self.third[s]
        what = f"rank {s}'s forward/backward of its micro-batch at step {step} (replay audit)"
        original = (int(table[s, _ORIG_LOSS]), int(table[s, _ORIG_GRADS]))
        replay = (int(table[s, _REPLAY_LOSS]), int(table[s, _REPLAY_GRADS]))
        part = "its loss" if original[0] != replay[0] else "its local gradients"
        if t is None:
            return s, (f"{buddy.MARK} (suspect): {what}: {part} differs from rank {r}'s "
                       "replay; no third node to decide")
        third = (int(table3[s, _THIRD_LOSS]), int(table3[s, _THIRD_GRADS]))
        if table[s, _REPLAY_ERROR] or table3[s, _THIRD_ERROR]:
            return s, (f"{buddy.MARK} (suspect): {what} could not be replayed by rank {r} or "
                       f"{t} (see their logs); undecided")
        if third == replay:
            return s, (f"{buddy.MARK} (faulty): {what} is wrong ({part}); ranks {r} and {t} "
                       "replayed it and agree")
        if third == original:
            return r, (f"{buddy.MARK} (faulty): rank {r} replayed {what} wrongly; rank {t} "
                       f"agrees with rank {s} (the step is sound)")
        return s, (f"{buddy.MARK} (suspect): {what}: ranks {s}, {r} and {t} all differ; "
                   "undecided")
