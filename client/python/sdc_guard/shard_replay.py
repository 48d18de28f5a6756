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
FSDP's collectives cannot).

Never a hang: a replay that raises on one rank reaches every rank before any
collective can wait on it, wherever FSDP's collectives allow it. The ranks
agree twice in each round: at the start of the replay's forward (a forward
pre-hook that runs before FSDP's own, i.e. before the round's first
all-gather) and between the forward and the backward (no collective runs
there). A rank whose replay raised before either point (a malformed
package, a loss function that raises on a peer's batch before or after the
model runs) joins that agreement with its failure; every rank leaves the
round there, no rank goes on to the next collective, and the failing rank
hands the error to the engine, so the step fails on every rank alike, with
the same GuardError, as an engine replay's error does under DDP. A replay
that raises *inside* the model's forward or backward has left its peers in
a collective it will never join: no collective can be trusted after it, so
the rank raises ``GuardError("ABORTED: ...")`` at once and must end (as
torchrun ends a job with a failed worker); its peers' collectives fail as
its connections close (Gloo: "Connection closed by peer", within a second
here), and each raises the same ABORTED error, never waiting for the
process group's timeout.
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


class _Abandoned(Exception):
    """Another rank's replay failed before FSDP's collectives: every rank
    leaves the round at the same agreement."""


