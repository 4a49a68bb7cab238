"""The test and measurement harness: what starts agents and synthetic engines as processes on loopback
(``agent_processes``, ``sidecar_pair``), the demo (``loopback_demo``), the benchmarks (``bench``) and the
one bounded poll (``waiting.wait_for``) that the tests share.

The runtime packages (agent, localapi, transports, codec, planner, schema, staging, compiled, config,
errors, sglang, podstatus, synthetic_engine) never import it (an import-linter contract in
pyproject.toml); only the ``pdpair-agent demo`` / ``bench`` / ``sidecar-bench`` handlers do, when they
run. The images leave the benchmarks (``bench``) out (.dockerignore) and keep the demo, their own check.
"""
