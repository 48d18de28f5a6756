#!/usr/bin/env bash
# The GPU check, for a machine with a GPU, torch 2.11.0+cu130 in a virtual
# environment and no network (see README.md).
# Run from the repository root with gpu-bundle/ from `./sdc gpu-bundle`:
#
#   tests/gpu/run.sh            # prints one JSON line last; exit 0 when every check passed
#
# 1. gpu_bench: fingerprint and non-finite scan GB/s against a device-to-device
#    copy of the same bytes, and one fingerprint of a 963M-parameter model;
# 2. kernels/cuda_test and client/device_test: the CUDA kernels and the
#    client's CUDA path bit for bit against the CPU, on random and crafted
#    tensors;
# 3. the wheel built on the build machine, installed for this machine's
#    Python (nothing compiled here), and a guarded examples/ddp_train.py job of 3 processes on the GPU (Gloo
#    on CUDA tensors) with sdcd and an injected fault: the faulty rank must be
#    blamed, the step skipped on every rank, the replicas identical.
# 4. tests/gpu/guarded_step.py: a guarded step under torch's sync debug mode
#    (no host sync inside backward) and its time against an unguarded one.
# Without a GPU (a dry run on a CPU machine) steps 1-2 report skips and the
# job runs on the CPU; "gpu" says which. Every step has a timeout; the whole
# run takes 2-4 minutes on an H200.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="$ROOT/gpu-bundle"
WORK=${SDC_GPU_WORK:-$(mktemp -d /tmp/sdc-gpu.XXXXXX)}
mkdir -p "$WORK"
start=$SECONDS
log() { printf 'gpu-check: %s\n' "$*" >&2; }
die() { printf '{"ok":false,"error":"%s"}\n' "$*"; exit 1; }

[[ -x "$B/bin/gpu_bench" ]] || die "no gpu-bundle/: run ./sdc gpu-bundle on the build machine first"
PY=${SDC_GPU_PYTHON:-}
for candidate in /opt/torch/.venv/bin/python3 "$HOME/.cache/sdc-guard/venv/bin/python3"; do
  [[ -z "$PY" && -x "$candidate" ]] && PY=$candidate
