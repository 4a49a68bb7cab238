"""Heartbeats between paired agents, both ways: each side sends one ``Heartbeat`` per interval to
every peer it is paired with, and declares a peer lost after ``misses`` intervals without hearing
from it (a heartbeat or any other message from that peer counts).

Prefill → decode beats let decode fail its rooms when prefill dies; decode → prefill beats let prefill
fail that decode's rooms, disconnect its transport peer and go unready when no decode is left —
instead of noticing a dead decode only when a write to it fails (and never, when it is idle).

A beat's ``agent_id`` is the identity the *receiver* knows the sender by: prefill's agent id (decode
learns it from the bootstrap topology), decode's control address (the one identity an sglang-format
registration gives prefill).
"""

from __future__ import annotations

import time

from ..codec import Heartbeat, encode_control


class Heartbeats:
    """When to send the next beat, what it says, and the silence after which a peer is lost."""

    def __init__(self, sender: str, interval: float, misses: int):
        self.sender, self.interval = sender, interval
        self.limit = interval * misses
        """Seconds of silence after which a peer counts as lost."""
        self._seq = 0
        self._next = 0.0

    def due(self, now: float) -> bytes | None:
        """The encoded beat to send to every paired peer if one is due at ``now``, else None."""
        if now < self._next:
            return None
        self._next = now + self.interval
        self._seq += 1
        return encode_control(Heartbeat(agent_id=self.sender, seq=self._seq, time_ns=time.time_ns()))

    def lost(self, last_seen: float, now: float) -> bool:
        return now - last_seen > self.limit


__all__ = ["Heartbeats"]
