"""What examples/ddp_train.py varies to train as real jobs do, kept out of the
loop itself: mixed precision (bf16 autocast, fp16 autocast under a
GradScaler), activation checkpointing, torch.compile, a DDP communication
hook (bf16/fp16 compression, PowerSGD); and, for the tests of the guard's
preflight, the mistakes that make a loss function disagree with what the
loop trained on (each as real code makes it), plus one rank's data that
overflows fp16."""

import contextlib
import random

import torch
import torch.nn.functional as F

from models import BnMlp, TinyTransformer, load_corpus, regression_batch, text_batch

MISTAKES = ("autocast-outside", "token-weighted", "aux-outside", "python-random")


def add_flags(p):
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                   help="autocast inside loss_fn (fp16: under a GradScaler, --grad_scaler)")
    p.add_argument("--grad_scaler", type=float, default=0,
                   help="train under torch.amp.GradScaler with this initial scale (0: off; "
                        "--amp=fp16 defaults to 2**16)")
    p.add_argument("--checkpointing", choices=["none", "reentrant", "non-reentrant"],
                   default="none", help="activation checkpointing of each transformer block")
    p.add_argument("--compile", choices=["none", "aot_eager", "inductor"], default="none",
                   help="torch.compile the module DDP wraps, with this backend")
    p.add_argument("--comm_hook", choices=["none", "bf16", "fp16", "powersgd"], default="none",
                   help="a DDP communication hook (the guard runs it inside its own)")
    p.add_argument("--mistake", choices=MISTAKES, default=None,
                   help="train on a loss loss_fn does not reproduce (the preflight's tests)")
    p.add_argument("--mistake_ranks", default="",
                   help="comma-separated ranks that make --mistake (default: every rank)")
    p.add_argument("--overflow_at", default="",
                   help="RANK:STEP: that rank's first micro-batch at that step overflows fp16 "
                        "(bn-mlp)")


def _autocast(args, device):
    if args.amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if args.amp == "bf16" else torch.float16)


class Setup:
    """The model to wrap, its data, the loss function the guard replays and
    the loss the loop trains on (the same, unless --mistake), the scaler and
    the communication hook."""

    def __init__(self, args, rank, device):
        self.args, self.rank, self.device = args, rank, device
        ranks = {int(r) for r in args.mistake_ranks.split(",") if r}
        self.mistake = args.mistake if args.mistake and (not ranks or rank in ranks) else None
        if args.model == "transformer":
            corpus = load_corpus(args.corpus)
            net = TinyTransformer(
                checkpointing=None if args.checkpointing == "none" else args.checkpointing)
            padded = args.mistake == "token-weighted"
            self.batch_of = lambda seed: text_batch(corpus, args.batch, net.context, seed,  # noqa: E731
                                                    padded=padded)
        else:
            if args.checkpointing != "none":
                raise SystemExit("--checkpointing: the transformer's blocks only")
            net = BnMlp(center=args.model == "center-mlp",
                        nondeterministic=args.model == "put-mlp")
            self.batch_of = lambda seed: regression_batch(args.batch, seed)  # noqa: E731
        self.net = net  # The module itself (fault hooks go on it).
        if self.mistake == "python-random":
            # Randomness the guard does not capture: a replay draws other values.
            net.register_forward_hook(lambda m, i, out: out * (1 + 1e-3 * random.random()))
        self.overflow = tuple(int(x) for x in args.overflow_at.split(":")) if args.overflow_at \
            else None
        scale = args.grad_scaler or (2.0 ** 16 if args.amp == "fp16" else 0)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=scale) if scale else None

    def module(self):
        """What DDP wraps: the model, compiled when asked."""
        net = self.net.to(self.device)
        if self.args.compile != "none":
            net = torch.compile(net, backend=self.args.compile)
        return net

    def comm_hook(self, process_group=None):
        """(state, hook) for DDP's register_comm_hook, or None."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if self.args.comm_hook == "bf16":
            return process_group, default_hooks.bf16_compress_hook
        if self.args.comm_hook == "fp16":
            return process_group, default_hooks.fp16_compress_hook
        if self.args.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=process_group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                min_compression_rate=1, random_seed=0)
            return state, powerSGD_hook.powerSGD_hook
        return None

    def batches(self, step, micro_batches):
        out = []
        for m in range(micro_batches):
            batch = tuple(t.to(self.device) for t in
                          self.batch_of((step * 1000003 + self.rank) * 31 + m))
            if self.overflow == (self.rank, step) and m == 0:
                # Targets far off: the loss's gradient, times the scale, is
                # past fp16's range in backward (the forward stays finite).
                batch = (batch[0], batch[1] * 1e4) + tuple(batch[2:])
            out.append(batch)
        return out

    def _raw_loss(self, model, batch, reduction="mean"):
        if self.args.model == "transformer":
            inputs, targets = batch
            logits = model(inputs)
            return F.cross_entropy(logits.reshape(-1, TinyTransformer.vocab).float(),
                                   targets.reshape(-1), reduction=reduction)
        return F.mse_loss(model(batch[0]).float(), batch[1], reduction=reduction)

    def loss_fn(self, model, batch):
        """One micro-batch's loss: what the guard replays (autocast inside)."""
        if self.mistake == "autocast-outside":
            return self._raw_loss(model, batch)
        with _autocast(self.args, self.device):
            return self._raw_loss(model, batch)

    def train_loss(self, model, batch, batches):
        """The loss the loop backpropagates for ``batch``, one of the step's
        ``batches``: loss_fn(model, batch) / micro-batches, or a mistake."""
        n = len(batches)
        if self.mistake == "autocast-outside":
            with _autocast(self.args, self.device):
                return self.loss_fn(model, batch) / n
        if self.mistake == "token-weighted":
            # Hugging Face's num_items_in_batch: a sum over the micro-batch
            # divided by the tokens of every micro-batch of the step.
            items = sum(int((b[1] != -100).sum()) for b in batches)
            with _autocast(self.args, self.device):
                return self._raw_loss(model, batch, reduction="sum") / items
        loss = self.loss_fn(model, batch) / n
        if self.mistake == "aux-outside":
            # An auxiliary loss added by the loop, not by loss_fn.
            first = next(p for p in model.parameters() if p.requires_grad)
            loss = loss + 1e-4 * first.float().square().mean()
        return loss
