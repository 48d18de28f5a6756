#!/usr/bin/env python3
"""./sdc bench configs: the guard under the configurations real jobs use.

For each configuration (fp32, bf16 autocast, fp16 under a GradScaler with
its overflow steps, activation checkpointing reentrant and not,
torch.compile, the bf16 compression hook, PowerSGD) it runs
examples/ddp_train.py on WORLD Gloo ranks (3 nodes) against a real sdcd:

  clean   the guarded job and the same configuration unguarded, at the same
          time, taking turns of --turn_steps steps on the machine (as
          ./sdc bench overhead does); the overhead is the guarded loop's
          median step time against the unguarded one's, after --warmup;
  fault   the guarded job with a fault on rank 3 at an audit step.

Before printing a figure it checks what the figure claims: the clean
guarded job trained bit for bit as the unguarded one (losses and final
weights), every audit passed, every skipped step was the scaler's overflow,
and sdcd recorded no incident; the fault was detected (the step skipped on
every rank) and sdcd named rank 3 and nobody else. A check that fails ends
the bench with an error, never a figure. Prints one JSON line per
configuration, then a Markdown table (docs/benchmarks.md).

Needs SDC_BIN (bazel-bin) and the sdc_guard package on PYTHONPATH; ./sdc
bench configs sets both.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")
FAULT_RANK = 3

# name -> (the configuration's flags, its fault)
CONFIGS = {
    "fp32": ([], "activation-scale"),
    "bf16-autocast": (["--amp=bf16"], "activation-scale"),
    # From a scale the first steps overflow at, and one rank's data
    # overflowing later (the data, not the GPU); the fault a NaN on rank 3.
    "fp16-grad-scaler": (["--amp=fp16", f"--grad_scaler={2.0 ** 24}", "--overflow_at=1:9"],
                         "nan-gradient"),
    "checkpointing-reentrant": (["--checkpointing=reentrant"], "activation-scale"),
    "checkpointing-non-reentrant": (["--checkpointing=non-reentrant"], "activation-scale"),
    "compile": (["--compile={backend}"], "activation-scale"),
    "bf16-compress-hook": (["--comm_hook=bf16"], "activation-scale"),
    "powersgd-hook": (["--comm_hook=powersgd"], "activation-scale"),
}


def fail(what):
    print(f"configs bench: {what}", file=sys.stderr)
    sys.exit(1)


class Sdcd:
    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self.token = os.path.join(directory, "admin.token")
        self.log = os.path.join(directory, "sdcd.log")
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [os.path.join(os.environ["SDC_BIN"], "daemon/sdcd"),
                 f"--db={os.path.join(directory, 'sdcd.db')}", f"--admin_token_file={self.token}",
                 "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
                 "--metrics_listen=127.0.0.1:0", "--report_deadline=30s"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                fail(f"sdcd exited: {open(self.log).read()[-2000:]}")
            line = next((l for l in open(self.log) if "serving trainers on" in l), None)
            if line:
                ports = re.findall(r"\(port (\d+)\)", line)
                self.trainers, self.admin = f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"
                return
            time.sleep(0.1)
        fail("sdcd did not start")

    def incidents(self, job):
        out = subprocess.run(
            [os.path.join(os.environ["SDC_BIN"], "ctl/sdcctl"), f"--server={self.admin}",
             f"--token_file={self.token}", "get", "incidents", f"--job={job}", "-o", "json"],
            capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            fail(f"sdcctl: {out.stdout}{out.stderr}")
        return json.loads(out.stdout or "{}").get("incidents", [])

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)


def run_cluster(directory, world, flags, env, timeout):
    """Runs one job; returns per-rank progress lines (steps, final)."""
    os.makedirs(directory, exist_ok=True)
    store = os.path.join(directory, "rendezvous")
    per_node = max(1, world // 3)
    procs, logs = [], []
    for r in range(world):
        rank_env = dict(os.environ, SDC_NODE_NAME=f"node-{chr(ord('a') + r // per_node)}",
                        LOCAL_RANK=str(r % per_node), **env)
        logs.append(os.path.join(directory, f"rank-{r}.log"))
        with open(logs[-1], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, EXAMPLE, f"--rank={r}", f"--world_size={world}",
                 f"--rendezvous={store}", f"--progress={directory}/progress-{r}.jsonl", *flags],
                stdout=log, stderr=subprocess.STDOUT, env=rank_env, start_new_session=True))
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    bad = [r for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        return None, f"rank(s) {bad} failed:\n{open(logs[bad[0]]).read()[-3000:]}"
    out = []
    for r in range(world):
        lines = [json.loads(l) for l in open(f"{directory}/progress-{r}.jsonl")]
        out.append(([l for l in lines if "final" not in l and "note" not in l],
                    next(l for l in lines if l.get("final"))))
    return out, ""


def median_ms(ranks, warmup):
    # A step's time is its slowest rank's (the ranks wait for each other).
    by_step = {}
    for steps, _ in ranks:
        for s in steps:
            if s["step"] > warmup:
                by_step[s["step"]] = max(by_step.get(s["step"], 0.0), s["ms"])
    return statistics.median(by_step.values())


def check_clean(name, guarded, plain, incidents, audit_every):
    """What the clean run's figures claim; returns the overflow steps."""
    for rank, ((g, gf), (p, pf)) in enumerate(zip(guarded, plain)):
        if [s["loss"] for s in g] != [s["loss"] for s in p]:
            fail(f"{name}: rank {rank}'s losses differ from the unguarded run's")
        for s in g:
            if not s["apply"] and not s.get("overflow"):
                fail(f"{name}: rank {rank} skipped step {s['step']}: {s['reason']}")
            if s["audited"] and s["outcome"] != "pass":
                fail(f"{name}: the audit of step {s['step']} ended {s['outcome']}")
        if gf["weights_digest"] != pf["weights_digest"]:
            fail(f"{name}: rank {rank} ended with other weights than unguarded")
    audits = sum(1 for s in guarded[0][0] if s["audited"])
    if audits != len(guarded[0][0]) // audit_every:
        fail(f"{name}: {audits} audits ran")
    if incidents:
        fail(f"{name}: the clean run raised incidents: {incidents}")
    return [s["step"] for s in guarded[0][0] if s.get("overflow")]


