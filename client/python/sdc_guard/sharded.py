"""What the guard needs to know about a model's layout, and the hooks it
puts on a sharded one.

``layout_of(model, process_group)`` says which ranks hold replicas of the
same tensors and which hold different shards:

  * a ``DistributedDataParallel`` model: every rank a full replica (one
    replica group, as before);
  * an FSDP2 module (``fully_shard``) on a 2-D ``DeviceMesh`` whose
    parameters are placed ``Replicate()`` on one dim and ``Shard(d)`` on the
    other, i.e. HSDP: the ranks with the same coordinate on the shard dim
    hold the same shard, one replica each, so that coordinate is the rank's
    replica group (the weight vote and its attribution run per shard, a
    strict majority of that shard's replicas), and the reduced gradients are
    compared in-band among those ranks only.

  * an FSDP2 module on a 1-D ``DeviceMesh`` (``Shard(d)``): every rank holds
    a shard of its own, a replica group of one; its optimizer update is
    verified by the buddy check (buddy.py).

  * tensor parallel x data parallel ("tp"): a model parallelised with
    ``parallelize_module`` over the "tp" dim of a (dp, tp) ``DeviceMesh``,
    then replicated over "dp" by FSDP2 with a replicate placement
    (``torch.distributed._composable.replicate_with_fsdp.replicate(model,
    mesh=mesh["dp"])``, or ``fully_shard`` on a (dp, 1) replicate x shard
    mesh of a (dp, 1, tp) mesh: HSDP with one rank per shard). Every
    parameter is ``Replicate()`` on the dp dim; the tp dim is where they
    differ (``Shard(d)`` for Colwise/Rowwise weights, ``Replicate()`` for a
    Rowwise bias). The ranks with the same tp coordinate hold the same
    tensors, one replica per dp coordinate: the tp coordinate is the rank's
    replica group and shard index, so the weight vote runs per tp shard
    across dp and names the tp rank whose shard differs (tp_layout below).

Anything else is a TypeError saying what is not covered yet: a mesh of more
than two dims of more than one rank, FSDP sharding over dp with tensor
parallel (no replica of any shard). (A ``ZeroRedundancyOptimizer``
around a DDP model is layout "ddp": the guard finds ZeRO from the optimizer
and verifies each rank's partition update with the buddy check, buddy.py.)

On an HSDP module the guard's check 1 runs in FSDP's own communication
seams (public FSDP2 APIs): a custom reduce-scatter (``ReduceScatter``,
``FSDPModule.set_custom_reduce_scatter``) scans each reduce-scatter input,
i.e. this rank's local gradients of one parameter group, before it is sent;
the all-reduce hook (``set_all_reduce_hook``) hands the engine each reduced
shard after the replicate-dim all-reduce, which is the tensor the sharded
gradients are views of.
"""

import dataclasses

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from sdc_guard._C import GuardError

try:  # torch >= 2.6 exports FSDP2 here.
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover  (a torch without FSDP2: DDP only)
    FSDPModule = ReduceScatter = DTensor = Replicate = Shard = None
try:  # FSDP2's replicate placement (torch >= 2.9): tensor parallel's data parallelism.
    from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
except ImportError:  # pragma: no cover
    ReplicateModule = ()


@dataclasses.dataclass
class Layout:
    """How the guard sees a model. ``kind``: "ddp", "hsdp" or "fsdp" (FSDP2
    on a 1-D mesh: no replica of any shard)."""

    kind: str  # "ddp", "hsdp", "fsdp" or "tp".
    module: torch.nn.Module  # What loss_fn(module, batch) is called with.
    process_group: object  # The group every rank of the job is in.
    shard_index: int = 0
    shard_count: int = 0  # 0: full replicas.
    replica_index: int = 0
    replica_count: int = 0
    fsdp_modules: tuple = ()

    @property
    def sharded(self):
        return self.shard_count > 0

    def variables(self):
        """The engine's SDC_* settings this layout fixes."""
        if not self.sharded:
            return {}
        return {
            "SDC_REPLICA_GROUP": str(self.shard_index),
            "SDC_SHARD_INDEX": str(self.shard_index),
            "SDC_SHARD_COUNT": str(self.shard_count),
            "SDC_REPLICA_INDEX": str(self.replica_index),
            # The engine's replay audit replays one rank alone, which FSDP's
            # collectives cannot: shard_replay.py runs them on these layouts.
            "SDC_AUDIT_EVERY": "0",
        }


_NOT_COVERED = (
    "sdc_guard.Guard covers a DistributedDataParallel model, an FSDP2 module on a 1-D "
    "DeviceMesh (FSDP), one on a 2-D replicate x shard DeviceMesh (HSDP) and a tensor "
    "parallel model replicated over a dp dim (tp); ")


