"""Room sources: where a role worker's rooms come from, composed into the worker (``source=``).

A prefill room opens when decode's metadata arrives; its *source items* come from the source. A decode
room is *made* by the source, which supplies its destination items. Either way the worker owns the
room's life (``room.lifecycle``) and tells the source of each state change it reports (``report``).

- ``SyntheticPrefillSource`` / ``SyntheticDecodeSource``: the agent's own synthetic engine
  (``agent.synthetic``): items from the agent's allocators, filled on prefill (on the forward thread
  when verifying) and verified on decode; decode makes rooms at the configured rate.
- The serving engine's sources, over the local API, are in ``localapi.sources``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from ..codec import TransferMetadata
from ..room import Items, Room
from .forward import ForwardThread
from .synthetic import items_for_tokens

if TYPE_CHECKING:
    from .decode import DecodeWorker
    from .prefill import PrefillWorker


class PrefillSource(Protocol):
    def attach(self, worker: PrefillWorker) -> None:
        """Serve ``worker`` (called once, from its constructor)."""

    def start(self, stop: threading.Event) -> None:
        """The worker's loop is starting (threads of the source's own start here)."""

    def opened(self, room: Room[Any], md: TransferMetadata) -> None:
        """Decode's metadata opened ``room``: give the worker its items (``worker.begin``), now or later."""

    def poll(self) -> None:
        """Once a turn, before the worker polls its transfers: items that became ready."""

    def report(self, room: Room[Any]) -> None:
        """``room`` reached a state the source hears of (Transferring, Success, Failed)."""

    def tick(self, now: float) -> None:
        """Once a turn, before the worker's periodic work."""

    def flush(self, now: float) -> None:
        """Once a turn, after every other step."""

    def idle_wait(self, wait: float) -> float:
        """The worker's idle sleep, possibly cut short."""


class DecodeSource(Protocol):
    def attach(self, worker: DecodeWorker) -> None:
        """Serve ``worker`` (called once, from its constructor)."""

    def generate(self, now: float) -> None:
        """Make the rooms due now (``worker.open_room``), while the prefill ranks are paired."""

    def report(self, room: Room[Any]) -> None:
        """``room`` reached a state the source hears of (WaitingForInput, Success, Failed)."""

    def flush(self, now: float) -> None:
        """Once a turn, after every other step."""

    def idle_wait(self, wait: float) -> float:
        """The worker's idle sleep, possibly cut short."""


class SyntheticPrefillSource:
    """Items from the agent's allocators, filled by the synthetic engine: on the forward thread when
    verifying (the bytes matter), else not at all, inline. ``inline``: fill inline even when verifying
    (the rooms of one batch of messages then start in one turn, which is when they coalesce)."""

    def __init__(self, inline: bool = False):
        self.inline = inline
        self.verify = False

    def attach(self, worker: PrefillWorker) -> None:
        self.worker = worker
        self.verify = worker.cfg.synthetic.verify
        self.forward = ForwardThread(self._fill, worker.inbox.waker())

    def start(self, stop: threading.Event) -> None:
        if self.verify and not self.inline:
            self.forward.start(stop)

    def opened(self, room: Room[Any], md: TransferMetadata) -> None:
        if not self.verify:
            self.begin(room.key, self._allocate(md))
        elif self.inline:
            self.begin(*self._fill((room.key, md)))
        else:
            self.forward.submit((room.key, md))

    def _allocate(self, md: TransferMetadata) -> Items | None:
        counts = [len(s) for s in md.dst_state_indices]
        w = self.worker
        with w.pool_lock:
            return w.allocate([len(md.dst_kv_indices)], md.dst_aux_index >= 0, counts)

    def _fill(self, job: tuple[Any, TransferMetadata]) -> tuple[Any, Items | None]:
        """Allocate and fill one room's sources (the forward thread's job, or inline)."""
        key, md = job
        items = self._allocate(md)
        if items is not None:
            self.worker.engine.fill(md.room, *items)
        return key, items

    def begin(self, key: Any, items: Items | None) -> None:
        if items is None:
            self.worker.fail(key, "prefill pools exhausted")
        else:
            self.worker.begin(key, items)

    def poll(self) -> None:
        filled = self.forward.done()
        if filled:
            with self.worker.together(len(filled)):
                for key, items in filled:
                    self.begin(key, items)

    def report(self, room: Room[Any]) -> None:
        return None

    def tick(self, now: float) -> None:
        return None

    def flush(self, now: float) -> None:
        return None

    def idle_wait(self, wait: float) -> float:
        return wait


class SyntheticDecodeSource:
    """Rooms at ``synthetic.requestsPerSecond`` (0: as fast as ``maxInflight`` allows), their token
    counts cycling ``synthetic.tokens``, items from the agent's allocators."""

    def __init__(self) -> None:
        self.next_request = 0.0

    def attach(self, worker: DecodeWorker) -> None:
        self.worker = worker

    def generate(self, now: float) -> None:
        with self.worker.pushers.corked():  # the rooms made in one turn leave in one write per lane
            self._generate(now)

    def _generate(self, now: float) -> None:
        w = self.worker
        syn = w.cfg.synthetic
        while (
            syn.enabled
            and w.ready_to_send()
            and len(w.rooms) < syn.max_inflight
            and (syn.requests == 0 or w.made < syn.requests)
            and now >= self.next_request
            and not self.warming_up()
        ):
            if not self.new_room(syn.tokens[w.made % len(syn.tokens)] if syn.tokens else 0):
                return
            rate = syn.requests_per_second
            self.next_request = max(self.next_request + 1 / rate, now - 1.0) if rate > 0 else now

    def warming_up(self) -> bool:
        """Every warm-up room (``synthetic.warmup``) is made and some are still in flight: the counted
        rooms wait for them, as a benchmark's raw-engine baseline finishes its warm-up requests before
        its clock starts — a warm-up room still moving bytes inside the counted window would make the
        window longer than the bytes counted in it."""
        w = self.worker
        warmup = w.cfg.synthetic.warmup
        return warmup > 0 and w.made == warmup and len(w.rooms) > 0

    def new_room(self, tokens: int) -> bool:
        """One room of ``tokens`` tokens; False when the pools are short."""
        w = self.worker
        counts = items_for_tokens(w.schema, tokens)
        items = w.allocate([counts.kv], counts.aux > 0, list(counts.state))
        if items is None:
            return False
        room_id = w.room_base + w.made
        w.made += 1
        w.open_room(room_id, items)
        return True

    def report(self, room: Room[Any]) -> None:
        return None

    def flush(self, now: float) -> None:
        return None

    def idle_wait(self, wait: float) -> float:
        return wait


__all__ = ["DecodeSource", "PrefillSource", "SyntheticDecodeSource", "SyntheticPrefillSource"]