def check_fault(name, ranks, incidents, step):
    if any(steps[step - 1]["apply"] for steps, _ in ranks):
        fail(f"{name}: the faulty step {step} was applied")
    named = sorted({r for i in incidents for r in i.get("ranks", [])})
    if named != [FAULT_RANK] or not any(i["outcome"] == "faulty" for i in incidents):
        fail(f"{name}: the fault on rank {FAULT_RANK} was not named alone: {incidents}")
    return named, sorted({i["outcome"] for i in incidents})


def bench(name, args, work):
    flags, fault_kind = CONFIGS[name]
    flags = [f.format(backend=args.compile_backend) for f in flags]
    if name == "fp16-grad-scaler":
        flags = ["--model=bn-mlp", *flags]
    sdcd = Sdcd(work)
    try:
        common = [f"--steps={args.steps}", *flags]
        env = {"SDC_COORDINATOR": sdcd.trainers, "SDC_AUDIT_EVERY": str(args.audit_every),
               "SDC_WEIGHT_CHECK_EVERY": str(args.audit_every)}
        turn = os.path.join(work, "turn")
        with open(turn, "w") as f:
            f.write("guarded\n")
        results = {}

        def loop(variant, extra, env_extra, nxt):
            results[variant] = run_cluster(
                os.path.join(work, variant), args.world,
                [*common, *extra, f"--turn_file={turn}", f"--turn_name={variant}",
                 f"--turn_next={nxt}", f"--turn_steps={args.turn_steps}"], env_extra, args.timeout)
            if results[variant][0] is None:
                with open(turn, "w") as f:
                    f.write("*\n")  # A failed loop holds no turn.

        threads = [threading.Thread(target=loop, args=("guarded", [], dict(env, SDC_JOB_ID=f"clean-{name}"), "unguarded")),
                   threading.Thread(target=loop, args=("unguarded", ["--unguarded"], {}, "guarded"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for variant in ("guarded", "unguarded"):
            if results[variant][0] is None:
                fail(f"{name} ({variant}): {results[variant][1]}")
        guarded, plain = results["guarded"][0], results["unguarded"][0]
        overflows = check_clean(name, guarded, plain, sdcd.incidents(f"clean-{name}"),
                                args.audit_every)
        fault_step = args.audit_every * 2
        spec = f"{fault_kind}:{FAULT_RANK}:step={fault_step}"
        faulty, why = run_cluster(
            os.path.join(work, "fault"), args.world, [f"--steps={fault_step}", *flags],
            dict(env, SDC_JOB_ID=f"fault-{name}", SDC_INJECT_FAULT=spec,
                 SDC_ALLOW_FAULT_INJECTION="yes-i-am-testing", SDC_VERDICT_WAIT_MS="5000"),
            args.timeout)
        if faulty is None:
            fail(f"{name} (fault): {why}")
        time.sleep(1)
        named, outcomes = check_fault(name, faulty, sdcd.incidents(f"fault-{name}"), fault_step)
        g, u = median_ms(guarded, args.warmup), median_ms(plain, args.warmup)
        return {"config": name, "clean_incidents": 0, "overflow_steps": overflows,
                "fault": spec, "fault_named": named, "fault_outcomes": outcomes,
                "step_ms_unguarded": round(u, 2), "step_ms_guarded": round(g, 2),
                "overhead_pct": round((g - u) / u * 100, 1), "world": args.world,
                "steps": args.steps, "audit_every": args.audit_every}
    finally:
        sdcd.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated, of: {', '.join(CONFIGS)}")
    p.add_argument("--world", type=int, default=6)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--turn_steps", type=int, default=5)
    p.add_argument("--audit_every", type=int, default=10)
    p.add_argument("--compile_backend", default="inductor",
                   help="torch.compile's backend for the compile configuration")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per job")
    args = p.parse_args()
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        fail(f"unknown configuration(s) {unknown} (known: {', '.join(CONFIGS)})")
    if args.steps <= args.warmup or args.audit_every * 2 > args.steps or args.world < 6:
        fail("need --steps > --warmup, --steps >= 2 * --audit_every and --world >= 6")
    if "SDC_BIN" not in os.environ:
        fail("SDC_BIN is not set: run ./sdc bench configs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sdc-bench-configs-") as tmp:
        for name in names:
            start = time.monotonic()
            print(f"configs bench: {name}...", file=sys.stderr, flush=True)
            row = bench(name, args, os.path.join(tmp, name))
            row["wall_s"] = round(time.monotonic() - start)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| configuration | clean run: incidents | overflow steps (skipped by the scaler) | "
          "injected fault | named | unguarded ms/step | guarded ms/step | overhead |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['config']} | {r['clean_incidents']} | {len(r['overflow_steps'])} | "
              f"{r['fault']} | rank {', '.join(map(str, r['fault_named']))} "
              f"({', '.join(r['fault_outcomes'])}) | {r['step_ms_unguarded']} | "
              f"{r['step_ms_guarded']} | {r['overhead_pct']:+.1f}% |")


if __name__ == "__main__":
    main()
