#!/usr/bin/env bash
# tests/images_test.sh: the container image definitions (deploy/images/*.Dockerfile)
# against the manifests that run them (deploy/eks/**) and the release bundle.
#
#   bazel test //tests:images_test
#
# No container engine runs here, so the images are not built; what can be
# checked without one is:
#  - every image sdc-guard/sdcd or sdc-guard/sdc-agent named in deploy/eks/**
#    (manifests, the example, kustomize `images:` newTag) carries the tag
#    VERSION, and the kustomization's app.kubernetes.io/version is VERSION;
#  - the Dockerfiles EXPOSE exactly the contract's ports (sdcd 7400, 7402 and 9464,
#    sdc-agent 9465), every containerPort of a container running the image is
#    EXPOSEd, and every Service port targets a container port of sdcd;
#  - the program each manifest runs (command[0]) exists at that path in the
#    image: the bundle tarball is unpacked where the Dockerfile ADDs it, the
#    Dockerfile's `ln -s` lines are replayed, and the path must resolve to an
#    executable file of the bundle;
#  - USER in each Dockerfile is the runAsUser (and runAsGroup) of the pods.
# Then it mutates a copy and checks that each kind of mismatch is caught.
set -euo pipefail

src="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:-sdc_guard}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/images_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp -RL "$src/deploy" "$work/deploy"
version=$(tr -d '[:space:]' <"$src/VERSION")
tarball="$src/release/sdc-guard-linux-x86_64.tar.gz"
[[ -f "$tarball" ]] || { echo "FAIL: no bundle at $tarball" >&2; exit 1; }

cat >"$work/check.py" <<'PY'
"""Checks deploy/images against deploy/eks; prints one line per check."""
import glob
import os
import re
import shlex
import sys
import tarfile

import yaml

deploy, version, tarball, scratch = sys.argv[1:5]
IMAGES = {"sdc-guard/sdcd": "sdcd.Dockerfile", "sdc-guard/sdc-agent": "sdc-agent.Dockerfile"}
CONTRACT_PORTS = {"sdc-guard/sdcd": {7400, 7402, 9464}, "sdc-guard/sdc-agent": {9465}}
failures = []


def bad(msg):
    failures.append(msg)
    print("  FAIL " + msg)


def ok(msg):
    print("  ok   " + msg)


def parse_dockerfile(path):
    """The last stage's ARG defaults, ADD/COPY, ln -s pairs, USER, EXPOSE."""
    text = open(path).read().replace("\\\n", " ")
    stages, cur = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            cur = {"args": {}, "adds": [], "links": [], "user": None, "expose": set(), "entrypoint": None}
            stages.append(cur)
            continue
        if cur is None:
            continue
        sub = lambda s: re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: cur["args"].get(m.group(1) or m.group(2), m.group(0)), s)
        if word == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            cur["args"][k.strip()] = v.strip()
        elif word == "ADD":
            parts = [p for p in shlex.split(sub(rest)) if not p.startswith("--")]
            cur["adds"].append((parts[0], parts[-1]))
        elif word == "RUN":
            for m in re.finditer(r"ln -s (\S+) (\S+)", sub(rest)):
                cur["links"].append((m.group(1), m.group(2)))
        elif word == "USER":
            cur["user"] = rest.strip()
        elif word == "EXPOSE":
            cur["expose"] |= {int(p.split("/")[0]) for p in rest.split()}
        elif word == "ENTRYPOINT":
            cur["entrypoint"] = yaml.safe_load(rest)[0]
    return stages[-1]


