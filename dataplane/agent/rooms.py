"""Rooms: one request's transfer between one prefill rank and one decode rank, tracked over ``KVPoll``.

States only move forward (``codec.advance``: a late or duplicated status is ignored), Failed is
terminal and always wins, Success is terminal. Every room carries a deadline: ``expire`` fails the
rooms past theirs, and ``fail_peer`` fails every room of a peer that died or was replaced — so no room
can wait forever (sglang #32579 / #33920 hung there).

The table is bounded (``capacity``) and keeps finished rooms only as counts, never as a growing list,
plus the last ``RECENT_FAILURES`` failures with their reasons, so a failure explains itself in ``/status``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from ..codec import KVPoll, advance
from ..errors import BadInput

TERMINAL = (KVPoll.Success, KVPoll.Failed)
RECENT_FAILURES = 32


@dataclass(eq=False)
class Room:
    key: Hashable
    room: int
    peer: str
    deadline: float
    state: KVPoll = KVPoll.Bootstrapping
    reason: str = ""
    created: float = field(default_factory=time.monotonic)
    finished: float = 0.0
    data: Any = None
    """The role worker's own per-room record (indices, pending ranks, transfers)."""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


class RoomTable:
    """Live rooms by key; finished rooms leave the table and are counted by outcome."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._rooms: dict[Hashable, Room] = {}
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.recent_failures: deque[dict[str, Any]] = deque(maxlen=RECENT_FAILURES)
        """The last failed rooms: room id, peer, reason and age in seconds when they failed."""

    def __len__(self) -> int:
        return len(self._rooms)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._rooms

    def get(self, key: Hashable) -> Room | None:
        return self._rooms.get(key)

    def add(
        self, key: Hashable, room: int, peer: str, timeout: float, data: Any = None,
        state: KVPoll = KVPoll.Bootstrapping,
    ) -> Room:
        """``state``: where the room starts (a live state), e.g. WaitingForInput for a room whose
        request arrived with it: one step instead of ``advance`` just after (a Python call chain)."""
        if key in self._rooms:
            raise BadInput(f"room {room} for {peer} is already in progress")
        if len(self._rooms) >= self.capacity:
            raise BadInput(f"too many rooms in flight ({self.capacity}); room {room} refused")
        entry = Room(key, room, peer, time.monotonic() + timeout, state, data=data)
        with self._lock:
            self._rooms[key] = entry
        return entry

    def advance(self, key: Hashable, state: KVPoll, reason: str = "") -> Room | None:
        """Apply ``state``; returns the room if this call finished it (it is then out of the table)."""
        entry = self._rooms.get(key)
        if entry is None:
            return None
        new = advance(entry.state, state)
        if new == entry.state:
            return None
        entry.state = new
        if new == KVPoll.Failed:
            entry.reason = reason or "failed"
        if new not in TERMINAL:  # ``entry.done``, without a property call per state change
            return None
        entry.finished = time.monotonic()
        with self._lock:
            del self._rooms[key]
            if new == KVPoll.Success:
                self.outcomes["success"] += 1
            else:
                self.outcomes[_outcome(entry.reason)] += 1
                self.recent_failures.append({
                    "room": entry.room, "peer": entry.peer, "reason": entry.reason,
                    "after_seconds": round(entry.finished - entry.created, 4),
                })
        return entry

    def fail(self, key: Hashable, reason: str) -> Room | None:
        return self.advance(key, KVPoll.Failed, reason)

    def expire(self, now: float | None = None) -> list[Room]:
        """Fail every room past its deadline; returns them."""
        now = time.monotonic() if now is None else now
        late = [r for r in list(self._rooms.values()) if r.deadline <= now]
        out = []
        for r in late:
            waited = now - r.created
            failed = self.fail(r.key, f"deadline exceeded: room {r.room} not done after {waited:.3f}s")
            if failed is not None:
                out.append(failed)
        return out

    def fail_peer(self, peer: str, reason: str) -> list[Room]:
        """Fail every live room of ``peer`` (dead, replaced or refused)."""
        out = []
        for r in [r for r in list(self._rooms.values()) if r.peer == peer]:
            failed = self.fail(r.key, reason)
            if failed is not None:
                out.append(failed)
        return out

    def live(self) -> list[Room]:
        return list(self._rooms.values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            states = Counter(KVPoll(r.state).name for r in self._rooms.values())
            return {
                "inflight": len(self._rooms),
                "states": dict(states),
                "finished": dict(self.outcomes),
                "recent_failures": list(self.recent_failures),
            }


def _outcome(reason: str) -> str:
    return "aborted" if reason.startswith("aborted") else "failed"
