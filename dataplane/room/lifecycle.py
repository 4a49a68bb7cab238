"""A room's life as a state machine: an event comes in, the room moves to its new state, and the
actions the role worker performs come out. No I/O, no threads, no clocks: time comes in with the call.

A room is one request's transfer between one prefill rank and one decode rank. Its state is sglang's
``KVPoll``, a closed set; it only moves forward, Failed is terminal and always wins, Success is
terminal. The legal moves, per role (anything else raises ``IllegalEvent``; an event for a room no
longer in the table is a late one and changes nothing):

=========  =========================  ==================  ================  ============================
role       from                       event               to                actions
=========  =========================  ==================  ================  ============================
prefill    WaitingForInput            ``Begin(items)``    Transferring      REPORT, POST
prefill    Transferring               ``WritesDone``      Success           SEND_STATUS, FREE, COUNT, REPORT
prefill    any live                   ``Fail``            Failed            RELEASE_WRITES, [SEND_STATUS],
                                                                            FREE, COUNT, REPORT
decode     Bootstrapping              ``Sent``            WaitingForInput   REPORT
decode     WaitingForInput+           ``Status(live)``    the later one     —
decode     WaitingForInput+           ``Status(Success)`` Success once      COMPLETE, REPORT
                                                          every rank said
decode     WaitingForInput+           ``Status(Failed)``  Failed            QUARANTINE, COUNT, REPORT
decode     any live                   ``Fail``            Failed            [SEND_ABORT], QUARANTINE,
                                                                            COUNT, REPORT
=========  =========================  ==================  ================  ============================

``[…]``: only when the event's ``notify`` is set (the peer is told). Every room carries a deadline:
``expire`` fails the rooms past theirs, and ``fail_peer`` fails every room of a peer that died or was
replaced, so no room can wait forever (sglang #32579 / #33920 hung there).

Actions are a closed set of constants (``Act``); their arguments are the room's own fields (state,
reason, record), so a transition allocates nothing. The table is bounded (``capacity``) and keeps
finished rooms only as counts, plus the last ``RECENT_FAILURES`` failures with their reasons, so a
failure explains itself in ``/status``.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..codec import KVPoll, advance
from ..errors import BadInput
from .records import Items

TERMINAL = (KVPoll.Success, KVPoll.Failed)
RECENT_FAILURES = 32
ROLES = ("prefill", "decode")

R = TypeVar("R")
"""The role's per-room record (``PrefillRecord`` or ``DecodeRecord``)."""


class IllegalEvent(BadInput):
    """An event the room's state does not allow (a bug or a confused peer): the room is unchanged."""


class Act(enum.Enum):
    """What the role worker does for a room after a transition."""

    POST = "post"
    """Prefill: plan the room from its items and post its writes."""
    RELEASE_WRITES = "release_writes"
    """Prefill: release the requests still in flight and drop the room's staged pieces."""
    SEND_STATUS = "send_status"
    """Prefill: the room's state (and reason) to its decode."""
    SEND_ABORT = "send_abort"
    """Decode: ``Abort`` to every prefill rank whose Success it still waited for."""
    FREE = "free"
    """Give the room's items back to where they came from (nothing, when a serving engine owns them)."""
    DISCARD = "discard"
    """Give back items that arrived for a room no longer in the table (they came with the event)."""
    QUARANTINE = "quarantine"
    """Decode: hold the failed room's items for one timeout: a late write must not land in a later room."""
    COMPLETE = "complete"
    """Decode: every byte is in: account (and verify) the room, free its items, count its outcome."""
    COUNT = "count"
    """Count the room's outcome (metrics, logs)."""
    REPORT = "report"
    """Tell the room's source its new state (a serving engine acts on it)."""


Actions = tuple[Act, ...]
NOTHING: Actions = ()
PREFILL_BEGIN: Actions = (Act.REPORT, Act.POST)
PREFILL_SUCCESS: Actions = (Act.SEND_STATUS, Act.FREE, Act.COUNT, Act.REPORT)
PREFILL_FAILED: Actions = (Act.RELEASE_WRITES, Act.SEND_STATUS, Act.FREE, Act.COUNT, Act.REPORT)
PREFILL_FAILED_QUIETLY: Actions = (Act.RELEASE_WRITES, Act.FREE, Act.COUNT, Act.REPORT)
LATE_ITEMS: Actions = (Act.DISCARD,)
DECODE_SENT: Actions = (Act.REPORT,)
DECODE_SUCCESS: Actions = (Act.COMPLETE, Act.REPORT)
DECODE_FAILED: Actions = (Act.SEND_ABORT, Act.QUARANTINE, Act.COUNT, Act.REPORT)
DECODE_FAILED_QUIETLY: Actions = (Act.QUARANTINE, Act.COUNT, Act.REPORT)


