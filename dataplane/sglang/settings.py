"""The backend's settings, parsed once when sglang builds the KV manager (the plugin's edge).

The pod's agent socket comes from ``PDPAIR_AGENT_SOCKET`` (the operator sets it on the engine
container); the deadlines are sglang's own disaggregation timeouts, read through sglang's ``envs`` so
``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` / ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` mean here what
they mean for sglang's other backends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

DEFAULT_SOCKET = "/var/run/pdpair/agent.sock"


@dataclass(frozen=True)
class Settings:
    socket_path: str = DEFAULT_SOCKET
    call_timeout: float = 5.0
    """Bound of one local-API call (the agent answers in microseconds; this only catches a hung agent)."""
    bootstrap_timeout: float = 300.0
    """Prefill: seconds a room may wait for decode to ask for it before it fails."""
    waiting_timeout: float = 300.0
    """Prefill: seconds between decode's request and the engine's last chunk before the room fails."""

    @classmethod
    def from_environment(cls, environ: Any = None) -> Settings:
        env = os.environ if environ is None else environ
        socket_path = env.get("PDPAIR_AGENT_SOCKET") or DEFAULT_SOCKET
        return cls(socket_path=socket_path, bootstrap_timeout=_sglang_env("BOOTSTRAP_TIMEOUT", 300.0),
                   waiting_timeout=_sglang_env("WAITING_TIMEOUT", 300.0))


def _sglang_env(name: str, default: float) -> float:
    """One of sglang's ``SGLANG_DISAGGREGATION_*`` timeouts, as sglang itself parses it."""
    try:
        from sglang.srt.environ import envs
    except ImportError:
        return default
    var = getattr(envs, f"SGLANG_DISAGGREGATION_{name}", None)
    return float(var.get()) if var is not None else default
