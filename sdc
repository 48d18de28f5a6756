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
  g++ clang
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libtorch-dev libgloo-dev
  libgtest-dev libgmock-dev
  libsqlite3-dev sqlite3 libcivetweb-dev libssl-dev
  prometheus shellcheck python3 python3-yaml procps
)

log() { printf 'sdc: %s\n' "$*" >&2; }
die() { printf 'sdc: error: %s\n' "$*" >&2; exit 1; }

missing_packages() {
  local p status
  for p in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || printf '%s\n' "$p"
  done
}

# Installs what is missing; silent when everything is present.
setup() {
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

# Flags every Bazel call shares: the disk cache lets a fresh clone (CI) reuse
# compiled actions from an earlier build on the same machine.
bazel_flags() {
  local flags=("--disk_cache=${SDC_BAZEL_DISK_CACHE:-$HOME/.cache/sdc-guard/bazel-disk}")
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    flags+=("--define=sdc_cuda=1")
  fi
  printf '%s\n' "${flags[@]}"
}

bazel_run() {
  local cmd=$1
  shift
  local flags
  mapfile -t flags < <(bazel_flags)
  bazel "$cmd" "${flags[@]}" "$@"
}

cmd_build() {
  setup
  bazel_run build //... "$@"
}

cmd_test() {
  setup
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    log "nvcc found: building the CUDA kernels for sm_80 and sm_90 (GPU tests skip without a GPU)"
  else
    log "no nvcc at /usr/local/cuda/bin: CUDA kernels are not built"
  fi
  local start=$SECONDS
  bazel_run test //... "$@"
  log "all tests passed in $((SECONDS - start)) s"
}

# Binaries are built once and then run straight from bazel-bin, so a
# benchmark's timing never includes Bazel.
build_targets() {
  bazel_run build "$@" >&2
}

cmd_bench() {
  local name=${1:-}
  [[ -n "$name" ]] || die "usage: ./sdc bench NAME (one of: kernels)"
  shift
  setup
  case "$name" in
    kernels)
      build_targets //bench:kernels_bench
      exec "$ROOT/bazel-bin/bench/kernels_bench" "$@"
      ;;
    *) die "unknown benchmark '$name' (one of: kernels)" ;;
  esac
}

cmd_demo() {
  setup
  cat <<'TXT'
sdc demo: the local cluster demo (sdcd + 6 trainer ranks with injected faults)
is not built yet. What exists today:
  ./sdc test            build everything and run every test
  ./sdc bench kernels   fingerprint / non-finite scan throughput
TXT
}

usage() {
  cat <<'TXT'
usage: ./sdc COMMAND [ARGS]
  demo                 run the local cluster demo with injected faults
  test [BAZEL ARGS]    install what is missing, build everything, run every test
  bench NAME           run a benchmark: kernels
  build [BAZEL ARGS]   install what is missing and build everything
  setup                install the Debian packages the project needs
TXT
}

main() {
  local cmd=${1:-help}
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
    demo) cmd_demo "$@" ;;
    test) cmd_test "$@" ;;
    bench) cmd_bench "$@" ;;
    build) cmd_build "$@" ;;
    setup) setup ;;
    help | -h | --help) usage ;;
    *) usage >&2; die "unknown command '$cmd'" ;;
  esac
}

main "$@"
