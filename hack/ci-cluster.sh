#!/usr/bin/env bash
# CI hook (called by scripts/test / .ci/run before pytest): build whatever Kubernetes
# binaries are missing from the version-keyed cache (hack/build-k8s.sh), so the
# `cluster` pytest fixture can start a local control plane. A warm cache makes this
# take about a second; a cold one about the time docs/devcluster.md gives.
# Skipped when the tests use an existing cluster (PDPAIR_TEST_KUBECONFIG, or
# PDPAIR_USE_EXISTING_CLUSTER=1 with KUBECONFIG).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${PDPAIR_TEST_KUBECONFIG:-}" || "${PDPAIR_USE_EXISTING_CLUSTER:-}" == "1" ]]; then
  echo "== k8s binaries: skipped (tests use an existing cluster)"
  exit 0
fi
echo "== k8s binaries (hack/build-k8s.sh)"
hack/build-k8s.sh
