"""A thread that posts prepared engine requests, in submission order, off the role worker's thread.

The NIXL adapter uses the native poster (``native/``) where it loads, which also signals
completion; this Python thread is the fallback (no compiler, ``nativePoster`` off).

UCX copies a host-to-host write inside NIXL's ``postXferReq`` (CMA), so posted on the role worker each
room's copy and the Python work of the next rooms ran one after the other. From this thread the copy
runs while the worker goes on (the binding releases the GIL during the call): a 2 MiB request with
190 µs of Python work per request took 520-548 µs posted in line and 308-370 µs posted here, on a
16-core host (the post alone: 306-330 µs). The engine must allow this thread and the worker to call it
at once (NIXL: ``NIXL_THREAD_SYNC_RW``).

A transfer handed over carries ``handles``, ``unposted`` (set once by ``submit``, then changed only
here), ``cancelled``, ``post_error`` and ``post_lock``, held here while one of its handles is posted
and by the adapter's abort: a handle is never released while being posted, nor posted once released.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from ...errors import TransferFailed

Posting = tuple[Any, Any] | threading.Event | None
"""(transfer, handle) to post, a drain marker to set, or None: stop."""


class Poster:
    """``post(transfer, handle)`` posts one handle and raises ``TransferFailed`` when it cannot;
    ``posted(transfer)`` runs here once a transfer's last handle is posted or skipped."""

    def __init__(self, post: Callable[[Any, Any], None], posted: Callable[[Any], None] | None = None):
        self._post = post
        self._posted = posted
        self._queue: queue.SimpleQueue[Posting] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pdpair-post", daemon=True)
        self.posted = 0
        self._submitted = 0
        """Handles queued so far (written by the submitting thread only)."""
        self._settled = 0
        """Handles posted or skipped so far (written by this thread only)."""
        self._thread.start()

    def submit(self, transfer: Any) -> None:
        """Queue every handle of ``transfer``; ``unposted`` is set before the first is queued."""
        transfer.unposted = len(transfer.handles)
        for handle in list(transfer.handles):
            self._submitted += 1
            self._queue.put((transfer, handle))

    @property
    def backlog(self) -> int:
        """Handles submitted and not yet posted or skipped: the thread is awake and has work."""
        return self._submitted - self._settled

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            transfer, handle = item
            with transfer.post_lock:
                if not transfer.cancelled and transfer.post_error is None:
                    try:
                        self._post(transfer, handle)
                    except TransferFailed as exc:
                        transfer.post_error = exc
                    self.posted += 1
                transfer.unposted -= 1
                last = transfer.unposted == 0
            self._settled += 1
            if last and self._posted is not None:
                self._posted(transfer)

    def drain(self, timeout: float = 10.0) -> None:
        """Return once everything submitted so far is posted or skipped."""
        done = threading.Event()
        self._queue.put(done)
        if not done.wait(timeout):
            raise TransferFailed(f"the posting thread did not drain within {timeout:.0f}s")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)


__all__ = ["Poster"]
