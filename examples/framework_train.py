#!/usr/bin/env python3
"""The example's model and data trained by a framework that owns the loop,
guarded through sdc_guard.integrations: transformers.Trainer (--framework=hf),
Lightning (lightning) or Accelerate (accelerate).

    torchrun --nproc_per_node=2 examples/framework_train.py --framework=hf --steps=30

The demo (./sdc demo --trainer=hf|lightning|accelerate) and the tests
(tests/python/test_integrations.py) start it with the command-line contract
of examples/ddp_train.py (--rank/--world_size/--rendezvous, --progress JSON
lines, --checkpoint_every/--checkpoint_dir). The lines marked `# sdc-guard`
are what guarding takes in each framework; the rest is the example's own
plumbing (its progress lines and fault points).
"""

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_support  # noqa: E402  (progress lines, the process group)
import configs  # noqa: E402  (the model, its data and loss)
from models import load_corpus, regression_batch, text_batch  # noqa: E402

FRAMEWORKS = ("hf", "lightning", "accelerate")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", choices=FRAMEWORKS, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--model", choices=["transformer", "bn-mlp", "center-mlp", "frozen-mlp"],
                   default="transformer")
    p.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--micro_batches", type=int, default=1, help="gradient accumulation")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--corpus", default="/usr/share/common-licenses")
    p.add_argument("--checkpoint_every", type=int, default=0)
    p.add_argument("--checkpoint_dir", default="")
    p.add_argument("--unguarded", action="store_true", help="(not offered here: use ddp_train.py)")
    configs.add_flags(p)
    cluster_support.add_flags(p)
    a = p.parse_args()
    for name in ("steps", "batch", "micro_batches"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: must be at least 1")
    if a.unguarded or a.turn_file or a.extra_collective:
        p.error("--unguarded, --turn_file, --extra_collective: examples/ddp_train.py's")
    if a.checkpoint_every and not a.checkpoint_dir:
        p.error("--checkpoint_every needs --checkpoint_dir")
    if (a.amp, a.grad_scaler, a.checkpointing, a.compile, a.comm_hook, a.mistake) != (
            "none", 0, "none", "none", "none", None):
        p.error("the configuration flags (--amp, --compile...) are examples/ddp_train.py's")
    return a


class Examples(torch.utils.data.Dataset):
    """Example i: one sequence (or regression sample) drawn with seed i,
    as a dict the frameworks' default collation stacks."""

    def __init__(self, args, count):
        self.count = count
        if args.model == "transformer":
            corpus = load_corpus(args.corpus)
            self.draw = lambda i: text_batch(corpus, 1, 64, i)  # noqa: E731
        else:
            self.draw = lambda i: regression_batch(1, i)  # noqa: E731

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        inputs, targets = self.draw(i)
        return {"inputs": inputs[0], "targets": targets[0]}


class WithLoss(nn.Module):
    """The example's network and loss as one module: forward returns
    {"loss": ...}, as a transformers model does."""

    def __init__(self, setup):
        super().__init__()
        self.net = setup.net
        self._loss = setup.loss_fn

    def forward(self, inputs, targets):
        return {"loss": self._loss(self.net, (inputs, targets))}


class Reporter:
    """The demo's progress lines from the guard's last step."""

    def __init__(self, args, rank):
        self.progress = cluster_support.Progress(args, rank)
        self.start = time.perf_counter()
        self.weight_ms = 0.0

    def step(self, guard, outcome):
        s = guard.last_step
        weight_ms = guard.weight_check_total_ms - self.weight_ms
        self.weight_ms = guard.weight_check_total_ms
        loss = float(s.loss) * s.micro_batches if s.loss is not None else float("nan")
        now = time.perf_counter()
        self.progress.step(s.step, loss, s, outcome, (now - self.start) * 1000, weight_ms)
        self.start = now


def fault_point(holder):
    """The model's fault point, once the framework's guard exists."""
    def hook(x):
        guard = holder()
        return guard.fault_point(x) if guard is not None else x
    return hook


def examples_needed(args, world):
    return args.steps * args.micro_batches * args.batch * world + args.batch * world


def train_hf(args, setup, rank, world, reporter):
    from transformers import TrainerCallback, TrainingArguments

    from sdc_guard.integrations.hf import GuardedTrainer  # sdc-guard

    class Progress(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            gate = trainer.sdc_checkpoints  # Decided at this step end, before this callback.
            reporter.step(trainer.sdc_guard, gate.outcomes.get(state.global_step, "none"))

    scratch = None if args.checkpoint_dir else tempfile.TemporaryDirectory()
    targs = TrainingArguments(
        output_dir=args.checkpoint_dir or scratch.name,
        per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.micro_batches,
        max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
        logging_strategy="no", report_to="none", use_cpu=True, ddp_backend="gloo",
        seed=args.seed, disable_tqdm=True, dataloader_num_workers=0, optim="adamw_torch",
        save_strategy="steps" if args.checkpoint_every else "no",
        save_steps=args.checkpoint_every or 500, save_only_model=True)
    model = WithLoss(setup)
    trainer = GuardedTrainer(model=model, args=targs,  # sdc-guard: in place of Trainer
                             train_dataset=Examples(args, examples_needed(args, world)))
    trainer.add_callback(Progress())
    setup.net.fault_hook = fault_point(lambda: trainer.sdc_guard)
    trainer.train()
    if scratch is not None:
        scratch.cleanup()
    return trainer.sdc_summary, trainer.optimizer


def train_lightning(args, setup, rank, world, reporter):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.environments import ClusterEnvironment

    from sdc_guard.integrations.lightning import GuardedDDPStrategy  # sdc-guard

    class Preinitialised(ClusterEnvironment):
        """The process group this script made (FileStore or torchrun)."""
        creates_processes_externally = True
        main_address = "127.0.0.1"
        main_port = 0

        @staticmethod
        def detect():
            return True

        def world_size(self):
            return world

        def set_world_size(self, size):
            pass

        def global_rank(self):
            return rank

        def set_global_rank(self, r):
            pass

        def local_rank(self):
            return rank

        def node_rank(self):
            return 0

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = WithLoss(setup)

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch)["loss"]
            self.log("train_loss", loss)  # Dropped in a replay (the adapter).
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=args.lr)

    strategy = GuardedDDPStrategy(  # sdc-guard: in place of strategy="ddp"
        cluster_environment=Preinitialised(), process_group_backend="gloo")

    class Progress(L.Callback):
        """A step's line once its checkpoint (ModelCheckpoint runs last) is decided."""
        pending = None
        reported = 0

        def flush(self):
            if self.pending is not None:
                step = self.pending
                ledger = strategy.sdc_checkpoints
                outcome = ("allowed" if step in ledger.allowed else
                           "vetoed" if step in ledger.vetoed else "none")
                reporter.step(strategy.sdc_guard, outcome)
                self.pending = None

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.flush()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            s = strategy.sdc_guard.last_step if strategy.sdc_guard is not None else None
            if s is not None and s.step != self.reported:  # Not an accumulation micro-batch.
                self.pending = self.reported = s.step

        def on_train_end(self, trainer, module):
            self.flush()

    callbacks = [Progress()]
    if args.checkpoint_every:
        callbacks.append(ModelCheckpoint(
            dirpath=args.checkpoint_dir, filename="step-{step}", auto_insert_metric_name=False,
            every_n_train_steps=args.checkpoint_every, save_top_k=-1,
            save_on_train_epoch_end=False))
    trainer = L.Trainer(
        accelerator="cpu", devices=world, num_nodes=1, strategy=strategy, max_steps=args.steps,
        accumulate_grad_batches=args.micro_batches, callbacks=callbacks, logger=False,
        enable_checkpointing=bool(args.checkpoint_every), enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, deterministic=False)
    module = Module()
    setup.net.fault_hook = fault_point(lambda: strategy.sdc_guard)
    loader = torch.utils.data.DataLoader(Examples(args, examples_needed(args, world)),
                                         batch_size=args.batch, shuffle=True, drop_last=True)
    trainer.fit(module, loader)
    return strategy.sdc_summary, strategy.optimizers[0]


