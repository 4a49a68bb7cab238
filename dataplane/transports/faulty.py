"""``FaultyTransport``: any transport with faults injected — for tests and the fault matrix only.

It holds the real transport and passes every call through, except that a seeded share of writes
(``FaultPlan.rate``) meets one fault, chosen among ``FaultPlan.kinds``:

- ``submit``: ``write`` raises ``TransferFailed`` (the engine refused the post);
- ``corrupt``: the completion arrives unreadable: the transfer reports FAILED once the engine is done;
- ``lose``: the completion never arrives: the transfer stays in progress until the caller's deadline
  aborts it (the engine's copy still runs and is released);
- ``delay``: the completion arrives ``delay`` seconds late.

``fail_after`` (0: never) fails every write after that many at submit, as an engine that broke for
good would. Real agents take a plan from ``PDPAIR_TEST_FAULTS`` (``pdpair-agent run`` reads it; the
launcher's callers set it); nothing in a product configuration selects this transport.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import BadInput, TransferFailed
from .base import MemoryRegion, Peer, Transfer, TransferState, Transport, Writes

KINDS = ("submit", "corrupt", "lose", "delay")

MAX_TRACKED = 65536
"""Faulted transfers awaiting their completion at most; past it, writes go through unfaulted."""


@dataclass(frozen=True)
class FaultPlan:
    rate: float = 0.0
    seed: int = 0
    kinds: tuple[str, ...] = KINDS
    delay: float = 0.2
    """Seconds a ``delay`` fault holds back a completion."""
    fail_after: int = 0

    @classmethod
    def parse(cls, text: str, source: str = "PDPAIR_TEST_FAULTS") -> FaultPlan:
        """``rate=0.3,seed=7,kinds=submit+lose,delay=0.2,fail_after=100`` (every field optional)."""
        fields: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = item.partition("=")
            try:
                if not sep:
                    raise ValueError(item)
                if name == "rate" or name == "delay":
                    fields[name] = float(value)
                elif name == "seed" or name == "fail_after":
                    fields[name] = int(value)
                elif name == "kinds":
                    fields[name] = tuple(value.split("+"))
                else:
                    raise ValueError(item)
            except ValueError:
                raise BadInput(_bad(source, text, f"cannot read {item!r}")) from None
        plan = cls(**fields)
        unknown = sorted(set(plan.kinds) - set(KINDS))
        if unknown or not plan.kinds:
            raise BadInput(_bad(source, text, f"kinds must be some of {'+'.join(KINDS)}, got {plan.kinds}"))
        if not 0.0 <= plan.rate <= 1.0 or plan.delay < 0 or plan.fail_after < 0:
            raise BadInput(_bad(source, text, "rate must lie in [0, 1], delay and fail_after be >= 0"))
        return plan


def _bad(source: str, text: str, why: str) -> str:
    return (
        f"{source}={text!r}: {why}; give comma-separated rate=<0..1>,seed=<int>,"
        f"kinds=<{'+'.join(KINDS)}>,delay=<seconds>,fail_after=<writes>"
    )


class FaultyTransport(Transport):
    """``inner`` with ``plan``'s faults. It presents the interface's defaults (no strided batches,
    host-side bounds checks), which every engine accepts."""

    name: ClassVar[str] = "faulty"

    def __init__(self, inner: Transport, plan: FaultPlan):
        self.inner, self.plan = inner, plan
        self._random = random.Random(plan.seed)
        self._peers = []
        self._fates: dict[Transfer, tuple[str, float]] = {}
        self.writes = 0
        self.injected = dict.fromkeys(KINDS, 0)

    # ---- passed through -------------------------------------------------------------------------
    def _pass_waker(self) -> None:
        """The driving thread sets ``waker`` on this transport (a plain attribute: compiled callers
        write it directly); the inner engine's thread calls its own, so it is handed on before every
        write."""
        if self.inner.waker is not self.waker:
            self.inner.waker = self.waker

    @property
    def wake_fd(self) -> int | None:
        return self.inner.wake_fd

    def collect(self) -> None:
        self._pass_waker()
        self.inner.collect()

    def describe(self) -> dict[str, Any]:
        out = self.inner.describe()
        out["faults"] = {"writes": self.writes, "injected": dict(self.injected), "rate": self.plan.rate,
                         "fail_after": self.plan.fail_after}
        return out

    def endpoint(self) -> bytes:
        return self.inner.endpoint()

    def _register(self, regions: list[MemoryRegion]) -> list[bytes]:
        return self.inner.register(regions)

    def connect(self, peer_id: str, endpoint: bytes, remote_regions: Sequence[bytes]) -> Peer:
        return self.inner.connect(peer_id, endpoint, remote_regions)

    def disconnect(self, peer: Peer) -> None:
        self.inner.disconnect(peer)

    def _release(self, peer: Any) -> None:
        self.inner.disconnect(peer)

    def close(self) -> None:
        self._fates.clear()
        self.inner.close()

    # ---- where faults happen --------------------------------------------------------------------
    def _start(self, peer: Peer, writes: Writes, overlap: bool) -> Transfer:
        self.writes += 1
        plan = self.plan
        if plan.fail_after and self.writes > plan.fail_after:
            self.injected["submit"] += 1
            raise TransferFailed(f"injected fault: engine broken after {plan.fail_after} writes")
        kind = ""
        if plan.rate and self._random.random() < plan.rate and len(self._fates) < MAX_TRACKED:
            kind = self._random.choice(plan.kinds)
            self.injected[kind] += 1
        if kind == "submit":
            raise TransferFailed("injected fault: write refused at submit")
        self._pass_waker()
        transfer = self.inner.write(peer, writes, overlap=overlap)
        if kind:
            self._fates[transfer] = (kind, time.monotonic() + plan.delay)
        return transfer

    def poll(self, transfer: Transfer) -> TransferState:
        state = self.inner.poll(transfer)
        fate = self._fates.get(transfer)
        if fate is None or state is TransferState.IN_PROGRESS:
            return state
        kind, due = fate
        if kind == "lose":
            return TransferState.IN_PROGRESS  # until the caller's deadline aborts it
        if kind == "delay" and time.monotonic() < due:
            return TransferState.IN_PROGRESS
        del self._fates[transfer]
        if kind == "corrupt" and state is TransferState.DONE:
            return transfer.fail(TransferFailed("injected fault: corrupted completion"))
        return state

    def abort(self, transfer: Transfer) -> None:
        self._fates.pop(transfer, None)
        self.inner.abort(transfer)
