# PDPair developer entry points. `make demo` and `make test` set up .venv on first use.
PY := .venv/bin/python

.PHONY: setup demo test faults lint
setup:
	@scripts/setup

demo: setup
	.venv/bin/pdpair-agent demo

test:
	scripts/test

# The fault matrix alone, written to docs/faults.md (its tests also run in `make test`).
faults:
	scripts/faults

# Local Kubernetes control plane (devcluster; docs/devcluster.md).
.PHONY: k8s-binaries cluster-up cluster-down
k8s-binaries:
	hack/build-k8s.sh

# Builds what is missing, starts a cluster (or reuses the running one); last line: KUBECONFIG=<path>
cluster-up: k8s-binaries
	@$(PY) -m devcluster up

cluster-down:
	@$(PY) -m devcluster down
