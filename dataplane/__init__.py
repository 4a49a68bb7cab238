"""PDPair data plane: per-component state schema, sglang-compatible wire codec, transfer planner,
transports (NIXL, MoRI) and the in-pod agent.

Layers, lowest first (enforced by import-linter): ``schema`` → ``codec`` → ``planner`` →
``transports`` → ``agent`` → ``cli``. ``errors`` and ``config`` sit beside them and import none of them.
This package imports nothing heavy at import time, so the operator can use ``dataplane.config``.
"""