# ---- events ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Begin:
    """Prefill: the room's source items are ready (filled by the synthetic engine, or the serving
    engine's ``Send``)."""

    items: Items


@dataclass(frozen=True)
class Sent:
    """Decode: the room's metadata left for every prefill rank it needs."""


@dataclass(frozen=True)
class WritesDone:
    """Prefill: every write of the room completed and every staged piece was acknowledged."""


@dataclass(frozen=True)
class Status:
    """Decode: a prefill rank's status for the room."""

    rank: int
    state: KVPoll
    reason: str = ""


@dataclass(frozen=True)
class Fail:
    """The room failed here (``reason``); ``notify``: tell the peer (not when the peer said so first,
    or when it is gone)."""

    reason: str
    notify: bool = True


Event = Begin | Sent | WritesDone | Status | Fail
SENT = Sent()
WRITES_DONE = WritesDone()


@dataclass(eq=False)
class Room(Generic[R]):
    key: Hashable
    room: int
    peer: str
    deadline: float
    created: float
    record: R
    state: KVPoll = KVPoll.Bootstrapping
    reason: str = ""
    finished: float = 0.0
    quiet: bool = False
    """It failed without telling its peer (``Fail.notify`` unset)."""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


class RoomTable(Generic[R]):
    """Live rooms of one role by key, each moved only by ``handle`` (and ``expire`` / ``fail_peer``,
    which feed it ``Fail``); finished rooms leave the table and are counted by outcome."""

    def __init__(self, role: str, capacity: int = 4096):
        if role not in ROLES:
            raise BadInput(f"room role {role!r}: expected prefill or decode")
        self.prefill = role == "prefill"
        self.capacity = capacity
        self._rooms: dict[Hashable, Room[R]] = {}
        self.outcomes: Counter[str] = Counter()
        self.recent_failures: deque[dict[str, Any]] = deque(maxlen=RECENT_FAILURES)
        """The last failed rooms: room id, peer, reason and age in seconds when they failed."""

    def __len__(self) -> int:
        return len(self._rooms)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._rooms

    def get(self, key: Hashable) -> Room[R] | None:
        return self._rooms.get(key)

    def live(self) -> list[Room[R]]:
        return list(self._rooms.values())

    def open(
        self,
        key: Hashable,
        room: int,
        peer: str,
        record: R,
        *,
        now: float,
        timeout: float,
        state: KVPoll = KVPoll.Bootstrapping,
    ) -> Room[R]:
        """A new room in ``state`` (prefill: WaitingForInput, its metadata arrived with it; decode:
        Bootstrapping, its metadata about to leave), due ``timeout`` seconds after ``now``."""
        if key in self._rooms:
            raise BadInput(f"room {room} for {peer} is already in progress")
        if len(self._rooms) >= self.capacity:
            raise BadInput(f"too many rooms in flight ({self.capacity}); room {room} refused")
        if state in TERMINAL:
            raise IllegalEvent(f"room {room} cannot open {KVPoll(state).name}")
        entry: Room[R] = Room(key, room, peer, now + timeout, now, record, state)
        self._rooms[key] = entry
        return entry

    def handle(self, key: Hashable, event: Event, now: float) -> tuple[Room[R] | None, Actions]:
        """Apply ``event`` to the room ``key``: (the room, the actions to perform). A room that left
        the table meanwhile gives (None, nothing) — or ``DISCARD`` for items that came too late."""
        entry = self._rooms.get(key)
        if entry is None:
            return None, (LATE_ITEMS if isinstance(event, Begin) else NOTHING)
        if self.prefill:
            state, reason, actions = _prefill_step(entry, event)
        else:
            state, reason, actions = _decode_step(entry, event)
        if state == entry.state:
            return entry, actions
        entry.state = state
        if state == KVPoll.Failed:
            entry.reason = reason or "failed"
            entry.quiet = actions is PREFILL_FAILED_QUIETLY or actions is DECODE_FAILED_QUIETLY
        if state == KVPoll.Success or state == KVPoll.Failed:
            self._finish(entry, now)
        return entry, actions

    def _finish(self, entry: Room[R], now: float) -> None:
        entry.finished = now
        del self._rooms[entry.key]
        if entry.state == KVPoll.Success:
            self.outcomes["success"] += 1
            return
        self.outcomes[outcome(entry.reason)] += 1
        self.recent_failures.append(
            {
                "room": entry.room,
                "peer": entry.peer,
                "reason": entry.reason,
                "after_seconds": round(entry.finished - entry.created, 4),
            }
        )

    def fail(
        self, key: Hashable, reason: str, now: float, notify: bool = True
    ) -> tuple[Room[R] | None, Actions]:
        return self.handle(key, Fail(reason, notify), now)

    def expire(self, now: float) -> list[tuple[Room[R], Actions]]:
        """Fail every room past its deadline (its peer is told)."""
        out = []
        for r in [r for r in self._rooms.values() if r.deadline <= now]:
            why = f"deadline exceeded: room {r.room} not done after {now - r.created:.3f}s"
            room, actions = self.handle(r.key, Fail(why), now)
            if room is not None:
                out.append((room, actions))
        return out

    def fail_peer(
        self, peer: str, reason: str, now: float, notify: bool = True
    ) -> list[tuple[Room[R], Actions]]:
        """Fail every live room of ``peer`` (dead, replaced or refused); ``notify``: tell it."""
        out = []
        for r in [r for r in self._rooms.values() if r.peer == peer]:
            room, actions = self.handle(r.key, Fail(reason, notify), now)
            if room is not None:
                out.append((room, actions))
        return out

    def snapshot(self) -> dict[str, Any]:
        """For ``/status``, read on another thread: each copy is one C call under the GIL, so the
        worker's changes never tear it (no lock on the room path)."""
        rooms, outcomes, failures = (
            list(self._rooms.values()),
            dict(self.outcomes),
            list(self.recent_failures),
        )
        return {
            "inflight": len(rooms),
            "states": dict(Counter(KVPoll(r.state).name for r in rooms)),
            "finished": outcomes,
            "recent_failures": failures,
        }


