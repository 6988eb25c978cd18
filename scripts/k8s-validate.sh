#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/kubernetes/*.yaml) offline
# against the Kubernetes API schemas, with the pinned PyPI package
# kubernetes-validate (its schemas are in the package; no cluster needed).
# Installed once into a virtualenv under $OUTBOXD_STATE_DIR (.outboxd/).
#   scripts/k8s-validate.sh [FILE...]
#   scripts/k8s-validate.sh --pod ARGS…   runs scripts/k8s-pod.py (a Pod of a
#                                          Deployment, run as the kubelet would)
#                                          with the same virtualenv's PyYAML
set -euo pipefail
cd "$(dirname "$0")/.."
state=${OUTBOXD_STATE_DIR:-$PWD/.outboxd}
venv="$state/k8s-validate"
version=1.37.0
kube=1.31.0
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$version" >&2
fi
if [ "${1:-}" = --pod ]; then
  shift
  exec "$venv/bin/python" scripts/k8s-pod.py "$@"
fi
if [ $# -eq 0 ]; then
  # Every manifest but kustomize's own file (not an API object).
  set -- $(ls deploy/kubernetes/*.yaml | grep -v /kustomization.yaml)
fi
exec "$venv/bin/kubernetes-validate" --strict --kubernetes-version "$kube" "$@"
