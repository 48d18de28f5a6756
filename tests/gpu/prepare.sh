#!/usr/bin/env bash
# Builds what tests/gpu/run.sh needs on the GPU machine into gpu-bundle/ at
# the repository root (ignored by git; the device tool carries it with
# carry=["gpu-bundle"]). Run through `./sdc gpu-bundle`, which builds the
# targets and the wheel first. The GPU machine has torch 2.11.0+cu130 but no
# gRPC, protobuf or Abseil and no network: their libraries travel here, with
# RPATH $ORIGIN/../lib, and the sdc_guard wheel (which bundles its own) for
# whatever Python that machine has.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/bazel-bin"
OUT="$ROOT/gpu-bundle"
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"

BINARIES=(tests/gpu/gpu_bench kernels/cuda_test client/device_test daemon/sdcd ctl/sdcctl)
for b in "${BINARIES[@]}"; do
  install -m 755 "$BIN/$b" "$OUT/bin/"
done

# The shared libraries they need that are neither the C++ runtime's nor
# torch's (those come from the GPU machine's own torch).
bundle_libraries() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r soname path; do
    case "$soname" in
      linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | \
        libutil.so* | libgcc_s.so* | libstdc++.so*) continue ;;
    esac
    [[ "$path" == *site-packages* ]] && continue
    [[ -e "$OUT/lib/$soname" ]] || install -m 755 "$path" "$OUT/lib/$soname"
  done
}
for b in "${BINARIES[@]}"; do
  bundle_libraries "$BIN/$b"
done
for f in "$OUT"/bin/*; do
  patchelf --set-rpath '$ORIGIN/../lib' "$f"
done
for f in "$OUT"/lib/*; do
  patchelf --set-rpath '$ORIGIN' "$f"
done
install -m 644 "$ROOT"/dist/sdc_guard-*.whl "$OUT/"
du -sh "$OUT" | awk '{print "gpu-bundle: " $1}'
