#!/usr/bin/env bash
# sdc: the one entry point. `./sdc demo` runs the main job, `./sdc test` sets up
# a fresh Debian machine and runs every test, `./sdc bench NAME` runs a
# benchmark. `./sdc help` lists everything.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

# Every Debian package the project needs, build and test tools included.
PACKAGES=(
  bazel-bootstrap bazel-platforms bazel-rules-java
  g++ clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  libgtest-dev libgmock-dev nlohmann-json3-dev libyaml-cpp-dev patchelf
  libsqlite3-dev sqlite3 libssl-dev libgoogle-perftools-dev prometheus-cpp-dev
  prometheus shellcheck python3 python3-yaml procps openssl kubectl
  binutils
  python3-venv python3-dev python3-pip
  slurmctld slurmd slurm-client
)

# PyTorch, pinned: the CUDA-enabled Linux wheel (with its nvidia-* CUDA
# libraries), into a virtual environment the project owns. Every C++ target
# builds against it (third_party/torch), the Python package is built for it
# and its tests run in it. 2.11.0 is what the GPU machine the project is
# sometimes lent has preinstalled (2.11.0+cu130), so what is built here runs
# there.
TORCH_VERSION=2.11.0
# The training frameworks sdc_guard.integrations adapts (tested in
# tests/python/test_integrations.py, run by ./sdc demo --trainer=hf|lightning|accelerate).
PYTHON_PACKAGES=("torch==$TORCH_VERSION" "numpy==2.4.6" "pytest==9.2.0"
  "transformers==5.25.0" "lightning==2.6.6" "accelerate==1.16.0")
SDC_CACHE=${SDC_CACHE:-$HOME/.cache/sdc-guard}
VENV="$SDC_CACHE/venv"

BENCHMARKS="kernels core daemon overhead detection watch soak configs abft"

log() { printf 'sdc: %s\n' "$*" >&2; }
die() { printf 'sdc: error: %s\n' "$*" >&2; exit 1; }

missing_packages() {
  local p status
  for p in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || printf '%s\n' "$p"
  done
}

# Installs the missing Debian packages; silent when everything is present.
setup_packages() {
  local missing
  missing=$(missing_packages)
  [[ -z "$missing" ]] && return 0
  # shellcheck disable=SC2086
  log "installing Debian packages: $(echo $missing)"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root (or sudo) to install: $(echo $missing)"
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq >/dev/null
  # shellcheck disable=SC2086
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends $missing >/dev/null \
    || die "apt-get install failed for: $(echo $missing)"
  missing=$(missing_packages)
  [[ -z "$missing" ]] || die "still missing after install: $(echo $missing)"
}

# Everything the project needs on this machine; silent when it is there.
setup() {
  setup_packages
  setup_venv
}

