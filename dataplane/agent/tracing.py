"""A recording ``room.trace.Tracer`` for ``bench/room_trace.py``: each worker's marks per room id, one
JSON file per worker when it stops.

On only when ``PDPAIR_ROOM_TRACE`` names a folder (the benchmark sets it for the agents it starts);
otherwise the workers get ``room.NO_TRACE``. One clock for every process of a host
(``time.perf_counter`` is CLOCK_MONOTONIC on Linux), so prefill's and decode's marks of one room line up.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

from ..room import NO_TRACE, Tracer

ENV = "PDPAIR_ROOM_TRACE"
MAX_ROOMS = 100_000
"""Rooms a recording keeps marks for (later rooms are not marked)."""
_SERIAL = itertools.count()


class RecordingTracer:
    """Marks by room id, written to ``folder/<role>-agent-<pid>-<n>.json`` by ``close``. A room
    state's step (``…f<state>``) keeps its first time: the state is pushed once."""

    enabled = True

    def __init__(self, folder: Path, role: str):
        self.path = folder / f"{role}-agent-{os.getpid()}-{next(_SERIAL)}.json"
        self.who = role[0].upper()
        self.marks: dict[int, dict[str, float]] = {}

    def mark(self, room: int, step: str, at: float | None = None) -> None:
        marks = self.marks.get(room)
        if marks is None:
            if len(self.marks) >= MAX_ROOMS:
                return
            marks = self.marks[room] = {}
        if len(step) > 1 and step[-2] == "f" and step in marks:
            return
        marks[step] = time.perf_counter() if at is None else at

    def close(self) -> None:
        data = {"who": self.who, "marks": {str(k): v for k, v in self.marks.items()}}
        self.path.write_text(json.dumps(data))


def room_tracer(role: str) -> Tracer:
    """The tracer a worker of ``role`` gets: recording when ``PDPAIR_ROOM_TRACE`` names a folder."""
    folder = os.environ.get(ENV)
    return RecordingTracer(Path(folder), role) if folder else NO_TRACE


__all__ = ["ENV", "RecordingTracer", "room_tracer"]
