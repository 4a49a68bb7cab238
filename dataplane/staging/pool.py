"""Bounded, reused staging slots with back-pressure. No torch: works over numpy or torch buffers.

A role allocates its staging memory once (one registered buffer cut into ``count`` equal slots) and
reuses it for every request. A slot is taken for one piece of a staged transfer and given back when
the piece has landed (sender: the receiver's acknowledgement; receiver: its scatter finished). When
every slot is in use the caller waits — non-blocking ``try_acquire`` for the single-threaded agent
loop, ``acquire(deadline)`` for threads — and a wait past its deadline raises ``DeadlineExceeded``,
so a stalled peer turns into a failed room, never an unbounded queue or unbounded memory.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..errors import BadInput, DeadlineExceeded

__all__ = ["SlotPool"]


class SlotPool:
    """``count`` slots of ``slot_bytes`` each over ``buffer`` (1-D, ``count * slot_bytes`` bytes,
    numpy or torch; ``None`` for credit-only use, e.g. the sender's view of the peer's slots)."""

    def __init__(self, count: int, slot_bytes: int, buffer: Any = None):
        if count <= 0 or slot_bytes <= 0:
            raise BadInput(f"staging needs positive slot count and size, got {count} x {slot_bytes}")
        if buffer is not None and _nbytes(buffer) < count * slot_bytes:
            raise BadInput(f"staging buffer has {_nbytes(buffer)} bytes, {count} x {slot_bytes} needed")
        self.count, self.slot_bytes, self.buffer = count, slot_bytes, buffer
        self._free = list(range(count - 1, -1, -1))
        self._cond = threading.Condition()

    @property
    def available(self) -> int:
        with self._cond:
            return len(self._free)

    def try_acquire(self) -> int | None:
        """A free slot id, or None when all are in use (the caller retries after progress)."""
        with self._cond:
            return self._free.pop() if self._free else None

    def acquire(self, deadline: float) -> int:
        """A free slot id, waiting until ``deadline`` (``time.monotonic``) for one to be released."""
        with self._cond:
            while not self._free:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineExceeded(f"staging: all {self.count} slots busy past the deadline")
                self._cond.wait(left)
            return self._free.pop()

    def release(self, slot: int) -> None:
        with self._cond:
            if not 0 <= slot < self.count or slot in self._free:
                raise BadInput(f"staging: slot {slot} is not in use")
            self._free.append(slot)
            self._cond.notify()

    def offset(self, slot: int) -> int:
        """Byte offset of ``slot`` in the buffer (what the peer writes to)."""
        return slot * self.slot_bytes

    def view(self, slot: int) -> Any:
        """The slot's bytes as a slice of the buffer (same type as the buffer)."""
        if self.buffer is None:
            raise BadInput("staging: this pool has no buffer (credit-only)")
        return self.buffer[slot * self.slot_bytes : (slot + 1) * self.slot_bytes]


def _nbytes(buf: Any) -> int:
    nbytes = getattr(buf, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else int(buf.numel() * buf.element_size())
