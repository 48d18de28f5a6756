#!/usr/bin/env bash
# Regenerates deploy/eks/base/prometheusrule.yaml from deploy/prometheus/alerts.yml
# (the one source of truth for sdc-guard's alerting rules). Run it after every
# edit of alerts.yml; tests/deploy_test.sh fails while the two differ.
#
#   deploy/prometheus/sync-prometheusrule.sh          # rewrite the file
#   deploy/prometheus/sync-prometheusrule.sh --check  # exit 1 if it is stale
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${here}/alerts.yml"
dst="${here}/../eks/base/prometheusrule.yaml"

render() {
  /usr/bin/python3 - "$src" <<'PY'
import sys
import yaml

with open(sys.argv[1]) as f:
    rules = yaml.safe_load(f)
doc = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {
        "name": "sdc-guard",
        "labels": {
            "app.kubernetes.io/name": "sdcd",
            "app.kubernetes.io/component": "coordinator",
        },
    },
    "spec": {"groups": rules["groups"]},
}
sys.stdout.write(
    "# GENERATED from deploy/prometheus/alerts.yml by\n"
    "# deploy/prometheus/sync-prometheusrule.sh: do not edit by hand.\n")
yaml.safe_dump(doc, sys.stdout, sort_keys=False, width=100, default_flow_style=False)
PY
}

case "${1:-}" in
  --check)
    if ! diff -u "$dst" <(render); then
      echo "$dst is stale: run $0" >&2
      exit 1
    fi
    echo "$dst matches $src"
    ;;
  "")
    render >"$dst.tmp"
    mv "$dst.tmp" "$dst"
    echo "wrote $dst"
    ;;
  *)
    echo "usage: $0 [--check]" >&2
    exit 2
    ;;
esac
