#!/usr/bin/env python3
"""Checks deploy/grafana/sdc-guard.json against what sdc-guard really exports.

  check_dashboard.py DEPLOY_DIR DOCS_MD TRAINER_METRICS_CC WORK_DIR EXPOSITION...

EXPOSITION files are real scrapes of sdcd's and sdc-agent's /metrics; the
metric families they declare (# TYPE lines, present even without samples),
with the trainer's families read from TRAINER_METRICS_CC (at least 8, or
the check fails), are the only names a panel may query. Every panel expression, with
Grafana's variables replaced, must parse (promtool check rules on a
throwaway rules file), and so must the ```promql blocks of DOCS_MD.
deploy/eks/components/grafana-dashboard must render a ConfigMap holding
the same JSON, labelled for Grafana's sidecar. Prints one line per finding and exits
1 on any.
"""
import json
import os
import re
import shutil
import subprocess
import sys

REQUIRED_PANELS = [
    "Incidents by GPU and node",
    "Replacement requests by state",
    "Verdict latency by check",
    "Agents connected",
    "Guard overhead per job",
]
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1d", "$__interval": "1m", "$job": ".*"}

failures = []


def expect(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def metric_names(expr):
    """sdc_ metric names an expression selects (not label names or strings)."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1 ()", expr)
    return set(re.findall(r"\b(sdc_[a-z0-9_]+)", expr))


def exported_names(paths):
    names = set()
    for path in paths:
        with open(path) as f:
            for line in f:
                m = re.match(r"# TYPE (\S+) (\S+)", line)
                if not m:
                    continue
                name, kind = m.groups()
                names.add(name)
                if kind == "histogram":
                    names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


def promtool_parses(exprs, work, label):
    rules = os.path.join(work, label + "-rules.yml")
    with open(rules, "w") as f:
        f.write("groups:\n  - name: check\n    rules:\n")
        for i, e in enumerate(exprs):
            f.write(f"      - record: check:expr_{i}\n        expr: {json.dumps(e)}\n")
    r = subprocess.run(["promtool", "check", "rules", rules], capture_output=True, text=True)
    return expect(r.returncode == 0 and f"{len(exprs)} rules found" in r.stdout,
                  f"{label}: promtool parses all {len(exprs)} expressions"
                  + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr).strip()))


def main():
    deploy_src, docs_path, trainer_cc, work = sys.argv[1:5]
    scrapes = sys.argv[5:]
    # A real copy: runfiles are symlinks, which Kustomize's load restrictor
    # would follow out of the kustomization's root.
    deploy = os.path.join(work, "deploy")
    shutil.copytree(deploy_src, deploy, symlinks=False)
    dashboard_path = os.path.join(deploy, "grafana", "sdc-guard.json")
    grafana_dir = os.path.join(deploy, "eks", "components", "grafana-dashboard")
    with open(dashboard_path) as f:
        text = f.read()
    dash = json.loads(text)
    exported = exported_names(scrapes)
    with open(trainer_cc) as f:
        source = f.read()
    trainer = set(re.findall(r'"(sdc_trainer_[a-z0-9_]+)"', source))
    trainer_histograms = set(re.findall(r'BuildHistogram\(\)\s*\.Name\("(sdc_trainer_[a-z0-9_]+)"\)', source))
    expect(len(trainer) >= 8 and trainer_histograms,
           f"trainer families from the source: {sorted(trainer)}")
    exported |= trainer
    for h in trainer_histograms:
        exported |= {h + "_bucket", h + "_sum", h + "_count"}
    # At least sdcd's and the agent's families, or the name check below
    # would pass on nothing.
    if not expect(any(n.startswith("sdc_agent_") for n in exported) and
                  "sdc_verdict_latency_seconds_bucket" in exported and len(exported) > 30,
                  f"scrapes declare sdcd's and sdc-agent's families ({len(exported)} names)"):
        return

    expect(isinstance(dash.get("schemaVersion"), int) and dash["schemaVersion"] >= 36,
           f"schemaVersion >= 36: {dash.get('schemaVersion')}")
    expect(dash.get("uid") == "sdc-guard" and dash.get("title"), "uid sdc-guard and a title")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    expect(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
           "a Prometheus datasource variable named datasource")
    job = variables.get("job", {})
    expect(job.get("type") == "query" and "label_values(" in json.dumps(job.get("query")) and
           job.get("includeAll"), "a job query variable with All")

    titles = [p.get("title") for p in dash.get("panels", [])]
    for t in REQUIRED_PANELS:
        expect(t in titles, f"panel '{t}'")
    expect(len(set(titles)) == len(titles), "panel titles are unique")
    expect(len({p.get("id") for p in dash["panels"]}) == len(dash["panels"]), "panel ids are unique")

    exprs = []
    for p in dash["panels"]:
        title = p.get("title")
        expect(p.get("datasource", {}).get("uid") == "${datasource}",
               f"panel '{title}': datasource is the variable")
        targets = p.get("targets") or []
        expect(len(targets) > 0, f"panel '{title}': has targets")
        for t in targets:
            expect(t.get("datasource", {}).get("uid") == "${datasource}",
                   f"panel '{title}' target {t.get('refId')}: datasource is the variable")
            expr = t.get("expr", "")
            names = metric_names(expr)
            expect(len(names) > 0, f"panel '{title}': '{expr}' queries an sdc_ metric")
            for n in sorted(names):
                expect(n in exported, f"panel '{title}': {n} is exported")
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            expect("$" not in expr, f"panel '{title}': no unknown variable left in '{expr}'")
            exprs.append(expr)
    promtool_parses(exprs, work, "dashboard")

    with open(docs_path) as f:
        docs = f.read()
    doc_queries = re.findall(r"```promql\n(.*?)```", docs, re.S)
    if expect(len(doc_queries) >= 2, f"{len(doc_queries)} promql blocks in docs/operations.md"):
        promtool_parses([q.strip() for q in doc_queries], work, "docs")
        for q in doc_queries:
            for n in sorted(metric_names(q)):
                expect(n in exported, f"docs query: {n} is exported")

    # The Component renders the same JSON into a sidecar ConfigMap.
    root = os.path.join(work, "kustomize")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "kustomization.yaml"), "w") as f:
        f.write("resources: []\ncomponents:\n  - " + os.path.relpath(grafana_dir, root) + "\n")
    r = subprocess.run(["kubectl", "kustomize", root], capture_output=True, text=True)
    if expect(r.returncode == 0, "kubectl kustomize renders the dashboard Component"
              + ("" if r.returncode == 0 else ": " + r.stderr.strip())):
        import yaml
        docs_out = list(yaml.safe_load_all(r.stdout))
        cms = [d for d in docs_out if d and d.get("kind") == "ConfigMap"]
        if expect(len(cms) == 1, "one ConfigMap"):
            cm = cms[0]
            expect(cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1",
                   "ConfigMap labelled grafana_dashboard: \"1\"")
            expect(cm.get("data", {}).get("sdc-guard.json") == text,
                   "ConfigMap data sdc-guard.json is deploy/grafana/sdc-guard.json")


if __name__ == "__main__":
    main()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
