"""The synthetic engine: a process that stands where a serving engine (sglang, vLLM) would, speaking the
local API (``dataplane.localapi``) to its sidecar agent — ``pdpair-agent engine``, the transfer canary
a PDPair runs in sidecar mode when it names no engine image. ``process`` drives rooms, ``cuda_pools``
holds its pools in CUDA memory, ``rank_processes`` runs one process per TP rank.
"""