# True when the virtual environment holds exactly the pinned packages.
venv_ready() {
  [[ -x "$VENV/bin/python3" ]] || return 1
  local spec name want have
  for spec in "${PYTHON_PACKAGES[@]}"; do
    name=${spec%%==*}
    want=${spec#*==}
    have=$("$VENV/bin/python3" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null) || return 1
    [[ "$have" == "$want" || "$have" == "$want+"* ]] || return 1
  done
}

# Makes the virtual environment and installs the pinned Python packages;
# silent when they are there. Debian's python3 (not whatever python3 is
# first on PATH), so the environment matches python3-dev's headers.
setup_venv() {
  venv_ready && return 0
  log "installing torch $TORCH_VERSION (CUDA wheel, about 4 GB with its CUDA libraries) and the pinned Python packages into $VENV"
  if [[ ! -x "$VENV/bin/python3" ]]; then
    /usr/bin/python3 -m venv "$VENV" || die "could not create the virtual environment $VENV"
  fi
  "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check --no-input \
    "${PYTHON_PACKAGES[@]}" || die "pip install failed for: ${PYTHON_PACKAGES[*]}"
  venv_ready || die "$VENV still lacks one of: ${PYTHON_PACKAGES[*]}"
}

# Flags every Bazel call shares: the disk cache lets a fresh clone (CI) reuse
# compiled actions from an earlier build on the same machine. BUILD_VENV is
# the environment whose torch @torch is (./sdc compat changes it, with
# BAZEL_STARTUP naming an output base of its own).
BUILD_VENV=$VENV
BAZEL_STARTUP=()
BAZEL_LIMIT=()  # A command (timeout N) that Bazel calls run under, or nothing.
bazel_flags() {
  local flags=("--disk_cache=${SDC_BAZEL_DISK_CACHE:-$SDC_CACHE/bazel-disk}"
    "--repo_env=SDC_VENV=$BUILD_VENV")
  if [[ -x /usr/local/cuda/bin/nvcc ]] && cuda_matches "$BUILD_VENV"; then
    flags+=("--define=sdc_cuda=1")
  fi
  printf '%s\n' "${flags[@]}"
}

# True when nvcc builds for the CUDA major version of the torch in $1 (the
# kernels link that torch's CUDA runtime): 13 for torch 2.11's default wheel,
# 12 for 2.9's and 2.10's.
cuda_matches() {
  local torch_cuda nvcc_cuda
  # torch/version.py says `cuda: Optional[str] = '13.0'` (read, not imported: fast).
  torch_cuda=$(sed -n "s/^cuda[:=].* '\([0-9]*\)\..*/\1/p" \
    "$1"/lib/python3*/site-packages/torch/version.py 2>/dev/null | head -1)
  nvcc_cuda=$(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  [[ -n "$torch_cuda" && "$torch_cuda" == "$nvcc_cuda" ]]
}

bazel_run() {
  local cmd=$1
  shift
  local flags
  mapfile -t flags < <(bazel_flags)
  "${BAZEL_LIMIT[@]}" bazel "${BAZEL_STARTUP[@]}" "$cmd" "${flags[@]}" "$@"
}

# The Python package: the engine library (Bazel, against the project's
# torch), the wheel in dist/, and the wheel unpacked in dist/site, which the
# demo's Python trainers and the pytest suite import. Exports SDC_PYTHON and
# SDC_PYTHONPATH for them. ./sdc compat makes the wheel for every supported
# torch.
build_python() {
  build_targets //client/python:libsdc_engine.so
  rm -rf "$ROOT/dist/site" "$ROOT"/dist/sdc_guard-*.whl
  local wheel
  wheel=$(make_wheel "$ROOT/dist" --engine "$TORCH_VERSION=$ROOT/bazel-bin/client/python/libsdc_engine.so")
  mkdir -p "$ROOT/dist/site"
  "$VENV/bin/python3" -m zipfile -e "$wheel" "$ROOT/dist/site" || die "unpacking $wheel failed"
  export SDC_PYTHON="$VENV/bin/python3" SDC_PYTHONPATH="$ROOT/dist/site"
  printf '%s\n' "$wheel"
}

# make_wheel OUT --engine TORCH=PATH...: the wheel of the package with those
# engine libraries, in OUT; prints its path.
make_wheel() {
  local out=$1 version
  shift
  version=$(tr -d '[:space:]' <"$ROOT/VERSION")
  grep -q "^__version__ = \"$version\"$" "$ROOT/client/python/sdc_guard/__init__.py" ||
    die "client/python/sdc_guard/__init__.py's __version__ is not VERSION ($version)"
  "$VENV/bin/python3" "$ROOT/client/python/build_wheel.py" --version "$version" "$@" \
    --package "$ROOT/client/python/sdc_guard" --out "$out" || die "building the wheel failed"
}

# The wheel for every torch version the package supports, one engine build
# each, in dist/compat/; then, in a virtual environment per (Python, torch)
# cell under ~/.cache/sdc-guard/compat (Python 3.10 to 3.13; torch 2.9, 2.10,
# 2.11; several GB of downloads the first time), pip installs that wheel and
# a guarded 3-rank Gloo job runs against a real sdcd (tests/compat/compat.py).
# CI's matrix (4 cells, each Python once; torch 2.9 and 2.11, so the wheel
# carries those two engines) unless --full (8 cells, 3 engines). Prints the
# matrix; fails when a cell fails or fewer than 2 Python or 2 torch versions
# ran. Every step has a time limit (compat.py's; ENGINE_BUILD_LIMIT_S here).
cmd_compat() {
  local start=$SECONDS lines torch venv engines=() matrix=()
  case "${1:-}" in
    "") ;;
    --full) matrix=(--full) ;;
    *) die "usage: ./sdc compat [--full] (unknown argument '$1')" ;;
  esac
  log "compat: the environments (tests/compat/compat.py venvs ${matrix[*]})"
  lines=$("$VENV/bin/python3" "$ROOT/tests/compat/compat.py" venvs "${matrix[@]}") ||
    die "making the compat environments failed"
  build_targets //daemon:sdcd //ctl:sdcctl //client/python:libsdc_engine.so
  engines+=(--engine "$TORCH_VERSION=$ROOT/bazel-bin/client/python/libsdc_engine.so")
  while read -r torch venv; do
    [[ -z "$torch" || "$torch" == "$TORCH_VERSION" ]] && continue
    [[ "$torch" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ && -x "$venv/bin/python3" ]] ||
      die "compat.py venvs printed '$torch $venv', not 'TORCH_VERSION VENV'"
    engines+=(--engine "$torch=$(build_engine "$torch" "$venv")")
  done <<<"$lines"
  rm -rf "$ROOT/dist/compat"
  local wheel
  wheel=$(make_wheel "$ROOT/dist/compat" "${engines[@]}")
  log "compat: $wheel ($(( ${#engines[@]} / 2 )) torch versions); the smoke job in each environment"
  local rc=0
  "$VENV/bin/python3" "$ROOT/tests/compat/compat.py" run --wheel "$wheel" --bin "$ROOT/bazel-bin" \
    "${matrix[@]}" || rc=$?
  log "compat: $((SECONDS - start)) s"
  return "$rc"
}