def image_root(name, df):
    """A directory laid out as the image's bundle paths would be."""
    root = os.path.join(scratch, name.replace("/", "_"))
    os.makedirs(root, exist_ok=True)
    bundle_name = "sdc-guard-%s-linux-x86_64.tar.gz" % version
    added = [dst for srcf, dst in df["adds"] if srcf == bundle_name]
    if not added:
        bad("%s: does not ADD %s (the bundle of VERSION %s)" % (IMAGES[name], bundle_name, version))
        return root
    with tarfile.open(tarball) as t:
        t.extractall(os.path.join(root, added[0].lstrip("/")))
    for target, link in df["links"]:
        path = os.path.join(root, link.lstrip("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(os.path.join(root, target.lstrip("/")), path)
    return root


def split_image(ref):
    name, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "")
    for base in IMAGES:
        if name == base or name.endswith("/" + base):
            return base, tag
    return None, tag


dockerfiles = {n: parse_dockerfile(os.path.join(deploy, "images", f)) for n, f in IMAGES.items()}
roots = {n: image_root(n, df) for n, df in dockerfiles.items()}

for name, df in dockerfiles.items():
    if df["expose"] == CONTRACT_PORTS[name]:
        ok("%s EXPOSEs %s" % (IMAGES[name], sorted(df["expose"])))
    else:
        bad("%s EXPOSEs %s, the contract says %s" % (IMAGES[name], sorted(df["expose"]), sorted(CONTRACT_PORTS[name])))

docs = []
for path in sorted(glob.glob(os.path.join(deploy, "eks", "**", "*.yaml"), recursive=True)):
    for doc in yaml.safe_load_all(open(path)):
        if isinstance(doc, dict):
            docs.append((os.path.relpath(path, deploy), doc))

seen = {n: 0 for n in IMAGES}
sdcd_ports = {}
for path, doc in docs:
    if doc.get("kind") == "Kustomization":
        for im in doc.get("images", []) or []:
            base, _ = split_image(im.get("name", ""))
            if base and "newTag" in im and str(im["newTag"]) != version:
                bad("%s: images newTag %s for %s, VERSION is %s" % (path, im["newTag"], base, version))
        for lab in doc.get("labels", []) or []:
            v = (lab.get("pairs") or {}).get("app.kubernetes.io/version")
            if v is not None and str(v) != version:
                bad("%s: app.kubernetes.io/version %s, VERSION is %s" % (path, v, version))
            elif v is not None:
                ok("%s: app.kubernetes.io/version %s" % (path, v))
        continue
    # Every pod template, however deep (Deployment, DaemonSet, PyTorchJob).
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        stack.extend(node.values())
        pod = node.get("spec") if isinstance(node.get("spec"), dict) else None
        if not pod or "containers" not in pod:
            continue
        pod_sc = pod.get("securityContext") or {}
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            base, tag = split_image(c.get("image", ""))
            if not base:
                continue
            seen[base] += 1
            where = "%s: container %s" % (path, c.get("name"))
            df = dockerfiles[base]
            if tag != version:
                bad("%s: image %s has tag '%s', VERSION is %s" % (where, c["image"], tag, version))
            ports = {p["containerPort"] for p in c.get("ports", []) or []}
            if not ports <= df["expose"]:
                bad("%s: containerPorts %s not all EXPOSEd by %s (%s)" % (where, sorted(ports), IMAGES[base], sorted(df["expose"])))
            if base == "sdc-guard/sdcd":
                for p in c.get("ports", []) or []:
                    sdcd_ports[p.get("name")] = p["containerPort"]
            program = (c.get("command") or [df["entrypoint"]])[0]
            full = os.path.join(roots[base], program.lstrip("/"))
            if not (os.path.isfile(full) and os.access(full, os.X_OK)):
                bad("%s: runs %s, which the image %s does not hold" % (where, program, IMAGES[base]))
            sc = c.get("securityContext") or {}
            uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
            gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
            want = df["user"] or ""
            want_uid, _, want_gid = want.partition(":")
            if uid is None or str(uid) != want_uid:
                bad("%s: runAsUser %s, but %s has USER %s" % (where, uid, IMAGES[base], want))
            if gid is not None and want_gid and str(gid) != want_gid:
                bad("%s: runAsGroup %s, but %s has USER %s" % (where, gid, IMAGES[base], want))
            if tag == version:
                ok("%s: %s, ports %s, runs %s as %s" % (where, c["image"], sorted(ports), program, uid))

for base, n in seen.items():
    if n == 0:
        bad("no manifest runs %s" % base)

for path, doc in docs:
    if doc.get("kind") == "Service" and (doc.get("spec", {}).get("selector") or {}).get("app.kubernetes.io/name") == "sdcd":
        for p in doc["spec"].get("ports", []):
            target = p.get("targetPort", p.get("port"))
            port = sdcd_ports.get(target) if isinstance(target, str) else target
            if port not in sdcd_ports.values() or port not in dockerfiles["sdc-guard/sdcd"]["expose"]:
                bad("%s: Service port %s targets %s, not an EXPOSEd container port of sdcd" % (path, p.get("name"), target))
            else:
                ok("%s: Service port %s -> %s" % (path, p.get("name"), port))

sys.exit(1 if failures else 0)
PY

check() { python3 "$work/check.py" "$1" "$version" "$tarball" "$(mktemp -d "$work/scratch.XXXXXX")"; }

echo "== the images against the manifests (VERSION $version)"
check "$work/deploy" || { echo "FAIL: deploy/images and deploy/eks disagree" >&2; exit 1; }

echo "== the checks can fail"
mutate() {  # NAME FILE SED-EXPRESSION
  local name=$1 file=$2 expr=$3
  rm -rf "$work/mut"
  cp -R "$work/deploy" "$work/mut"
  sed -i "$expr" "$work/mut/$file"
  if cmp -s "$work/deploy/$file" "$work/mut/$file"; then
    echo "FAIL: mutation '$name' changed nothing in $file" >&2
    exit 1
  fi
  if check "$work/mut" >"$work/mut.log" 2>&1; then
    echo "FAIL: mutation '$name' was not caught" >&2
    exit 1
  fi
  echo "  ok   caught: $name ($(grep -m1 FAIL "$work/mut.log" | sed 's/^ *FAIL //'))"
}
mutate "old image tag" eks/base/coordinator-deployment.yaml "s#sdc-guard/sdcd:$version#sdc-guard/sdcd:0.0.9#"
mutate "old overlay newTag" eks/overlays/hyperpod/kustomization.yaml "0,/newTag: $version/s//newTag: 0.0.9/"
mutate "old version label" eks/base/kustomization.yaml "s#app.kubernetes.io/version: $version#app.kubernetes.io/version: 0.0.9#"
mutate "port not exposed" images/sdcd.Dockerfile "s#^EXPOSE 7400 7402 9464#EXPOSE 7400 9464#"
mutate "program not in image" images/sdcd.Dockerfile "s#ln -s /opt/sdc-guard/bin/sdcd /usr/local/bin/sdcd#ln -s /opt/sdc-guard/bin/sdcd /usr/bin/sdcd#"
mutate "agent program not in image" images/sdc-agent.Dockerfile "s#/usr/local/bin/sdc-agent \\\\#/usr/bin/sdc-agent \\\\#"
mutate "uid mismatch" images/sdc-agent.Dockerfile "s#^USER 0:0#USER 1000:1000#"
mutate "Service targets a missing port" eks/base/coordinator-service.yaml "s#targetPort: metrics#targetPort: 9999#"
echo "PASS: deploy/images agrees with deploy/eks and the bundle"