def _prefill_step(room: Room[Any], event: Event) -> tuple[KVPoll, str, Actions]:
    state = room.state
    match event:
        case Fail(reason=reason, notify=notify):
            return KVPoll.Failed, reason, PREFILL_FAILED if notify else PREFILL_FAILED_QUIETLY
        case Begin(items=items) if state == KVPoll.WaitingForInput:
            room.record.items = items
            return KVPoll.Transferring, "", PREFILL_BEGIN
        case WritesDone() if state == KVPoll.Transferring:
            return KVPoll.Success, "", PREFILL_SUCCESS
    raise IllegalEvent(f"prefill room {room.room}: {type(event).__name__} in {KVPoll(state).name}")


def _decode_step(room: Room[Any], event: Event) -> tuple[KVPoll, str, Actions]:
    state = room.state
    match event:
        case Fail(reason=reason, notify=notify):
            return KVPoll.Failed, reason, DECODE_FAILED if notify else DECODE_FAILED_QUIETLY
        case Sent() if state == KVPoll.Bootstrapping:
            return KVPoll.WaitingForInput, "", DECODE_SENT
        case Status(rank=rank, state=st, reason=reason) if state != KVPoll.Bootstrapping:
            if st == KVPoll.Failed:
                return KVPoll.Failed, f"prefill rank {rank}: {reason or 'failed'}", DECODE_FAILED_QUIETLY
            if st == KVPoll.Success:
                ranks = room.record.ranks
                ranks.discard(rank)
                return (KVPoll.Success, "", DECODE_SUCCESS) if not ranks else (state, "", NOTHING)
            return advance(state, st), "", NOTHING
    raise IllegalEvent(f"decode room {room.room}: {type(event).__name__} in {KVPoll(state).name}")


def outcome(reason: str) -> str:
    """A failed room's outcome label: ``aborted`` when a side aborted it, else ``failed``."""
    return "aborted" if reason.startswith("aborted") else "failed"


__all__ = [
    "DECODE_FAILED",
    "DECODE_FAILED_QUIETLY",
    "DECODE_SENT",
    "DECODE_SUCCESS",
    "PREFILL_BEGIN",
    "PREFILL_FAILED",
    "PREFILL_FAILED_QUIETLY",
    "PREFILL_SUCCESS",
    "SENT",
    "WRITES_DONE",
    "Act",
    "Actions",
    "Begin",
    "Event",
    "Fail",
    "IllegalEvent",
    "Room",
    "RoomTable",
    "Sent",
    "Status",
    "WritesDone",
]
