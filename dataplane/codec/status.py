"""The status message (prefill → decode) and the room state machine, as sglang 0.5.23 MoRI uses them.

Frames: 0 guard, 1 room, 2 ``KVPoll`` as ASCII int, 3 prefill unique rank, 4 failure reason (UTF-8,
empty for none). ``advance`` applies sglang's update rule: Failed is terminal and always accepted;
otherwise the status only moves forward — a regression (a late or duplicated message, normal on PUSH
sockets) is IGNORED, returning the current status, not raised.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import WireFormatError
from .frames import GUARD, check_frames, int_frame, parse_int
from .messages import KVPoll, StatusMessage

MAX_REASON_BYTES = 64 * 1024
I32_MAX = 2**31 - 1

TERMINAL = frozenset({KVPoll.Failed, KVPoll.Success})
_STATUS_FRAMES = {state: b"%d" % state for state in KVPoll}
"""Each status's frame 2, made once: every room sends one, and ``KVPoll(x)`` is a Python call."""
_BY_CODE = tuple(sorted(KVPoll))
"""The members by wire code (0..4): indexing it is what ``KVPoll(code)`` does, without the enum's call."""


def advance(current: KVPoll, new: KVPoll) -> KVPoll:
    """The status after ``new`` arrives in state ``current``: Failed sticks and always wins; otherwise
    the larger of the two (regressions are ignored). Both are members already, so the larger is
    returned as it is: ``KVPoll(max(...))`` cost three Python calls per room state change."""
    if current == KVPoll.Failed or new == KVPoll.Failed:
        return KVPoll.Failed
    return new if new > current else current


def encode_status(msg: StatusMessage) -> list[bytes]:
    reason = (msg.failure_reason or "").encode("utf-8")
    if len(reason) > MAX_REASON_BYTES:
        reason = reason[:MAX_REASON_BYTES].decode("utf-8", errors="ignore").encode("utf-8")
    return [
        GUARD,
        int_frame(msg.room, field="room"),
        _status_frame(msg.status),
        int_frame(msg.prefill_rank, field="prefill_rank", hi=I32_MAX),
        reason,
    ]


def _status_frame(status: KVPoll) -> bytes:
    """Frame 2; anything but a member goes through ``KVPoll(x)`` for its check (and its error)."""
    if type(status) is KVPoll:
        return _STATUS_FRAMES[status]
    return int_frame(int(KVPoll(status)), field="status")


def decode_status(frames: Sequence[bytes]) -> StatusMessage:
    """Parse untrusted frames; an unknown status code or non-UTF-8 reason is a ``WireFormatError``."""
    f = check_frames(frames, kind="status", min_frames=4)
    code = parse_int(f[2], field="status", hi=len(_BY_CODE) - 1)
    reason_frame = f[4] if len(f) > 4 else b""
    if len(reason_frame) > MAX_REASON_BYTES:
        raise WireFormatError(
            f"status: failure reason of {len(reason_frame)} bytes exceeds {MAX_REASON_BYTES}"
        )
    try:
        reason = reason_frame.decode("utf-8") if reason_frame else None
    except UnicodeDecodeError as exc:
        raise WireFormatError(
            f"status: failure reason is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    return StatusMessage(
        room=parse_int(f[1], field="room"),
        status=_BY_CODE[code],
        prefill_rank=parse_int(f[3], field="prefill_rank", hi=I32_MAX),
        failure_reason=reason,
    )