def _name(model):
    return f"{type(model).__module__}.{type(model).__name__}"


def check_kind(model):
    """TypeError unless ``model`` is DDP or an FSDP2 module."""
    if isinstance(model, DistributedDataParallel):
        return
    if FSDPModule is None or not isinstance(model, FSDPModule):
        raise TypeError(
            "sdc_guard.Guard needs the model wrapped in "
            "torch.nn.parallel.DistributedDataParallel, or an FSDP2 module (fully_shard) on a "
            f"2-D replicate x shard DeviceMesh (HSDP), got {_name(model)}")


def layout_of(model, process_group=None):
    """The Layout of ``model``; TypeError for a layout the guard does not
    cover, naming what it is; ValueError when the mesh and the process group
    disagree."""
    check_kind(model)
    if isinstance(model, DistributedDataParallel):
        group = process_group if process_group is not None else model.process_group
        return Layout("ddp", model.module, group)
    return _hsdp_layout(model, process_group)


def _hsdp_layout(model, process_group):
    mesh = placements = None
    mixed = False  # Parameters placed differently on one mesh: tensor parallel.
    by_name = {}
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor):
            raise TypeError(
                _NOT_COVERED + f"parameter {name!r} of this FSDP2 module is not a DTensor (a "
                "parameter fully_shard did not manage is not covered yet)")
        by_name[name] = tuple(p.placements)
        if mesh is None:
            mesh, placements = p.device_mesh, tuple(p.placements)
        elif p.device_mesh != mesh:
            raise TypeError(
                _NOT_COVERED + f"parameter {name!r} is placed on {p.device_mesh}, another mesh "
                f"than the first parameter's {mesh} (mixed meshes are not covered yet)")
        elif tuple(p.placements) != placements:
            mixed = True
    if mesh is None:
        raise TypeError(_NOT_COVERED + "this FSDP2 module has no parameters")
    if mixed and mesh.ndim == 1:
        raise TypeError(
            _NOT_COVERED + f"the parameters of this FSDP2 module are placed differently on a "
            f"1-D mesh ({placements} and others): per-parameter shard placements are not "
            "covered yet")
    if mixed or mesh.ndim > 2 or isinstance(model, ReplicateModule):
        # (FSDP2's replicate on a (dp, tp) mesh whose parameters all happen
        # to be placed alike, e.g. all Colwise, is tensor parallel too.)
        import sdc_guard.tensor_parallel as tensor_parallel  # noqa: PLC0415  (it imports this)

        return tensor_parallel.layout(model, process_group, mesh, by_name)
    replicate = [i for i, pl in enumerate(placements) if isinstance(pl, Replicate)]
    shard = [i for i, pl in enumerate(placements) if isinstance(pl, Shard)]
    if mesh.ndim == 1 and len(shard) == 1:
        return _fsdp_layout(model, process_group, mesh)
    if mesh.ndim != 2 or len(replicate) != 1 or len(shard) != 1:
        raise TypeError(
            _NOT_COVERED + f"these parameters are placed {placements} on a {mesh.ndim}-D mesh "
            "(only (Shard(d),) and (Replicate(), Shard(d)) are covered: tensor parallel and "
            "meshes of more dims are not covered yet)")
    r_dim, s_dim = replicate[0], shard[0]
    replicas, shards = mesh.size(r_dim), mesh.size(s_dim)
    if replicas < 2:
        raise TypeError(
            _NOT_COVERED + f"the replicate dim has {replicas} rank: every shard is held by one "
            "rank only; shard over a 1-D mesh for that (FSDP, checked by the buddy check)")
    group, coordinate = _group_and_coordinate(mesh, process_group)
    fsdp_modules = tuple(m for m in model.modules() if isinstance(m, FSDPModule))
    return Layout("hsdp", model, group, shard_index=int(coordinate[s_dim]), shard_count=shards,
                  replica_index=int(coordinate[r_dim]), replica_count=replicas,
                  fsdp_modules=fsdp_modules)


def _group_and_coordinate(mesh, process_group):
    """The process group the guard's collectives use (it must span the mesh)
    and this rank's coordinate in the mesh; ValueError otherwise."""
    group = process_group if process_group is not None else dist.group.WORLD
    if dist.get_world_size(group) != mesh.size():
        raise ValueError(
            f"the DeviceMesh has {mesh.size()} ranks but the process group "
            f"{dist.get_world_size(group)}: the guard's collectives need every rank of the mesh "
            "(pass the group that spans it as process_group=)")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("this rank is not in the model's DeviceMesh")
    return group, coordinate