# build_engine TORCH VENV: libsdc_engine.so against the torch in VENV, in a
# Bazel output base of its own (the project's stays on its torch; the disk
# cache is shared); prints the library's path. A build after a change to the
# client compiles its torch-including files again: minutes each; the limit
# is ENGINE_BUILD_LIMIT_S.
ENGINE_BUILD_LIMIT_S=${SDC_ENGINE_BUILD_LIMIT_S:-1800}
build_engine() {
  local torch=$1 venv=$2
  local base="$SDC_CACHE/compat/bazel-torch$torch"
  BUILD_VENV=$venv
  BAZEL_STARTUP=("--output_base=$base" "--max_idle_secs=120")
  # --foreground: in the caller's process group, which an outer timeout
  # (.ci/run's) signals as a whole.
  BAZEL_LIMIT=("timeout" "--foreground" "--kill-after=30" "$ENGINE_BUILD_LIMIT_S")
  if [[ -x /usr/local/cuda/bin/nvcc ]] && ! cuda_matches "$venv"; then
    log "compat: torch $torch is built for another CUDA than nvcc here: its engine has no CUDA kernels"
  fi
  log "compat: the engine for torch $torch (Bazel, output base $base)"
  build_targets --symlink_prefix=/ //client/python:libsdc_engine.so >&2
  local bin
  bin=$(bazel_run info --symlink_prefix=/ bazel-bin 2>/dev/null) || die "bazel info failed for torch $torch"
  BUILD_VENV=$VENV
  BAZEL_STARTUP=()
  BAZEL_LIMIT=()
  printf '%s\n' "$bin/client/python/libsdc_engine.so"
}

# The release: the relocatable bundle of sdcd, sdcctl and sdc-agent
# (//release:bundle, see docs/ARCHITECTURE.md "Release bundles") copied to
# dist/ as a .tar.gz and unpacked beside it, plus the Python wheel.
cmd_release() {
  setup
  local version top
  version=$(tr -d '[:space:]' <"$ROOT/VERSION")
  top="sdc-guard-$version-linux-x86_64"
  log "building sdcd, sdcctl, sdc-agent and the release bundle $top (Bazel)"
  build_targets //release:bundle
  local tarball="$ROOT/bazel-bin/release/sdc-guard-linux-x86_64.tar.gz"
  [[ -f "$tarball" ]] || die "the build made no bundle at $tarball"
  mkdir -p "$ROOT/dist"
  rm -rf "${ROOT:?}/dist/$top" "$ROOT/dist/$top.tar.gz"
  install -m 0644 "$tarball" "$ROOT/dist/$top.tar.gz"
  tar -C "$ROOT/dist" -xzf "$ROOT/dist/$top.tar.gz" || die "unpacking $top.tar.gz failed"
  local b out
  for b in sdcd sdcctl; do
    out=$("$ROOT/dist/$top/bin/$b" --version 2>&1) || die "dist/$top/bin/$b --version failed: $out"
    [[ "$out" == "$b $version" ]] || die "dist/$top/bin/$b --version printed '$out', want '$b $version'"
  done
  log "bundle: dist/$top.tar.gz ($(du -h "$ROOT/dist/$top.tar.gz" | cut -f1); unpacked in dist/$top, $(du -sh "$ROOT/dist/$top" | cut -f1))"
  log "  sdc-agent needs SDC_TORCH_LIB=<torch $TORCH_VERSION's lib/ directory> (the bundle does not carry torch)"
  log "building the Python wheel"
  local wheel
  wheel=$(build_python)
  log "wheel: $wheel (pip install it into an environment with torch $TORCH_VERSION)"
}

