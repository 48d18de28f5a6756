#!/usr/bin/env bash
# tests/deploy_test.sh: checks sdc-guard's deployment files (deploy/) offline.
#
#   bazel test //tests:deploy_test
#   bash tests/deploy_test.sh            (from anywhere in a checkout)
#
# What it checks, and prints as it goes:
#  - every kustomization (deploy/eks/base and each overlay) renders with
#    `kubectl kustomize`; on the rendered objects: images, namespace, the
#    coordinator Deployment (1 replica, Recreate, named ports 7400/7402/9464,
#    probes, PVC at /var/lib/sdc, flags sdcd really has, actuator,
#    approval, security context, resources), PVC, Service, ServiceMonitor,
#    RBAC (nodes get/list/watch/patch only, bound to sdcd only), the agent
#    DaemonSet (tolerations, NODE_NAME, NVML env, no privilege, no RBAC,
#    its own Pod Security "privileged" namespace, the relay socket in its one
#    hostPath, metrics port and /healthz probes), PriorityClasses, sdcd's
#    PodDisruptionBudget and GPU-node anti-affinity, the NetworkPolicies
#    (ports equal the Service's; who is admitted and refused), the PodMonitor,
#    for the hyperpod-api overlay --actuator=hyperpod with its IRSA role,
#    node identities (agents on sdcd's agent port over TLS with a projected
#    service-account token of the audience and account sdcd verifies, with
#    keys and issuer from a ConfigMap), and TLS on both ends from one
#    cert-manager CA (client certificates with the mtls overlay);
#  - deploy/eks/iam: the policy allows exactly the SageMaker calls
#    daemon/actuator.cc makes; the trust policy names ServiceAccount sdcd;
#  - deploy/prometheus/alerts.yml: promtool check + unit tests, the alert
#    contract (names, expressions, for, severity, operator commands), the
#    metrics exist in sdcd's source, and the PrometheusRule carries the same
#    groups;
#  - the PyTorchJob examples (sidecar; relay: same socket as the agent's);
#  - the systemd units: required settings, sdcd flags (agent port, TLS, the
#    agents' node certificates), systemd-analyze verify;
#  - the Slurm installer (role detection with python3 and jq, files
#    installed, the cluster CA and node certificates of --pki, the relay's
#    uids) and trainer-env.sh (coordinator, the node's certificate);
#  - shellcheck on every .sh under deploy/ and on this file;
#  - that the checks can fail: mutated manifests must be rejected.
# Any failure: a FAIL line naming it, and exit status 1.
set -euo pipefail

PY=/usr/bin/python3
failures=0

section() { printf '\n== %s\n' "$*"; }
ok() { printf '  ok   %s\n' "$*"; }
skip() { printf '  SKIP %s\n' "$*"; }
bad() {
  printf '  FAIL %s\n' "$*"
  failures=$((failures + 1))
}

# The checkout: Bazel's runfiles tree, or the directory above this file.
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  src="${TEST_SRCDIR}/${TEST_WORKSPACE:-sdc_guard}"
else
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fi
self="${BASH_SOURCE[0]}"
[[ -d "$src/deploy" ]] || {
  echo "FAIL: no deploy/ directory under $src" >&2
  exit 1
}

work="$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/deploy_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# A real copy (runfiles are symlinks, which kustomize's load restrictor and
# the mutation checks below must not follow back into the source tree).
cp -RL "$src/deploy" "$work/deploy"
deploy="$work/deploy"
export HOME="$work/home"
mkdir -p "$HOME"
export KUBECONFIG="$work/no-kubeconfig"

# Sources the checks compare the manifests with: sdcd's flags and metrics,
# the trainer's environment variables.
sdcd_main="$src/daemon/sdcd_main.cc"
service_cc="$src/daemon/service_metrics.cc"
actuator_cc="$src/daemon/actuator.cc"
options_h="$src/client/options.h"
trainer_metrics_cc="$src/client/trainer_metrics.cc"

section "tools"
for tool in kubectl promtool shellcheck openssl "$PY"; do
  if command -v "$tool" >/dev/null; then
    ok "$tool: $(command -v "$tool")"
  else
    bad "$tool is not installed (./sdc setup installs kubectl, prometheus, shellcheck, python3-yaml)"
  fi
done
if "$PY" -c 'import yaml' 2>/dev/null; then ok "python3 yaml module"; else bad "python3-yaml is not installed"; fi
for f in "$sdcd_main" "$service_cc" "$actuator_cc" "$options_h" "$trainer_metrics_cc"; do
  if [[ -r "$f" ]]; then ok "reference source ${f#"$src"/}"; else bad "cannot read $f"; fi
done
if ((failures > 0)); then
  echo "FAIL: $failures prerequisite(s) missing" >&2
  exit 1
fi

# ---------------------------------------------------------------------------
# The checker: python3 + yaml over rendered manifests, units and the example.
cat >"$work/check.py" <<'PY'
import copy
import re
import sys

import yaml

