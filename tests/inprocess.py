"""Helpers for tests that run a prefill and a decode ``AgentRuntime`` in one process."""

from __future__ import annotations

import time
from typing import Any


def verified_run(decode: Any, requests: int, timeout: float) -> dict[str, Any]:
    """Wait (at most ``timeout`` s) for decode to complete ``requests`` rooms; check that every one
    succeeded and every byte of every component was verified; return decode's status."""
    deadline = time.monotonic() + timeout
    while decode.worker.completed < requests and time.monotonic() < deadline:
        time.sleep(0.02)
    st = decode.status.snapshot()
    assert st["requests"]["succeeded"] == requests, st["requests"]
    assert st["requests"]["verification_failures"] == 0
    for name, c in st["components"].items():
        assert c["bytes"] > 0 and c["verified_bytes"] == c["bytes"] and c["mismatched_bytes"] == 0, name
    return st