cmd_build() {
  setup
  bazel_run build //... "$@"
  local wheel
  wheel=$(build_python)
  log "Python package: $wheel (pip install it into an environment with torch $TORCH_VERSION)"
}

# The pytest suite: the sdc_guard package in real torch.distributed Gloo
# groups against a real sdcd (tests/python). The 15 slowest tests are listed
# at the end: the suite is most of CI's time.
cmd_pytest() {
  build_targets //demo:sdc-demo //demo:tcp-proxy //daemon:sdcd //ctl:sdcctl
  build_python >/dev/null
  log "pytest: the Python package under torch.distributed (tests/python)"
  SDC_BIN="$ROOT/bazel-bin" PYTHONPATH="$SDC_PYTHONPATH" \
    "$VENV/bin/python3" -m pytest -q -p no:cacheprovider --durations=15 --durations-min=5 \
    "$ROOT/tests/python" "$@"
}

# Two fuzzers, SECONDS each: the coordinator's ingestion fuzz target, built
# with clang's libFuzzer and sanitizers outside Bazel (Bazel's toolchain here
# is gcc), then the stream fuzzer (tests/stream_fuzz_test.cc): malformed and
# mutated frames on a real sdcd's Attach, Relay and Connect streams.
cmd_fuzz() {
  local seconds=${1:-60}
  [[ "$seconds" =~ ^[0-9]+$ ]] || die "usage: ./sdc fuzz [SECONDS]"
  fuzz_coordinator "$seconds"
  fuzz_streams "$seconds"
}

fuzz_streams() {
  local seconds=$1 seed=$((RANDOM * 32768 + RANDOM))
  log "fuzzing sdcd's streams for ${seconds}s (seed $seed; replay with SDC_STREAM_FUZZ_SEED)"
  bazel_run test //tests:stream_fuzz_test --nocache_test_results --test_output=errors \
    --test_env=SDC_STREAM_FUZZ_SECONDS="$seconds" --test_env=SDC_STREAM_FUZZ_SEED="$seed" \
    --test_timeout=$((seconds + 240)) >/dev/null 2>&1 ||
    die "the stream fuzzer found a failure (seed $seed; log: bazel-testlogs/tests/stream_fuzz_test/test.log)"
  grep -E "^stream fuzz: [0-9]+ streams" "$ROOT/bazel-testlogs/tests/stream_fuzz_test/test.log" |
    sed 's/^/sdc: /' >&2 || true
}

