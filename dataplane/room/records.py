"""The typed records a room carries: its items, the engine requests in flight, the staged part, and
each role's per-room record. Data only; the lifecycle (``room.lifecycle``) moves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from ..planner import WritePlan

P = TypeVar("P")
"""The peer a prefill room writes to (the agent's paired decode)."""
M = TypeVar("M")
"""The room's request as decode sent it (its transfer metadata)."""
T = TypeVar("T")
"""A transfer handle (the transport's)."""
Q = TypeVar("Q")
"""A prefill rank decode asks for a room (the agent's paired prefill peer)."""


class Items(NamedTuple):
    """A room's items in the local pools: KV page indices, the aux slot (None: no aux), and per state
    component its item indices (None: the room has none of it)."""

    kv: np.ndarray
    aux: int | None
    state: list[np.ndarray | None]


class Part(NamedTuple):
    """One component's share of an engine request."""

    component: int
    nbytes: int
    writes: int


@dataclass(eq=False)
class InFlight(Generic[T]):
    """One engine request of a room, posted and not yet seen done."""

    transfer: T
    start: float
    """``time.perf_counter()`` when the room's write began."""
    posted: float
    """When the transport's ``write`` returned (of the request's time, the host's share)."""
    parts: list[Part]


@dataclass(eq=False)
class StagedPart:
    """The part of a room's plan on the staged path, until the peer acknowledged its last piece."""

    start: float
    plan: WritePlan


@dataclass(eq=False)
class PrefillRecord(Generic[P, M, T]):
    """Prefill's room: the decode it writes to and its request, its source items once known, its
    requests in flight."""

    decode: P
    metadata: M
    items: Items | None = None
    pending: list[InFlight[T]] = field(default_factory=list)
    staged: StagedPart | None = None


@dataclass(eq=False)
class DecodeRecord(Generic[Q]):
    """Decode's room: its destination items, the prefill ranks whose Success it still waits for, the
    prefill peer of each rank it asked (of the pod the engine named, when it started), and when its
    metadata left (``time.perf_counter()``)."""

    items: Items
    ranks: set[int]
    prefill: dict[int, Q] = field(default_factory=dict)
    sent: float = 0.0


__all__ = ["DecodeRecord", "InFlight", "Items", "Part", "PrefillRecord", "StagedPart"]
