#!/usr/bin/env python3
"""A small byte-level transformer trained with DistributedDataParallel (or
FSDP2, HSDP, ZeRO-1, dp x tp: --layout, examples/layouts.py) on the licence texts
every Debian machine has, with or without sdc-guard.

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
import datetime
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_support  # noqa: E402  (progress lines, turns, fault points)
import configs  # noqa: E402  (mixed precision, checkpointing, compile, hooks)
import layouts  # noqa: E402  (ddp, fsdp, hsdp, zero, tp)


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
    p.add_argument("--resume", action="store_true",
                   help="with --checkpoint_dir: start from the newest final checkpoint (its model "
                        "weights; the optimizer starts afresh), tell the guard its step, and train "
                        "on to the same last step (first_step + steps - 1)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: rank on GPU LOCAL_RANK %% the GPUs visible (collectives stay on Gloo)")
    p.add_argument("--unguarded", action="store_true", help="train without sdc-guard")
    p.add_argument("--no_broadcast_buffers", action="store_true",
                   help="DDP(broadcast_buffers=False): every replica keeps its own buffers")
    p.add_argument("--freeze", action="store_true",
                   help="freeze the first parameter (requires_grad off), as a frozen backbone")
    p.add_argument("--on_guard_error", choices=["raise", "continue"], default="raise",
                   help="continue: a GuardError (raised on every rank alike) skips the step")
    p.add_argument("--pg_timeout_s", type=int, default=0,
                   help="the process group's collective timeout (0: torch's default)")
    configs.add_flags(p)
    layouts.add_flags(p)
    cluster_support.add_flags(p)
    a = p.parse_args()
    for name in ("steps", "first_step", "batch", "micro_batches"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: must be at least 1")
    layouts.check_flags(p, a)
    return a


def main():
    args = parse_args()
    torch.set_num_threads(1)  # Ranks share the CPUs.
    timeout = datetime.timedelta(seconds=args.pg_timeout_s) if args.pg_timeout_s else None
    cluster_support.init_process_group(args, timeout)  # torchrun's env://, or --rendezvous.
    rank = dist.get_rank()

    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)  # Identical initial replicas.
    # Batches (and below, dropout) follow the dp rank: under tp every tp
    # rank of a replica trains on its replica's (examples/layouts.py).
    data_rank = layouts.data_rank(args, rank)
    setup = configs.Setup(args, data_rank, device)
    net, loss_fn, scaler = setup.net, setup.loss_fn, setup.scaler
    if args.freeze or args.model == "frozen-mlp":
        next(net.parameters()).requires_grad_(False)
    torch.manual_seed(args.seed + 1000 * (data_rank + 1))  # Per-rank dropout streams.
    if device.type == "cuda":
        torch.cuda.manual_seed(args.seed + 1000 * (data_rank + 1))
    model = layouts.wrap(args, setup.module(), device,
                         broadcast_buffers=not args.no_broadcast_buffers)
    optimizer = layouts.optimizer(args, [p for p in model.parameters() if p.requires_grad])
    comm_hook = setup.comm_hook()
    scaled = (lambda loss: scaler.scale(loss)) if scaler is not None else (lambda loss: loss)

    last_step = args.first_step + args.steps - 1
    first_step = args.first_step
    resumed = None
    if args.resume and args.checkpoint_dir:
        from sdc_guard.checkpoints import latest_final_step

        resumed = latest_final_step(args.checkpoint_dir)  # Only final ones: never a provisional.
        if resumed is not None:
            path = os.path.join(args.checkpoint_dir, f"step-{resumed}.pt")
            net.load_state_dict(torch.load(path, map_location=device))
            first_step = resumed + 1
        print(f"rank {rank}: resuming from step {resumed} (attempt "
              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '-')})", file=sys.stderr, flush=True)

    guard = checkpoints = None
    if not args.unguarded:
        import sdc_guard  # sdc-guard

        # sdc-guard (SDC_* settings): a GradScaler's scale travels with replays; the
        # communication hook runs inside the guard's.
        resume = {"resume_step": resumed} if resumed is not None else {}
        guard = sdc_guard.Guard(model, optimizer, loss_fn, grad_scaler=scaler, comm_hook=comm_hook,
                                **resume)
        net.fault_hook = guard.fault_point  # Tests and demos inject faults here.
        if args.checkpoint_dir:
            checkpoints = sdc_guard.ProvisionalCheckpoints(guard, args.checkpoint_dir)  # sdc-guard
    elif comm_hook is not None:
        model.register_comm_hook(*comm_hook)

    progress = cluster_support.Progress(args, rank)
    turns = cluster_support.Turns(args, rank, first_step, last_step)
    counter = cluster_support.CollectiveCount(args)
    for step in range(first_step, last_step + 1):
        turns.begin(step)
        counter.begin()
        start = time.perf_counter()
        batches = setup.batches(step, args.micro_batches)
        checkpoint = args.checkpoint_every > 0 and step % args.checkpoint_every == 0
        total = 0.0
        s = None
        outcome = "none"
        if guard is not None:
            weight_ms = guard.weight_check_total_ms  # Check 3's time in this iteration, below.
            filters = list(warnings.filters)
            try:
                with guard.step(step, batches[0], micro_batches=args.micro_batches) as s:  # sdc-guard
                    for i, mb in enumerate(batches):
                        last = i == len(batches) - 1
                        with contextlib.nullcontext() if last else model.no_sync():
                            loss = setup.train_loss(model, mb, batches)
                            s.backward(scaled(loss))  # sdc-guard: in place of loss.backward()
                        total += loss.item()
            except sdc_guard.GuardError as e:
                if args.on_guard_error == "raise":
                    raise
                progress.note({"step": step, "rank": rank, "guard_error": str(e),
                               "deterministic": torch.are_deterministic_algorithms_enabled(),
                               "warning_filters_restored": warnings.filters == filters})
            guard.optimizer_step(optimizer)  # sdc-guard: applies or skips (and the scaler's update)
            if checkpoint and checkpoints is not None:
                # sdc-guard: the gate (a collective), then a provisional save.
                state, form = layouts.state_to_save(args, net, optimizer)
                saved = checkpoints.checkpoint(step, state, format=form)
                outcome = "allowed" if saved else "vetoed"
            elif checkpoint:
                outcome = "allowed" if guard.may_checkpoint() else "vetoed"
            weight_ms = guard.weight_check_total_ms - weight_ms
        else:
            optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(batches):
                last = i == len(batches) - 1
                with contextlib.nullcontext() if last else model.no_sync():
                    loss = setup.train_loss(model, mb, batches)
                    scaled(loss).backward()
                total += loss.item()
            cluster_support.extra_collective(args)
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
            weight_ms = 0.0
        ms = (time.perf_counter() - start) * 1000
        progress.step(step, total, s, outcome, ms, weight_ms, counter.end())
        turns.end(step)

    summary = None
    if guard is not None:
        guard.shutdown(flush_seconds=10)  # sdc-guard: the last reports reach sdcd
        if args.checkpoint_every > 0:
            dist.barrier()  # Every rank's reports are in: a late revocation is decided.
        if checkpoints is not None:
            checkpoints.finish()  # sdc-guard: a revocation after the last checkpoint
        summary = guard.summary()
        print(f"sdc-guard rank {rank} summary: {summary}", file=sys.stderr)
    extra = {"scale": scaler.get_scale()} if scaler is not None else {}
    progress.final(net, summary, extra)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