fuzz_coordinator() {
  local seconds=$1
  if ! command -v clang++ >/dev/null; then
    log "clang++ is not installed: skipping the coordinator fuzz run"
    return 0
  fi
  local dir="${SDC_CACHE:-$HOME/.cache/sdc-guard}/fuzz"
  mkdir -p "$dir/corpus"
  local absl_libs=(-labsl_statusor -labsl_status -labsl_cord -labsl_cordz_info
    -labsl_cordz_handle -labsl_cordz_functions -labsl_cord_internal -labsl_str_format_internal
    -labsl_strings -labsl_strings_internal -labsl_synchronization -labsl_graphcycles_internal
    -labsl_stacktrace -labsl_symbolize -labsl_debugging_internal -labsl_demangle_internal
    -labsl_malloc_internal -labsl_time -labsl_civil_time -labsl_time_zone -labsl_hash
    -labsl_city -labsl_low_level_hash -labsl_raw_hash_set -labsl_int128 -labsl_throw_delegate
    -labsl_spinlock_wait -labsl_raw_logging_internal -labsl_log_severity -labsl_base -lpthread)
  # The sources come from Bazel's own graph so that this list cannot fall
  # behind the BUILD files.
  local sources
  mapfile -t sources < <(bazel query --noshow_progress \
      'kind("source file", deps(//daemon/core:coordinator_fuzz))' 2>/dev/null |
    sed -n 's|^//\([^:@]*\):\(.*\.cc\)$|\1/\2|p')
  ((${#sources[@]})) || die "bazel query found no sources for the fuzz target"
  log "building the coordinator fuzz target with clang (libFuzzer, ASan, UBSan)"
  clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -DSDC_LIBFUZZER -I"$ROOT" \
    "${sources[@]}" "${absl_libs[@]}" -o "$dir/coordinator_fuzz" || die "the fuzz target did not build"
  log "fuzzing the coordinator for ${seconds}s (corpus: $dir/corpus)"
  "$dir/coordinator_fuzz" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    "$dir/corpus" 2>"$dir/last.log" || { tail -40 "$dir/last.log" >&2; die "the fuzzer found a failure (log: $dir/last.log)"; }
  grep -E "^stat::number_of_executed_units" "$dir/last.log" | sed 's/^/sdc: fuzz /' >&2 || true
}

# The package layering (docs/ARCHITECTURE.md, "Arrows run one way"), read
# from Bazel's own graph: every dependency, transitive, of every target
# (tests and file dependencies included). Each rule is "NAME|FROM|FORBIDDEN":
# nothing in FROM may depend on anything in FORBIDDEN. //:VERSION is the
# root package's file that //common:version reads.
OURS='//...:*'
LAYER_RULES=(
  "the trainer client (client/) must not depend on sdcd (daemon/)|//client/...:*|//daemon/...:*"
  "sdcd (daemon/) must not depend on the trainer client (client/)|//daemon/...:*|//client/...:*"
  "protocol/ depends only on proto/ and kernels/|//protocol/...:*|$OURS except (//protocol/...:* + //proto/...:* + //kernels/...:*)"
  "sdcctl (ctl/) depends only on proto/ and common/|//ctl/...:*|$OURS except (//ctl/...:* + //proto/...:* + //common/...:* + //:VERSION)"
  "common/ depends only on proto/|//common/...:*|$OURS except (//common/...:* + //proto/...:* + //:VERSION)"
  "sdc-agent (agent/) must not depend on sdcd or the trainer client|//agent/...:*|//daemon/...:* + //client/...:*"
)

# Bazel's query takes no build flags (--define): only the venv for @torch.
layers_query() {
  bazel query --noshow_progress "--repo_env=SDC_VENV=$VENV" "$1"
}

cmd_layers() {
  local rule name from forbidden out broken=0
  local -a found path
  local log="$SDC_CACHE/layers.log"
  mkdir -p "$SDC_CACHE"
  for rule in "${LAYER_RULES[@]}"; do
    IFS='|' read -r name from forbidden <<<"$rule"
    out=$(layers_query "deps($from) intersect ($forbidden)" 2>"$log") ||
      { tail -20 "$log" >&2; die "bazel query failed checking that $name (log: $log)"; }
    [[ -z "$out" ]] && continue
    broken=1
    mapfile -t found <<<"$out"
    log "layering broken: $name, but $from reaches:"
    printf '  %s\n' "${found[@]}" >&2
    out=$(layers_query "somepath($from, ${found[0]})" 2>/dev/null) || out=""
    mapfile -t path <<<"$out"
    log "one path, from the top:"
    printf '  %s\n' "${path[@]}" >&2
  done
  ((broken == 0)) || die "package dependencies break docs/ARCHITECTURE.md's arrows (see above)"
  log "layering holds: client -> protocol <- daemon; ctl -> proto, common; common -> proto"
}

cmd_test() {
  setup
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    log "nvcc found: building the CUDA kernels for sm_80 and sm_90 (GPU tests skip without a GPU)"
  else
    log "no nvcc at /usr/local/cuda/bin: CUDA kernels are not built"
  fi
  local start=$SECONDS
  cmd_layers
  bazel_run test //... "$@"
  cmd_pytest
  smoke_python_bench
  smoke_configs_bench
  smoke_every_step_benches
  cmd_slurm_loop
  cmd_fuzz "${SDC_FUZZ_SECONDS:-30}"
  log "all tests passed in $((SECONDS - start)) s"
}

# `./sdc bench overhead --trainer=python` at a smoke size, checked by
# bench/smoke_test.sh as bench/BUILD checks every other bench: it needs the
# wheel, which ./sdc builds outside Bazel (cmd_pytest just did). Two loops,
# not three, and 12 steps: 12 Python ranks importing torch (about 50 CPU
# seconds) are most of its time.
smoke_python_bench() {
  build_targets //bench:overhead_bench
  [[ -n "${SDC_PYTHONPATH:-}" ]] || build_python >/dev/null  # cmd_pytest built it.
  local log="$SDC_CACHE/bench-smoke-overhead-python.log" start=$SECONDS
  log "smoke run: ./sdc bench overhead --trainer=python (log: $log)"
  if ! "$ROOT/bench/smoke_test.sh" \
    overhead_pct,step_ms_unguarded,step_ms_guarded,audit_step_ratio,weight_check_pct_of_step,trainer,collectives_per_step_unguarded,collectives_per_step_guarded \
    "$ROOT/bazel-bin/bench/overhead_bench" --trainer=python --variants=unguarded,guarded \
    --steps=12 --warmup=2 --rounds=1 --audit_every=6 --weight_check_every=3 --turn_steps=6 \
    >"$log" 2>&1; then
    tail -40 "$log" >&2
    die "the smoke run of ./sdc bench overhead --trainer=python failed (log: $log)"
  fi
  log "smoke run of ./sdc bench overhead --trainer=python passed in $((SECONDS - start)) s"
}

# `./sdc bench configs` at a smoke size: fp32 only, 12 steps. The bench
# checks what each figure claims (bit for bit as unguarded, 0 incidents, the
# fault named) and exits 1 before printing one that is wrong.
smoke_configs_bench() {
  local log="$SDC_CACHE/bench-smoke-configs.log" start=$SECONDS
  log "smoke run: ./sdc bench configs (log: $log)"
  if ! SDC_BIN="$ROOT/bazel-bin" PYTHONPATH="${SDC_PYTHONPATH:-}" timeout 600 \
    "$VENV/bin/python3" "$ROOT/bench/configs.py" --configs=fp32 --steps=12 --warmup=4 \
    --turn_steps=4 --audit_every=4 --timeout=300 >"$log" 2>&1; then
    tail -40 "$log" >&2
    die "the smoke run of ./sdc bench configs failed (log: $log)"
  fi
  log "smoke run of ./sdc bench configs passed in $((SECONDS - start)) s"
}

# `./sdc bench detection --every-step` and `./sdc bench soak --every-step`
# at smoke sizes (seconds each), checked by bench/smoke_test.sh: each checks
# its own results (0 alarms on clean steps, every catch a faulted step's)
# before it prints the JSON line whose keys are checked here.
smoke_every_step_benches() {
  [[ -n "${SDC_PYTHONPATH:-}" ]] || build_python >/dev/null
  local log="$SDC_CACHE/bench-smoke-every-step.log" start=$SECONDS
  log "smoke run: ./sdc bench detection --every-step, soak --every-step (log: $log)"
  if ! { PYTHONPATH="$SDC_PYTHONPATH" timeout 300 "$ROOT/bench/smoke_test.sh" \
      trials,rel_exponents,dtypes,clean_steps,clean_alarms,products_per_step,rows \
      "$VENV/bin/python3" "$ROOT/bench/every_step_detection.py" --every-step --trials=3 \
      --exponents=-4,-20 --dtypes=fp32,bf16 &&
    PYTHONPATH="$SDC_PYTHONPATH" timeout 300 "$ROOT/bench/smoke_test.sh" \
      steps,dtype,checksum_alarms,checksum_skips,steps_skipped,products_checked,products_per_step \
      "$VENV/bin/python3" "$ROOT/bench/every_step_soak.py" --every-step --dtype=bf16 \
      --steps=30 --progress_every=10; } >"$log" 2>&1; then
    tail -40 "$log" >&2
    die "the smoke run of ./sdc bench detection/soak --every-step failed (log: $log)"
  fi
  log "smoke run of ./sdc bench detection/soak --every-step passed in $((SECONDS - start)) s"
}

# Binaries are built once and then run straight from bazel-bin, so a
# benchmark's timing never includes Bazel. Bazel's chatter goes to a log,
# shown only when the build fails; its progress line ("[120 / 516]
# Compiling ...") is shown at most every 10 s, so a first build on a fresh
# machine (several minutes) is seen to be working.
build_targets() {
  local log="${SDC_CACHE:-$HOME/.cache/sdc-guard}/build.log"
  mkdir -p "$(dirname "$log")"
  if ! bazel_run build --show_progress --show_progress_rate_limit=10 --curses=no --color=no \
      "$@" 2>&1 | tee "$log" | show_build_progress; then
    tail -40 "$log" >&2
    die "build failed (full log: $log)"
  fi
}

# Bazel's progress lines from standard input, one short line each on stderr.
show_build_progress() {
  local line start=$SECONDS
  while IFS= read -r line; do
    if [[ "$line" =~ ^\[([0-9,]+)\ /\ ([0-9,]+)\]\ ([^;]*) ]]; then
      printf 'sdc: building (%d s): %s of %s actions, %.60s\n' "$((SECONDS - start))" \
        "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" >&2
    fi
  done
}

cmd_bench() {
  local name=${1:-}
  [[ -n "$name" ]] || die "usage: ./sdc bench NAME (one of: $BENCHMARKS)"
  shift
  setup
  case "$name" in
    overhead)
      if [[ " $* " == *" --every-step "* ]]; then
        # The every-step checksums' cost (bench/every_step_overhead.py): one
        # Python process, the guarded job with and without them and unguarded.
        build_python >/dev/null
        PYTHONPATH="$SDC_PYTHONPATH" exec "$VENV/bin/python3" "$ROOT/bench/every_step_overhead.py" "$@"
      fi
      # Starts sdcd and trainers from its runfiles.
      build_targets //bench:overhead_bench
      # A sharded --layout trains examples/ddp_train.py (bench/layout_overhead.h).
      if [[ " $* " == *" --trainer=python "* || " $* " == *" --trainer python "* ||
            " $* " =~ \ --layout[=\ ]([a-z,]*)(fsdp|hsdp|zero|tp) ]]; then
        build_python >/dev/null
      fi
      exec "$ROOT/bazel-bin/bench/overhead_bench" "$@"
      ;;
    detection | soak)
      if [[ " $* " == *" --every-step "* ]]; then
        # The every-step checksums' detection curve and clean soak
        # (bench/every_step_detection.py, bench/every_step_soak.py): one
        # Python process each, a one-rank Gloo group.
        build_python >/dev/null
        PYTHONPATH="$SDC_PYTHONPATH" exec "$VENV/bin/python3" "$ROOT/bench/every_step_$name.py" "$@"
      fi
      if [[ "$name" == soak ]]; then
        # The detection bench's long clean soak (about 40 minutes here; not in CI).
        build_targets //bench:detection_bench
        exec "$ROOT/bazel-bin/bench/detection_bench" --soak_only "$@"
      fi
      # Starts sdcd and trainers from its runfiles; the sharded layouts'
      # rows (--layouts, on unless none) train examples/ddp_train.py.
      build_targets //bench:detection_bench
      if [[ " $* " != *" --layouts=none "* ]]; then
        build_python >/dev/null
      fi
      exec "$ROOT/bazel-bin/bench/detection_bench" "$@"
      ;;
    kernels | core | watch | abft)
      # watch starts sdcd and trainers from its runfiles.
      build_targets "//bench:${name}_bench"
      if [[ " $* " == *" --trainer=python "* || " $* " == *" --trainer python "* ]]; then
        build_python >/dev/null
      fi
      exec "$ROOT/bazel-bin/bench/${name}_bench" "$@"
      ;;
    configs)
      # The guard under real jobs' configurations (bench/configs.py): Python
      # ranks of examples/ddp_train.py against a real sdcd.
      build_targets //daemon:sdcd //ctl:sdcctl
      build_python >/dev/null
      SDC_BIN="$ROOT/bazel-bin" PYTHONPATH="$SDC_PYTHONPATH" \
        exec "$VENV/bin/python3" "$ROOT/bench/configs.py" "$@"
      ;;
    daemon)
      build_targets //bench:daemon_bench //daemon:sdcd
      TEST_SRCDIR="$ROOT/bazel-bin/bench/daemon_bench.runfiles" TEST_WORKSPACE=sdc_guard \
        exec "$ROOT/bazel-bin/bench/daemon_bench" "$@"
      ;;
    *) die "unknown benchmark '$name' (one of: $BENCHMARKS)" ;;
  esac
}

