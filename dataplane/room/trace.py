"""Trace points: named steps of a room's route that a worker marks as it passes them.

The role workers call ``Tracer.mark(room, step)`` at the steps below; the default ``NO_TRACE`` does
nothing (the call is the whole cost). ``bench/room_trace.py`` turns a recording tracer on in the agents
it starts (``agent.tracing``) and joins both sides' marks by room id into its step table. The steps, by
who marks them (in sidecar mode each name is led by the process's letter, ``D`` / ``P``):

- decode: ``D0a`` / ``D0b`` around making and sending a room's metadata; ``D1`` / ``D2`` around
  handling a prefill status.
- prefill: ``Pw`` its inbox's wait returned (the metadata's arrival), ``P0`` room opened, ``Qa`` /
  ``Qb`` around ``plan_request``, ``Ra`` / ``Rb`` around ``transfer_requests``, ``Wa`` / ``Wb`` around
  the transport's ``write``, ``P2`` / ``P3`` around finishing the room, ``Ps`` its status handed to
  the lane or ZMQ, ``P4`` a corked status left.
- sidecar: ``w0`` the worker took the engine's request off the link, ``f<state>`` the worker pushed
  that room state to the engine.
"""

from __future__ import annotations

from typing import Protocol


class Tracer(Protocol):
    """Where a worker's trace points go."""

    enabled: bool
    """False: the worker may skip computing what it would mark."""

    def mark(self, room: int, step: str, at: float | None = None) -> None:
        """``room`` passed ``step`` (at ``at``, a ``time.perf_counter()``; None: now)."""

    def close(self) -> None:
        """The worker stopped: keep what was marked."""


class NoTrace:
    """The default tracer: marks nothing."""

    enabled = False

    def mark(self, room: int, step: str, at: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None


NO_TRACE = NoTrace()

__all__ = ["NO_TRACE", "NoTrace", "Tracer"]