done
[[ -n "$PY" ]] || die "no Python with torch (set SDC_GPU_PYTHON)"
read -r TORCH_DIR SITE TORCH_VERSION < <("$PY" -c '
import os, sysconfig, torch
print(os.path.dirname(torch.__file__), sysconfig.get_paths()["purelib"], torch.__version__)') || die "$PY cannot import torch"
NVIDIA_LIBS=$(ls -d "$SITE"/nvidia/*/lib 2>/dev/null | paste -sd: -)
export LD_LIBRARY_PATH="$B/lib:$TORCH_DIR/lib:$NVIDIA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # Audits run with deterministic algorithms.
log "torch $TORCH_VERSION ($PY), work folder $WORK"

# 1. Speed.
log "gpu_bench"
bench=$(timeout 240 "$B/bin/gpu_bench") || die "gpu_bench failed"
[[ "$bench" == *'"gpu":true'* ]] && gpu=true || gpu=false

# 2. Bit for bit. One JSON object per binary: passed, failed, skipped.
gtest() {
  local name=$1 out
  out=$(timeout 300 "$B/bin/$name" --gtest_brief=0 2>&1)
  local rc=$?
  printf '%s\n' "$out" >"$WORK/$name.log"
  # gtest's summary lines: "[  PASSED  ] 5 tests.", "[  SKIPPED ] 2 tests, listed below:".
  count() { grep -oP "^\\[  $1 *\\] \\K[0-9]+(?= tests?)" <<<"$out" | head -1 || true; }
  local passed failed skipped
  passed=$(count PASSED)
  failed=$(count FAILED)
  skipped=$(count SKIPPED)
  printf '{"rc":%d,"passed":%d,"failed":%d,"skipped":%d}' "$rc" "${passed:-0}" "${failed:-0}" "${skipped:-0}"
}
log "kernels/cuda_test, client/device_test"
cuda_test=$(gtest cuda_test)
device_test=$(gtest device_test)

# 3. The wheel built on the build machine (its engine library has no CPython
#    code: nothing is compiled here, whatever this machine's Python), then a
#    guarded job.
log "installing the wheel for Python $("$PY" -c 'import sys; print(sys.version.split()[0])')"
install_start=$SECONDS
wheel=$(ls "$B"/sdc_guard-*.whl 2>/dev/null | head -1)
[[ -n "$wheel" ]] || die "no wheel in gpu-bundle/: run ./sdc gpu-bundle again"
"$PY" -m zipfile -e "$wheel" "$WORK/site" || die "unpacking $wheel failed"
PYTHONPATH="$WORK/site" "$PY" -c 'import sdc_guard' 2>"$WORK/import.log" ||
  die "import sdc_guard failed: $(tail -c 600 "$WORK/import.log" | tr '\n"' ' ')"
install_s=$((SECONDS - install_start))

log "sdcd and a guarded job of 3 ranks ($([[ $gpu == true ]] && echo GPU || echo CPU: no GPU))"
"$B/bin/sdcd" --db="$WORK/sdcd.db" --admin_token_file="$WORK/admin.token" \
  --listen=127.0.0.1:0 --admin_listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  >"$WORK/sdcd.log" 2>&1 &
sdcd=$!
trap 'kill $sdcd 2>/dev/null' EXIT
for _ in $(seq 100); do grep -q "serving trainers on" "$WORK/sdcd.log" && break; sleep 0.1; done
line=$(grep "serving trainers on" "$WORK/sdcd.log") || die "sdcd did not start: $(tail -c 300 "$WORK/sdcd.log")"
trainer_port=$(sed -E 's/.*serving trainers on [^ ]+ \(port ([0-9]+)\).*/\1/' <<<"$line")
admin_port=$(sed -E 's/.*admin on [^ ]+ \(port ([0-9]+)\).*/\1/' <<<"$line")
device=$([[ $gpu == true ]] && echo cuda || echo cpu)
fault_rank=1
fault_step=6
pids=()
for r in 0 1 2; do
  SDC_JOB_ID=gpu-check SDC_COORDINATOR="127.0.0.1:$trainer_port" SDC_NODE_NAME="node-$r" \
    LOCAL_RANK=0 SDC_AUDIT_EVERY=3 SDC_WEIGHT_CHECK_EVERY=3 SDC_VERDICT_WAIT_MS=5000 \
    SDC_INJECT_FAULT="activation-scale:$fault_rank:step=$fault_step:10000" \
    SDC_ALLOW_FAULT_INJECTION=yes-i-am-testing PYTHONPATH="$WORK/site" \
    timeout 300 "$PY" "$ROOT/examples/ddp_train.py" --rank=$r --world_size=3 \
    --rendezvous="$WORK/rendezvous" --steps=9 --device=$device \
    --progress="$WORK/progress-$r.jsonl" >"$WORK/rank-$r.log" 2>&1 &
  pids+=($!)
done
job_rc=0
for p in "${pids[@]}"; do wait "$p" || job_rc=1; done
incidents=$("$B/bin/sdcctl" --server="127.0.0.1:$admin_port" --token_file="$WORK/admin.token" \
  get incidents -o json 2>&1)
job=$("$PY" - "$WORK" "$job_rc" "$fault_rank" "$fault_step" "$incidents" <<'PY'
import json, sys
work, rc, fault_rank, fault_step, incidents = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
out = {"rc": rc}
try:
    ranks = [[json.loads(l) for l in open(f"{work}/progress-{r}.jsonl")] for r in range(3)]
    steps = [[l for l in lines if "final" not in l] for lines in ranks]
    finals = [next(l for l in lines if l.get("final")) for lines in ranks]
    skipped = sorted({s["step"] for s in steps[0] if not s["apply"]})
    out["skipped_steps"] = skipped
    out["same_decisions"] = all([s["apply"] for s in st] == [s["apply"] for s in steps[0]] for st in steps)
    out["weights_identical"] = len({f["weights_digest"] for f in finals}) == 1
    try:
        found = json.loads(incidents)
        items = found.get("incidents", found) if isinstance(found, dict) else found
    except ValueError:
        items = []
    blamed = sorted({r for i in items if i.get("confirmed") for r in i.get("ranks", [])})
    out["blamed"] = blamed
    out["ok"] = (rc == 0 and skipped == [fault_step] and out["same_decisions"]
                 and out["weights_identical"] and blamed == [fault_rank])
except Exception as e:  # A missing file: the job failed; its logs are in the work folder.
    out["ok"] = False
    out["error"] = repr(e)[:300]
print(json.dumps(out, separators=(",", ":")))
PY
)
kill $sdcd 2>/dev/null

# 4. The guarded step itself (issue 43): no host sync inside backward under
#    torch.cuda.set_sync_debug_mode("warn"), and guarded against unguarded
#    step time for a 308M-parameter bf16 model (one process, one GPU).
log "a guarded step under sync debug, and its time against an unguarded one"
step=$(PYTHONPATH="$WORK/site" timeout 300 "$PY" "$ROOT/tests/gpu/guarded_step.py" \
  2>"$WORK/guarded_step.log" | tail -1)
[[ "$step" == "{"* ]] || step="{\"ok\":false,\"error\":\"see $WORK/guarded_step.log\"}"
ok=$("$PY" -c '
import json, sys
b, c, d, j, s = (json.loads(a) for a in sys.argv[1:6])
gpu = b["gpu"]
tests = all(t["rc"] == 0 and t["failed"] == 0 for t in (c, d)) and (not gpu or c["skipped"] + d["skipped"] == 0)
products = not gpu or b.get("product_checks_ok", False)  # Every product checked, 0 alarms.
print("true" if tests and products and j["ok"] and s["ok"] else "false")' "$bench" "$cuda_test" "$device_test" "$job" "$step")
printf '{"ok":%s,"gpu":%s,"torch":"%s","bench":%s,"cuda_test":%s,"device_test":%s,"wheel_install_s":%d,"job":%s,"guarded_step":%s,"wall_s":%d,"work":"%s"}\n' \
  "$ok" "$gpu" "$TORCH_VERSION" "$bench" "$cuda_test" "$device_test" "$install_s" "$job" \
  "$step" "$((SECONDS - start))" "$WORK"
[[ "$ok" == true ]]