def _fsdp_layout(model, process_group, mesh):
    """FSDP2 on a 1-D mesh: every rank holds a shard no other rank holds, a
    replica group of its own (the weight vote has nothing to compare; the
    buddy check verifies the optimizer's update of the shard, buddy.py)."""
    group, coordinate = _group_and_coordinate(mesh, process_group)
    fsdp_modules = tuple(m for m in model.modules() if isinstance(m, FSDPModule))
    return Layout("fsdp", model, group, shard_index=int(coordinate[0]), shard_count=mesh.size(),
                  replica_index=0, replica_count=1, fsdp_modules=fsdp_modules)


def local(tensor):
    """A DTensor's local shard, the same storage (not a copy); any other
    tensor as it is."""
    if DTensor is not None and isinstance(tensor, DTensor):
        with torch.no_grad():
            return tensor.to_local()
    return tensor


if ReduceScatter is not None:

    class GuardedReduceScatter(ReduceScatter):
        """FSDP's reduce-scatter with check 1 of its input (this rank's local
        gradients of one parameter group, before any reduction) in front.
        Errors of the guard's part are kept by the engine and fail the step on
        every rank at its end: raising here would leave the other ranks
        waiting in the reduce-scatter.

        Where FSDP's shard group has one rank (the tp layout: a replicate
        placement, or HSDP with one rank per shard), FSDP allocates the
        reduce-scatter's input and output here but copies instead of calling
        it: the input is kept (``unsent``) and ReducedShards checks it when
        the replicate-dim all-reduce hook runs, still before any of it is
        applied."""

        def __init__(self, guard):
            self._guard = guard
            self.unsent = []  # Allocations since the last call: [input, output].

        def allocate(self, size, *, dtype, device):
            t = torch.empty(*size, dtype=dtype, device=device)
            self.unsent = (self.unsent + [t])[-2:]
            return t

        def local_gradients(self, input_tensor):
            """Check 1 of this rank's local gradients ``input_tensor`` (and a
            replay's fingerprint of them); False in a replay, whose
            gradients are not the step's."""
            guard = self._guard
            self.unsent = []
            audit = guard._shard_replay
            if audit is not None:
                audit.seen_reduce_scatter(input_tensor)
                if audit.replaying:  # A replay's: no check 1, the step's count unchanged.
                    return False
            if guard._current is None or guard._closed:
                raise GuardError(
                    "FAILED_PRECONDITION: backward() ran outside guard.step(): a guarded FSDP2 "
                    "module trains inside `with guard.step(...)`")
            try:
                guard._engine().scan_local_bucket(input_tensor)
            except Exception as e:  # noqa: BLE001  (any error fails the step on every rank)
                guard._engine().note_failure(
                    f"the guard's reduce-scatter: {type(e).__name__}: {e}")
            guard._hook_calls_this_step += 1
            guard.hook_calls += 1
            return True

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            self.local_gradients(input_tensor)
            return dist.reduce_scatter_tensor(output=output_tensor, input=input_tensor,
                                              group=group, op=op, async_op=async_op)


class ReducedShards:
    """FSDP's all-reduce hook: each reduced shard, after the replicate-dim
    all-reduce, to the engine (scanned and fingerprinted at the step's end,
    when FSDP has divided it in place and the sharded gradients view it).
    Where FSDP skipped the reduce-scatter (a shard group of one rank), check
    1 of the local gradients it kept runs here first."""

    def __init__(self, guard, comm=None):
        self._guard = guard
        self._comm = comm
        self.index = 0  # Per step: the order is FSDP's, the same on every rank.

    def __call__(self, reduce_output):
        guard = self._guard
        comm = self._comm
        if comm is not None and len(comm.unsent) == 2 and comm.unsent[1] is reduce_output:
            if not comm.local_gradients(comm.unsent[0]):
                return  # A replay's.
        if guard._shard_replay is not None and guard._shard_replay.replaying:
            return  # A replay's reduced shard: discarded, not the step's.
        try:
            guard._engine().add_reduced_bucket(self.index, reduce_output)
        except Exception as e:  # noqa: BLE001
            guard._engine().note_failure(f"the guard's all-reduce hook: {type(e).__name__}: {e}")
        self.index += 1


def install(guard, layout):
    """The guard's reduce-scatter and all-reduce hook on every FSDP module of
    ``layout``; returns the ReducedShards (its index is reset each step)."""
    comm = GuardedReduceScatter(guard)
    reduced = ReducedShards(guard, comm)
    for m in layout.fsdp_modules:
        m.set_custom_reduce_scatter(comm)
        m.set_all_reduce_hook(reduced)
    return reduced
