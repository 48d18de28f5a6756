#!/usr/bin/env bash
# tests/bundle_test.sh: the release bundle (//release:bundle) runs with
# nothing from the build machine.
#
#   bazel test //tests:bundle_test
#
# It unpacks the bundle into a root filesystem that holds only the bundle,
# an empty /tmp, /dev/null and a state directory (no shell, no libc, no
# loader of its own), and inside it, through chroot:
#  - sdcd, sdcctl and sdc-agent --version print VERSION;
#  - sdcd starts on loopback with a SQLite file and an admin unix socket;
#  - the bundle's sdcctl lists nodes and requests through that socket;
#  - sdcd's /metrics (scraped from outside) reports the version;
#  - the bundle's sdc-agent, run outside the root with the build's torch as
#    SDC_TORCH_LIB, registers with that sdcd and passes a CPU diagnostic in
#    its child process (the launcher re-executed through SDC_BUNDLE_EXE);
#  - sdcd stops on SIGTERM with status 0.
# Outside the root filesystem it checks that every ELF file's DT_NEEDED is
# in lib/ or one of torch's libraries (sdc-agent's, from SDC_TORCH_LIB), and
# that sdc-agent refuses to start without SDC_TORCH_LIB, saying why.
# Needs root, or unprivileged user namespaces (`unshare -r`), for chroot.
set -euo pipefail

fail() {
  printf 'FAIL: %s\n' "$*" >&2
  [[ -s "${log:-/nonexistent}" ]] && sed 's/^/  sdcd: /' "$log" >&2
  exit 1
}
ok() { printf '  ok   %s\n' "$*"; }

src="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:-sdc_guard}"
tarball="$src/release/sdc-guard-linux-x86_64.tar.gz"
version=$(tr -d '[:space:]' <"$src/VERSION")
[[ -f "$tarball" ]] || fail "no bundle at $tarball"

