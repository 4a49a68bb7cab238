"""Which message a control socket received: the one place that tells sglang's positional frames and
our own tagged control messages apart, so a worker dispatches with one ``match`` on ``FrameKind``.

sglang 0.5.23's MoRI frames all start with ``GUARD``: a registration has ``b"None"`` where a room id
would be (frame 1), a status has at most ``STATUS_FRAMES`` frames, transfer metadata at least
``MIN_METADATA_FRAMES``. Our own control messages (``codec.control``) are one msgspec frame.
"""

from __future__ import annotations

import enum

from ..errors import WireFormatError
from .frames import GUARD

STATUS_FRAMES = 5
"""A status is the guard, room, state, prefill rank and an optional reason."""


class FrameKind(enum.Enum):
    CONTROL = "control"
    """One of our tagged control messages (hello, refusal, heartbeat, abort, staged)."""
    REGISTRATION = "registration"
    """sglang's decode registration (decode → prefill, once per pairing)."""
    METADATA = "metadata"
    """sglang's per-room transfer metadata (decode → prefill)."""
    STATUS = "status"
    """sglang's per-room status (prefill → decode)."""


def frame_kind(frames: list[bytes]) -> FrameKind:
    """The kind of an (untrusted, unsealed) message; anything else is a ``WireFormatError``."""
    n = len(frames)
    if n == 1:
        return FrameKind.CONTROL
    if n > 1 and frames[0] == GUARD:
        if frames[1] == b"None":
            return FrameKind.REGISTRATION
        return FrameKind.STATUS if n <= STATUS_FRAMES else FrameKind.METADATA
    raise WireFormatError(f"unrecognised control message of {n} frames")


__all__ = ["STATUS_FRAMES", "FrameKind", "frame_kind"]
