#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/kubernetes/*.yaml) offline
# against the Kubernetes API schemas, with the pinned PyPI package
# kubernetes-validate (its schemas are in the package; no cluster needed).
# Installed once into a virtualenv under $OUTBOXD_STATE_DIR (.outboxd/).
#   scripts/k8s-validate.sh [FILE...]
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
if [ $# -eq 0 ]; then
  set -- deploy/kubernetes/*.yaml
fi
exec "$venv/bin/kubernetes-validate" --strict --kubernetes-version "$kube" "$@"
