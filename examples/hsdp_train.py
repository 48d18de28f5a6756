#!/usr/bin/env python3
"""A small MLP trained with HSDP (FSDP2's fully_shard on a replicate x shard
DeviceMesh, Gloo on the CPU), with FSDP2 on a 1-D mesh (--replicas=1:
every rank a shard of its own), or with ZeRO-1 (--zero: DDP and a
ZeroRedundancyOptimizer, every rank updating a partition of its own), with
or without sdc-guard.

    torchrun --nproc_per_node=6 examples/hsdp_train.py --replicas=3 --shards=2
    torchrun --nproc_per_node=6 examples/hsdp_train.py --replicas=3 --shards=2 --unguarded
    torchrun --nproc_per_node=6 examples/hsdp_train.py --replicas=1 --shards=6 --optimizer=sgd
    torchrun --nproc_per_node=6 examples/hsdp_train.py --zero
    torchrun --nproc_per_node=6 examples/hsdp_train.py --replicas=3 --tp=2

With --tp=N the Mlp is tensor parallel instead (parallelize_module over the
"tp" dim of a (replicas, N) mesh: Colwise, Rowwise, Colwise) and replicated
over the "dp" dim by FSDP2's replicate (torch.distributed._composable.
replicate_with_fsdp); the N ranks of one dp replica train on one batch.

Each rank trains on its own micro-batches (every rank of an FSDP job is a
data-parallel rank). The lines marked `# sdc-guard` are all that guarding
takes. Tests use --rank/--world_size/--rendezvous and --progress (JSON lines:
one per step, then each rank's final digest of its own shards), and
--corrupt_at_rest=RANK:STEP, which flips one bit of RANK's shard of the first
parameter after STEP's optimizer step, outside the guard (corruption of a
stored shard at rest, as faulty memory would do it). With --zero it flips a
bit of the first parameter of RANK's ZeRO partition as step STEP + 1 begins:
still between the two optimizer steps, and after step STEP's weight vote,
which would otherwise see that replica differ from the others.
--corrupt_grad=RANK:STEP nudges one element of an activation's gradient in
RANK's backward of STEP (a finite local-gradient fault, loss unchanged). With --checkpoint_dir
the gate's allowed checkpoints are torch.distributed.checkpoint sharded state
dicts kept provisional until sdcd confirms them (sdc_guard.ProvisionalCheckpoints;
with --zero each rank's ZeRO partition state), and --resume starts from the
newest final one (a line {"note": true, "restored": STEP, "shard_digest": ...}).
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_support  # noqa: E402  (--rank/--world_size/--rendezvous)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--replicas", type=int, default=3, help="the mesh's replicate dim")
    p.add_argument("--shards", type=int, default=2, help="the mesh's shard dim")
    p.add_argument("--tp", type=int, default=0,
                   help="tensor parallel over this many ranks (replicas x tp = world size)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="AdamW, or SGD with momentum 0.9 and weight decay")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--checkpoint_every", type=int, default=0,
                   help="ask the guard's checkpoint gate every N steps")
    p.add_argument("--checkpoint_dir", default="",
                   help="save allowed checkpoints here (torch.distributed.checkpoint)")
    p.add_argument("--resume", action="store_true",
                   help="start after the newest final checkpoint in --checkpoint_dir")
    p.add_argument("--zero", action="store_true",
                   help="DDP with a ZeroRedundancyOptimizer of --optimizer over every rank "
                        "(--replicas and --shards are ignored)")
    p.add_argument("--audit_every", type=int, default=0,
                   help="with --zero: the guard's replay audits every N steps (0: its default)")
    p.add_argument("--corrupt_at_rest", default="", help="RANK:STEP (tests only)")
    p.add_argument("--corrupt_grad", default="", help="RANK:STEP (tests only)")
    p.add_argument("--replay_raises", default="",
                   help="RANK:WHERE (tests only): RANK's loss_fn raises while the guard replays, "
                        "WHERE before-forward, after-forward or mid-forward")
    p.add_argument("--on_guard_error", choices=["raise", "continue"], default="raise",
                   help="continue: a GuardError (raised on every rank alike) skips the step")
    p.add_argument("--unguarded", action="store_true", help="train without sdc-guard")
    cluster_support.add_flags(p)
    return p.parse_args()


class Mlp(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(16, width), torch.nn.Linear(width, width), torch.nn.Linear(width, 4)])
        self.fault_point = lambda x: x  # guard.fault_point when guarded (fault injection).
        self.corrupt_grad = False  # Armed: the next backward's local gradients (tests only).
        self.raises = lambda where: None  # Raises in a replay (--replay_raises, tests only).

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i == 0:
                x = self.fault_point(x)
                self.raises("mid-forward")  # Between FSDP units' all-gathers.
            if i == 1 and self.corrupt_grad:
                self.corrupt_grad = False
                x.register_hook(nudge)
            if i + 1 < len(self.layers):
                x = torch.tanh(x)
        return x


def nudge(grad):
    """One element of an activation's gradient off by 2^-10 relative: the
    local gradients of the layers below it are finite and wrong, the loss is not."""
    grad = grad.clone()
    flat = grad.view(-1)
    k = int(flat.abs().argmax())
    flat[k] = flat[k] * (1 + 2**-10)
    print(f"rank {dist.get_rank()}: CORRUPTED one element of a local gradient", file=sys.stderr,
          flush=True)
    return grad


def loss_fn(module, batch):
    net = module.module if hasattr(module, "module") else module
    net.raises("before-forward")
    x, y = batch
    out = module(x)
    net.raises("after-forward")
    return torch.nn.functional.mse_loss(out, y)


def replay_raises(args, guard, rank):
    """Mlp.raises for --replay_raises: an error of this rank's loss_fn while
    the guard replays (a loss function failing on a peer's batch)."""
    if not args.replay_raises or guard is None:
        return lambda where: None
    who, where = args.replay_raises.split(":")

    def raises(at):
        if guard.replaying and int(who) == rank and at == where:
            raise ValueError(f"INJECTED replay error {where} on rank {rank}")
    return raises


def batch_of(args, step, rank):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(args.batch, 16, generator=g)
    return x, torch.sin(x[:, :4] * 2) + 0.1 * torch.randn(args.batch, 4, generator=g)


def shard_digest(module):
    """The kernels' digest of this rank's local shards (fixed seed; with
    --zero the whole model): equal across runs and replicas exactly when
    the bits are."""
    from sdc_guard import _C

    names, tensors = [], []
    for n, p in module.named_parameters():
        names.append(n)
        tensors.append(local(p).detach())
    return "%016x" % _C.model_digest(names, tensors)


def optimizer_digest(optimizer):
    """The kernels' digest of this rank's optimizer state (its shards of the
    DTensor state; with --zero its own partition's): what a checkpoint
    holds of it."""
    from sdc_guard import _C

    opt = optimizer.optim if hasattr(optimizer, "optim") else optimizer
    names, tensors = [], []
    for i, group in enumerate(opt.param_groups):
        for j, p in enumerate(group["params"]):
            for key, value in sorted(opt.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    names.append(f"{i}.{j}.{key}")
                    tensors.append(local(value).detach().reshape(-1).float())
    return "%016x" % _C.model_digest(names, tensors)


def local(p):
    """This rank's shard of a parameter (FSDP2's DTensor), or the parameter."""
    return p.to_local() if hasattr(p, "to_local") else p


def corrupt_at_rest(module, optimizer):
    """One bit of this rank's shard of the first parameter (ZeRO: of its
    partition's first parameter), flipped in place."""
    with torch.no_grad():
        if hasattr(optimizer, "optim"):  # A ZeroRedundancyOptimizer: its local optimizer's.
            local = optimizer.optim.param_groups[0]["params"][0]
        else:
            local = next(module.parameters()).to_local()
        bits = local.view(-1)[:1].view(torch.int32)
        bits ^= 1 << 22
    print(f"rank {dist.get_rank()}: CORRUPTED one bit of its stored shard", file=sys.stderr,
          flush=True)


def main():
    args = parse_args()
    torch.set_num_threads(1)  # Ranks share the CPUs.
    cluster_support.init_process_group(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.replicas * (args.tp or args.shards) != world and not args.zero:
        raise SystemExit(f"--replicas x --shards (or --tp) must be the world size {world}")
    data_rank = rank  # Whose batch this rank trains on: with --tp its dp replica's.
    if args.tp:
        mesh = init_device_mesh("cpu", (args.replicas, args.tp), mesh_dim_names=("dp", "tp"))
        data_rank = mesh.get_coordinate()[0]
    elif args.zero:
        mesh = None
    elif args.replicas == 1:  # FSDP: no replica of any shard (the guard's buddy check).
        mesh = init_device_mesh("cpu", (args.shards,), mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh("cpu", (args.replicas, args.shards),
                                mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(args.seed)  # Every rank builds the same model before sharding.
    model = net = Mlp(args.width)  # net: the Mlp itself (model may be DDP around it).
    if args.optimizer == "sgd":
        cls, settings = torch.optim.SGD, dict(lr=args.lr, momentum=0.9, weight_decay=1e-4)
    else:
        cls, settings = torch.optim.AdamW, dict(lr=args.lr)
    if args.tp:
        from torch.distributed._composable.replicate_with_fsdp import replicate
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        parallelize_module(model, mesh["tp"], {
            "layers.0": ColwiseParallel(), "layers.1": RowwiseParallel(),
            "layers.2": ColwiseParallel(output_layouts=Replicate())})
        for layer in model.layers:
            replicate(layer, mesh=mesh["dp"])
        replicate(model, mesh=mesh["dp"])
        optimizer = cls(model.parameters(), **settings)
    elif args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **settings)
    else:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = cls(model.parameters(), **settings)
    corrupt = tuple(int(v) for v in args.corrupt_at_rest.split(":")) if args.corrupt_at_rest \
        else (-1, -1)
    corrupt_grad = tuple(int(v) for v in args.corrupt_grad.split(":")) if args.corrupt_grad \
        else (-1, -1)

    guard = checkpoints = None
    first = 1
    if not args.unguarded:
        import sdc_guard  # sdc-guard

        audits = {"audit_every": args.audit_every} if args.audit_every else {}
        # sdc-guard: finds the mesh's shards, or ZeRO's partitions from the optimizer.
        guard = sdc_guard.Guard(model, optimizer, loss_fn, **audits)
        net.fault_point = guard.fault_point  # Tests' and demos' fault injection only.
        net.raises = replay_raises(args, guard, rank)
        if args.checkpoint_dir:  # ZeRO: each rank's partition state (TrainingState)
            checkpoints = sdc_guard.ProvisionalCheckpoints(guard, args.checkpoint_dir)  # sdc-guard
            state = {"train": sdc_guard.TrainingState(model, optimizer)}
    if args.resume:
        if checkpoints is None:
            raise SystemExit("--resume needs --checkpoint_dir (and the guard)")
        storage = [local(p).data_ptr() for p in model.parameters()]
        resumed = checkpoints.restore(state)  # sdc-guard: the newest final one (a collective)
        if resumed is None:
            raise SystemExit(f"--resume: no final checkpoint in {args.checkpoint_dir}")
        # Loading copies into the shards the guard checks; it must not replace them.
        assert storage == [local(p).data_ptr() for p in model.parameters()]
        first = resumed + 1
        if args.progress:
            with open(args.progress, "a") as f:
                f.write(json.dumps({"note": True, "restored": resumed, "rank": rank,
                                    "shard_digest": shard_digest(model),
                                    "optimizer_digest": optimizer_digest(optimizer)}) + "\n")

    out = open(args.progress, "a") if args.progress else None
    for step in range(first, args.steps + 1):
        batch = batch_of(args, step, data_rank)
        record = {"step": step, "rank": rank}
        net.corrupt_grad = (rank, step) == corrupt_grad
        if guard is not None:
            try:
                with guard.step(step, batch) as s:  # sdc-guard
                    if args.zero and (rank, step - 1) == corrupt:
                        corrupt_at_rest(model, optimizer)
                    loss = loss_fn(model, batch)
                    s.backward(loss)  # sdc-guard: in place of loss.backward()
            except sdc_guard.GuardError as e:  # Every rank alike (the step is skipped).
                if args.on_guard_error == "raise":
                    raise
                record["guard_error"] = str(e)
            applied = guard.optimizer_step(optimizer)  # sdc-guard: applies or skips
            record.update(apply=applied, reason=s.reason, audited=s.audited,
                          audit_outcome=s.audit_outcome, repaired=s.repaired)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            record.update(apply=True, reason="")
        if (rank, step) == corrupt and not args.zero:
            corrupt_at_rest(model, optimizer)
        if args.checkpoint_every and step % args.checkpoint_every == 0 and guard is not None:
            if checkpoints is not None:  # sdc-guard: the gate, then a provisional sharded save
                allowed = checkpoints.checkpoint(step, state)
            else:
                allowed = guard.may_checkpoint()  # sdc-guard
            record["checkpoint"] = "allowed" if allowed else "vetoed"
            if allowed:
                record["shard_digest"] = shard_digest(model)  # What the checkpoint holds.
                record["optimizer_digest"] = optimizer_digest(optimizer)
        record["loss"] = loss.item()
        if out is not None:
            out.write(json.dumps(record) + "\n")
            out.flush()

    final = {"final": True, "rank": rank, "shard_digest": shard_digest(model)}
    if guard is not None:
        guard.shutdown(flush_seconds=10)  # sdc-guard: the last reports reach sdcd
        if checkpoints is not None:
            dist.barrier()  # Every rank's reports are in: a late revocation is decided.
            checkpoints.finish()  # sdc-guard: a revocation after the last checkpoint
        summary = guard.summary()
        final["guard"] = {k: summary[k] for k in ("steps", "skipped", "weight_checks",
                                                  "checkpoints_allowed", "checkpoints_vetoed",
                                                  "reports_dropped", "buddy_checks",
                                                  "buddy_findings", "buddy_bytes_sent",
                                                  "buddy_ms", "buddy_vetoes", "audits",
                                                  "repairs", "sharded_audits",
                                                  "sharded_audit_mismatches", "sharded_audit_ms")}
    if out is not None:
        out.write(json.dumps(final) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
