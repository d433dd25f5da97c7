#!/usr/bin/env bash
# Makes the test-only Python venv that deploy_manifests uses for kubernetes-validate (PyPI; its
# wheel ships the Kubernetes API's JSON schemas, so validating needs no network). Idempotent: an
# existing venv with the pinned version is kept. Never used by the product.
#
#   deploy/make-test-venv.sh DIR      then: COHORT_KUBERNETES_VALIDATE=DIR/bin/kubernetes-validate
#
# Needs python3-venv (Debian) and pip's access to PyPI the first time.
set -euo pipefail
version=1.37.0
dir="${1:?usage: make-test-venv.sh DIR}"
case "$dir" in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
if [ -x "$dir/bin/kubernetes-validate" ] && "$dir/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$version"; then
  exit 0
fi
rm -rf "$dir"
/usr/bin/python3 -m venv "$dir"
"$dir/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$version"
"$dir/bin/kubernetes-validate" --version