def train_accelerate(args, setup, rank, world, reporter):
    from accelerate import Accelerator

    from sdc_guard.integrations.accelerate import AcceleratedGuard  # sdc-guard

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.micro_batches)
    model = WithLoss(setup)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = torch.utils.data.DataLoader(Examples(args, examples_needed(args, world)),
                                         batch_size=args.batch, shuffle=True, drop_last=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def loss_fn(m, batch):
        return m(**batch)["loss"]

    guard = AcceleratedGuard(accelerator, model, optimizer, loss_fn)  # sdc-guard
    setup.net.fault_hook = guard.fault_point
    step = 1
    for batch in loader:
        with accelerator.accumulate(model):
            with guard.step(step, batch):  # sdc-guard
                accelerator.backward(loss_fn(model, batch))
            optimizer.step()  # Applies or skips (the guard's decision).
            optimizer.zero_grad()
        if not accelerator.sync_gradients:
            continue
        outcome = "none"
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            path = os.path.join(args.checkpoint_dir, f"step-{step}.state")
            outcome = "allowed" if guard.save_state(step, path) else "vetoed"  # sdc-guard
        reporter.step(guard.guard, outcome)
        if step == args.steps:
            break
        step += 1
    return guard.finish(), optimizer  # sdc-guard: the last reports, a late revocation


def optimizer_steps(optimizer):
    """How many steps AdamW applied (its per-parameter step count): a step the
    guard skipped is not one."""
    counts = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(counts, default=0)


def main():
    args = parse_args()
    torch.set_num_threads(1)  # Ranks share the CPUs.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cluster_support.init_process_group(args)  # torchrun's env://, or --rendezvous.
    rank, world = dist.get_rank(), dist.get_world_size()
    # What Accelerate and Lightning read of a job they did not launch.
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": os.environ.get("LOCAL_WORLD_SIZE", str(world))})
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.manual_seed(args.seed)  # Identical initial replicas.
    setup = configs.Setup(args, rank, torch.device("cpu"))
    if args.model == "frozen-mlp":
        next(setup.net.parameters()).requires_grad_(False)
    torch.manual_seed(args.seed + 1000 * (rank + 1))  # Per-rank dropout streams.
    reporter = Reporter(args, rank)
    train = {"hf": train_hf, "lightning": train_lightning, "accelerate": train_accelerate}
    summary, optimizer = train[args.framework](args, setup, rank, world, reporter)
    print(f"sdc-guard rank {rank} summary: {summary}", file=sys.stderr)
    reporter.progress.final(setup.net, summary, {"optimizer_steps": optimizer_steps(optimizer)})
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
