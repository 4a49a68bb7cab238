"""The test and measurement harness: what starts agents and synthetic engines as processes on loopback
(``agent_processes``, ``sidecar_pair``), the demo (``loopback_demo``), the benchmarks (``bench``) and the
one bounded poll (``waiting.wait_for``) that the tests share.

Nothing the images run imports it: the runtime packages (agent, localapi, transports, codec, planner,
schema, staging, compiled, config, errors, sglang, podstatus, synthetic_engine) never do (an
import-linter contract in pyproject.toml), and the images leave it out (.dockerignore). Only the
``pdpair-agent demo`` / ``bench`` / ``sidecar-bench`` handlers import it, when they run.
"""
