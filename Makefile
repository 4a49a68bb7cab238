# PDPair developer entry points. `make demo` and `make test` set up .venv on first use.
PY := .venv/bin/python

.PHONY: setup demo test lint
setup:
	@scripts/setup

demo: setup
	.venv/bin/pdpair-agent demo

test: setup
	.ci/run
