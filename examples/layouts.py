"""How examples/ddp_train.py lays its model over the ranks (--layout):

  ddp   every rank a full replica (DistributedDataParallel), the default;
  fsdp  FSDP2 (``fully_shard``) on a 1-D mesh: every rank holds a shard of
        its own, no replica of any shard (the guard's buddy check);
  hsdp  FSDP2 on a replicate x shard mesh of --replicas x (world / replicas):
        rank r holds shard r % shards, and the ranks with the same shard (one
        per replica) hold the same bits (the weight vote per shard);
  zero  DDP with a ZeroRedundancyOptimizer (ZeRO-1): full replicas, every rank
        updating a partition of the parameters and broadcasting it (the
        guard's buddy check verifies each partition's update);
  tp    tensor parallel over --replicas x (world / replicas) = dp x tp: the
        transformer parallelised over the "tp" dim (parallelize_module) and
        replicated over "dp" by FSDP2's replicate; rank r is tp rank
        r % tp of dp replica r // tp, and the tp ranks of one replica train
        on one batch with one dropout stream (data_rank).

With the demo's numbering (rank = node x GPUs per node + local rank) and
--replicas = nodes, HSDP's replicas of a shard sit on different nodes, as a
real job lays them out: a node's fault then shows in one replica of each
shard it holds. On tp the same numbering puts a dp replica's tp group on
one node (tp inside a node, as real jobs place it). The transformer's
blocks are not modules with a forward of their own, so the whole model is
one FSDP unit (one all-gather per forward).

The transformer under tp (``_tensor_parallel``) keeps every head whole on
one tp rank: qkv is ColwiseParallel and read head-major
(TinyTransformer.head_major), proj RowwiseParallel (one all-reduce), fc1
Colwise and fc2 Rowwise (one all-reduce), the embeddings RowwiseParallel
over the vocabulary / positions, the head ColwiseParallel gathering the
logits; the LayerNorms are replicated on tp (Replicate() DTensors, so that
FSDP2 places every parameter on the one (dp, tp) mesh). A 4-head, width-64
model splits over tp = 1, 2 or 4.
"""

import torch
import torch.distributed as dist

LAYOUTS = ("ddp", "fsdp", "hsdp", "zero", "tp")


def add_flags(p):
    p.add_argument("--layout", choices=LAYOUTS, default="ddp",
                   help="ddp: full replicas; fsdp: FSDP2 on a 1-D mesh; hsdp: FSDP2 on a "
                        "--replicas x (world / replicas) mesh; zero: DDP and a "
                        "ZeroRedundancyOptimizer; tp: tensor parallel over world / replicas "
                        "ranks, replicated over --replicas")
    p.add_argument("--replicas", type=int, default=3,
                   help="--layout=hsdp, tp: the mesh's replicate (dp) dim (the demo passes its "
                        "nodes)")


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
    if args.layout == "tp" and (args.model != "transformer" or args.checkpointing != "none"):
        p.error("--layout=tp: the transformer (its tp plan below), without --checkpointing")


def data_rank(args, rank):
    """Whose batches and dropout stream ``rank`` trains with: its own, or
    under tp its dp replica's (every tp rank of a replica computes one
    model's forward on one batch)."""
    if args.layout != "tp":
        return rank
    return rank // (dist.get_world_size() // args.replicas)


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
    if args.layout == "tp":
        return _tensor_parallel(args, module, world)
    if args.layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    else:
        if args.replicas < 2 or world % args.replicas:
            raise SystemExit(f"--layout=hsdp: --replicas={args.replicas} must be at least 2 and "
                             f"divide the world size {world}")
        mesh = init_device_mesh("cpu", (args.replicas, world // args.replicas),
                                mesh_dim_names=("replicate", "shard"))
    return fully_shard(module, mesh=mesh)


def _tensor_parallel(args, module, world):
    """``module`` (the transformer) parallelised over the "tp" dim of a
    (replicas, world / replicas) mesh, then replicated over "dp" by FSDP2's
    replicate; every parameter ends on that one 2-D mesh."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    if args.replicas < 2 or world % args.replicas:
        raise SystemExit(f"--layout=tp: --replicas={args.replicas} must be at least 2 and "
                         f"divide the world size {world}")
    tp = world // args.replicas
    if module.heads % tp:
        raise SystemExit(f"--layout=tp: {module.heads} heads do not split over tp = {tp}")
    mesh = init_device_mesh("cpu", (args.replicas, tp), mesh_dim_names=("dp", "tp"))
    plan = {"token": RowwiseParallel(input_layouts=Replicate()),
            "position": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(module.blocks)):
        plan.update({f"blocks.{i}.qkv": ColwiseParallel(), f"blocks.{i}.proj": RowwiseParallel(),
                     f"blocks.{i}.fc1": ColwiseParallel(), f"blocks.{i}.fc2": RowwiseParallel()})
    parallelize_module(module, mesh["tp"], plan)
    module.head_major = True

    def replicated_in(mod, inputs, device_mesh):  # Each tp rank holds the same activations.
        return tuple(DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) else x for x in inputs)

    def local_out(mod, output, device_mesh):
        return output.to_local() if isinstance(output, DTensor) else output

    for sub in module.modules():
        if isinstance(sub, torch.nn.LayerNorm):
            distribute_module(sub, mesh["tp"], input_fn=replicated_in, output_fn=local_out)
    return replicate(module, mesh=mesh["dp"])


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
        return net.state_dict(), "torch"  # (tp: each rank its tp shards, as FSDP's.)
    import sdc_guard

    return {"train": sdc_guard.TrainingState(net, optimizer)}, "dcp"

