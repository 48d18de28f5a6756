#!/usr/bin/env bash
# tests/kubectl_sdc_test.sh: deploy/kubectl-plugin/kubectl-sdc against a real
# sdcd, with a stand-in kubectl on PATH. The stand-in records its arguments
# and does what `kubectl port-forward ... :7401` does on the wire: it listens
# on a free local port, prints "Forwarding from 127.0.0.1:PORT -> 7401" and
# relays TCP to sdcd's admin port. What this cannot test: the API server's
# side of a real port-forward (no cluster here).
set -euo pipefail

fail() {
  printf 'FAIL %s\n' "$*"
  exit 1
}

if [[ -n "${TEST_SRCDIR:-}" ]]; then
  root="$TEST_SRCDIR/${TEST_WORKSPACE:-sdc_guard}"
else
  root="$(cd "$(dirname "$0")/.." && pwd)"
fi
plugin="$root/deploy/kubectl-plugin/kubectl-sdc"
sdcd="$root/daemon/sdcd"
sdcctl="$root/ctl/sdcctl"
for f in "$plugin" "$sdcd" "$sdcctl"; do
  [[ -x "$f" ]] || fail "missing $f"
done

work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/kubectl-sdc.XXXXXX")"
sdcd_pid=""
# shellcheck disable=SC2317  # Run by the EXIT trap.
cleanup() {
  [[ -n "$sdcd_pid" ]] && kill "$sdcd_pid" 2>/dev/null && wait "$sdcd_pid" 2>/dev/null
  true
}
trap cleanup EXIT

"$sdcd" --db="$work/sdcd.db" --admin_token_file="$work/admin.token" --listen=127.0.0.1:0 \
  --admin_listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 >"$work/sdcd.log" 2>&1 &
sdcd_pid=$!
admin_port=""
for _ in $(seq 1 100); do
  admin_port="$(sed -n 's/.*admin on 127\.0\.0\.1:0 (port \([0-9]*\)).*/\1/p' "$work/sdcd.log")"
  [[ -n "$admin_port" ]] && break
  sleep 0.1
done
[[ -n "$admin_port" ]] || fail "sdcd did not start: $(cat "$work/sdcd.log")"

# The stand-in kubectl.
mkdir -p "$work/bin"
cat >"$work/bin/kubectl" <<STANDIN
#!/usr/bin/env bash
printf '%s\n' "\$*" >>"$work/kubectl.args"
[[ "\${FAKE_KUBECTL_FAIL:-}" == 1 ]] && { echo 'error: pods "sdcd" not found' >&2; exit 1; }
echo \$\$ >"$work/forward.pid"
exec python3 -u - "$admin_port" <<'PY'
import socket, sys, threading
target = int(sys.argv[1])
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(8)
print("Forwarding from 127.0.0.1:%d -> 7401" % server.getsockname()[1])
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass
while True:
    client, _ = server.accept()
    upstream = socket.create_connection(("127.0.0.1", target))
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
PY
STANDIN
chmod +x "$work/bin/kubectl"
ln -s "$sdcctl" "$work/bin/sdcctl"
export PATH="$work/bin:$PATH"
printf 'token_file: %s\n' "$work/admin.token" >"$work/sdcctl.yaml"
export SDCCTL_CONFIG="$work/sdcctl.yaml"

# Arguments pass through; namespace and context go to kubectl.
out="$("$plugin" -n team-a --context=prod whoami 2>&1)" || fail "whoami: $out"
grep -q 'Name: *root' <<<"$out" || fail "whoami through the forward: $out"
grep -qx -- 'port-forward --namespace team-a --context=prod --address 127.0.0.1 deploy/sdcd :7401' \
  "$work/kubectl.args" || fail "kubectl arguments: $(cat "$work/kubectl.args")"
echo "ok   whoami through the forward; kubectl got namespace, context, target"

# The forward is gone once the plugin returns.
pid="$(cat "$work/forward.pid")"
for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then fail "the port-forward $pid outlived the plugin"; fi
echo "ok   the forward ended with the plugin"

# sdcctl's exit status comes back (3: not found), flags after the command too.
set +e
out="$("$plugin" describe request 9 --namespace sdc-system 2>&1)"
code=$?
set -e
[[ $code == 3 ]] || fail "describe request 9: exit $code, want 3: $out"
grep -q 'no replacement request 9' <<<"$out" || fail "describe output: $out"
grep -qx -- 'port-forward --namespace sdc-system --address 127.0.0.1 deploy/sdcd :7401' \
  <(tail -n 1 "$work/kubectl.args") || fail "kubectl arguments: $(tail -n 1 "$work/kubectl.args")"
echo "ok   sdcctl's exit status (3) and --namespace after the command"

# A forward that cannot start: exit 5 with kubectl's reason.
set +e
out="$(FAKE_KUBECTL_FAIL=1 "$plugin" get jobs 2>&1)"
code=$?
set -e
[[ $code == 5 ]] || fail "failed forward: exit $code, want 5: $out"
grep -q 'pods "sdcd" not found' <<<"$out" || fail "failed forward message: $out"
echo "ok   a failed forward exits 5 with kubectl's message"

# Commands that need no server do not forward.
lines_before="$(wc -l <"$work/kubectl.args")"
"$plugin" completion bash | grep -q '_sdcctl()' || fail "completion through the plugin"
[[ "$(wc -l <"$work/kubectl.args")" == "$lines_before" ]] || fail "completion started a forward"
echo "ok   completion runs without a forward"
shellcheck "$plugin" "$0" && echo "ok   shellcheck"
echo PASS