cmd_demo() {
  setup
  log "building the demo (the first build on a fresh machine takes several minutes)"
  build_targets //demo:sdc-demo //demo:sdc-trainer //daemon:sdcd //ctl:sdcctl
  # Every trainer but the C++ one imports the sdc_guard package (a sharded
  # --layout trains the Python one).
  if [[ " $* " =~ \ --trainer[=\ ](python|hf|lightning|accelerate)\  ||
        " $* " =~ \ --layout[=\ ](fsdp|hsdp|zero|tp)\  ]]; then
    build_python >/dev/null
  fi
  exec "$ROOT/bazel-bin/demo/sdc-demo" "$@"
}

# The operator CLI, built on demand: ./sdc ctl get requests ...
cmd_ctl() {
  build_targets //ctl:sdcctl >/dev/null 2>&1 || build_targets //ctl:sdcctl
  exec "$ROOT/bazel-bin/ctl/sdcctl" "$@"
}

# The guard's loop under a real Slurm on this machine (tests/slurm/
# slurm_loop_test.sh): slurmctld and four slurmd from a slurm.conf in a
# temporary directory, sdcd with --actuator=slurm, a guarded job submitted
# with sbatch --requeue; a fault, an operator's approval, the node failed
# with scontrol, the job requeued and resumed. About a minute. Root runs the
# Slurm daemons (sudo -n when this is not root).
cmd_slurm_loop() {
  build_targets //daemon:sdcd //ctl:sdcctl
  [[ -n "${SDC_PYTHONPATH:-}" ]] || build_python >/dev/null
  local log="$SDC_CACHE/slurm-loop.log" start=$SECONDS sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    sudo -n true 2>/dev/null || die "slurm-loop: the Slurm daemons need root (or sudo without a password)"
    sudo=(sudo -n)
  fi
  log "slurm loop: a guarded job under slurmctld + slurmd (log: $log)"
  if ! "${sudo[@]}" timeout --kill-after=30 600 "$ROOT/tests/slurm/slurm_loop_test.sh" \
    --bin "$ROOT/bazel-bin" --python "$VENV/bin/python3" --pythonpath "$SDC_PYTHONPATH" \
    >"$log" 2>&1; then
    tail -60 "$log" >&2
    die "the Slurm loop test failed (log: $log)"
  fi
  grep '^slurm-loop: ' "$log" >&2
  log "slurm loop passed in $((SECONDS - start)) s"
}

