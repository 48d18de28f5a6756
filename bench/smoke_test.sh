#!/usr/bin/env bash
# A benchmark at smoke size, as a test (STYLE.md item 16: every benchmark is
# also a test). bench/BUILD runs every `./sdc bench` command so, and ./sdc
# test runs the one that needs the Python wheel.
#
#   smoke_test.sh KEYS BENCH [FLAGS...]
#
# Runs BENCH with FLAGS. Passes when it exits 0 (each bench checks its own
# results before it prints a figure and exits 1 when they are wrong) and
# the last line it prints is a JSON object holding every key of KEYS
# (comma-separated): the keys `./sdc bench` promises its readers.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: smoke_test.sh KEYS BENCH [FLAGS...]" >&2
  exit 2
fi
keys=$1
bench=$2
shift 2
name=$(basename "$bench")
out=$(mktemp "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/$name.XXXXXX")
trap 'rm -f "$out"' EXIT

start=$SECONDS
echo "smoke: $name $*" >&2
rc=0
"$bench" "$@" >"$out" || rc=$?
cat "$out"
if [[ $rc -ne 0 ]]; then
  echo "FAIL: $name exited $rc at smoke size (its own check failed; see above)" >&2
  exit 1
fi
python3 - "$name" "$keys" "$(tail -n 1 "$out")" <<'PY'
import json
import sys

name, keys, line = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    figures = json.loads(line)
except ValueError as e:
    sys.exit(f"FAIL: {name}'s last line is not JSON ({e}): {line[:200]}")
if not isinstance(figures, dict):
    sys.exit(f"FAIL: {name}'s last line is not a JSON object: {line[:200]}")
missing = [k for k in keys.split(",") if k and k not in figures]
if missing:
    sys.exit(f"FAIL: {name}'s JSON lacks {', '.join(missing)}")
PY
echo "smoke: $name passed in $((SECONDS - start)) s" >&2
