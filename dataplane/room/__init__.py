"""A room's lifecycle, pure: typed records (``records``), the state machine that moves a room on
events and says what the role worker does next (``lifecycle``), and the trace points the worker
marks (``trace``). No I/O, no threads, no clocks; nothing here knows the agent, the local API or a
transport (import-linter keeps it so).
"""

from .lifecycle import (
    SENT,
    WRITES_DONE,
    Act,
    Actions,
    Begin,
    Event,
    Fail,
    IllegalEvent,
    Room,
    RoomTable,
    Sent,
    Status,
    WritesDone,
)
from .records import DecodeRecord, InFlight, Items, Part, PrefillRecord, StagedPart
from .trace import NO_TRACE, NoTrace, Tracer

__all__ = [
    "NO_TRACE",
    "SENT",
    "WRITES_DONE",
    "Act",
    "Actions",
    "Begin",
    "DecodeRecord",
    "Event",
    "Fail",
    "IllegalEvent",
    "InFlight",
    "Items",
    "NoTrace",
    "Part",
    "PrefillRecord",
    "Room",
    "RoomTable",
    "Sent",
    "StagedPart",
    "Status",
    "Tracer",
    "WritesDone",
]
