"""What the demo launcher and the benchmarks need from examples/ddp_train.py,
kept out of the example itself: the same command-line contract as the C++
trainer (demo/trainer_main.cc): --rank/--world_size/--rendezvous in place of
torchrun's environment, one JSON line per step in --progress, turn-taking
between clusters sharing a machine (--turn_file), and the unguarded loop's
optional extra collective (--extra_collective), and a count of the
collectives each step issues (--count_collectives)."""

import json
import math
import os
import time

import torch
import torch.distributed as dist

AGREEMENT_WORDS = 12  # The guard's agreement all-reduce: 12 int64, MAX.


def add_flags(parser):
    parser.add_argument("--rank", type=int, default=-1,
                        help="this process's rank (default: torchrun's RANK)")
    parser.add_argument("--world_size", type=int, default=-1,
                        help="number of ranks (default: torchrun's WORLD_SIZE)")
    parser.add_argument("--rendezvous", default="",
                        help="a file every rank names (default: torchrun's env://)")
    parser.add_argument("--progress", default="", help="JSON lines: one per step, then a summary")
    parser.add_argument("--extra_collective", action="store_true",
                        help="with --unguarded: one more all-reduce (MAX of 12 int64) per step")
    parser.add_argument("--count_collectives", action="store_true",
                        help="write how many collectives each step issued (torch's profiler)")
    parser.add_argument("--turn_file", default="")
    parser.add_argument("--turn_name", default="")
    parser.add_argument("--turn_next", default="")
    parser.add_argument("--turn_steps", type=int, default=10)


def init_process_group(args, timeout=None):
    """Gloo on the CPU: torchrun's environment, or --rendezvous FILE.
    ``timeout``: the collectives' (a timedelta; None: torch's default)."""
    extra = {"timeout": timeout} if timeout is not None else {}
    if args.rendezvous:
        if args.rank < 0 or args.world_size < 1 or args.rank >= args.world_size:
            raise SystemExit("--rank and --world_size: need 0 <= rank < world_size")
        dist.init_process_group("gloo", init_method="file://" + args.rendezvous,
                                rank=args.rank, world_size=args.world_size, **extra)
    elif os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and \
            os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # A worker group torchrun restarted (--max-restarts) shares the agent's
        # store with the group before it, whose Gloo addresses are still
        # there: seen here as "connectFullMesh failed ... Connection refused"
        # (torch 2.11). The restarted group takes keys of its own.
        restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, **extra)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"restart-{restart}", store),
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), **extra)
    else:
        dist.init_process_group("gloo", **extra)


def extra_collective(args):
    if args.extra_collective:
        words = torch.full((AGREEMENT_WORDS,), dist.get_rank(), dtype=torch.int64)
        dist.all_reduce(words, op=dist.ReduceOp.MAX)


class CollectiveCount:
    """--count_collectives: the collectives one step issues, whoever issues
    them (DDP's bucket all-reduces, the guard's own from C++, a buffer
    broadcast), as torch's profiler sees them: every call into a process
    group passes torch's dispatcher as one c10d operator ("c10d::allreduce_",
    "c10d::broadcast_", "c10d::send", ...), recorded on the calling thread
    when it is made. (The backend's own events, "gloo:all_reduce" and the
    like, are recorded where the work runs and were seen to fall outside the
    step now and then.) Off: begin and end do nothing and end returns None."""

    PREFIX = "c10d::"

    def __init__(self, args):
        self.on = args.count_collectives
        self._profile = None

    def begin(self):
        if self.on:
            from torch.profiler import ProfilerActivity, profile

            self._profile = profile(activities=[ProfilerActivity.CPU])
            self._profile.__enter__()

    def end(self):
        if self._profile is None:
            return None
        p, self._profile = self._profile, None
        p.__exit__(None, None, None)
        return sum(1 for e in p.events() if e.name.startswith(self.PREFIX))


def weights_digest(module):
    """The kernels' model digest of the parameters, as hex: equal on every
    rank exactly when the replicas hold the same bits. A sharded parameter
    (FSDP2's DTensor) is gathered whole first: a collective, every rank
    calls this at the same point."""
    from sdc_guard import _C

    names, tensors = zip(*module.named_parameters())
    tensors = [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]
    return "%016x" % _C.model_digest(list(names), [t.detach() for t in tensors])


def _number(x):
    """JSON has no NaN or infinity: a non-finite value is written as null."""
    return x if math.isfinite(x) else None


