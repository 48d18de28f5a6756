"""The guarded step on a GPU (issue 43, item 4), run by tests/gpu/run.sh.

One process, a one-rank DDP group (NCCL on a GPU, Gloo on the CPU dry run),
a model of --params_m million bf16 parameters (a stack of square Linear
layers; fp32 and a small model on the CPU). Prints one JSON line:
  syncs_in_backward  torch.cuda.set_sync_debug_mode("warn") warnings while
                     the guarded backward runs (the guard's hook included):
                     must be 0; null on the CPU, where nothing syncs
  step_ms_unguarded, step_ms_guarded, overhead_pct
                     medians over --steps steps after --warmup, the two
                     models taking turns step by step (same shapes, same data)
  d2h_unguarded, d2h_guarded
                     device-to-host copies (the profiler's "Memcpy DtoH"
                     CUDA activities) in one more step of each, not a
                     weight-check step: the guard may add one, the step's
                     read at the decision (kernels/cuda_check_queue.h);
                     null on the CPU
A one-rank job has no peer to audit: audits are off (SDC_AUDIT_EVERY=0),
weight checks every 10 steps. Exit 1 with "ok": false when a check fails.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def build(width, layers, dtype, device):
    torch.manual_seed(0)
    layers_ = []
    for _ in range(layers):
        layers_ += [torch.nn.Linear(width, width, bias=False), torch.nn.GELU()]
    return torch.nn.Sequential(*layers_).to(device=device, dtype=dtype)


def loss_fn(module, batch):
    return module(batch).float().pow(2).mean()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--params_m", type=int, default=0, help="0: 308 on a GPU, 4 on the CPU")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    params_m = a.params_m or (308 if gpu else 4)
    width = 3584 if gpu else 512
    layers = max(1, round(params_m * 1e6 / (width * width)))
    os.environ.setdefault("SDC_JOB_ID", "gpu-guarded-step")
    os.environ.setdefault("SDC_NODE_NAME", "node-a")
    os.environ["SDC_AUDIT_EVERY"] = "0"
    os.environ["SDC_WEIGHT_CHECK_EVERY"] = "10"
    store = tempfile.mktemp(prefix="sdc-gpu-step-")
    dist.init_process_group("nccl" if gpu else "gloo", init_method="file://" + store, rank=0,
                            world_size=1)
    import sdc_guard

    ids = [0] if gpu else None
    plain = DDP(build(width, layers, dtype, device), device_ids=ids)
    guarded = DDP(build(width, layers, dtype, device), device_ids=ids)
    params = sum(t.numel() for t in guarded.parameters())
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    guarded_opt = torch.optim.AdamW(guarded.parameters(), lr=1e-4)
    guard = sdc_guard.Guard(guarded, guarded_opt, loss_fn)

    def timed(fn):
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if gpu:
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1000

    syncs = 0 if gpu else None
    ms = {"plain": [], "guarded": []}
    for step in range(1, a.warmup + a.steps + 1):
        batch = torch.randn(a.batch, width, device=device, dtype=dtype)

        def plain_step():
            plain_opt.zero_grad(set_to_none=True)
            loss_fn(plain, batch).backward()
            plain_opt.step()

        def guarded_step():
            nonlocal syncs
            with guard.step(step, batch) as s:
                loss = loss_fn(guarded, batch)
                if gpu:
                    with warnings.catch_warnings(record=True) as seen:
                        warnings.simplefilter("always")
                        torch.cuda.set_sync_debug_mode("warn")
                        try:
                            s.backward(loss)
                        finally:
                            torch.cuda.set_sync_debug_mode("default")
                    syncs += sum(1 for w in seen if "synchroniz" in str(w.message).lower())
                else:
                    s.backward(loss)
            guard.optimizer_step()
            if not s.apply:
                raise SystemExit(f"step {step} skipped: {s.reason}")

        for name, fn in (("plain", plain_step), ("guarded", guarded_step)):
            t = timed(fn)
            if step > a.warmup:
                ms[name].append(t)
    d2h = {"plain": None, "guarded": None}
    if gpu:
        # One more step of each under the profiler, counting copies to the host.
        step = a.warmup + a.steps + 1
        if step % 10 == 0:
            step += 1  # Not a weight-check step: those read fingerprints too.
        batch = torch.randn(a.batch, width, device=device, dtype=dtype)
        for name, fn in (("plain", plain_step), ("guarded", guarded_step)):
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            d2h[name] = sum(1 for e in prof.events() if "Memcpy DtoH" in e.name)
    guard.shutdown(0.0)
    dist.destroy_process_group()
    u, g = statistics.median(ms["plain"]), statistics.median(ms["guarded"])
    ok = syncs in (0, None) and (not gpu or d2h["guarded"] - d2h["plain"] <= 1)
    print(json.dumps({"ok": ok, "gpu": gpu, "params": params, "dtype": str(dtype).split(".")[-1],
                      "steps": a.steps, "syncs_in_backward": syncs,
                      "d2h_unguarded": d2h["plain"], "d2h_guarded": d2h["guarded"],
                      "step_ms_unguarded": round(u, 3), "step_ms_guarded": round(g, 3),
                      "overhead_pct": round((g - u) / u * 100, 3)}, separators=(",", ":")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