# What tests/gpu/run.sh needs on a GPU machine, into gpu-bundle/ (see
# tests/gpu/README.md).
cmd_gpu_bundle() {
  build_targets //tests/gpu:gpu_bench //kernels:cuda_test //client:device_test \
    //daemon:sdcd //ctl:sdcctl
  build_python >/dev/null
  "$ROOT/tests/gpu/prepare.sh"
}

usage() {
  cat <<'TXT'
usage: ./sdc COMMAND [ARGS]
  demo [FLAGS]         run the local cluster demo with injected faults (--help for flags)
  ctl ARGS             the operator CLI (sdcctl), e.g. ./sdc ctl get requests
  test [BAZEL ARGS]    install what is missing, build everything, run every test
  bench NAME           run a benchmark: kernels, core, daemon, overhead, detection, soak,
                       configs (the guard under mixed precision, checkpointing, compile, hooks),
                       abft; `overhead --every-step`: the every-step checksums' cost per step;
                       `detection --every-step`: their detection curve; `soak --every-step`:
                       their false alarms over 15,320 clean steps (--dtype fp32|bf16)
  build [BAZEL ARGS]   install what is missing, build everything and the Python wheel (dist/)
  compat [--full]      the wheel for torch 2.9-2.11 (dist/compat/), smoke-tested on Python 3.10-3.13
                       (4 cells on torch 2.9 and 2.11, as CI; --full: 8, with 2.10)
  slurm-loop           the guard's whole loop under a real slurmctld + slurmd on this machine
                       (fault, approval, scontrol state=fail, requeue, resume; needs root)
  release              the relocatable bundle of sdcd, sdcctl, sdc-agent and the wheel in dist/
  pytest [ARGS]        only the Python package's tests (tests/python)
  fuzz [SECONDS]       fuzz the coordinator's ingestion, then sdcd's streams (default 60 s each)
  layers               check the package dependency arrows (also the first step of test)
  gpu-bundle           build what tests/gpu/run.sh needs on a GPU machine (gpu-bundle/)
  setup                install the Debian packages and the pinned torch the project needs
TXT
}

main() {
  local cmd=${1:-help}
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
    demo) cmd_demo "$@" ;;
    ctl) cmd_ctl "$@" ;;
    test) cmd_test "$@" ;;
    bench) cmd_bench "$@" ;;
    build) cmd_build "$@" ;;
    release) cmd_release ;;
    slurm-loop) setup; cmd_slurm_loop ;;
    pytest) setup; cmd_pytest "$@" ;;
    gpu-bundle) setup; cmd_gpu_bundle ;;
    fuzz) setup; cmd_fuzz "$@" ;;
    compat) setup; cmd_compat "$@" ;;
    layers) cmd_layers ;;
    setup) setup ;;
    help | -h | --help) usage ;;
    *) usage >&2; die "unknown command '$cmd'" ;;
  esac
}

main "$@"
