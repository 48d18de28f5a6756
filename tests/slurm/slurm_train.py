"""One rank of the guarded job that tests/slurm/slurm_loop_test.sh submits
to a real Slurm: a small MLP trained data-parallel (DDP over Gloo, a
FileStore rendezvous on the job's shared directory), guarded by sdc_guard,
with provisional checkpoints (sdc_guard.ProvisionalCheckpoints, in
torch.distributed.checkpoint format). At start it resumes from the newest
final checkpoint, when there is one, as a requeued job would.

Slurm gives the placement: rank SLURM_PROCID of SLURM_NTASKS; the guard's
settings (SDC_COORDINATOR, SDC_JOB_ID, SDC_NODE_NAME, ...) come from
deploy/slurm/trainer-env.sh, sourced in the task. One JSON line per step,
then one final line, to --progress."""

import argparse
import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sdc_guard


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)
        self.fault_hook = None  # sdc_guard.Guard.fault_point: where tests inject faults.

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.fault_hook is not None:
            h = self.fault_hook(h)
        return self.fc2(h)


def batch(step, rank):
    """The rank's micro-batch of a step: the same on every attempt."""
    g = torch.Generator().manual_seed(step * 1000003 + rank)
    x = torch.randn(8, 16, generator=g)
    return x, x[:, :4] * 0.5 - x[:, 4:8]


def loss_fn(module, b):
    x, y = b
    return torch.nn.functional.mse_loss(module(x), y)


def digest(module):
    h = hashlib.sha256()
    for p in module.state_dict().values():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True, help="the job's last step")
    p.add_argument("--checkpoint_every", type=int, required=True)
    p.add_argument("--checkpoint_dir", required=True)
    p.add_argument("--rendezvous", required=True, help="FileStore path, fresh per attempt")
    p.add_argument("--progress", required=True, help="JSON lines file of this rank")
    p.add_argument("--step_seconds", type=float, default=0,
                   help="pause after each step: a job still running when its node is failed")
    args = p.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + args.rendezvous, rank=rank,
                            world_size=world)
    torch.manual_seed(1234)  # Identical initial replicas.
    net = Mlp()
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = sdc_guard.Guard(model, optimizer, loss_fn)
    net.fault_hook = guard.fault_point
    checkpoints = sdc_guard.ProvisionalCheckpoints(guard, args.checkpoint_dir)
    state = {"train": sdc_guard.TrainingState(model, optimizer)}
    resumed = checkpoints.restore(state)  # The newest final checkpoint, or None.
    first = (resumed or 0) + 1
    out = open(args.progress, "a")

    def write(record):
        out.write(json.dumps(record) + "\n")
        out.flush()

    write({"start": True, "attempt": attempt, "rank": rank, "world": world,
           "node": os.environ.get("SDC_NODE_NAME"), "slurm_node": os.environ.get("SLURMD_NODENAME"),
           "host": socket.gethostname(), "job_id": os.environ.get("SDC_JOB_ID"),
           "resumed_from": resumed, "first_step": first,
           "weights": digest(net) if resumed else None})
    for step in range(first, args.steps + 1):
        b = batch(step, rank)
        with guard.step(step, b) as s:
            loss = loss_fn(model, b)
            s.backward(loss)
        applied = guard.optimizer_step(optimizer)
        record = {"step": step, "rank": rank, "attempt": attempt, "loss": loss.item(),
                  "apply": bool(applied), "checkpoint": "none"}
        if step % args.checkpoint_every == 0:
            saved = checkpoints.checkpoint(step, state)
            record["checkpoint"] = "allowed" if saved else "vetoed"
            record["weights"] = digest(net)  # What a resume from this step must load.
        write(record)
        time.sleep(args.step_seconds)
    checkpoints.finish()
    summary = guard.summary()
    guard.shutdown()
    write({"final": True, "attempt": attempt, "rank": rank, "weights": digest(net),
           "guard": {k: v for k, v in summary.items() if isinstance(v, (int, float, str))},
           "final_checkpoints": sorted(s for s, (_, prov) in checkpoints.steps().items()
                                       if not prov)})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