work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bundle_test.XXXXXX")"
pid=""
agent_pid=""
cleanup() {
  [[ -n "$agent_pid" ]] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

root="$work/root"
mkdir -p "$root/opt" "$root/tmp" "$root/state" "$root/dev"
chmod 1777 "$root/tmp"
tar -C "$root/opt" -xzf "$tarball"
top="sdc-guard-$version-linux-x86_64"
[[ -d "$root/opt/$top" ]] || fail "the tarball does not unpack to $top/"
bundle="/opt/$top"
ok "bundle unpacks to $top/ ($(du -sh "$root/opt/$top" | cut -f1) unpacked, $(du -hL "$tarball" | cut -f1) packed)"

# /dev/null: a device node where we may make one, else an empty file (what
# the programs write there is then kept, which does no harm here).
mknod -m 666 "$root/dev/null" c 1 3 2>/dev/null || : >"$root/dev/null"

# What the root filesystem holds besides the bundle: nothing.
others=$(cd "$root" && find . -mindepth 1 -not -path "./opt*" -not -path ./tmp -not -path ./state \
  -not -path ./dev -not -path ./dev/null | head -5)
[[ -z "$others" ]] || fail "the root filesystem holds more than the bundle: $others"

# DT_NEEDED closure: bundled, or torch's (documented in make_bundle.sh).
torch_allowed=" libtorch.so libtorch_cpu.so libtorch_cuda.so libc10.so libc10_cuda.so "
checked=0
for f in "$root$bundle"/bin/* "$root$bundle"/libexec/* "$root$bundle"/lib/*; do
  while read -r needed; do
    [[ -e "$root$bundle/lib/$needed" || "$torch_allowed" == *" $needed "* ]] && continue
    fail "$(basename "$f") needs $needed: neither in the bundle's lib/ nor torch's"
  done < <(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  checked=$((checked + 1))
done
ok "every DT_NEEDED of $checked ELF files is in lib/ (or torch's, for sdc-agent)"
for b in sdcd sdcctl sdc-agent; do
  if readelf -d "$root$bundle/bin/$b" 2>/dev/null | grep -q NEEDED; then
    fail "bin/$b is not static"
  fi
done
ok "bin/ launchers are static"

# chroot as root; otherwise inside a user namespace where we are root.
# Both exec the program, so a background job's pid is the program's.
if [[ $(id -u) -eq 0 ]]; then
  chroot_cmd=(chroot "$root")
elif unshare -r true 2>/dev/null; then
  chroot_cmd=(unshare -r chroot "$root")
else
  fail "needs root or unprivileged user namespaces (unshare -r) to chroot"
fi
in_root() { "${chroot_cmd[@]}" "$@"; }

for b in sdcd sdcctl; do
  out=$(in_root "$bundle/bin/$b" --version 2>&1) || fail "$b --version: $out"
  [[ "$out" == "$b $version" ]] || fail "$b --version printed '$out', want '$b $version'"
done
ok "sdcd and sdcctl --version print '$version' inside the bundle-only root"
# Through a symlink elsewhere, as /usr/local/bin/sdcctl is installed: with
# no /proc the launcher resolves argv[0].
mkdir -p "$root/usr/local/bin"
ln -s "$bundle/bin/sdcctl" "$root/usr/local/bin/sdcctl"
out=$(in_root /usr/local/bin/sdcctl --version 2>&1) || fail "sdcctl --version through a symlink: $out"
[[ "$out" == "sdcctl $version" ]] || fail "sdcctl --version through a symlink printed '$out'"
rm -rf "${root:?}/usr"
ok "a symlink to a launcher (/usr/local/bin/sdcctl) finds the bundle"

out=$(env -u SDC_TORCH_LIB "${chroot_cmd[@]}" "$bundle/bin/sdc-agent" --version 2>&1 || true)
[[ "$out" == *"set SDC_TORCH_LIB"* ]] || fail "sdc-agent without SDC_TORCH_LIB: '$out'"
ok "sdc-agent without SDC_TORCH_LIB refuses, naming it"
# With torch: the build's own torch (the RUNPATH Bazel gave sdc-agent), the
# bundle run in place from outside the root filesystem.
torch_lib=$(readelf -d "$src/agent/sdc-agent" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p' |
  tr ':' '\n' | grep '/torch/lib$' | head -1)
[[ -f "$torch_lib/libtorch.so" ]] || fail "found no torch lib/ in sdc-agent's RUNPATH"
out=$(SDC_TORCH_LIB="$torch_lib" "$root$bundle/bin/sdc-agent" --version 2>&1) ||
  fail "sdc-agent --version with SDC_TORCH_LIB=$torch_lib: $out"
[[ "$out" == "sdc-agent $version" ]] || fail "sdc-agent --version printed '$out'"
ok "sdc-agent --version prints '$version' with SDC_TORCH_LIB=$torch_lib"
# The diagnostic child is the launcher re-run with __diagnostic first: the
# launcher must pass it through to the agent's own parser.
out=$(SDC_TORCH_LIB="$torch_lib" "$root$bundle/bin/sdc-agent" __diagnostic 2>&1 || true)
[[ "$out" == *"__diagnostic: want SIZE"* ]] || fail "sdc-agent __diagnostic through the launcher: '$out'"
ok "the launcher passes sdc-agent's __diagnostic child command through"

# sdcd on loopback: trainer and metrics ports chosen by the kernel, admin on
# a unix socket; a SQLite database in /state.
token=0123456789abcdef0123456789abcdef
printf '%s\n' "$token" >"$root/state/admin.token"
chmod 600 "$root/state/admin.token"
log="$work/sdcd.log"
# Agents on their own port; --insecure_dev_mode (loopback only) takes the
# agent's node at its word: this test is about the bundle, node identities
# have theirs (tests/agent_e2e_test, daemon/node_identity_test).
"${chroot_cmd[@]}" "$bundle/bin/sdcd" --db=/state/sdc.db --listen=127.0.0.1:0 \
  --agent_listen=127.0.0.1:0 --insecure_dev_mode --metrics_listen=127.0.0.1:0 --admin_listen=unix:/state/admin.sock \
  --admin_token_file=/state/admin.token >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q "serving trainers" "$log" && break
  kill -0 "$pid" 2>/dev/null || fail "sdcd exited while starting"
  sleep 0.1
done
grep -q "sdcd $version serving trainers" "$log" || fail "sdcd did not start within 10 s"
[[ -S "$root/state/admin.sock" ]] || fail "no admin socket at /state/admin.sock"
[[ -s "$root/state/sdc.db" ]] || fail "no SQLite database at /state/sdc.db"
ok "sdcd $version started in the bundle-only root (SQLite at /state/sdc.db)"

ctl() {
  in_root "$bundle/bin/sdcctl" --server=unix:/state/admin.sock \
    --token_file=/state/admin.token --timeout=10s "$@"
}
out=$(ctl get nodes -o json 2>&1) || fail "sdcctl get nodes: $out"
[[ "$out" == *"["* || "$out" == *"{"* ]] || fail "sdcctl get nodes -o json printed '$out'"
ok "sdcctl get nodes -o json answers through the admin socket"
out=$(ctl get requests 2>&1) || fail "sdcctl get requests: $out"
ok "sdcctl get requests answers ($(printf '%s' "$out" | head -1))"
# A wrong token must be refused, or the calls above prove nothing.
printf 'ffffffffffffffffffffffffffffffff\n' >"$root/state/wrong.token"
chmod 600 "$root/state/wrong.token"
if out=$(in_root "$bundle/bin/sdcctl" --server=unix:/state/admin.sock \
  --token_file=/state/wrong.token get requests 2>&1); then
  fail "sdcctl with a wrong token succeeded: $out"
fi
ok "sdcctl with a wrong token is refused"

port=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$log" | head -1)
[[ -n "$port" ]] || fail "sdcd's log names no metrics port"
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
metrics=$(cat <&3)
exec 3<&-
[[ "$metrics" == *"version=\"$version\""* ]] || fail "/metrics does not report version $version"
ok "sdcd's /metrics reports version=\"$version\""

# The bundle's sdc-agent (outside the root: it needs torch) registers with
# that sdcd and runs a diagnostic in its child process, which it starts by
# re-executing the launcher (SDC_BUNDLE_EXE): a pass proves that path.
agent_port=$(sed -n 's/.*agents on [^ ]* (port \([0-9]*\)).*/\1/p' "$log" | head -1)
[[ -n "$agent_port" ]] || fail "sdcd's log names no agent port"
agent_log="$work/agent.log"
SDC_TORCH_LIB="$torch_lib" "$root$bundle/bin/sdc-agent" --coordinator="127.0.0.1:$agent_port" \
  --node_name=bundle-node --heartbeat=1s >"$agent_log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 150); do
  grep -q "registered with sdcd .* as node bundle-node" "$agent_log" && break
  kill -0 "$agent_pid" 2>/dev/null || { cat "$agent_log" >&2; fail "the bundle's sdc-agent exited"; }
  sleep 0.1
done
grep -q "registered with sdcd .* as node bundle-node" "$agent_log" ||
  { cat "$agent_log" >&2; fail "the bundle's sdc-agent did not register within 15 s"; }
out=$(ctl diagnose node bundle-node --size=64 2>&1) || { cat "$agent_log" >&2; fail "sdcctl diagnose node bundle-node: $out"; }
[[ "$out" == *"diagnostic 1 on node bundle-node: PASSED"* ]] || fail "diagnose printed '$out'"
ok "the bundle's sdc-agent registered and passed a diagnostic in its child process"
kill -TERM "$agent_pid"
wait "$agent_pid" 2>/dev/null || true
agent_pid=""

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
[[ $status -eq 0 ]] || fail "sdcd exited with status $status on SIGTERM"
ok "sdcd stopped on SIGTERM with status 0"
echo "PASS: the release bundle runs in a root filesystem holding only itself"