class Progress:
    """The C++ trainer's progress lines, key for key: demo/progress_line.h
    defines them and the launcher reads them, every key required with its
    JSON type. Non-finite numbers are written as null (read back as NaN)."""

    def __init__(self, args, rank):
        self.rank = rank
        self.out = open(args.progress, "a") if args.progress else None

    def step(self, step, loss, s, checkpoint, ms, weight_ms, collectives=None):
        if self.out is None:
            return
        t = s.timings_ms if s is not None else {}
        overflow = s is not None and s.overflow
        line = {
            "step": step, "rank": self.rank, "loss": _number(loss),
            "apply": s.apply if s is not None else True,
            "reason": s.reason if s is not None else "",
            "audited": s.audited if s is not None else False,
            "outcome": s.audit_outcome if s is not None else "",
            "unverified": s.audit_unverified if s is not None else False,
            "norm": _number(s.grad_norm) if s is not None else 0.0,
            "repaired": s.repaired if s is not None else False,
            "checkpoint": checkpoint, "ms": _number(ms),
            "check1_ms": _number(t.get("check1_ms", 0.0)),
            "agreement_ms": _number(t.get("agreement_ms", 0.0)),
            "audit_ms": _number(t.get("audit_ms", 0.0)), "weight_ms": _number(weight_ms),
            "end_unix_ms": time.time() * 1000,
        }
        if overflow:
            line["overflow"] = True  # Not a key the C++ trainer writes: only when set.
        if collectives is not None:
            line["collectives"] = collectives  # --count_collectives only.
        self.out.write(json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n")
        self.out.flush()

    def note(self, record):
        """A line of its own (not a step's): {"note": true, ...record}."""
        if self.out is None:
            return
        self.out.write(json.dumps({"note": True, **record}, separators=(",", ":")) + "\n")
        self.out.flush()

    def final(self, module, summary, extra=None):
        if self.out is None:
            return
        guard = {}
        if summary is not None:
            guard = {k: summary[k] for k in (
                "steps", "skipped", "audits", "weight_checks", "repairs", "checkpoints_allowed",
                "checkpoints_vetoed", "reports_sent", "reports_acked", "reports_dropped",
                "audits_off")}
            guard["unverified"] = summary["audits_unverified"]
            guard["mismatches"] = summary["audit_mismatches"]
            if summary.get("every_step"):  # Guard(every_step=True): the product checksums.
                for k in ("checksum_alarms", "checksum_skips", "products_checked"):
                    guard[k] = summary[k]
            if summary["buddy_checks"] or summary["sharded_audits"]:  # Sharded layouts.
                for k in ("buddy_checks", "buddy_findings", "buddy_bytes_sent",
                          "sharded_audits", "sharded_audit_mismatches"):
                    guard[k] = summary[k]
                # Integers only (the launcher keeps those): microseconds.
                guard["buddy_us"] = round(summary["buddy_ms"] * 1000)
                guard["sharded_audit_us"] = round(summary["sharded_audit_ms"] * 1000)
        self.out.write(json.dumps({"final": True, "rank": self.rank,
                                   "weights_digest": weights_digest(module), "guard": guard,
                                   **(extra or {})},
                                  separators=(",", ":")) + "\n")
        self.out.flush()


class Turns:
    """Turn-taking between clusters on one machine (the overhead benchmark),
    as the C++ trainer does: a turn starts once rank 0 reads this cluster's
    name (or *) in the file and every rank passed a barrier; it ends with a
    barrier and rank 0 naming the next cluster."""

    def __init__(self, args, rank, first_step, last_step):
        self.file, self.name, self.next = args.turn_file, args.turn_name, args.turn_next
        self.steps, self.rank, self.first, self.last = args.turn_steps, rank, first_step, last_step
        if self.file and not (self.name and self.next):
            raise SystemExit("--turn_file: needs --turn_name and --turn_next")

    def begin(self, step):
        if not self.file or (step - self.first) % self.steps != 0:
            return
        if self.rank == 0:
            while True:
                try:
                    with open(self.file) as f:
                        holder = f.readline().strip()
                except FileNotFoundError:
                    holder = ""
                if holder in (self.name, "*"):
                    break
                time.sleep(0.005)
        dist.barrier()

    def end(self, step):
        if not self.file or ((step - self.first + 1) % self.steps != 0 and step != self.last):
            return
        dist.barrier()
        if self.rank != 0:
            return
        tmp = f"{self.file}.{self.name}"
        with open(tmp, "w") as f:
            f.write(self.next + "\n")
        os.replace(tmp, self.file)
