#!/usr/bin/env python3
"""A small byte-level transformer trained with DistributedDataParallel on the
licence texts every Debian machine has, with or without sdc-guard.

    torchrun --nproc_per_node=2 examples/ddp_train.py --steps=50           # guarded
    torchrun --nproc_per_node=2 examples/ddp_train.py --steps=50 --unguarded

Guarded, it reports to sdcd at SDC_COORDINATOR (without one the checks run
in-band only); the job id is SDC_JOB_ID, else the launcher's (torchrun's
--rdzv_id, a PyTorchJob's, Slurm's), else one rank 0 draws; see README.md.
The lines marked `# sdc-guard` are all that guarding takes. The demo
(./sdc demo --trainer=python) and the benchmarks start this script too,
with --rank/--world_size/--rendezvous instead of torchrun's environment
and --progress for their JSON lines (examples/cluster_support.py).
"""

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_support  # noqa: E402  (progress lines, turns, fault points)
from models import BnMlp, TinyTransformer, load_corpus, regression_batch, text_batch  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--first_step", type=int, default=1)
    p.add_argument("--model", choices=["transformer", "bn-mlp", "center-mlp", "put-mlp", "frozen-mlp"], default="transformer")
    p.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--micro_batches", type=int, default=1, help="gradient accumulation")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--corpus", default="/usr/share/common-licenses")
    p.add_argument("--checkpoint_every", type=int, default=0)
    p.add_argument("--checkpoint_dir", default="")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: rank on GPU LOCAL_RANK %% the GPUs visible (collectives stay on Gloo)")
    p.add_argument("--unguarded", action="store_true", help="train without sdc-guard")
    p.add_argument("--no_broadcast_buffers", action="store_true",
                   help="DDP(broadcast_buffers=False): every replica keeps its own buffers")
    p.add_argument("--grad_scaler", type=float, default=0,
                   help="train under torch.amp.GradScaler with this initial scale (0: off)")
    p.add_argument("--freeze", action="store_true",
                   help="freeze the first parameter (requires_grad off), as a frozen backbone")
    cluster_support.add_flags(p)
    a = p.parse_args()
    for name in ("steps", "first_step", "batch", "micro_batches"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: must be at least 1")
    return a


def main():
    args = parse_args()
    torch.set_num_threads(1)  # Ranks share the CPUs.
    cluster_support.init_process_group(args)  # torchrun's env://, or --rendezvous.
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)  # Identical initial replicas.
    if args.model == "transformer":
        corpus = load_corpus(args.corpus)
        net = TinyTransformer()
        batch_of = lambda seed: text_batch(corpus, args.batch, net.context, seed)  # noqa: E731

        def loss_fn(model, batch):
            inputs, targets = batch
            return F.cross_entropy(model(inputs).reshape(-1, net.vocab), targets.reshape(-1))
    else:
        net = BnMlp(center=args.model == "center-mlp", nondeterministic=args.model == "put-mlp")
        batch_of = lambda seed: regression_batch(args.batch, seed)  # noqa: E731

        def loss_fn(model, batch):
            return F.mse_loss(model(batch[0]), batch[1])

    if args.freeze or args.model == "frozen-mlp":
        next(net.parameters()).requires_grad_(False)
    torch.manual_seed(args.seed + 1000 * (rank + 1))  # Per-rank dropout streams.
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.cuda.manual_seed(args.seed + 1000 * (rank + 1))
    model = DDP(net.to(device), device_ids=[device.index] if device.type == "cuda" else None,
                broadcast_buffers=not args.no_broadcast_buffers)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)

    scaler = None
    if args.grad_scaler > 0:
        scaler = torch.amp.GradScaler(device.type, init_scale=args.grad_scaler)
    scaled = (lambda loss: scaler.scale(loss)) if scaler is not None else (lambda loss: loss)

    def optimizer_step():
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    guard = checkpoints = None
    if not args.unguarded:
        import sdc_guard  # sdc-guard

        # sdc-guard (SDC_* settings); a GradScaler's scale travels with replays.
        guard = sdc_guard.Guard(model, optimizer, loss_fn, grad_scaler=scaler)
        net.fault_hook = guard.fault_point  # Tests and demos inject faults here.
        if args.checkpoint_dir and rank == 0:
            checkpoints = sdc_guard.ProvisionalCheckpoints(guard, args.checkpoint_dir)

    progress = cluster_support.Progress(args, rank)
    turns = cluster_support.Turns(args, rank, args.first_step, args.first_step + args.steps - 1)
    for step in range(args.first_step, args.first_step + args.steps):
        turns.begin(step)
        start = time.perf_counter()
        batches = [tuple(t.to(device) for t in batch_of((step * 1000003 + rank) * 31 + m))
                   for m in range(args.micro_batches)]
        checkpoint = args.checkpoint_every > 0 and step % args.checkpoint_every == 0
        total = 0.0
        s = None
        if guard is not None:
            with guard.step(step, batches[0], micro_batches=args.micro_batches) as s:  # sdc-guard
                for i, mb in enumerate(batches):
                    last = i == len(batches) - 1
                    with contextlib.nullcontext() if last else model.no_sync():
                        loss = loss_fn(model, mb) / args.micro_batches
                        s.backward(scaled(loss))  # sdc-guard: in place of loss.backward()
                    total += loss.item()
            if s.apply:  # sdc-guard: the same decision on every rank
                optimizer_step()
            weight_ms = guard.after_optimizer_step(checkpoint=checkpoint)  # sdc-guard
        else:
            optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(batches):
                last = i == len(batches) - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    loss = loss_fn(model, mb) / args.micro_batches
                    scaled(loss).backward()
                total += loss.item()
            cluster_support.extra_collective(args)
            optimizer_step()
            weight_ms = 0.0
        outcome = "none"
        if checkpoint and guard is not None:
            allowed = guard.may_checkpoint()  # sdc-guard: a collective
            outcome = "allowed" if allowed else "vetoed"
            if checkpoints is not None:
                if allowed:
                    checkpoints.save(step, net.state_dict())
                checkpoints.reconcile()
        progress.step(step, total, s, outcome, (time.perf_counter() - start) * 1000, weight_ms)
        turns.end(step)

    summary = None
    if guard is not None:
        guard.shutdown(flush_seconds=10)
        if args.checkpoint_every > 0:
            dist.barrier()  # Every rank's reports are in: a late revocation is decided.
        if checkpoints is not None:
            try:
                guard.refresh_checkpoints(timeout_seconds=5)
                checkpoints.reconcile()
            except sdc_guard.GuardError as e:
                print(f"ddp_train: checkpoint status unknown at the end: {e}", file=sys.stderr)
        summary = guard.summary()
        print(f"sdc-guard rank {rank} summary: {summary}", file=sys.stderr)
    progress.final(net, summary)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
