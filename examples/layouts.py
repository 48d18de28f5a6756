"""How examples/ddp_train.py lays its model over the ranks (--layout):

  ddp   every rank a full replica (DistributedDataParallel), the default;
  fsdp  FSDP2 (``fully_shard``) on a 1-D mesh: every rank holds a shard of
        its own, no replica of any shard (the guard's buddy check);
  hsdp  FSDP2 on a replicate x shard mesh of --replicas x (world / replicas):
        rank r holds shard r % shards, and the ranks with the same shard (one
        per replica) hold the same bits (the weight vote per shard);
  zero  DDP with a ZeroRedundancyOptimizer (ZeRO-1): full replicas, every rank
        updating a partition of the parameters and broadcasting it (the
        guard's buddy check verifies each partition's update).

With the demo's numbering (rank = node x GPUs per node + local rank) and
--replicas = nodes, HSDP's replicas of a shard sit on different nodes, as a
real job lays them out: a node's fault then shows in one replica of each
shard it holds. The transformer's blocks are not modules with a forward of
their own, so the whole model is one FSDP unit (one all-gather per forward).
"""

import torch
import torch.distributed as dist

LAYOUTS = ("ddp", "fsdp", "hsdp", "zero")


def add_flags(p):
    p.add_argument("--layout", choices=LAYOUTS, default="ddp",
                   help="ddp: full replicas; fsdp: FSDP2 on a 1-D mesh; hsdp: FSDP2 on a "
                        "--replicas x (world / replicas) mesh; zero: DDP and a "
                        "ZeroRedundancyOptimizer")
    p.add_argument("--replicas", type=int, default=3,
                   help="--layout=hsdp: the mesh's replicate dim (the demo passes its nodes)")


def check_flags(p, args):
    """Errors for what a sharded layout does not take in this example."""
    if args.layout in ("ddp", "zero"):
        return
    if args.micro_batches != 1:
        p.error(f"--layout={args.layout}: one micro-batch per step (no gradient accumulation here)")
    if args.resume or args.first_step != 1:
        p.error(f"--layout={args.layout}: --resume is for the ddp layout (the sharded example "
                "resumes in examples/hsdp_train.py)")
    if args.device != "cpu" or args.compile != "none" or args.comm_hook != "none":
        p.error(f"--layout={args.layout}: CPU, no --compile and no --comm_hook in this example")


def wrap(args, module, device, broadcast_buffers=True):
    """The model the loop trains: DDP over ``module``, or ``module`` itself
    sharded in place by ``fully_shard`` on the layout's mesh."""
    if args.layout in ("ddp", "zero"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
                   broadcast_buffers=broadcast_buffers)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    if args.layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    else:
        if args.replicas < 2 or world % args.replicas:
            raise SystemExit(f"--layout=hsdp: --replicas={args.replicas} must be at least 2 and "
                             f"divide the world size {world}")
        mesh = init_device_mesh("cpu", (args.replicas, world // args.replicas),
                                mesh_dim_names=("replicate", "shard"))
    return fully_shard(module, mesh=mesh)


def optimizer(args, params):
    """AdamW over ``params``; under ZeRO each rank keeps the state of, and
    updates, only its partition of them."""
    if args.layout == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=args.lr)
    return torch.optim.AdamW(params, lr=args.lr)


def state_to_save(args, net, optimizer):
    """(state, format) for ProvisionalCheckpoints.checkpoint: the DDP model's
    state dict saved by one writer, or a sharded one (each rank its shards,
    torch.distributed.checkpoint). ZeRO's replicas hold the whole model:
    its weights are saved as DDP's are (the optimizer's partitions are not)."""
    if args.layout in ("ddp", "zero"):
        return net.state_dict(), "torch"
    import sdc_guard

    return {"train": sdc_guard.TrainingState(net, optimizer)}, "dcp"