NS = "sdc-system"
AGENT_NS = "sdc-agent"  # hostPath for the relay socket: Pod Security "privileged"
RELAY_SOCKET = "/run/sdc-guard/relay.sock"
AGENT_METRICS_PORT = 9465
TRAINER_LABEL = ("sdc-guard.io/trainer", "true")
PROMETHEUS_NS = "monitoring"
# Nodes sdcd must never be scheduled on (GPU nodes, which it may act on) and
# one it must accept.
GPU_NODES = [{"nvidia.com/gpu.present": "true", "node.kubernetes.io/instance-type": "m5.xlarge"},
             {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"},
             {"node.kubernetes.io/instance-type": "ml.g5.8xlarge"}]
CPU_NODE = {"node.kubernetes.io/instance-type": "ml.m5.2xlarge", "kubernetes.io/os": "linux"}
SDCD_IMAGE = "sdc-guard/sdcd"
AGENT_IMAGE = "sdc-guard/sdc-agent"
DEFAULT_TAG = "0.2.0"
# sdc-agent's flags (agent/agent_main.cc) that a manifest may set; --inject_diagnostic_fault
# (tests only) is deliberately absent, so a manifest carrying it is rejected.
AGENT_FLAGS = {"coordinator", "node_name", "heartbeat", "instance_id", "tls_ca", "tls_cert", "tls_key",
               "token_file", "action_command", "action_timeout", "diagnostic_timeout", "nvml_library",
               "relay_listen", "relay_allowed_uids", "relay_group", "metrics_listen"}
AGENT_PORT = 7402  # sdcd's --agent_listen: agents prove their node there
TOKEN_AUDIENCE = "sdcd"  # sdcd's default --agent_token_audience (daemon/config.h)
RBAC_VERBS = {"get", "list", "watch", "patch"}
HEALTH_KEY = "sagemaker.amazonaws.com/node-health-status"
HEALTH_TAINTS = [
    {"key": HEALTH_KEY, "value": "UnschedulablePendingReplacement", "effect": "NoSchedule"},
    {"key": HEALTH_KEY, "value": "UnschedulablePendingReboot", "effect": "NoSchedule"},
    {"key": HEALTH_KEY, "value": "Unschedulable", "effect": "NoExecute"},
]
ALERTS = {  # name: (expr, for)
    "SdcReplacementRequestPending": ('sdc_replacement_requests{state="pending"} > 0', "5m"),
    "SdcIncidentAttributed": ('increase(sdc_incidents_total{attributed="true"}[15m]) > 0', None),
    "SdcSystemicMismatch": ('increase(sdc_checks_total{check="replay",result="systemic"}[30m]) > 0', None),
    "SdcCoordinatorDown": ('up{job=~".*sdcd.*"} == 0', "2m"),
    "SdcRejectedInputs": ("rate(sdc_rejected_inputs_total[10m]) > 1", None),
    "SdcStoreBacklog": ("sdc_store_queue_depth > 10000", "5m"),
    "SdcStepsSkipped": ("increase(sdc_steps_skipped_total[30m]) > 0", None),
    "SdcCoordinatorAbsent": ('absent(up{job=~".*sdcd.*"})', "10m"),
    "SdcActuatorRunFailed": ('increase(sdc_actuator_runs_total{result="failed"}[30m]) > 0', None),
    "SdcAgentsDisconnected": ('sdc_agent_nodes{status="disconnected"} > 0', "10m"),
    "SdcVerdictSlow": ("histogram_quantile(0.99, sum by (job, instance, check, le) "
                       "(rate(sdc_verdict_latency_seconds_bucket[10m]))) > 10", "15m"),
    "SdcTrainerLinkDown": ("count by (sdc_job) (sdc_trainer_link_up == 0) > 0", "5m"),
    "SdcTrainerReportsDropped": ("sum by (sdc_job, kind, reason) "
                                 "(increase(sdc_trainer_reports_dropped_total[15m])) > 0", None),
}
NAMESPACED_EXEMPT = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                     "PersistentVolume", "StorageClass", "PriorityClass", "ClusterIssuer",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
CERT_MANAGER_NS = "cert-manager"  # cert-manager's cluster resource namespace: the CA's Secret
CA_ISSUER = "sdc-guard-ca"


class Report:
    def __init__(self, label, quiet=False):
        self.label, self.quiet, self.errors = label, quiet, []

    def expect(self, cond, what, detail=""):
        if cond:
            if not self.quiet:
                print(f"  ok   [{self.label}] {what}")
        else:
            self.errors.append(f"[{self.label}] {what}" + (f": {detail}" if detail else ""))
        return bool(cond)

    def finish(self):
        for e in self.errors:
            print(f"  FAIL {e}")
        return 1 if self.errors else 0


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def read(path):
    with open(path) as f:
        return f.read()


def sdcd_flags(path):
    """{flag name: type} from sdcd_main.cc's ABSL_FLAG definitions."""
    return {n: t.strip() for t, n in re.findall(r"ABSL_FLAG\(\s*([^,]+?)\s*,\s*(\w+)\s*,", read(path))}


def trainer_vars(path):
    return set(re.findall(r"\b(SDC_[A-Z0-9_]+|LOCAL_RANK)\b", read(path)))


def parse_flags(args):
    """[(name, value or None, raw)] for --name=value / --name arguments."""
    out = []
    for a in args:
        m = re.fullmatch(r"--?([A-Za-z0-9_]+)(?:=(.*))?", a, re.S)
        out.append((m.group(1), m.group(2), a) if m else (None, None, a))
    return out


def check_flag_list(r, what, args, known):
    """Every argument is --flag=value (bare only for bools) for a flag the binary defines."""
    parsed, problems = parse_flags(args), []
    for name, value, raw in parsed:
        if name is None:
            problems.append(f"'{raw}' is not a --flag")
        elif name not in known:
            problems.append(f"unknown flag in '{raw}' (known: {', '.join(sorted(known))})")
        elif isinstance(known, dict) and known[name] != "bool" and value is None:
            problems.append(f"'{raw}': write --{name}=VALUE")
    r.expect(not problems, f"{what}: {len(parsed)} flags, each one the binary defines, as --flag=value",
             "; ".join(problems))
    return parsed


def flag_values(parsed, name):
    return [v for n, v, _ in parsed if n == name]


def host_port(addr):
    host, _, port = (addr or "").rpartition(":")
    return host, port


def approval_auto(text):
    return re.search(r"approval[\"']?\s*[=:,]?\s*[\"']?auto\b", text) is not None


def walk_strings(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from walk_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk_strings(v)
    elif isinstance(obj, str):
        yield obj


def pod_specs(doc):
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        yield kind + "/" + doc["metadata"]["name"], spec.get("template", {}).get("spec", {})
    elif kind == "CronJob":
        yield "CronJob/" + doc["metadata"]["name"], spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "Pod":
        yield "Pod/" + doc["metadata"]["name"], spec
    elif kind == "PyTorchJob":
        for rtype, rspec in (spec.get("pytorchReplicaSpecs") or {}).items():
            yield f"PyTorchJob/{doc['metadata']['name']}/{rtype}", rspec["template"]["spec"]


def all_containers(pod):
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(field) or []:
            yield field, c


def tolerates(tol, taint):
    if tol.get("effect") and tol["effect"] != taint["effect"]:
        return False
    op, key = tol.get("operator", "Equal"), tol.get("key", "")
    if not key:
        return op == "Exists"
    if key != taint["key"]:
        return False
    return op == "Exists" or tol.get("value", "") == taint.get("value", "")


def selector_matches(sel, labels):
    if not sel or not (sel.get("matchLabels") or sel.get("matchExpressions")):
        return False
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if (op == "In" and labels.get(k) not in vals) or (op == "NotIn" and labels.get(k) in vals) \
                or (op == "Exists" and k not in labels) or (op == "DoesNotExist" and k in labels):
            return False
    return True


def resolve_port(container, port):
    for p in container.get("ports") or []:
        if port in (p.get("name"), p.get("containerPort")):
            return p.get("containerPort")
    return None


def expected_images(kustomization):
    """Image of each sdc-guard component after the kustomization's images: field."""
    want = {SDCD_IMAGE: f"{SDCD_IMAGE}:{DEFAULT_TAG}", AGENT_IMAGE: f"{AGENT_IMAGE}:{DEFAULT_TAG}"}
    for img in (load(kustomization)[0].get("images") or []):
        if img.get("name") in want:
            name = img.get("newName", img["name"])
            if img.get("digest"):
                want[img["name"]] = f"{name}@{img['digest']}"
            else:
                want[img["name"]] = f"{name}:{img.get('newTag', DEFAULT_TAG)}"
    return want


# --- Rendered kustomizations --------------------------------------------------

def check_rendered(r, docs, kustomization, actuator, known, alerts_path, base):
    by = {}
    for d in docs:
        by.setdefault(d.get("kind"), {})[d["metadata"]["name"]] = d
    get = lambda kind, name: by.get(kind, {}).get(name)

    required = [("Namespace", NS), ("Namespace", AGENT_NS), ("ServiceAccount", "sdcd"), ("ServiceAccount", "sdc-agent"),
                ("PriorityClass", "sdc-guard-coordinator"), ("PriorityClass", "sdc-guard-agent"),
                ("PodDisruptionBudget", "sdcd"), ("NetworkPolicy", "sdcd"), ("NetworkPolicy", "sdc-agent"),
                ("PodMonitor", "sdc-agent"),
                ("ClusterRole", "sdc-guard-coordinator"), ("ClusterRoleBinding", "sdc-guard-coordinator"),
                ("ValidatingAdmissionPolicy", "sdc-guard-coordinator-node-label"),
                ("ValidatingAdmissionPolicyBinding", "sdc-guard-coordinator-node-label"),
                ("Role", "sdc-guard-operator"),
                ("PersistentVolumeClaim", "sdcd-state"), ("Deployment", "sdcd"), ("Service", "sdcd"),
                ("ServiceMonitor", "sdcd"), ("PrometheusRule", "sdc-guard"), ("DaemonSet", "sdc-agent")]
    missing = [f"{k}/{n}" for k, n in required if get(k, n) is None]
    r.expect(not missing, f"all {len(required)} objects present", "missing " + ", ".join(missing))
    if missing:
        return
    home_ns = lambda d: (CERT_MANAGER_NS if (d["kind"], d["metadata"]["name"]) == ("Certificate", CA_ISSUER) else
                         AGENT_NS if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "sdc-agent" else NS)
    wrong_ns = [f"{d['kind']}/{d['metadata']['name']}={d['metadata'].get('namespace')}" for d in docs
                if d["kind"] not in NAMESPACED_EXEMPT and d["metadata"].get("namespace") != home_ns(d)]
    r.expect(not wrong_ns, f"agent objects in {AGENT_NS}, every other namespaced object in {NS}", ", ".join(wrong_ns))
    autos = [s for d in docs for s in walk_strings(d) if approval_auto(s)]
    r.expect(not autos, "no --approval=auto anywhere", "; ".join(autos))

    # Images: the two sdc-guard images (after the overlay's images: override),
    # an override keeping each component's image name.
    want = expected_images(kustomization)
    for component, image in want.items():
        repo = re.split(r"[:@]", image.rsplit("/", 1)[-1])[0]
        r.expect(repo == component.rsplit("/", 1)[-1], f"{component} resolves to a {repo} image", image)
    for _, pod in (p for d in docs for p in pod_specs(d)):
        for field, c in all_containers(pod):
            r.expect(c.get("image") in want.values(), f"container {c['name']} image {c.get('image')} is an sdc-guard image",
                     "allowed: " + ", ".join(want.values()))

    # Coordinator Deployment.
    dep = get("Deployment", "sdcd")
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    r.expect(spec.get("replicas") == 1, "sdcd replicas: 1", f"got {spec.get('replicas')}")
    r.expect((spec.get("strategy") or {}).get("type") == "Recreate", "sdcd strategy: Recreate",
             f"got {spec.get('strategy')}")
    cs = [c for c in pod.get("containers") or [] if c.get("name") == "sdcd"]
    if not r.expect(len(cs) == 1, "sdcd container present"):
        return
    c = cs[0]
    r.expect(c.get("image") == want[SDCD_IMAGE], f"sdcd image is {want[SDCD_IMAGE]}", c.get("image"))
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    r.expect(ports.get("grpc") == 7400, "sdcd port grpc: 7400", str(ports))
    r.expect(ports.get("metrics") == 9464, "sdcd port metrics: 9464", str(ports))
    r.expect(ports.get("agents") == AGENT_PORT, f"sdcd port agents: {AGENT_PORT}", str(ports))
    # With TLS on the trainer port kubelet's gRPC probe cannot connect: the
    # probes then use /healthz on the (plain HTTP) metrics port.
    tls = any(a.startswith("--tls_cert=") for a in c.get("args") or [])
    for probe in ("livenessProbe", "readinessProbe") + (("startupProbe",) if c.get("startupProbe") else ()):
        if tls:
            h = (c.get(probe) or {}).get("httpGet") or {}
            r.expect(h.get("path") == "/healthz" and resolve_port(c, h.get("port")) == 9464,
                     f"sdcd {probe} (TLS): httpGet /healthz on 9464", str(c.get(probe)))
        else:
            g = (c.get(probe) or {}).get("grpc") or {}
            r.expect(resolve_port(c, g.get("port")) == 7400 and not g.get("service"),
                     f"sdcd {probe}: grpc on 7400", str(c.get(probe)))
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
    state = mounts.get("/var/lib/sdc")
    claim = ((vols.get(state["name"]) if state else None) or {}).get("persistentVolumeClaim", {}).get("claimName")
    r.expect(claim == "sdcd-state" and not state.get("readOnly"),
             "PVC sdcd-state mounted read-write at /var/lib/sdc", f"mount {state}, claim {claim}")
    if c.get("command"):
        r.expect(c["command"][-1].endswith("sdcd"), "sdcd command runs sdcd", str(c["command"]))
    parsed = check_flag_list(r, "sdcd args", c.get("args") or [], known)
    listen = flag_values(parsed, "listen")
    r.expect(listen == ["0.0.0.0:7400"], "--listen=0.0.0.0:7400", str(listen))
    agl = flag_values(parsed, "agent_listen")
    r.expect(agl == [f"0.0.0.0:{AGENT_PORT}"], f"--agent_listen=0.0.0.0:{AGENT_PORT} (agents get a port)", str(agl))
    r.expect(not flag_values(parsed, "insecure_dev_mode"), "no --insecure_dev_mode")
    ml = flag_values(parsed, "metrics_listen")
    r.expect(len(ml) == 1 and host_port(ml[0]) == ("0.0.0.0", "9464"), "--metrics_listen on 0.0.0.0:9464", str(ml))
    al = flag_values(parsed, "admin_listen")
    r.expect(len(al) <= 1 and all(a.startswith("unix:") or host_port(a)[0] in ("127.0.0.1", "localhost", "[::1]")
                                  for a in al), "--admin_listen is loopback or a unix socket", str(al))
    db = flag_values(parsed, "db")
    r.expect(len(db) == 1 and db[0].startswith("/var/lib/sdc/"), "--db on the PVC (/var/lib/sdc/)", str(db))
    tok = flag_values(parsed, "admin_token_file")
    r.expect(len(tok) == 1 and (tok[0].startswith("/var/lib/sdc/") or any(
        tok[0].startswith(p.rstrip("/") + "/") for p in mounts if p != "/var/lib/sdc")),
        "--admin_token_file on a mounted volume", str(tok))
    act = flag_values(parsed, "actuator")
    r.expect(act == [actuator], f"--actuator={actuator}, once", str(act))
    appr = flag_values(parsed, "approval")
    r.expect(appr in ([], ["require"]), "--approval unset or require", str(appr))
    psc, csc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    r.expect(csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, "sdcd runs as non-root")
    r.expect(csc.get("readOnlyRootFilesystem") is True, "sdcd read-only root filesystem")
    r.expect(csc.get("allowPrivilegeEscalation") is False and not csc.get("privileged"),
             "sdcd: no privilege escalation, not privileged")
    r.expect("ALL" in ((csc.get("capabilities") or {}).get("drop") or []), "sdcd drops all capabilities")
    res = c.get("resources") or {}
    r.expect(all(k in (res.get(s) or {}) for s in ("requests", "limits") for k in ("cpu", "memory")),
             "sdcd resources: cpu/memory requests and limits", str(res))
    r.expect(pod.get("serviceAccountName") == "sdcd", "sdcd uses ServiceAccount sdcd")
    env = {e["name"]: e.get("value") for e in c.get("env") or []}
    for name in ("HOME", "SQLITE_TMPDIR", "TMPDIR"):
        if env.get(name):
            r.expect(any(env[name] == p or env[name].startswith(p + "/") for p in mounts),
                     f"sdcd ${name} ({env[name]}) is on a writable volume", str(sorted(mounts)))

    # PersistentVolumeClaim.
    pvc = get("PersistentVolumeClaim", "sdcd-state")["spec"]
    r.expect(pvc.get("resources", {}).get("requests", {}).get("storage") == "10Gi", "PVC requests 10Gi")
    r.expect("ReadWriteOnce" in (pvc.get("accessModes") or []), "PVC ReadWriteOnce")
    if base:
        r.expect("storageClassName" not in pvc, "base PVC has no storageClassName")

    # Service.
    svc = get("Service", "sdcd")
    sp = svc["spec"]
    r.expect(sp.get("type", "ClusterIP") == "ClusterIP", "Service sdcd is ClusterIP")
    sports = {p.get("name"): p for p in sp.get("ports") or []}
    for name, port in (("grpc", 7400), ("agents", AGENT_PORT), ("metrics", 9464)):
        p = sports.get(name) or {}
        r.expect(p.get("port") == port and resolve_port(c, p.get("targetPort", port)) == port,
                 f"Service port {name}: {port} -> container {port}", str(p))
    pod_labels = dep["spec"]["template"]["metadata"].get("labels") or {}
    sel = sp.get("selector") or {}
    r.expect(sel and all(pod_labels.get(k) == v for k, v in sel.items()), "Service selects the sdcd pods",
             f"{sel} vs {pod_labels}")
    agent_labels = get("DaemonSet", "sdc-agent")["spec"]["template"]["metadata"].get("labels") or {}
    r.expect(not all(agent_labels.get(k) == v for k, v in sel.items()), "Service does not select agent pods")

    # ServiceMonitor.
    sm = get("ServiceMonitor", "sdcd")
    r.expect(sm.get("apiVersion") == "monitoring.coreos.com/v1", "ServiceMonitor is monitoring.coreos.com/v1")
    smspec = sm["spec"]
    r.expect(selector_matches(smspec.get("selector"), svc["metadata"].get("labels") or {}),
             "ServiceMonitor selects the Service's labels", f"{smspec.get('selector')} vs {svc['metadata'].get('labels')}")
    nsel = smspec.get("namespaceSelector")
    r.expect(nsel is None or nsel.get("any") or svc["metadata"].get("namespace") in (nsel.get("matchNames") or []),
             "ServiceMonitor looks in the Service's namespace", str(nsel))
    eps = smspec.get("endpoints") or []
    r.expect(any(e.get("port") == "metrics" for e in eps) and "metrics" in sports,
             "ServiceMonitor scrapes Service port 'metrics'", str(eps))
    r.expect(all(e.get("interval") == "30s" for e in eps) and eps, "ServiceMonitor interval 30s")
    r.expect(all(e.get("path", "/metrics") == "/metrics" for e in eps), "ServiceMonitor path /metrics")
    job = (svc["metadata"].get("labels") or {}).get(smspec["jobLabel"]) if smspec.get("jobLabel") else svc["metadata"]["name"]
    r.expect(job and re.fullmatch(".*sdcd.*", job), f"scrape job '{job}' matches SdcCoordinatorDown's job=~\".*sdcd.*\"")

    # RBAC: nodes get/list/watch/patch and nothing else, for sdcd only.
    # One namespaced Role, for `kubectl sdc`: reach sdcd's admin port, nothing more.
    r.expect(list(by.get("Role", {})) == ["sdc-guard-operator"] and not by.get("RoleBinding"),
             "one namespaced Role (sdc-guard-operator) and no RoleBinding",
             str(list(by.get("Role", {})) + list(by.get("RoleBinding", {}))))
    op_role = get("Role", "sdc-guard-operator") or {}
    op_rules = sorted((tuple(x.get("apiGroups") or []), tuple(x.get("resources") or []), tuple(sorted(x.get("verbs") or [])),
                       bool(x.get("resourceNames") or x.get("nonResourceURLs"))) for x in op_role.get("rules") or [])
    r.expect(op_rules == [(("",), ("pods",), ("get", "list"), False), (("",), ("pods/portforward",), ("create",), False),
                          (("apps",), ("deployments",), ("get",), False)],
             "Role sdc-guard-operator allows exactly what `kubectl port-forward deploy/sdcd` needs", str(op_rules))
    for name, cr in by.get("ClusterRole", {}).items():
        rules = cr.get("rules") or []
        r.expect(not cr.get("aggregationRule"), f"ClusterRole {name} is not aggregated")
        r.expect(rules, f"ClusterRole {name} has rules")
        for rule in rules:
            r.expect(rule.get("resources") == ["nodes"], f"ClusterRole {name}: resources exactly [nodes]",
                     str(rule.get("resources")))
            r.expect(rule.get("apiGroups") == [""], f"ClusterRole {name}: core API group only", str(rule.get("apiGroups")))
            r.expect(set(rule.get("verbs") or []) <= RBAC_VERBS and rule.get("verbs"),
                     f"ClusterRole {name}: verbs {rule.get('verbs')} within {sorted(RBAC_VERBS)}")
            r.expect(not rule.get("nonResourceURLs") and not rule.get("resourceNames"),
                     f"ClusterRole {name}: no nonResourceURLs or resourceNames")
        if actuator == "eks":
            verbs = {v for rule in rules for v in rule.get("verbs") or []}
            r.expect({"get", "patch"} <= verbs, f"ClusterRole {name} allows what `kubectl label node` needs (get, patch)")
    for name, crb in by.get("ClusterRoleBinding", {}).items():
        ref = crb.get("roleRef") or {}
        r.expect(ref.get("kind") == "ClusterRole" and ref.get("name") in by.get("ClusterRole", {}),
                 f"ClusterRoleBinding {name} binds a ClusterRole of this install", str(ref))
        subs = [(s.get("kind"), s.get("name"), s.get("namespace")) for s in crb.get("subjects") or []]
        r.expect(subs == [("ServiceAccount", "sdcd", NS)], f"ClusterRoleBinding {name} binds only {NS}/sdcd", str(subs))

    # The admission policy: sdcd's RBAC patch narrowed to one label.
    vap = get("ValidatingAdmissionPolicy", "sdc-guard-coordinator-node-label")
    vspec = vap.get("spec") or {}
    conds = [c.get("expression", "") for c in vspec.get("matchConditions") or []]
    r.expect(conds == [f"request.userInfo.username == 'system:serviceaccount:{NS}:sdcd'"],
             f"the admission policy matches only {NS}/sdcd", str(conds))
    rules = (vspec.get("matchConstraints") or {}).get("resourceRules") or []
    r.expect([(x.get("resources"), x.get("operations")) for x in rules] == [(["nodes"], ["UPDATE"])],
             "the admission policy covers node updates", str(rules))
    r.expect(vspec.get("failurePolicy") == "Fail", "the admission policy fails closed")
    exprs = " ".join(v.get("expression", "") for v in vspec.get("validations") or [])
    keyvar = next((v.get("expression") for v in vspec.get("variables") or [] if v.get("name") == "key"), "")
    r.expect(keyvar == f"'{HEALTH_KEY}'", f"the admission policy's one label is {HEALTH_KEY}", keyvar)
    for need in ("object.spec == oldObject.spec", "annotations", "UnschedulablePendingReplacement"):
        r.expect(need in exprs, f"the admission policy checks {need}")
    vb = get("ValidatingAdmissionPolicyBinding", "sdc-guard-coordinator-node-label")
    r.expect((vb.get("spec") or {}).get("policyName") == vap["metadata"]["name"] and
             (vb.get("spec") or {}).get("validationActions") == ["Deny"],
             "the admission policy's binding denies")

    # Agent DaemonSet.
    ds = get("DaemonSet", "sdc-agent")
    apod = ds["spec"]["template"]["spec"]
    tols = apod.get("tolerations") or []
    for t in HEALTH_TAINTS:
        r.expect(any(tolerates(x, t) for x in tols), f"agent tolerates {t['key']}={t['value']}:{t['effect']}")
    r.expect(any(x.get("key") == HEALTH_KEY for x in tols), f"agent names {HEALTH_KEY} explicitly")
    for flag in ("hostPID", "hostNetwork", "hostIPC"):
        r.expect(not apod.get(flag), f"agent {flag} is false")
    r.expect(apod.get("serviceAccountName") == "sdc-agent" and apod.get("automountServiceAccountToken") is False,
             "agent ServiceAccount sdc-agent without a token")
    sa = get("ServiceAccount", "sdc-agent")
    r.expect(sa.get("automountServiceAccountToken") is False, "ServiceAccount sdc-agent does not automount a token")
    acs = [x for x in apod.get("containers") or [] if x.get("name") == "sdc-agent"]
    if not r.expect(len(acs) == 1, "sdc-agent container present"):
        return
    a = acs[0]
    r.expect(a.get("image") == want[AGENT_IMAGE], f"agent image is {want[AGENT_IMAGE]}", a.get("image"))
    asc, apsc = a.get("securityContext") or {}, apod.get("securityContext") or {}
    r.expect(not asc.get("privileged") and asc.get("allowPrivilegeEscalation") is False,
             "agent: not privileged, no privilege escalation")
    # Root (uid 0) only to own the relay socket in kubelet's root-owned
    # hostPath directory; then without any capability and read-only.
    r.expect(asc.get("runAsNonRoot", apsc.get("runAsNonRoot")) is True or
             ((asc.get("capabilities") or {}).get("drop") == ["ALL"] and not (asc.get("capabilities") or {}).get("add")
              and asc.get("readOnlyRootFilesystem") is True),
             "agent runs as non-root, or as root without capabilities on a read-only root", str(asc))
    env = {e["name"]: e for e in a.get("env") or []}
    r.expect(((env.get("NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
             "agent NODE_NAME from fieldRef spec.nodeName")
    r.expect((env.get("NVIDIA_VISIBLE_DEVICES") or {}).get("value") == "all", "agent NVIDIA_VISIBLE_DEVICES=all")
    r.expect("utility" in ((env.get("NVIDIA_DRIVER_CAPABILITIES") or {}).get("value") or ""),
             "agent NVIDIA_DRIVER_CAPABILITIES includes utility")
    ares = a.get("resources") or {}
    r.expect(all(k in (ares.get("limits") or {}) for k in ("cpu", "memory")), "agent cpu/memory limits", str(ares))
    r.expect(not any("gpu" in k for s in ("requests", "limits") for k in (ares.get(s) or {})), "agent requests no GPU")
    # Diagnostics write the reference product under $TMPDIR for their child
    # process: with a read-only root, /tmp must be a volume.
    avols = {v["name"]: v for v in apod.get("volumes") or []}
    atmp = next((m for m in a.get("volumeMounts") or [] if m.get("mountPath") == "/tmp"), None)
    r.expect(not asc.get("readOnlyRootFilesystem") or
             (atmp is not None and not atmp.get("readOnly") and "emptyDir" in avols.get(atmp["name"], {})),
             "agent /tmp is a writable emptyDir (diagnostics need it)", str(atmp))
    aparsed = check_flag_list(r, "agent args", a.get("args") or [], AGENT_FLAGS)
    coord = flag_values(aparsed, "coordinator")
    svc_hosts = {f"sdcd.{svc['metadata']['namespace']}.svc", f"sdcd.{svc['metadata']['namespace']}.svc.cluster.local",
                 f"sdcd.{svc['metadata']['namespace']}"}
    r.expect(len(coord) == 1 and host_port(coord[0])[0] in svc_hosts and host_port(coord[0])[1] == str(AGENT_PORT),
             f"agent --coordinator is the sdcd Service's agent port {AGENT_PORT}", str(coord))
    check_node_identity(r, by, dep, c, parsed, ds, a, aparsed)

    check_eks_wiring(r, by, dep, c, ds, a, aparsed, svc, actuator)

    # Pod security: seccomp on both pods.
    for d in (dep, ds):
        p = d["spec"]["template"]["spec"]
        r.expect(((p.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "RuntimeDefault",
                 f"{d['kind']}/{d['metadata']['name']} seccompProfile RuntimeDefault")

    check_prometheus_rule(r, alerts_path, get("PrometheusRule", "sdc-guard"))


# --- EKS wiring: relay, probes, NetworkPolicy, PDB, priority, affinity ----------

def node_expr_matches(e, labels):
    k, op, vals = e["key"], e["operator"], e.get("values") or []
    if op == "In":
        return labels.get(k) in vals
    if op == "NotIn":
        return labels.get(k) not in vals
    if op == "Exists":
        return k in labels
    if op == "DoesNotExist":
        return k not in labels
    raise ValueError(f"node selector operator {op} not modelled here")


def node_allowed(pod, labels):
    """Whether a node with these labels passes the pod's nodeSelector and required nodeAffinity."""
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    req = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms")
    if not terms:
        return True
    return any(all(node_expr_matches(e, labels) for e in t.get("matchExpressions") or []) for t in terms)


def peer_admits(peer, pod_ns, ns_labels, pod_labels):
    """Whether one NetworkPolicy `from` entry admits a pod (labels) in namespace pod_ns."""
    if "ipBlock" in peer:
        return False  # pods are matched by selectors here
    nsel, psel = peer.get("namespaceSelector"), peer.get("podSelector")
    if nsel is None and psel is None:
        return False
    ns_ok = (pod_ns == peer.get("_policy_ns")) if nsel is None else (
        nsel == {} or selector_matches(nsel, ns_labels))
    pod_ok = psel is None or psel == {} or selector_matches(psel, pod_labels)
    return ns_ok and pod_ok


def policy_admits(policy, port, pod_ns, pod_labels):
    """Whether NetworkPolicy `policy` lets a pod in pod_ns with pod_labels reach TCP `port`."""
    ns_labels = {"kubernetes.io/metadata.name": pod_ns}
    for rule in policy["spec"].get("ingress") or []:
        ports = [p.get("port") for p in rule.get("ports") or []]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        if not peers:
            return True  # from everywhere
        for peer in peers:
            if peer_admits(dict(peer, _policy_ns=policy["metadata"].get("namespace")), pod_ns, ns_labels, pod_labels):
                return True
    return False


def check_eks_wiring(r, by, dep, c, ds, a, aparsed, svc, actuator):
    get = lambda kind, name: by.get(kind, {}).get(name)
    pod, apod = dep["spec"]["template"]["spec"], ds["spec"]["template"]["spec"]
    sdcd_labels = dep["spec"]["template"]["metadata"].get("labels") or {}
    agent_labels = ds["spec"]["template"]["metadata"].get("labels") or {}
    sdcd_ns, agent_ns = dep["metadata"]["namespace"], ds["metadata"]["namespace"]

    # Pod Security: sdcd's namespace restricted; the agent's admits its hostPath.
    level = lambda ns: ((get("Namespace", ns) or {}).get("metadata", {}).get("labels") or {}).get(
        "pod-security.kubernetes.io/enforce")
    r.expect(level(sdcd_ns) == "restricted", f"namespace {sdcd_ns} (sdcd) enforces Pod Security restricted",
             str(level(sdcd_ns)))
    r.expect(agent_ns != sdcd_ns and level(agent_ns) == "privileged",
             f"the agent has its own namespace {agent_ns}, at Pod Security privileged (hostPath)", str(level(agent_ns)))

    # Relay: --relay_listen on a Unix socket inside the only hostPath, which
    # is mounted at the same path.
    relay = flag_values(aparsed, "relay_listen")
    r.expect(relay == ["unix:" + RELAY_SOCKET], f"agent --relay_listen=unix:{RELAY_SOCKET}", str(relay))
    hostpaths = {v["name"]: v["hostPath"] for v in apod.get("volumes") or [] if "hostPath" in v}
    sock_dir = RELAY_SOCKET.rsplit("/", 1)[0]
    r.expect(list(hostpaths.values()) == [{"path": sock_dir, "type": "DirectoryOrCreate"}],
             f"agent's only hostPath is {sock_dir} (DirectoryOrCreate)", str(hostpaths))
    hmounts = [m for m in a.get("volumeMounts") or [] if m["name"] in hostpaths]
    r.expect([m["mountPath"] for m in hmounts] == [sock_dir] and not any(m.get("readOnly") for m in hmounts),
             f"agent mounts it read-write at {sock_dir}", str(hmounts))
    asc = a.get("securityContext") or {}
    r.expect((asc.get("capabilities") or {}).get("drop") == ["ALL"] and not (asc.get("capabilities") or {}).get("add"),
             "agent drops every capability and adds none", str(asc.get("capabilities")))

    # Agent metrics and probes.
    ml = flag_values(aparsed, "metrics_listen")
    r.expect(ml == [f"0.0.0.0:{AGENT_METRICS_PORT}"], f"agent --metrics_listen=0.0.0.0:{AGENT_METRICS_PORT}", str(ml))
    aports = {p.get("name"): p.get("containerPort") for p in a.get("ports") or []}
    r.expect(aports == {"metrics": AGENT_METRICS_PORT}, f"agent declares exactly port metrics {AGENT_METRICS_PORT}",
             str(aports))
    for probe in ("livenessProbe", "readinessProbe"):
        h = (a.get(probe) or {}).get("httpGet") or {}
        r.expect(h.get("path") == "/healthz" and resolve_port(a, h.get("port")) == AGENT_METRICS_PORT,
                 f"agent {probe}: httpGet /healthz on a declared port = {AGENT_METRICS_PORT}", str(a.get(probe)))
    pm = get("PodMonitor", "sdc-agent")
    r.expect(selector_matches(pm["spec"].get("selector"), agent_labels) and
             pm["metadata"].get("namespace") == agent_ns, "PodMonitor sdc-agent selects the agent pods in their namespace")
    r.expect([e.get("port") for e in pm["spec"].get("podMetricsEndpoints") or []] == ["metrics"],
             "PodMonitor scrapes the agent's port metrics")

    # Priority.
    for who, p, cls, policy in (("sdcd", pod, "sdc-guard-coordinator", None), ("agent", apod, "sdc-guard-agent", "Never")):
        pc = get("PriorityClass", p.get("priorityClassName") or "")
        r.expect(p.get("priorityClassName") == cls and pc is not None,
                 f"{who} priorityClassName {cls}, defined here", str(p.get("priorityClassName")))
        if pc:
            r.expect(0 < pc.get("value", 0) < 1000000000 and not pc.get("globalDefault"),
                     f"PriorityClass {cls}: above workloads, below system classes, not the default", str(pc.get("value")))
            if policy:
                r.expect(pc.get("preemptionPolicy") == policy, f"PriorityClass {cls} preemptionPolicy {policy}",
                         str(pc.get("preemptionPolicy")))

    # PodDisruptionBudget: selects exactly the sdcd pod, allows no voluntary eviction.
    pdb = get("PodDisruptionBudget", "sdcd")
    r.expect(pdb["metadata"].get("namespace") == sdcd_ns and selector_matches(pdb["spec"].get("selector"), sdcd_labels)
             and not selector_matches(pdb["spec"].get("selector"), agent_labels),
             "PodDisruptionBudget sdcd selects the sdcd pod (and not the agents)", str(pdb["spec"].get("selector")))
    r.expect(pdb["spec"].get("maxUnavailable") == 0 or pdb["spec"].get("minAvailable") == 1,
             "PodDisruptionBudget sdcd: maxUnavailable 0 (one replica)", str(pdb["spec"]))

    # Affinity: never on a GPU node, possible on a CPU node.
    r.expect(all(not node_allowed(pod, n) for n in GPU_NODES), "sdcd's node affinity refuses GPU nodes",
             str(pod.get("affinity")))
    r.expect(node_allowed(pod, CPU_NODE), "sdcd's node affinity admits a CPU node", str(pod.get("affinity")))

    # NetworkPolicy for sdcd: ports equal the Service's, admitted peers exact.
    np = get("NetworkPolicy", "sdcd")
    r.expect(np["metadata"].get("namespace") == sdcd_ns and selector_matches(np["spec"].get("podSelector"), sdcd_labels),
             "NetworkPolicy sdcd selects the sdcd pod in its namespace")
    r.expect("Ingress" in (np["spec"].get("policyTypes") or []), "NetworkPolicy sdcd restricts ingress")
    np_ports = sorted(p.get("port") for rule in np["spec"].get("ingress") or [] for p in rule.get("ports") or [])
    svc_ports = sorted(p.get("port") for p in svc["spec"].get("ports") or [])
    r.expect(np_ports == svc_ports, f"NetworkPolicy sdcd ports {np_ports} == Service ports {svc_ports}")
    trainer = {TRAINER_LABEL[0]: TRAINER_LABEL[1]}
    cases = [  # (who, namespace, labels, port, admitted)
        ("a labelled trainer in any namespace", "team-a", trainer, 7400, True),
        ("the agent pods", agent_ns, agent_labels, AGENT_PORT, True),
        ("a labelled trainer on the agent port", "team-a", trainer, AGENT_PORT, False),
        ("an unlabelled pod on the agent port", "team-a", {"app": "web"}, AGENT_PORT, False),
        ("agent-labelled pods outside the agent namespace on the agent port", "team-a", agent_labels, AGENT_PORT,
         False),
        ("Prometheus", PROMETHEUS_NS, {"app.kubernetes.io/name": "prometheus"}, 9464, True),
        ("an unlabelled pod", "team-a", {"app": "web"}, 7400, False),
        ("agent-labelled pods outside the agent namespace", "team-a", agent_labels, 7400, False),
        ("a labelled trainer on the metrics port", "team-a", trainer, 9464, False),
        ("Prometheus on the trainer port", PROMETHEUS_NS, {"app.kubernetes.io/name": "prometheus"}, 7400, False),
    ]
    for who, ns, labels, port, want in cases:
        r.expect(policy_admits(np, port, ns, labels) == want,
                 f"NetworkPolicy sdcd {'admits' if want else 'refuses'} {who} on {port}")
    anp = get("NetworkPolicy", "sdc-agent")
    r.expect(anp["metadata"].get("namespace") == agent_ns and selector_matches(anp["spec"].get("podSelector"), agent_labels),
             "NetworkPolicy sdc-agent selects the agent pods")
    anp_ports = sorted(p.get("port") for rule in anp["spec"].get("ingress") or [] for p in rule.get("ports") or [])
    r.expect(anp_ports == sorted(aports.values()), f"NetworkPolicy sdc-agent ports {anp_ports} == agent ports")
    r.expect(policy_admits(anp, AGENT_METRICS_PORT, PROMETHEUS_NS, {}) and
             not policy_admits(anp, AGENT_METRICS_PORT, "team-a", trainer),
             "NetworkPolicy sdc-agent admits Prometheus only")

    check_mtls(r, by, dep, c, ds, a, aparsed)

    # The hyperpod actuator: cluster named, IRSA role on ServiceAccount sdcd.
    sa = get("ServiceAccount", "sdcd")
    role = ((sa["metadata"].get("annotations") or {}).get("eks.amazonaws.com/role-arn") or "")
    sparsed = parse_flags(c.get("args") or [])
    if actuator == "hyperpod":
        r.expect(re.fullmatch(r"arn:aws:iam::[A-Z0-9_]+:role/[\w+=,.@/-]+", role) is not None,
                 "ServiceAccount sdcd carries the IRSA annotation eks.amazonaws.com/role-arn", role)
        r.expect(len(flag_values(sparsed, "hyperpod_cluster")) == 1 and flag_values(sparsed, "hyperpod_cluster")[0],
                 "--hyperpod_cluster set once", str(flag_values(sparsed, "hyperpod_cluster")))
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        r.expect(bool(env.get("AWS_REGION")), "sdcd AWS_REGION set for the AWS CLI")
    else:
        r.expect(not role and not flag_values(sparsed, "hyperpod_cluster"),
                 "no IRSA role or --hyperpod_cluster without --actuator=hyperpod")


def check_node_identity(r, by, dep, c, sparsed, ds, a, aparsed):
    """Agents prove their node to sdcd: a projected service-account token sdcd verifies, over TLS."""
    pod, apod = dep["spec"]["template"]["spec"], ds["spec"]["template"]["spec"]
    tf = flag_values(aparsed, "token_file")
    avols = {v["name"]: v for v in apod.get("volumes") or []}
    m = next((m for m in a.get("volumeMounts") or [] if tf and tf[0].startswith(m["mountPath"].rstrip("/") + "/")), None)
    sources = ((avols.get(m["name"]) if m else None) or {}).get("projected", {}).get("sources") or []
    sat = next((x["serviceAccountToken"] for x in sources if "serviceAccountToken" in x), {})
    r.expect(len(tf) == 1 and m is not None and m.get("readOnly") is True and
             tf[0] == m["mountPath"].rstrip("/") + "/" + sat.get("path", ""),
             "agent --token_file is the projected service-account token, mounted read-only", f"{tf} {m} {sources}")
    aud = (flag_values(sparsed, "agent_token_audience") or [TOKEN_AUDIENCE])[0]
    r.expect(sat.get("audience") == aud, f"the token's audience is sdcd's --agent_token_audience ({aud})", str(sat))
    r.expect(0 < int(sat.get("expirationSeconds", 3600)) <= 86400, "the token expires within a day", str(sat))
    r.expect(apod.get("automountServiceAccountToken") is False, "the agent gets no API token")
    sa = f"system:serviceaccount:{ds['metadata']['namespace']}:{apod.get('serviceAccountName', 'default')}"
    accounts = [x for v in flag_values(sparsed, "agent_token_service_accounts") for x in v.split(",")] or \
        ["system:serviceaccount:sdc-agent:sdc-agent"]  # sdcd's default (daemon/config.h)
    r.expect(sa in accounts, f"sdcd takes tokens of the agent's service account {sa}", str(accounts))
    keys, issuer = flag_values(sparsed, "agent_token_keys"), flag_values(sparsed, "agent_token_issuer")
    r.expect(len(keys) == 1 and len(issuer) == 1 and issuer[0], "sdcd: --agent_token_keys and --agent_token_issuer",
             f"{keys} {issuer}")
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    km = next((m for m in c.get("volumeMounts") or [] if keys and keys[0].startswith(m["mountPath"].rstrip("/") + "/")), None)
    cm = ((vols.get(km["name"]) if km else None) or {}).get("configMap", {}).get("name")
    r.expect(km is not None and km.get("readOnly") is True and cm in by.get("ConfigMap", {}),
             "--agent_token_keys is a file of a ConfigMap defined here, mounted read-only", f"{keys} {km}")
    env = {e["name"]: e for e in c.get("env") or []}
    for ref in re.findall(r"\$\((\w+)\)", issuer[0] if issuer else ""):
        src = ((env.get(ref) or {}).get("valueFrom") or {}).get("configMapKeyRef") or {}
        r.expect(src.get("name") == cm and src.get("key") in ((by.get("ConfigMap", {}).get(cm) or {}).get("data") or {}),
                 f"--agent_token_issuer's ${ref} comes from ConfigMap {cm}", str(env.get(ref)))
    r.expect(flag_values(aparsed, "tls_ca"), "agents dial sdcd with TLS (their token never crosses in clear)")


def check_mtls(r, by, dep, c, ds, a, aparsed):
    """TLS is on for both ends or neither; files come from cert-manager Secrets of one CA."""
    sparsed = parse_flags(c.get("args") or [])
    s_flags = {f: flag_values(sparsed, f) for f in ("tls_cert", "tls_key", "tls_client_ca")}
    a_flags = {f: flag_values(aparsed, f) for f in ("tls_ca", "tls_cert", "tls_key")}
    s_on, a_on = any(s_flags.values()), any(a_flags.values())
    r.expect(s_on == a_on, "TLS on sdcd's trainer port and on the agents together, or on neither",
             f"sdcd {s_flags}, agent {a_flags}")
    if not (s_on and a_on):
        return
    r.expect(s_flags["tls_cert"] and s_flags["tls_key"], "sdcd: --tls_cert and --tls_key", str(s_flags))
    r.expect(a_flags["tls_ca"] and bool(a_flags["tls_cert"]) == bool(a_flags["tls_key"]),
             "agent: --tls_ca (sdcd's CA), and --tls_cert with --tls_key or neither", str(a_flags))
    s_flags = {f: v for f, v in s_flags.items() if v}
    a_flags = {f: v for f, v in a_flags.items() if v}
    certs = by.get("Certificate", {})

    def secret_files(who, container, pod, flags, ns):
        """The Certificate behind every file the flags name (one Secret, mounted read-only)."""
        r.expect(all(len(v) == 1 for v in flags.values()), f"{who}: each of {sorted(flags)} set once", str(flags))
        vols = {v["name"]: v for v in pod.get("volumes") or []}
        secrets = set()
        for f, vals in flags.items():
            path = vals[0] if vals else ""
            m = next((m for m in container.get("volumeMounts") or [] if path.startswith(m["mountPath"].rstrip("/") + "/")), None)
            sec = ((vols.get(m["name"]) if m else None) or {}).get("secret") or {}
            r.expect(m is not None and m.get("readOnly") is True and sec.get("secretName"),
                     f"{who} --{f} is a file of a read-only Secret volume", f"{path}: {m} {sec}")
            secrets.add(sec.get("secretName"))
        cert = next((x for x in certs.values() if x["spec"].get("secretName") in secrets
                     and x["metadata"].get("namespace") == ns), None)
        r.expect(len(secrets) == 1 and cert is not None, f"{who}: the Secret is a cert-manager Certificate's in {ns}",
                 str(secrets))
        return cert or {"spec": {}}

    scert = secret_files("sdcd", c, dep["spec"]["template"]["spec"], s_flags, dep["metadata"]["namespace"])
    acert = secret_files("agent", a, ds["spec"]["template"]["spec"], a_flags, ds["metadata"]["namespace"])
    for who, cert, usage in (("sdcd", scert, "server auth"), ("agent", acert, "client auth")):
        ref = cert["spec"].get("issuerRef") or {}
        r.expect(ref.get("kind") == "ClusterIssuer" and ref.get("name") == CA_ISSUER and CA_ISSUER in by.get("ClusterIssuer", {}),
                 f"{who} certificate issued by ClusterIssuer {CA_ISSUER}, defined here", str(ref))
        r.expect(usage in (cert["spec"].get("usages") or []), f"{who} certificate usage {usage}",
                 str(cert["spec"].get("usages")))
    host = host_port((flag_values(aparsed, "coordinator") or [""])[0])[0]
    r.expect(host in (scert["spec"].get("dnsNames") or []), f"sdcd's certificate names {host}, the host agents dial",
             str(scert["spec"].get("dnsNames")))
    ca_issuer = by.get("ClusterIssuer", {}).get(CA_ISSUER) or {}
    ca = certs.get(CA_ISSUER) or {"spec": {}, "metadata": {}}
    r.expect((ca_issuer.get("spec") or {}).get("ca", {}).get("secretName") == ca["spec"].get("secretName")
             and ca["spec"].get("isCA") is True and ca["metadata"].get("namespace") == CERT_MANAGER_NS,
             f"ClusterIssuer {CA_ISSUER} signs with the CA Certificate's Secret in {CERT_MANAGER_NS}")


def check_iam(r, policy_path, trust_path, actuator_cc, rendered):
    """The IAM policy allows exactly the SageMaker calls the hyperpod actuator makes."""
    import json
    src = read(actuator_cc)
    calls = set(re.findall(r'"aws",\s*"sagemaker",\s*"([a-z-]+)"', src))
    actions = {"sagemaker:" + "".join(w.capitalize() for w in c.split("-")) for c in calls}
    r.expect(actions, "daemon/actuator.cc calls the SageMaker API through the aws CLI", str(calls))
    try:
        policy = json.loads(read(policy_path))
        trust = json.loads(read(trust_path))
    except ValueError as e:
        r.expect(False, "IAM policy JSON parses", str(e))
        return
    r.expect(policy.get("Version") == "2012-10-17" and trust.get("Version") == "2012-10-17",
             "both IAM documents are Version 2012-10-17")
    allowed, resources = set(), set()
    for st in policy.get("Statement") or []:
        r.expect(st.get("Effect") == "Allow", f"policy statement {st.get('Sid')} is Allow")
        acts = st.get("Action")
        allowed |= set([acts] if isinstance(acts, str) else acts or [])
        res = st.get("Resource")
        resources |= set([res] if isinstance(res, str) else res or [])
    r.expect(allowed == actions, f"policy allows exactly {sorted(actions)}", str(sorted(allowed)))
    r.expect(resources and all(re.fullmatch(r"arn:aws:sagemaker:[A-Za-z0-9_-]+:[A-Z0-9_]+:cluster/[A-Za-z0-9_]+", x)
                               for x in resources), "policy is scoped to one HyperPod cluster ARN", str(resources))
    sa = next((d for d in load(rendered) if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "sdcd"), None)
    want_sub = f"system:serviceaccount:{sa['metadata']['namespace']}:sdcd" if sa else None
    sts = trust.get("Statement") or []
    conds = [v for st in sts for v in ((st.get("Condition") or {}).get("StringEquals") or {}).items()]
    r.expect(len(sts) == 1 and sts[0].get("Action") == "sts:AssumeRoleWithWebIdentity" and
             "oidc-provider/" in (sts[0].get("Principal") or {}).get("Federated", ""),
             "trust policy: AssumeRoleWithWebIdentity from the cluster's OIDC provider")
    r.expect(any(k.endswith(":sub") and v == want_sub for k, v in conds),
             f"trust policy admits only ServiceAccount {want_sub}", str(conds))
    r.expect(any(k.endswith(":aud") and v == "sts.amazonaws.com" for k, v in conds), "trust policy audience sts.amazonaws.com")


def check_relay_example(r, path, rendered, tvars):
    """The relay example's ranks reach the socket the rendered agent listens on."""
    docs = load(path)
    r.expect(len(docs) == 1 and docs[0].get("kind") == "PyTorchJob", "relay example is one PyTorchJob")
    ds = next(d for d in load(rendered) if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "sdc-agent")
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    relay = flag_values(parse_flags(agent.get("args") or []), "relay_listen")
    sock = relay[0][len("unix:"):] if relay and relay[0].startswith("unix:") else None
    agent_vol = next((v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"].get("volumes") or []
                      if "hostPath" in v), None)
    r.expect(sock and agent_vol and sock.startswith(agent_vol + "/"), "the agent's socket lies in its hostPath",
             f"{sock} {agent_vol}")
    job = docs[0]
    specs = job["spec"].get("pytorchReplicaSpecs") or {}
    r.expect({"Master", "Worker"} <= set(specs), "Master and Worker replica specs")
    for rtype, rspec in specs.items():
        pod = rspec["template"]["spec"]
        vols = {v["name"]: v for v in pod.get("volumes") or []}
        trainers = [c for c in pod.get("containers") or [] if c.get("name") == "pytorch"]
        if not r.expect(len(trainers) == 1, f"{rtype}: one container named pytorch"):
            continue
        t = trainers[0]
        env = {e["name"]: e for e in t.get("env") or []}
        for var in env:
            if var.startswith("SDC_"):
                r.expect(var in tvars, f"{rtype}: {var} is a variable the client reads (client/options.h)")
        coord = (env.get("SDC_COORDINATOR") or {}).get("value")
        r.expect(coord == relay[0] if relay else False, f"{rtype}: SDC_COORDINATOR is the agent's --relay_listen",
                 f"{coord} vs {relay}")
        mount = next((m for m in t.get("volumeMounts") or [] if sock and sock.startswith(m["mountPath"].rstrip("/") + "/")), None)
        hp = (vols.get(mount["name"]) or {}).get("hostPath") if mount else None
        r.expect(mount and hp and hp.get("path") == agent_vol and mount["mountPath"] == agent_vol,
                 f"{rtype}: mounts the agent's hostPath {agent_vol} at the same path", f"{mount} {hp}")
        r.expect(mount and mount.get("readOnly") is True, f"{rtype}: the relay mount is read-only")
        nn = ((env.get("SDC_NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        r.expect(nn == "spec.nodeName", f"{rtype}: SDC_NODE_NAME from fieldRef spec.nodeName")
        r.expect(not any((c.get("image") or "").startswith(SDCD_IMAGE) for _, c in all_containers(pod)),
                 f"{rtype}: no sdcd in the job (the cluster coordinator serves it)")


# --- Alert rules --------------------------------------------------------------

def check_prometheus_rule(r, alerts_path, prometheus_rule):
    alerts = load(alerts_path)[0]
    r.expect(prometheus_rule.get("apiVersion") == "monitoring.coreos.com/v1", "PrometheusRule is monitoring.coreos.com/v1")
    r.expect(prometheus_rule["spec"].get("groups") == alerts.get("groups"),
             "PrometheusRule groups == deploy/prometheus/alerts.yml groups",
             "they differ: run deploy/prometheus/sync-prometheusrule.sh")


def check_alert_contract(r, alerts_path, metrics):
    alerts = load(alerts_path)[0]
    rules = {x.get("alert"): x for g in alerts["groups"] for x in g["rules"]}
    for name, (expr, dur) in ALERTS.items():
        x = rules.get(name)
        if not r.expect(x is not None, f"alert {name} defined", "missing in alerts.yml"):
            continue
        norm = lambda s: re.sub(r"\s+", "", s or "")
        r.expect(norm(x.get("expr")) == norm(expr), f"alert {name}: expr {expr}", x.get("expr"))
        r.expect(x.get("for") == dur, f"alert {name}: for {dur or '(none)'}", str(x.get("for")))
        r.expect((x.get("labels") or {}).get("severity") in ("critical", "warning", "info"), f"alert {name}: severity label")
        ann = x.get("annotations") or {}
        r.expect(ann.get("summary") and "sdcctl " in (ann.get("description") or ""),
                 f"alert {name}: summary, and a description naming an sdcctl command")
        r.expect(ann.get("runbook_url") == f"docs/operations.md#{name.lower()}",
                 f"alert {name}: runbook_url docs/operations.md#{name.lower()}", str(ann.get("runbook_url")))
        # Metric names only: labels (by (sdc_job), {kind="..."}) are not metrics.
        expr = re.sub(r"\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}", "", x.get("expr", ""))
        for metric in re.findall(r"\b(sdc_[a-z_]+?)(?:_bucket|_sum|_count)?\b", expr):
            r.expect(metric in metrics, f"alert {name}: metric {metric} is exported by sdcd or a trainer",
                     "not in sdcd's or the trainer's source")
    r.expect(set(rules) == set(ALERTS), "no alerts beyond the contract", str(sorted(set(rules) - set(ALERTS))))


# --- PyTorchJob example -------------------------------------------------------

def check_example(r, path, known, tvars):
    docs = load(path)
    r.expect(len(docs) == 1 and docs[0].get("kind") == "PyTorchJob" and docs[0].get("apiVersion") == "kubeflow.org/v1",
             "example is one kubeflow.org/v1 PyTorchJob")
    job = docs[0]
    name = job["metadata"]["name"]
    specs = job["spec"].get("pytorchReplicaSpecs") or {}
    r.expect({"Master", "Worker"} <= set(specs), "Master and Worker replica specs")
    r.expect(specs.get("Master", {}).get("replicas") == 1, "one Master")
    autos = [s for s in walk_strings(job) if approval_auto(s)]
    r.expect(not autos, "no --approval=auto", str(autos))
    sidecars = []
    job_ids = set()
    for rtype, rspec in specs.items():
        pod = rspec["template"]["spec"]
        vols = {v["name"]: v for v in pod.get("volumes") or []}
        for field, c in all_containers(pod):
            if (c.get("image") or "").startswith(SDCD_IMAGE + ":"):
                sidecars.append((rtype, field, c, vols))
        trainers = [c for c in pod.get("containers") or [] if c.get("name") == "pytorch"]
        if not r.expect(len(trainers) == 1, f"{rtype}: one container named pytorch"):
            continue
        env = {e["name"]: e for e in trainers[0].get("env") or []}
        for var in env:
            if var.startswith("SDC_"):
                r.expect(var in tvars, f"{rtype}: {var} is a variable the client reads (client/options.h)")
        coord = (env.get("SDC_COORDINATOR") or {}).get("value", "")
        host, port = host_port(coord)
        hosts = {"localhost", "127.0.0.1"} if rtype == "Master" else set()
        hosts |= {f"{name}-master-0", f"{name}-master-0.default.svc"}
        r.expect(port == "7400" and host in hosts, f"{rtype}: SDC_COORDINATOR reaches the Master's sdcd on 7400", coord)
        jid = env.get("SDC_JOB_ID") or {}
        fr = ((jid.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        r.expect(jid.get("value") == name or fr in ("metadata.labels['training.kubeflow.org/job-name']",
                                                   "metadata.labels['job-name']"),
                 f"{rtype}: SDC_JOB_ID is the job name", str(jid))
        job_ids.add(jid.get("value") or fr)
        nn = ((env.get("SDC_NODE_NAME") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        r.expect(nn == "spec.nodeName", f"{rtype}: SDC_NODE_NAME from fieldRef spec.nodeName")
    r.expect(len(job_ids) == 1, "every rank has the same SDC_JOB_ID", str(job_ids))
    if not r.expect(len(sidecars) == 1 and sidecars[0][0] == "Master", "exactly one sdcd, in the Master pod"):
        return
    rtype, field, c, vols = sidecars[0]
    r.expect(field == "containers" or c.get("restartPolicy") == "Always",
             "sdcd is a native sidecar (init container with restartPolicy: Always)", f"{field}, {c.get('restartPolicy')}")
    parsed = check_flag_list(r, "sidecar sdcd args", c.get("args") or [], known)
    r.expect(flag_values(parsed, "listen") == ["0.0.0.0:7400"], "sidecar --listen=0.0.0.0:7400")
    r.expect(flag_values(parsed, "approval") in ([], ["require"]), "sidecar --approval unset or require")
    db = flag_values(parsed, "db")
    mount = next((m for m in c.get("volumeMounts") or [] if db and db[0].startswith(m["mountPath"].rstrip("/") + "/")), None)
    vol = vols.get(mount["name"]) if mount else None
    r.expect(vol and ("emptyDir" in vol or "persistentVolumeClaim" in vol),
             f"sidecar --db {db} on an emptyDir or PVC", str(vol))
    r.expect(((c.get("startupProbe") or c.get("readinessProbe") or {}).get("grpc") or {}).get("port") == 7400,
             "sidecar has a gRPC probe on 7400")


# --- systemd units ------------------------------------------------------------

def parse_unit(path):
    sections, cur = {}, None
    for line in read(path).splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            cur = sections.setdefault(line.strip("[]"), {})
            continue
        k, _, v = line.partition("=")
        cur.setdefault(k.strip(), []).append(v.strip())
    return sections


def check_units(r, sdcd_unit, agent_unit, known):
    u = parse_unit(sdcd_unit)
    s = u.get("Service", {})
    one = lambda k: (s.get(k) or [None])[-1]
    for key, value in (("User", "sdc"), ("StateDirectory", "sdc"), ("RuntimeDirectory", "sdc"),
                       ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                       ("Restart", "on-failure")):
        r.expect(one(key) == value, f"sdcd.service {key}={value}", str(one(key)))
    r.expect(one("ProtectHome") in ("yes", "true", "read-only", "tmpfs"), "sdcd.service ProtectHome")
    r.expect(any("/var/lib/sdc" in v.split() for v in s.get("ReadWritePaths", [])), "sdcd.service ReadWritePaths=/var/lib/sdc")
    r.expect(u.get("Install", {}).get("WantedBy") == ["multi-user.target"], "sdcd.service WantedBy=multi-user.target")
    exec_start = (one("ExecStart") or "").split()
    r.expect(exec_start[:1] == ["/usr/local/bin/sdcd"], "sdcd.service runs /usr/local/bin/sdcd", str(exec_start[:1]))
    parsed = check_flag_list(r, "sdcd.service ExecStart", exec_start[1:], known)
    want = {"--db=/var/lib/sdc/sdcd.db", "--admin_token_file=/var/lib/sdc/admin.token", "--listen=0.0.0.0:7400",
            f"--agent_listen=0.0.0.0:{AGENT_PORT}", "--admin_listen=unix:/run/sdc/admin.sock",
            "--metrics_listen=0.0.0.0:9464", "--tls_cert=/etc/sdc-guard/tls/sdcd.crt",
            "--tls_key=/etc/sdc-guard/tls/sdcd.key", "--tls_client_ca=/etc/sdc-guard/tls/ca.crt", "--actuator=slurm"}
    r.expect(set(exec_start[1:]) == want, "sdcd.service ExecStart flags are exactly the Slurm set",
             f"extra {sorted(set(exec_start[1:]) - want)}, missing {sorted(want - set(exec_start[1:]))}")
    r.expect(flag_values(parsed, "approval") in ([], ["require"]), "sdcd.service keeps --approval=require")
    r.expect("adminlevel=operator" in read(sdcd_unit), "sdcd.service documents the Slurm operator requirement")
    r.expect(any("PATH=" in v and "/opt/slurm/bin" in v for v in s.get("Environment", [])),
             "sdcd.service PATH reaches HyperPod's scontrol (/opt/slurm/bin)")

    a = parse_unit(agent_unit).get("Service", {})
    aone = lambda k: (a.get(k) or [None])[-1]
    r.expect(aone("Restart") == "always", "sdc-agent.service Restart=always")
    r.expect("-/etc/default/sdc-agent" in a.get("EnvironmentFile", []), "sdc-agent.service EnvironmentFile=-/etc/default/sdc-agent")
    aexec = (aone("ExecStart") or "").split()
    r.expect(aexec[:1] == ["/usr/local/bin/sdc-agent"], "sdc-agent.service runs /usr/local/bin/sdc-agent")
    aflags = [x for x in aexec[1:] if x != "$SDC_AGENT_FLAGS"]
    aparsed = check_flag_list(r, "sdc-agent.service ExecStart", aflags, AGENT_FLAGS)
    r.expect(flag_values(aparsed, "coordinator") == ["${SDC_COORDINATOR}"], "sdc-agent --coordinator=${SDC_COORDINATOR}")
    r.expect(flag_values(aparsed, "tls_ca") == ["/etc/sdc-guard/tls/ca.crt"] and
             flag_values(aparsed, "tls_cert") == ["/etc/sdc-guard/tls/node.crt"] and
             flag_values(aparsed, "tls_key") == ["/etc/sdc-guard/tls/node.key"],
             "sdc-agent proves its node with the node certificate over TLS (the CA of sdcd's --tls_client_ca)",
             str(aflags))
    r.expect(flag_values(parsed, "tls_client_ca") == flag_values(aparsed, "tls_ca"),
             "sdcd verifies agents' certificates with the CA agents trust")
    r.expect(aone("RuntimeDirectory") == "sdc-agent", "sdc-agent.service RuntimeDirectory=sdc-agent (the relay socket's)")
    r.expect(not any(approval_auto(x) for x in read(sdcd_unit).splitlines() + read(agent_unit).splitlines()),
             "no --approval=auto in the units")


# --- Mutations: every check above must be able to fail ------------------------

def mutations():
    def find(docs, kind, name):
        return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)

    def dep_container(docs):
        return find(docs, "Deployment", "sdcd")["spec"]["template"]["spec"]["containers"][0]

    def agent_pod(docs):
        return find(docs, "DaemonSet", "sdc-agent")["spec"]["template"]["spec"]

    def m(f):
        def apply(docs):
            f(docs)
            return docs
        return apply

    return {
        "ClusterRole verb delete": m(lambda d: find(d, "ClusterRole", "sdc-guard-coordinator")["rules"][0]["verbs"].append("delete")),
        "ClusterRole resource pods": m(lambda d: find(d, "ClusterRole", "sdc-guard-coordinator")["rules"][0]["resources"].append("pods")),
        "extra ClusterRole rule on secrets": m(lambda d: find(d, "ClusterRole", "sdc-guard-coordinator")["rules"].append(
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})),
        "agent bound to the ClusterRole": m(lambda d: find(d, "ClusterRoleBinding", "sdc-guard-coordinator")["subjects"].append(
            {"kind": "ServiceAccount", "name": "sdc-agent", "namespace": NS})),
        "operator Role may exec": m(lambda d: find(d, "Role", "sdc-guard-operator")["rules"].append(
            {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]})),
        "operator Role reads secrets": m(lambda d: find(d, "Role", "sdc-guard-operator")["rules"][1]["resources"].append("secrets")),
        "replicas 2": m(lambda d: find(d, "Deployment", "sdcd")["spec"].update(replicas=2)),
        "strategy RollingUpdate": m(lambda d: find(d, "Deployment", "sdcd")["spec"].update(strategy={"type": "RollingUpdate"})),
        "--approval=auto": m(lambda d: dep_container(d)["args"].append("--approval=auto")),
        "unknown sdcd flag": m(lambda d: dep_container(d)["args"].append("--actuater=eks")),
        "second --actuator": m(lambda d: dep_container(d)["args"].append("--actuator=command")),
        "foreign image": m(lambda d: dep_container(d).update(image="busybox:latest")),
        "agent image on the coordinator": m(lambda d: dep_container(d).update(image=f"{AGENT_IMAGE}:{DEFAULT_TAG}")),
        "liveness probe not gRPC": m(lambda d: dep_container(d).update(livenessProbe={"tcpSocket": {"port": 7400}})),
        "readiness probe on 9464": m(lambda d: dep_container(d).update(readinessProbe={"grpc": {"port": 9464}})),
        "port grpc renamed": m(lambda d: dep_container(d)["ports"][0].update(name="rpc")),
        "state not on the PVC": m(lambda d: dep_container(d)["volumeMounts"][0].update(mountPath="/data")),
        "writable root filesystem": m(lambda d: dep_container(d)["securityContext"].update(readOnlyRootFilesystem=False)),
        "PVC storage 1Gi": m(lambda d: find(d, "PersistentVolumeClaim", "sdcd-state")["spec"]["resources"]["requests"].update(storage="1Gi")),
        "ServiceMonitor port http": m(lambda d: find(d, "ServiceMonitor", "sdcd")["spec"]["endpoints"][0].update(port="http")),
        "ServiceMonitor selects nothing": m(lambda d: find(d, "ServiceMonitor", "sdcd")["spec"]["selector"]["matchLabels"].update(
            {"app.kubernetes.io/name": "other"})),
        "Service metrics port 9465": m(lambda d: find(d, "Service", "sdcd")["spec"]["ports"][2].update(port=9465)),
        "Service without the agent port": m(lambda d: find(d, "Service", "sdcd")["spec"]["ports"].pop(1)),
        "agent without health-status toleration": m(lambda d: agent_pod(d).update(tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists"}])),
        "agent privileged": m(lambda d: agent_pod(d)["containers"][0]["securityContext"].update(privileged=True)),
        "agent hostPID": m(lambda d: agent_pod(d).update(hostPID=True)),
        "agent /tmp on the read-only root": m(lambda d: agent_pod(d)["containers"][0].pop("volumeMounts")),
        "agent NODE_NAME literal": m(lambda d: agent_pod(d)["containers"][0]["env"][0].update(value="x", valueFrom=None)),
        "agent coordinator elsewhere": m(lambda d: agent_pod(d)["containers"][0]["args"].__setitem__(0, "--coordinator=sdcd:7400")),
        "agent on the trainer port": m(lambda d: agent_pod(d)["containers"][0]["args"].__setitem__(
            0, "--coordinator=sdcd.sdc-system.svc:7400")),
        "sdcd without an agent port": m(lambda d: dep_container(d)["args"].remove("--agent_listen=0.0.0.0:7402")),
        "sdcd in insecure dev mode": m(lambda d: dep_container(d)["args"].append("--insecure_dev_mode")),
        "agent without its token": m(lambda d: agent_pod(d)["containers"][0]["args"].remove(
            "--token_file=/var/run/secrets/sdc-guard/token")),
        "agent token for the API server": m(lambda d: next(v for v in agent_pod(d)["volumes"] if "projected" in v)
                                            ["projected"]["sources"][0]["serviceAccountToken"].update(audience="https://kubernetes.default.svc")),
        "agent automounts its API token": m(lambda d: agent_pod(d).update(automountServiceAccountToken=True)),
        "sdcd trusts another service account": m(lambda d: dep_container(d)["args"].append(
            "--agent_token_service_accounts=system:serviceaccount:default:default")),
        "sdcd without the token keys": m(lambda d: [dep_container(d)["args"].remove(x) for x in list(dep_container(d)["args"])
                                                   if x.startswith("--agent_token_")]),
        "PrometheusRule drifted": m(lambda d: find(d, "PrometheusRule", "sdc-guard")["spec"]["groups"][0]["rules"][0].update(
            expr="sdc_replacement_requests > 1")),
        "wrong namespace": m(lambda d: find(d, "Service", "sdcd")["metadata"].update(namespace="default")),
        "agent in sdc-system": m(lambda d: find(d, "DaemonSet", "sdc-agent")["metadata"].update(namespace=NS)),
        "sdc-system not restricted": m(lambda d: find(d, "Namespace", NS)["metadata"]["labels"].update(
            {"pod-security.kubernetes.io/enforce": "privileged"})),
        "relay socket elsewhere": m(lambda d: agent_pod(d)["containers"][0]["args"].__setitem__(
            2, "--relay_listen=unix:/var/run/sdc.sock")),
        "relay on TCP": m(lambda d: agent_pod(d)["containers"][0]["args"].__setitem__(2, "--relay_listen=127.0.0.1:7401")),
        "agent mounts the container runtime socket": m(lambda d: agent_pod(d)["volumes"].append(
            {"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}})),
        "agent adds CAP_SYS_ADMIN": m(lambda d: agent_pod(d)["containers"][0]["securityContext"]["capabilities"].update(
            add=["SYS_ADMIN"])),
        "agent metrics on 9466": m(lambda d: agent_pod(d)["containers"][0]["args"].__setitem__(3, "--metrics_listen=0.0.0.0:9466")),
        "agent liveness on an undeclared port": m(lambda d: agent_pod(d)["containers"][0]["livenessProbe"]["httpGet"].update(
            port="health")),
        "agent readiness path /": m(lambda d: agent_pod(d)["containers"][0]["readinessProbe"]["httpGet"].update(path="/")),
        "agent without priorityClassName": m(lambda d: agent_pod(d).pop("priorityClassName")),
        "agent PriorityClass preempts": m(lambda d: find(d, "PriorityClass", "sdc-guard-agent").update(
            preemptionPolicy="PreemptLowerPriority")),
        "sdcd PriorityClass missing": m(lambda d: d.remove(find(d, "PriorityClass", "sdc-guard-coordinator"))),
        "PDB selects the agents": m(lambda d: find(d, "PodDisruptionBudget", "sdcd")["spec"].update(
            selector={"matchLabels": {"app.kubernetes.io/part-of": "sdc-guard"}})),
        "PDB allows one eviction": m(lambda d: find(d, "PodDisruptionBudget", "sdcd")["spec"].update(maxUnavailable=1)),
        "sdcd without affinity": m(lambda d: find(d, "Deployment", "sdcd")["spec"]["template"]["spec"].pop("affinity")),
        "sdcd affinity misses p5": m(lambda d: find(d, "Deployment", "sdcd")["spec"]["template"]["spec"]["affinity"]
                                      ["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                                      [0]["matchExpressions"][1]["values"].remove("ml.p5.48xlarge")),
        "NetworkPolicy port 7401": m(lambda d: find(d, "NetworkPolicy", "sdcd")["spec"]["ingress"][0]["ports"][0].update(port=7401)),
        "NetworkPolicy admits every pod": m(lambda d: find(d, "NetworkPolicy", "sdcd")["spec"]["ingress"][0].update(
            **{"from": [{"namespaceSelector": {}}]})),
        "NetworkPolicy agent port from anywhere": m(lambda d: find(d, "NetworkPolicy", "sdcd")["spec"]["ingress"][1].pop("from")),
        "NetworkPolicy agent port for trainers": m(lambda d: find(d, "NetworkPolicy", "sdcd")["spec"]["ingress"][1]["from"].append(
            find(d, "NetworkPolicy", "sdcd")["spec"]["ingress"][0]["from"][0])),
        "NetworkPolicy metrics from anywhere": m(lambda d: find(d, "NetworkPolicy", "sdcd")["spec"]["ingress"][2].pop("from")),
        "PodMonitor on port http": m(lambda d: find(d, "PodMonitor", "sdc-agent")["spec"]["podMetricsEndpoints"][0].update(
            port="http")),
        "IRSA role without the hyperpod actuator": m(lambda d: find(d, "ServiceAccount", "sdcd")["metadata"].update(
            annotations={"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"})),
    }


def mtls_mutations():
    def find(docs, kind, name):
        return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)

    def args(docs, kind, name):
        return find(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]["args"]

    def m(f):
        def apply(docs):
            f(docs)
            return docs
        return apply

    return {
        "sdcd TLS, agents plain": m(lambda d: [args(d, "DaemonSet", "sdc-agent").remove(x) for x in list(
            args(d, "DaemonSet", "sdc-agent")) if x.startswith("--tls_")]),
        "sdcd gRPC probe under TLS": m(lambda d: find(d, "Deployment", "sdcd")["spec"]["template"]["spec"]["containers"][0].update(
            livenessProbe={"grpc": {"port": 7400}})),
        "sdcd key outside the Secret": m(lambda d: args(d, "Deployment", "sdcd").append("--tls_key=/tmp/key.pem")),
        "server certificate for another name": m(lambda d: find(d, "Certificate", "sdcd-tls")["spec"].update(
            dnsNames=["sdcd.default.svc"])),
        "agent certificate from another issuer": m(lambda d: find(d, "Certificate", "sdc-agent-tls")["spec"]["issuerRef"].update(
            name="sdc-guard-selfsigned")),
        "agent Secret renamed": m(lambda d: next(v for v in find(d, "DaemonSet", "sdc-agent")["spec"]["template"]["spec"]["volumes"]
                                                 if v["name"] == "tls")["secret"].update(secretName="other")),
    }


def main():
    mode = sys.argv[1]
    if mode == "rendered":
        label, rendered, kustomization, actuator, sdcd_main, alerts, base = sys.argv[2:9]
        r = Report(label)
        check_rendered(r, load(rendered), kustomization, actuator, sdcd_flags(sdcd_main), alerts, base == "base")
        return r.finish()
    if mode == "selftest":
        rendered, kustomization, sdcd_main, alerts = sys.argv[2:6]
        which = sys.argv[6] if len(sys.argv) > 6 else "base"
        docs, known, bad = load(rendered), sdcd_flags(sdcd_main), 0
        clean = Report("selftest-clean", quiet=True)
        check_rendered(clean, copy.deepcopy(docs), kustomization, "dry-run", known, alerts, True)
        if clean.errors:
            print("  FAIL [selftest] the unmutated render fails: " + "; ".join(clean.errors))
            return 1
        for name, mutate in (mutations() if which == "base" else mtls_mutations()).items():
            r = Report("mutant", quiet=True)
            try:
                check_rendered(r, mutate(copy.deepcopy(docs)), kustomization, "dry-run", known, alerts, True)
            except Exception as e:  # a crash is a rejection too, but say so
                r.errors.append(f"checker raised {type(e).__name__}: {e}")
            if r.errors:
                print(f"  ok   [selftest] mutation '{name}' rejected: {r.errors[0]}")
            else:
                print(f"  FAIL [selftest] mutation '{name}' was NOT rejected")
                bad += 1
        return 1 if bad else 0
    if mode == "alerts":
        alerts, sdcd_main, service_cc, trainer_metrics_cc = sys.argv[2:6]
        metrics = set(re.findall(r'\.Name\("(sdc_[a-z_]+)"\)', read(sdcd_main) + read(service_cc) +
                                 read(trainer_metrics_cc)))
        # The trainer's counters are named through a helper (CounterOf).
        metrics |= set(re.findall(r'"(sdc_trainer_[a-z_]+)"', read(trainer_metrics_cc)))
        r = Report("alerts")
        check_alert_contract(r, alerts, metrics)
        return r.finish()
    if mode == "example":
        path, sdcd_main, options_h = sys.argv[2:5]
        r = Report("example")
        check_example(r, path, sdcd_flags(sdcd_main), trainer_vars(options_h))
        return r.finish()
    if mode == "units":
        sdcd_unit, agent_unit, sdcd_main = sys.argv[2:5]
        r = Report("units")
        check_units(r, sdcd_unit, agent_unit, sdcd_flags(sdcd_main))
        return r.finish()
    if mode == "vars":
        options_h, names = sys.argv[2], sys.argv[3:]
        known, missing = trainer_vars(options_h), [n for n in names if n not in trainer_vars(sys.argv[2])]
        for n in names:
            print(f"  {'ok  ' if n in known else 'FAIL'} [vars] {n} is read by the client (client/options.h)")
        return 1 if missing else 0
    if mode == "iam":
        policy, trust, actuator_cc, rendered = sys.argv[2:6]
        r = Report("iam")
        check_iam(r, policy, trust, actuator_cc, rendered)
        return r.finish()
    if mode == "relay-example":
        path, rendered, options_h = sys.argv[2:5]
        r = Report("relay-example")
        check_relay_example(r, path, rendered, trainer_vars(options_h))
        return r.finish()
    if mode == "approval-scan":
        bad = 0
        for path in sys.argv[2:]:
            for i, line in enumerate(read(path).splitlines(), 1):
                if approval_auto(line):
                    print(f"  FAIL [scan] {path}:{i}: approval set to auto: {line.strip()}")
                    bad += 1
        if not bad:
            print(f"  ok   [scan] no file under deploy/ sets approval to auto ({len(sys.argv) - 2} files)")
        return 1 if bad else 0
    raise SystemExit(f"unknown mode {mode}")


sys.exit(main())
PY
check() { "$PY" "$work/check.py" "$@"; }

# ---------------------------------------------------------------------------
section "kustomize renders"
eks="$deploy/eks"
kustomizations=("base")
for d in "$eks"/overlays/*/; do
  kustomizations+=("overlays/$(basename "$d")")
done
for k in "${kustomizations[@]}"; do
  out="$work/render-${k//\//-}.yaml"
  if ! kubectl kustomize "$eks/$k" >"$out" 2>"$work/kustomize.err"; then
    bad "kubectl kustomize deploy/eks/$k: $(cat "$work/kustomize.err")"
    continue
  fi
  ok "kubectl kustomize deploy/eks/$k ($(grep -c '^kind:' "$out") objects)"
  actuator=dry-run
  [[ "$k" == overlays/hyperpod ]] && actuator=eks
  [[ "$k" == overlays/hyperpod-api ]] && actuator=hyperpod
  kind=overlay
  [[ "$k" == base ]] && kind=base
  check rendered "$k" "$out" "$eks/$k/kustomization.yaml" "$actuator" "$sdcd_main" \
    "$deploy/prometheus/alerts.yml" "$kind" || bad "deploy/eks/$k: see FAIL lines above"
done
for o in hyperpod hyperpod-api dry-run mtls; do
  [[ -f "$work/render-overlays-$o.yaml" ]] || bad "overlay $o must exist and render"
done

section "IAM for the hyperpod actuator"
check iam "$eks/iam/sdcd-hyperpod-policy.json" "$eks/iam/sdcd-trust-policy.json" "$actuator_cc" \
  "$work/render-overlays-hyperpod-api.yaml" || bad "deploy/eks/iam"

section "Prometheus rules"
if promtool check rules "$deploy/prometheus/alerts.yml" >"$work/promtool.out" 2>&1; then
  ok "promtool check rules deploy/prometheus/alerts.yml: $(grep -o '[0-9]* rules found' "$work/promtool.out")"
else
  bad "promtool check rules: $(cat "$work/promtool.out")"
fi
if (cd "$deploy/prometheus" && promtool test rules alerts_test.yml) >"$work/promtool-test.out" 2>&1; then
  ok "promtool test rules deploy/prometheus/alerts_test.yml (every alert fires, and only when it should)"
else
  bad "promtool test rules: $(cat "$work/promtool-test.out")"
fi
check alerts "$deploy/prometheus/alerts.yml" "$sdcd_main" "$service_cc" "$trainer_metrics_cc" ||
  bad "alert contract"
if "$deploy/prometheus/sync-prometheusrule.sh" --check >"$work/sync.out" 2>&1; then
  ok "deploy/eks/base/prometheusrule.yaml is what sync-prometheusrule.sh generates"
else
  bad "PrometheusRule is stale: $(cat "$work/sync.out")"
fi

section "PyTorchJob examples"
check example "$eks/examples/pytorchjob-sidecar.yaml" "$sdcd_main" "$options_h" ||
  bad "deploy/eks/examples/pytorchjob-sidecar.yaml"
check relay-example "$eks/examples/pytorchjob-relay.yaml" "$work/render-base.yaml" "$options_h" ||
  bad "deploy/eks/examples/pytorchjob-relay.yaml"
if grep -rq 'pytorchjob-' "$eks"/base/kustomization.yaml "$eks"/overlays/*/kustomization.yaml; then
  bad "the examples must not be part of a kustomization"
else
  ok "the examples are in no kustomization"
fi

section "approval"
mapfile -t deploy_files < <(find "$deploy" -type f | sort)
check approval-scan "${deploy_files[@]}" || bad "approval set to auto somewhere under deploy/"

section "systemd units"
check units "$deploy/slurm/sdcd.service" "$deploy/slurm/sdc-agent.service" "$sdcd_main" || bad "systemd units"
if ! command -v systemd-analyze >/dev/null; then
  skip "systemd-analyze verify: systemd-analyze is not installed here (units checked by the parser above only)"
else
  # The units run /usr/local/bin binaries that this machine lacks: verify
  # copies whose ExecStart points at stub executables.
  mkdir -p "$work/units/bin"
  for b in sdcd sdc-agent; do
    printf '#!/bin/sh\nexit 0\n' >"$work/units/bin/$b"
    chmod +x "$work/units/bin/$b"
  done
  for u in sdcd.service sdc-agent.service; do
    sed "s#/usr/local/bin/#$work/units/bin/#g" "$deploy/slurm/$u" >"$work/units/$u"
  done
  # A known-good unit first: if even that does not verify, systemd-analyze
  # does not work in this environment and the result would mean nothing.
  printf '[Unit]\nDescription=probe\n[Service]\nExecStart=%s\n' "$work/units/bin/sdcd" >"$work/units/probe.service"
  if ! (cd "$work/units" && systemd-analyze verify --man=no ./probe.service) >"$work/sa-probe.out" 2>&1 ||
    [[ -s "$work/sa-probe.out" ]]; then
    skip "systemd-analyze verify: it fails on a trivial unit here ($(head -n 3 "$work/sa-probe.out" | tr '\n' ' '))"
  else
    for u in sdcd.service sdc-agent.service; do
      # verify exits 0 on unknown keys and unparsable values and only
      # prints them: any output is a failure.
      if (cd "$work/units" && systemd-analyze verify --man=no "./$u") >"$work/sa.out" 2>&1 && [[ ! -s "$work/sa.out" ]]; then
        ok "systemd-analyze verify $u (ExecStart pointed at a stub): no warnings"
      else
        bad "systemd-analyze verify $u: $(cat "$work/sa.out")"
      fi
    done
  fi
fi

section "Slurm installer"
inst="$deploy/slurm/lifecycle/install_sdc_guard.sh"
# The real release bundle (//release:bundle): a dist/ as ./sdc release makes
# it, the tarball beside the unpacked directory.
bundle_tgz="$src/release/sdc-guard-linux-x86_64.tar.gz"
version="$(tr -d '[:space:]' <"$src/VERSION")"
dist="$work/dist"
mkdir -p "$dist" "$work/hp"
cp "$bundle_tgz" "$dist/sdc-guard-$version-linux-x86_64.tar.gz"
tar -C "$dist" -xzf "$bundle_tgz"
torch_lib=/fsx/venv/lib/python3.11/site-packages/torch/lib
# installed ROOT PROGRAM: /usr/local/bin/PROGRAM links to current/bin/PROGRAM,
# current to VERSION, and the bundle's sdcd/sdcctl run from there.
installed() {
  local r="$work/roots/$1" p="$2"
  [[ "$(readlink "$r/usr/local/bin/$p")" == "/opt/sdc-guard/current/bin/$p" &&
    "$(readlink "$r/opt/sdc-guard/current")" == "$version" &&
    -x "$r/opt/sdc-guard/$version/bin/$p" && -x "$r/opt/sdc-guard/$version/libexec/$p" &&
    -f "$r/opt/sdc-guard/$version/lib/ld-linux-x86-64.so.2" ]] || return 1
  if [[ "$p" != sdc-agent ]]; then
    [[ "$("$r/opt/sdc-guard/current/bin/$p" --version)" == "$p $version" ]] || return 1
  fi
}
cat >"$work/hp/resource_config.json" <<'JSON'
{"ClusterConfig": {"ClusterName": "test"},
 "InstanceGroups": [
  {"Name": "controller-machine", "Instances": [{"InstanceName": "controller-machine-1", "CustomerIpAddress": "10.1.0.10"}]},
  {"Name": "my-login-group", "Instances": [{"InstanceName": "my-login-group-1", "CustomerIpAddress": "10.1.0.20"}]},
  {"Name": "compute-nodes", "Instances": [{"CustomerIpAddress": "10.1.0.30"}, {"CustomerIpAddress": "10.1.0.31"}]}]}
JSON
printf '{"controller_group": "controller-machine", "login_group": "my-login-group"}\n' >"$work/hp/provisioning_parameters.json"
# install ROOT TOOL IP [ARGS...]: the installer under --root with a fake HyperPod config.
install_as() {
  local root="$1" tool="$2" ip="$3"
  shift 3
  SDC_GUARD_JSON_TOOL="$tool" SAGEMAKER_RESOURCE_CONFIG_PATH="$work/hp/resource_config.json" \
    SDC_PROVISIONING_PARAMETERS="$work/hp/provisioning_parameters.json" SDC_COORDINATOR="" \
    bash "$inst" --root "$work/roots/$root" --self-ip "$ip" --torch-lib "$torch_lib" "$@" >"$work/roots/$root.log" 2>&1
}
mkdir -p "$work/roots"
for tool in python3 jq; do
  if ! command -v "$tool" >/dev/null; then
    skip "installer role detection with $tool: $tool is not installed"
    continue
  fi
  if install_as "ctl-$tool" "$tool" "10.1.0.10 172.17.0.1" "$dist" &&
    installed "ctl-$tool" sdcd && installed "ctl-$tool" sdcctl &&
    [[ -f "$work/roots/ctl-$tool/etc/systemd/system/sdcd.service" && ! -e "$work/roots/ctl-$tool/usr/local/bin/sdc-agent" ]] &&
    grep -q 'would run: systemctl enable --now sdcd.service' "$work/roots/ctl-$tool.log"; then
    ok "installer ($tool): controller detected from resource_config.json; bundle in /opt/sdc-guard/$version, sdcd and sdcctl linked and running --version, sdcd.service enabled"
  else
    bad "installer ($tool) controller: $(cat "$work/roots/ctl-$tool.log")"
  fi
  if SDC_GUARD_DIST="$dist" install_as "cmp-$tool" "$tool" "10.1.0.31" &&
    installed "cmp-$tool" sdc-agent &&
    [[ -f "$work/roots/cmp-$tool/etc/systemd/system/sdc-agent.service" && ! -e "$work/roots/cmp-$tool/usr/local/bin/sdcd" ]] &&
    grep -qx "SDC_TORCH_LIB=$torch_lib" "$work/roots/cmp-$tool/etc/default/sdc-agent" &&
    grep -qx 'SDC_COORDINATOR=10.1.0.10:7402' "$work/roots/cmp-$tool/etc/default/sdc-agent" &&
    grep -qx 'SDC_TRAINER_COORDINATOR=10.1.0.10:7400' "$work/roots/cmp-$tool/etc/default/sdc-agent" &&
    grep -q 'would run: systemctl enable --now sdc-agent.service' "$work/roots/cmp-$tool.log"; then
    ok "installer ($tool): compute detected (SDC_GUARD_DIST); agent linked from the bundle, SDC_COORDINATOR=controller:7402 (agents), SDC_TRAINER_COORDINATOR=controller:7400, SDC_TORCH_LIB, enabled"
  else
    bad "installer ($tool) compute: $(cat "$work/roots/cmp-$tool.log")"
  fi
  if install_as "login-$tool" "$tool" "10.1.0.20" "$dist" &&
    installed "login-$tool" sdcctl && [[ ! -e "$work/roots/login-$tool/etc/systemd/system/sdcd.service" &&
      ! -e "$work/roots/login-$tool/etc/systemd/system/sdc-agent.service" ]]; then
    ok "installer ($tool): login node gets sdcctl only"
  else
    bad "installer ($tool) login: $(cat "$work/roots/login-$tool.log")"
  fi
done
if install_as explicit python3 "192.0.2.1" --role compute --coordinator head:7400 --no-start --dist "$dist" &&
  grep -qx 'SDC_COORDINATOR=head:7402' "$work/roots/explicit/etc/default/sdc-agent" &&
  grep -qx 'SDC_TRAINER_COORDINATOR=head:7400' "$work/roots/explicit/etc/default/sdc-agent" &&
  ! grep -q 'enable --now' "$work/roots/explicit.log"; then
  ok "installer: --role compute --coordinator --no-start"
else
  bad "installer explicit role: $(cat "$work/roots/explicit.log")"
fi
if install_as relay python3 "192.0.2.1" --role compute --coordinator head:7400 --relay-uids 1001,1002 --no-start \
  --dist "$dist" &&
  grep -qx 'SDC_RELAY_LISTEN=unix:/run/sdc-agent/relay.sock' "$work/roots/relay/etc/default/sdc-agent" &&
  grep -q '^SDC_AGENT_FLAGS="--relay_allowed_uids=1001,1002' "$work/roots/relay/etc/default/sdc-agent" &&
  grep -qx 'SDC_RELAY_LISTEN=' "$work/roots/explicit/etc/default/sdc-agent"; then
  ok "installer: --relay-uids writes SDC_RELAY_LISTEN=unix:/run/sdc-agent/relay.sock and --relay_allowed_uids (empty without it)"
else
  bad "installer --relay-uids: $(cat "$work/roots/relay.log")"
fi
if install_as badrelay python3 "192.0.2.1" --role compute --coordinator head:7400 --relay-uids alice --dist "$dist"; then
  bad "installer must refuse --relay-uids alice"
else
  ok "installer refuses --relay-uids that are not uids"
fi
# Node identities: --pki makes the cluster's CA once (controller), sdcd's
# certificate for its names, and each compute node's certificate naming the
# node; both chain to the CA, keys not world-readable.
mkdir -p "$work/pki"
chmod 0700 "$work/pki"
if install_as pki-ctl python3 "10.1.0.10" --pki "$work/pki" --no-start "$dist" &&
  install_as pki-cmp python3 "10.1.0.31" --pki "$work/pki" --no-start "$dist" &&
  openssl verify -CAfile "$work/pki/ca.crt" "$work/roots/pki-ctl/etc/sdc-guard/tls/sdcd.crt" \
    "$work/roots/pki-cmp/etc/sdc-guard/tls/node.crt" >/dev/null &&
  openssl x509 -in "$work/roots/pki-ctl/etc/sdc-guard/tls/sdcd.crt" -noout -ext subjectAltName | grep -q 'IP Address:10.1.0.10' &&
  openssl x509 -in "$work/roots/pki-cmp/etc/sdc-guard/tls/node.crt" -noout -ext subjectAltName |
  grep -qx "    DNS:$(hostname)" &&
  cmp -s "$work/pki/ca.crt" "$work/roots/pki-cmp/etc/sdc-guard/tls/ca.crt" &&
  [[ "$(stat -c %a "$work/roots/pki-cmp/etc/sdc-guard/tls/node.key")" == 640 &&
    "$(stat -c %a "$work/roots/pki-ctl/etc/sdc-guard/tls/sdcd.key")" == 640 ]]; then
  ok "installer --pki: one CA; sdcd's certificate names the controller's address, a compute node's its Slurm name (DNS:$(hostname)); keys 0640"
else
  bad "installer --pki: $(cat "$work/roots/pki-ctl.log" "$work/roots/pki-cmp.log")"
fi
rm -rf "$work/nopki" && mkdir -p "$work/nopki"
if install_as nopki python3 "10.1.0.31" --pki "$work/nopki" --no-start "$dist"; then
  bad "installer must refuse a compute node when --pki holds no CA"
elif grep -q "no CA in" "$work/roots/nopki.log"; then
  ok "installer refuses a compute node when --pki holds no CA (the controller makes it)"
else
  bad "installer --pki without a CA: $(cat "$work/roots/nopki.log")"
fi
if install_as slurmuser python3 "10.1.0.10" --sdcd-user slurm "$dist" &&
  grep -qx 'User=slurm' "$work/roots/slurmuser/etc/systemd/system/sdcd.service.d/user.conf"; then
  ok "installer: --sdcd-user slurm writes the sdcd.service drop-in"
else
  bad "installer --sdcd-user: $(cat "$work/roots/slurmuser.log")"
fi
# The tarball alone, then a second version beside the first: current moves,
# the old version stays for a rollback.
if install_as tarball python3 "10.1.0.10" --no-start "$dist/sdc-guard-$version-linux-x86_64.tar.gz" &&
  installed tarball sdcd; then
  ok "installer: installs from the bundle tarball itself"
else
  bad "installer from the tarball: $(cat "$work/roots/tarball.log")"
fi
mkdir -p "$work/next"
cp -a "$dist/sdc-guard-$version-linux-x86_64" "$work/next/sdc-guard-9.9.9-linux-x86_64"
echo 9.9.9 >"$work/next/sdc-guard-9.9.9-linux-x86_64/share/sdc-guard/VERSION"
if install_as tarball python3 "10.1.0.10" --no-start "$work/next" &&
  [[ "$(readlink "$work/roots/tarball/opt/sdc-guard/current")" == 9.9.9 &&
    -x "$work/roots/tarball/opt/sdc-guard/$version/bin/sdcd" &&
    "$(readlink "$work/roots/tarball/usr/local/bin/sdcd")" == /opt/sdc-guard/current/bin/sdcd ]]; then
  ok "installer: an upgrade moves current to the new version and keeps the old one"
else
  bad "installer upgrade: $(cat "$work/roots/tarball.log")"
fi
mkdir -p "$work/bare/bin"
printf '#!/bin/sh\nexit 0\n' >"$work/bare/bin/sdcd"
chmod +x "$work/bare/bin/sdcd"
if install_as bare python3 "10.1.0.10" "$work/bare"; then
  bad "installer must refuse a directory of bare binaries"
elif grep -q "is not a release bundle" "$work/roots/bare.log"; then
  ok "installer refuses bare binaries"
else
  bad "installer on bare binaries: $(cat "$work/roots/bare.log")"
fi
if SDC_GUARD_JSON_TOOL=python3 SAGEMAKER_RESOURCE_CONFIG_PATH=/nonexistent SDC_TORCH_LIB="" \
  bash "$inst" --root "$work/roots/notorch" --role compute --coordinator head:7400 "$dist" >"$work/roots/notorch.log" 2>&1; then
  bad "installer must refuse a compute node without --torch-lib"
elif grep -q "torch-lib" "$work/roots/notorch.log"; then
  ok "installer refuses a compute node without --torch-lib"
else
  bad "installer without --torch-lib: $(cat "$work/roots/notorch.log")"
fi
if install_as unknown python3 "192.0.2.1" "$dist"; then
  bad "installer must refuse a node missing from resource_config.json without --role"
else
  ok "installer refuses a node missing from resource_config.json without --role: $(tail -n 1 "$work/roots/unknown.log")"
fi
if install_as badrole python3 "10.1.0.30" --role gpu "$dist"; then
  bad "installer must refuse --role gpu"
else
  ok "installer refuses an unknown --role"
fi

section "trainer-env.sh"
tenv="$deploy/slurm/trainer-env.sh"
# shellcheck disable=SC2016 # expanded by the inner bash
got="$(env -i PATH="$PATH" SLURM_JOB_ID=4242 SLURMD_NODENAME=ip-10-1-0-31 SDC_COORDINATOR=10.1.0.10:7400 \
  bash -c 'set -euo pipefail; source "$1"; printf "%s|%s|%s|%s|%s" "$SDC_COORDINATOR" "$SDC_JOB_ID" "$SDC_NODE_NAME" "$SDC_AUDIT_EVERY" "$SDC_WEIGHT_CHECK_EVERY"' _ "$tenv" 2>&1)" || true
if [[ "$got" == "10.1.0.10:7400|4242|ip-10-1-0-31|100|10" ]]; then
  ok "sourcing trainer-env.sh (set -u) exports SDC_COORDINATOR, SDC_JOB_ID=\$SLURM_JOB_ID, SDC_NODE_NAME, defaults"
else
  bad "trainer-env.sh exports: got '$got'"
fi
# shellcheck disable=SC2016 # expanded by the inner bash
got="$(env -i PATH="$PATH" SLURM_JOB_ID=7 SDC_COORDINATOR=h:7400 bash -c 'source "$1"; printf "%s" "$SDC_NODE_NAME"' _ "$tenv" 2>&1)" || true
if [[ "$got" == "$(hostname)" ]]; then
  ok "trainer-env.sh: SDC_NODE_NAME falls back to \$(hostname) outside a step"
else
  bad "trainer-env.sh SDC_NODE_NAME fallback: got '$got'"
fi
# With a relaying agent on the node, trainers dial it; without, sdcd's
# trainer port (the agent's own address is sdcd's agent port).
printf 'SDC_COORDINATOR=head:7402\nSDC_TRAINER_COORDINATOR=head:7400\nSDC_RELAY_LISTEN=unix:/run/sdc-agent/relay.sock\n' \
  >"$work/agent-relay.env"
printf 'SDC_COORDINATOR=head:7402\nSDC_TRAINER_COORDINATOR=head:7400\nSDC_RELAY_LISTEN=\n' >"$work/agent-direct.env"
for pair in "agent-relay.env|unix:/run/sdc-agent/relay.sock" "agent-direct.env|head:7400"; do
  # shellcheck disable=SC2016 # expanded by the inner bash
  got="$(env -i PATH="$PATH" SLURM_JOB_ID=7 SDC_AGENT_DEFAULTS="$work/${pair%%|*}" \
    bash -c 'set -euo pipefail; source "$1"; printf "%s" "$SDC_COORDINATOR"' _ "$tenv" 2>&1)" || true
  if [[ "$got" == "${pair#*|}" ]]; then
    ok "trainer-env.sh: SDC_COORDINATOR=${pair#*|} from ${pair%%|*}"
  else
    bad "trainer-env.sh with ${pair%%|*}: got '$got'"
  fi
done
# Dialing sdcd, a rank presents the node's certificate (when its user can
# read the key); through the relay, none.
mkdir -p "$work/tls"
touch "$work/tls/ca.crt" "$work/tls/node.crt" "$work/tls/node.key"
# shellcheck disable=SC2016 # expanded by the inner bash
got="$(env -i PATH="$PATH" SLURM_JOB_ID=7 SDC_AGENT_DEFAULTS="$work/agent-direct.env" SDC_TLS_DIR="$work/tls" \
  bash -c 'set -euo pipefail; source "$1"; printf "%s|%s|%s" "$SDC_TLS_CA" "$SDC_TLS_CERT" "$SDC_TLS_KEY"' _ "$tenv" 2>&1)" || true
if [[ "$got" == "$work/tls/ca.crt|$work/tls/node.crt|$work/tls/node.key" ]]; then
  ok "trainer-env.sh: dialing sdcd, SDC_TLS_CA/CERT/KEY are the node's certificate"
else
  bad "trainer-env.sh TLS: got '$got'"
fi
# shellcheck disable=SC2016 # expanded by the inner bash
got="$(env -i PATH="$PATH" SLURM_JOB_ID=7 SDC_AGENT_DEFAULTS="$work/agent-relay.env" SDC_TLS_DIR="$work/tls" \
  bash -c 'source "$1"; printf "%s" "${SDC_TLS_CERT:-none}"' _ "$tenv" 2>&1)" || true
if [[ "$got" == none ]]; then
  ok "trainer-env.sh: through the relay socket, no certificate"
else
  bad "trainer-env.sh relay TLS: got '$got'"
fi
mapfile -t exported < <(sed -n 's/^ *export \([A-Z_]*\)=.*/\1/p' "$tenv")
check vars "$options_h" "${exported[@]}" || bad "trainer-env.sh exports a variable the client does not read"

section "shellcheck"
mapfile -t scripts < <(find "$deploy" -name '*.sh' -type f | sort)
for f in "${scripts[@]}" "$self"; do
  name="${f#"$work"/}"
  [[ "$f" == "$self" ]] && name="tests/deploy_test.sh"
  if shellcheck -x "$f" >"$work/sc.out" 2>&1; then
    ok "shellcheck $name"
  else
    bad "shellcheck $name: $(cat "$work/sc.out")"
  fi
done

section "the checks can fail"
check selftest "$work/render-base.yaml" "$eks/base/kustomization.yaml" "$sdcd_main" \
  "$deploy/prometheus/alerts.yml" || bad "mutation self-test (see FAIL lines above)"
check selftest "$work/render-overlays-mtls.yaml" "$eks/overlays/mtls/kustomization.yaml" "$sdcd_main" \
  "$deploy/prometheus/alerts.yml" mtls || bad "mutation self-test of the mtls overlay (see FAIL lines above)"
# End to end through kustomize: a "delete" verb in the ClusterRole source.
cp -R "$deploy" "$work/mutant"
sed -i 's/verbs: \["get", "list", "patch"\]/verbs: ["get", "list", "patch", "delete"]/' "$work/mutant/eks/base/coordinator-rbac.yaml"
if ! grep -q '"delete"' "$work/mutant/eks/base/coordinator-rbac.yaml"; then
  bad "could not plant a delete verb in coordinator-rbac.yaml (its verbs line changed?)"
elif kubectl kustomize "$work/mutant/eks/base" >"$work/mutant.yaml" 2>/dev/null &&
  ! check rendered mutant "$work/mutant.yaml" "$work/mutant/eks/base/kustomization.yaml" dry-run "$sdcd_main" \
    "$work/mutant/prometheus/alerts.yml" base >"$work/mutant.out"; then
  ok "a ClusterRole with verb delete, rendered by kustomize, is rejected: $(grep -m1 FAIL "$work/mutant.out" | sed 's/^ *//')"
else
  bad "a ClusterRole with verb delete was not rejected"
fi
# The IAM policy: a wildcard action must be rejected.
sed 's/"sagemaker:BatchReplaceClusterNodes"/"sagemaker:*"/' "$eks/iam/sdcd-hyperpod-policy.json" >"$work/mutant-policy.json"
if ! grep -q 'sagemaker:\*' "$work/mutant-policy.json"; then
  bad "could not plant a wildcard action in sdcd-hyperpod-policy.json"
elif ! check iam "$work/mutant-policy.json" "$eks/iam/sdcd-trust-policy.json" "$actuator_cc" \
  "$work/render-overlays-hyperpod-api.yaml" >"$work/mutant-iam.out"; then
  ok "an IAM policy allowing sagemaker:* is rejected: $(grep -m1 FAIL "$work/mutant-iam.out" | sed 's/^ *//')"
else
  bad "an IAM policy allowing sagemaker:* was not rejected"
fi
# The relay example: a trainer dialing another socket must be rejected.
sed 's#unix:/run/sdc-guard/relay.sock#unix:/tmp/relay.sock#' "$eks/examples/pytorchjob-relay.yaml" >"$work/mutant-relay.yaml"
if ! check relay-example "$work/mutant-relay.yaml" "$work/render-base.yaml" "$options_h" >"$work/mutant-relay.out"; then
  ok "a relay example dialing another socket is rejected: $(grep -m1 FAIL "$work/mutant-relay.out" | sed 's/^ *//')"
else
  bad "a relay example dialing another socket was not rejected"
fi

section "summary"
if ((failures > 0)); then
  echo "FAIL: $failures check group(s) failed; see the FAIL lines above" >&2
  exit 1
fi
echo "PASS: deploy/ checked (${#kustomizations[@]} kustomizations, alerts, example, units, installer, scripts)"
