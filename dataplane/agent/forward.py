"""The synthetic "forward pass" thread of a prefill worker: fills a room's source items off the
worker's thread, so the worker keeps polling transfers meanwhile (numpy releases the GIL while it
fills), and hands each finished room back with a wake-up frame on the worker's inbox.

Event-driven both ways: the thread blocks on its queue (a ``put`` wakes it at once) and the worker
blocks in its inbox poll (the ``WAKE`` frame wakes it at once) — neither side polls on a timer, so
a hand-off costs two thread wake-ups rather than a poll interval. Used only when the bytes matter
(verification on); without verification the worker allocates inline and skips the thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

STOP_CHECK = 0.25
"""Seconds between checks of the stop event while the queue is empty (a ``put`` never waits for it)."""


class ForwardThread:
    """Runs ``job(item)`` for every submitted item on one thread; ``done()`` returns the results."""

    def __init__(self, job: Callable[[Any], Any], wake: Callable[[], None]):
        self._job, self._wake = job, wake
        self._todo: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def start(self, stop: threading.Event) -> None:
        threading.Thread(target=self._loop, args=(stop,), name="pdpair-engine", daemon=True).start()

    def submit(self, item: Any) -> None:
        self._todo.put(item)

    def done(self) -> list[Any]:
        """Results finished since the last call, without waiting."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                item = self._todo.get(timeout=STOP_CHECK)
            except queue.Empty:
                continue
            self._done.put(self._job(item))
            self._wake()


__all__ = ["ForwardThread"]