class _Diverged(Exception):
    """A replay failed where its peers wait in a collective it will not join."""


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
        self._stage = self._BEFORE
        if not self.off_reason:  # Before FSDP's own pre-hook: the round's first agreement.
            guard.module.register_forward_pre_hook(self._at_forward, prepend=True)
            guard.module.register_forward_hook(self._after_forward)

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
        """The audit of ``step`` (REQUIRES: active). Returns (text, outcome):
        the finding or error this rank hands the engine (None: none names
        it) and "pass", "mismatch" or "error" (a replay raised on some rank:
        every rank's step fails alike). Raises GuardError("ABORTED: ...")
        when the ranks' collectives can no longer be matched (module doc)."""
        start = time.perf_counter()
        record, self._record = self._record, None
        try:
            return self._audit(step, record)
        except (_Diverged, RuntimeError) as e:  # A collective that no rank can finish.
            from sdc_guard._C import GuardError

            raise GuardError(
                f"ABORTED: the sharded replay audit of step {step} failed on rank {self.rank} "
                f"where its peers wait in FSDP's collectives ({e}); no collective of this "
                "process group can be trusted after it: end this process (torchrun ends the "
                "job's other workers; on Gloo their collectives fail as its connections "
                "close)") from e
        finally:
            torch.use_deterministic_algorithms(self._deterministic_before[0],
                                               warn_only=self._deterministic_before[1])
            self.audits += 1
            self.ms += 1000 * (time.perf_counter() - start)

    def _audit(self, step, record):
        cells = {(self.rank, _ORIG_LOSS): record.get("loss", 0),
                 (self.rank, _ORIG_GRADS): record.get("units", 0)}
        pairs = [(self.replayer[s], s) for s in range(self.world)]
        failed = self._round(pairs, record, (_REPLAY_LOSS, _REPLAY_GRADS, _REPLAY_ERROR), cells)
        if failed is not None:
            return failed, "error"
        table = self._table(cells)
        mismatched = [s for s in range(self.world) if table[s, _REPLAY_ERROR] or
                      (table[s, _ORIG_LOSS], table[s, _ORIG_GRADS]) !=
                      (table[s, _REPLAY_LOSS], table[s, _REPLAY_GRADS])]
        if not mismatched:
            return None, "pass"
        self.mismatches += 1
        cells = {}
        again = mismatched if self.tp_group is None else \
            sorted({r for s in mismatched for r in self.tp_group[s]})  # Whole tp groups.
        thirds = [(self.third[s], s) for s in again if self.third[s] is not None]
        failed = self._round(thirds, record, (_THIRD_LOSS, _THIRD_GRADS, _THIRD_ERROR), cells)
        if failed is not None:
            return failed, "error"
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
        return mine, "mismatch"

    def _round(self, pairs, record, columns, cells):
        """Every round of ``pairs`` (replayer, subject): the subjects' batches
        sent, and every rank replaying one at a time (its own, discarded,
        when it has none in a round). Returns None, or, when a replay raised
        on some rank (every rank then leaves at the same round), this rank's
        error text ("" when another rank's replay raised)."""
        for this in rounds(pairs, self.world):
            received, error = self._exchange(this, record)
            subject = next((s for r, s in this if r == self.rank), None)
            package = received if subject is not None else record
            loss, units, late, failed = self._replay(package, subject, error)
            if failed is not None:
                return failed
            if subject is not None:
                cells[(subject, columns[0])] = loss
                cells[(subject, columns[1])] = units
                cells[(subject, columns[2])] = late
        return None

    def _exchange(self, pairs, record):
        """Sends this rank's record to the replayers that need it; returns
        (the package of the subject this rank replays or None, this rank's
        error text or None). A record that cannot be packed is sent as a
        length of -1, so no receiver waits for a body that never comes."""
        mine = next((s for r, s in pairs if r == self.rank), None)
        outgoing = [r for r, s in pairs if s == self.rank and r != self.rank]
        payload, error = None, None
        if outgoing:
            try:
                payload = buddy._to_bytes({k: record[k] for k in
                                           ("tensors", "micro_batches", "rng", "cuda_rng",
                                            "buffers", "scale")})
            except Exception as e:  # noqa: BLE001  (the receivers must not wait)
                error = f"packing its micro-batch for rank(s) {outgoing}: {type(e).__name__}: {e}"
        glob = lambda r: dist.get_global_rank(self.group, r)  # noqa: E731
        size = torch.zeros(1, dtype=torch.int64)
        works = [dist.irecv(size, src=glob(mine), group=self.group)] if mine is not None else []
        length = torch.tensor([payload.numel() if payload is not None else -1])
        works += [dist.isend(length, dst=glob(r), group=self.group) for r in outgoing]
        for w in works:
            w.wait()
        incoming = int(size.item()) if mine is not None else -1
        body = torch.empty(incoming, dtype=torch.uint8) if incoming >= 0 else None
        works = [dist.irecv(body, src=glob(mine), group=self.group)] if body is not None else []
        works += [dist.isend(payload, dst=glob(r), group=self.group) for r in outgoing
                  if payload is not None]
        for w in works:
            w.wait()
        if mine is None:
            return None, error
        if body is None:
            return None, error or f"rank {mine} could not send its micro-batch"
        try:
            return buddy._from_bytes(body), error
        except Exception as e:  # noqa: BLE001
            return None, error or (f"unpacking rank {mine}'s micro-batch: "
                                   f"{type(e).__name__}: {e}")

    # The stages of a replay, for where an error leaves the ranks' collectives.
    _BEFORE, _FORWARD, _AFTER, _BACKWARD = "before the forward", "forward", \
        "between forward and backward", "backward"

    def _agree(self, error):
        """One agreement of a round (every rank calls it at the same point):
        ``error`` this rank's (None: none). Raises _Abandoned when another
        rank's replay failed; returns the ranks that failed."""
        flags = torch.zeros(self.world, dtype=torch.int64)
        flags[self.rank] = 1 if error is not None else 0
        dist.all_reduce(flags, group=self.group)
        failed = [r for r in range(self.world) if flags[r]]
        if failed and error is None:
            raise _Abandoned(failed)
        return failed

    def _at_forward(self, module, args):
        """The replay's forward pre-hook (before FSDP's): the first agreement."""
        if self.replaying and self._stage == self._BEFORE:
            self._agree(None)  # Raises _Abandoned when a peer failed before it.
            self._stage = self._FORWARD

    def _after_forward(self, module, args, output):
        if self.replaying and self._stage == self._FORWARD:
            self._stage = self._AFTER

    def _replay(self, package, subject, error):
        """(loss digest, unit digests' digest, late, failed) of a replay of
        ``package`` (``error``: why this rank has none to replay); this
        rank's gradients, buffers and RNG as they were after. ``late``: 1
        when the digests failed after the backward (no collective pending:
        the subject's table cell says so). ``failed``: None, or (a replay
        raised on some rank before FSDP's collectives diverged, so every
        rank leaves here) this rank's error text, "" when the error was
        another rank's."""
        g = self.guard
        params = g._sharded_params
        stashed = [p.grad for p in params]
        buffers = [b for _, b in g.module.named_buffers()]
        own = [b.detach().clone() for b in buffers]
        own_rng, own_cuda_rng = torch.get_rng_state(), self._cuda_rng()
        self._units = []
        self._stage = self._BEFORE
        self.replaying = True
        whose = f"rank {subject}'s micro-batch" if subject is not None else "its own micro-batch"
        try:
            if error is not None:
                raise RuntimeError(error)
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
            if self._stage == self._BEFORE:  # loss_fn never called the module.
                self._agree(None)
                self._stage = self._AFTER
            if package["scale"] != 1.0:
                loss = loss * torch.tensor(package["scale"], dtype=torch.float32,
                                           device=loss.device)
            loss_digest = digest([loss])
            self._agree(None)  # The second agreement: the backward's collectives next.
            self._stage = self._BACKWARD
            loss.backward()
        except _Abandoned as e:
            if self.rank == 0:
                print(f"sdc-guard: a sharded replay raised on rank(s) {e.args[0]}: every rank "
                      "left the replay audit there", file=sys.stderr, flush=True)
            return 0, 0, 0, ""
        except Exception as e:  # noqa: BLE001
            text = (f"a sharded replay of {whose} raised ({self._stage}): "
                    f"{type(e).__name__}: {e}")
            print(f"sdc-guard rank {self.rank}: {text}", file=sys.stderr, flush=True)
            if self._stage in (self._FORWARD, self._BACKWARD):
                raise _Diverged(text) from e
            self._agree(text)
            return 0, 0, 0, text
        else:
            try:  # After the backward: nothing pending, the table carries an error.
                units = 0
                if package["micro_batches"] == 1:
                    units = digest([torch.tensor(self._units, dtype=torch.int64)])
                return loss_digest, units, 0, None
            except Exception as e:  # noqa: BLE001
                print(f"sdc-guard rank {self.rank}: digesting a sharded replay of {whose}: "
                      f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return 0, 0, 1, None
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
