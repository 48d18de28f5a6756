"""The guard's layout of a tensor-parallel model replicated over a
data-parallel dim (issue 44, item 5): "tp".

What it covers, as torch 2.11 runs it on CPU with Gloo:

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {...ColwiseParallel(), RowwiseParallel()...})
    replicate(model, mesh=mesh["dp"])  # torch.distributed._composable.replicate_with_fsdp

or the same with ``fully_shard(model, mesh=mesh3["dp", "shard"])`` on a
(dp, 1, tp) mesh (HSDP with one rank per shard, TorchTitan's spelling of
dp x tp). ``DistributedDataParallel`` itself refuses such a model (its
bucketing flattens a tp-sharded DTensor: "Attempted to flatten multiple
dimensions"), and ``fully_shard`` on the dp dim alone shards every
parameter over dp, leaving no replica to vote with. Both spellings above
run FSDP2's machinery with a shard group of one rank: every parameter is
``Replicate()`` on the dp dim, FSDP never calls the reduce-scatter (it
copies), and all-reduces each parameter group's gradients over dp.

The ranks with one tp coordinate hold the same tensors (the tp shard of
each Colwise/Rowwise weight, the whole of a replicated bias), one replica
per dp coordinate. So the tp coordinate is the rank's replica group and
shard index, its dp coordinate its replica index, and the engine's
per-shard machinery of HSDP applies unchanged: the weight fingerprint vote
per tp shard across dp (a strict majority of that shard's replicas), its
attribution naming the tp rank whose shard differs ("holds shard j/tp"),
the reduced gradients compared among those ranks only. Check 1 reads each
rank's local gradients where FSDP's shard group is one rank: in the
guard's reduce-scatter's allocation, checked when the dp all-reduce hook
runs (sharded.GuardedReduceScatter).

Replay audits (shard_replay.py) replay whole tp groups: a tp group's
forward runs tp collectives, so the ranks of dp replica d replay together,
each the micro-batch of the rank with its own tp coordinate in a partner
replica on other nodes (``replay_pairs``), and a mismatch is replayed by a
third replica's whole tp group. A replay can name a tp group, not one of
its ranks: the tp collectives mix every tp rank's activations into each
rank's loss, so a fault on one tp rank shows on all of them. When more
than one rank of a tp group mismatches, each is named a suspect of its tp
group (``verdict``); a mismatch on one rank alone (a fault in its own
local gradients) keeps the three-node rule's verdict naming that rank.
"""

import torch.distributed as dist

from sdc_guard import buddy, sharded


def layout(model, process_group, mesh, placements):
    """The "tp" Layout of an FSDP2 module on ``mesh`` whose parameters are
    placed ``placements`` ({name: tuple of placements}); TypeError naming
    what is not covered: no dim on which every parameter is replicated
    (FSDP x TP), or more than one dim of several ranks on which they differ
    (HSDP with a shard dim of several ranks x TP, or a mesh of more dims)."""
    dims = range(mesh.ndim)
    all_replicated = [all(isinstance(p[d], sharded.Replicate) for p in placements.values())
                      for d in dims]
    replicate = [d for d in dims if all_replicated[d] and mesh.size(d) > 1]
    split = [d for d in dims if not all_replicated[d] and mesh.size(d) > 1]
    first = next(iter(placements.items()))
    if len(replicate) != 1:
        raise TypeError(
            sharded._NOT_COVERED + f"on this {mesh.ndim}-D mesh {mesh} {len(replicate)} dims of "
            f"several ranks hold every parameter replicated (parameter {first[0]!r} is placed "
            f"{first[1]}): a tensor parallel layout needs exactly one, the data-parallel dim "
            "(FSDP sharding over dp with tensor parallel leaves no replica to vote with; "
            "replicate over dp, or HSDP with one rank per shard)")
    if len(split) != 1:
        raise TypeError(
            sharded._NOT_COVERED + f"on this {mesh.ndim}-D mesh {mesh} the parameters differ on "
            f"{len(split)} dims of several ranks (parameter {first[0]!r} is placed {first[1]}): "
            "a tensor parallel layout covers one, the tp dim (HSDP with a shard dim of several "
            "ranks and tensor parallel is not covered yet)")
    dp_dim, tp_dim = replicate[0], split[0]
    group, coordinate = sharded._group_and_coordinate(mesh, process_group)
    fsdp_modules = tuple(m for m in model.modules() if isinstance(m, sharded.FSDPModule))
    return sharded.Layout(
        "tp", model, group, shard_index=int(coordinate[tp_dim]), shard_count=mesh.size(tp_dim),
        replica_index=int(coordinate[dp_dim]), replica_count=mesh.size(dp_dim),
        fsdp_modules=fsdp_modules)


def replay_pairs(layout, group, nodes):
    """(replayer, third, tp_group) per rank of ``group`` (a collective; see
    ``pairs``)."""
    coords = [None] * dist.get_world_size(group)
    dist.all_gather_object(coords, (layout.replica_index, layout.shard_index), group=group)
    return pairs(coords, nodes, layout.replica_count, layout.shard_count)


def pairs(coords, nodes, replicas, tps):
    """(replayer, third, tp_group) per rank from every rank's (dp, tp)
    coordinates and node: ``buddy.pairs`` over the dp replicas (a replica's
    nodes: its ranks'), mapped to the rank of the same tp coordinate, so
    that each tp group replays one partner tp group's micro-batch at once.
    A partner replica sharing a node with the replica is none, and when
    any replica has none no rank has a replayer (None: replays off)."""
    rank_of = {c: r for r, c in enumerate(coords)}
    replica_nodes = [sorted({nodes[r] for r, (d, _) in enumerate(coords) if d == dp})
                     for dp in range(replicas)]
    dp_replayer, dp_third = buddy.pairs([",".join(n) for n in replica_nodes])

    def rank(partner, d, j):
        if partner is None or set(replica_nodes[partner]) & set(replica_nodes[d]):
            return None
        return rank_of[(partner, j)]

    replayer = [rank(dp_replayer[d], d, j) for d, j in coords]
    if None in replayer:  # Every rank replays in every round, or none does.
        replayer = [None] * len(coords)
    third = [rank(dp_third[d], d, j) if replayer[r] is not None else None
             for r, (d, j) in enumerate(coords)]
    tp_group = [[rank_of[(d, k)] for k in range(tps)] for d, _ in coords]
    return replayer, third, tp_group


def verdict(text, subject, mismatched, tp_group):
    """The three-node rule's ``text`` for ``subject``, as a suspect of its tp
    group when other ranks of that group mismatched too (the tp
    collectives mix their activations: the replay cannot tell which). The
    tp group and why leads, after the mark sdcd parses and "(replay audit)",
    which makes sdcd's incident check 2's: the engine keeps a skipped step's
    first 200 characters for sdcd."""
    together = [r for r in tp_group[subject] if r in mismatched]
    if len(together) < 2:
        return text
    ranks = ", ".join(str(r) for r in together)
    _, _, rest = text.partition("): ")
    return (f"{buddy.MARK} (suspect): a tp group's replays differed together (replay audit): "
            f"ranks {ranks} (tp mixes activations: no replay tells which is wrong); "
            f"{rest}")
