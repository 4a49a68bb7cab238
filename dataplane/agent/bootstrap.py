"""The prefill bootstrap endpoint: how decode finds prefill's ranks (like sglang's bootstrap server).

Prefill rank 0 serves ``GET /topology``: the prefill TP size, every rank's ZMQ control address and
process instance, the generation and a manifest summary. Ranks above 0 announce themselves with
``PUT /ranks`` (and re-announce every heartbeat interval, so a restarted rank 0 re-learns them).

Each process gets a fresh ``instance`` id when it starts: decode compares instances to notice a prefill
replaced behind the same bootstrap address (the sglang PR #34289 failure) and re-handshakes.
"""

from __future__ import annotations

import threading

import msgspec

from ..errors import WireFormatError
from .http import Handler, Reply, Request, get_json, put_json


class RankInfo(msgspec.Struct, frozen=True):
    rank: int
    host: str
    control_port: int
    instance: str
    agent: str = ""
    generation: str = ""


class Topology(msgspec.Struct, frozen=True):
    agent: str
    instance: str
    generation: str
    model: str
    tp_size: int
    ranks: tuple[RankInfo, ...]
    components: tuple[tuple[str, str], ...] = ()
    """(name, state type) per component, in order: enough for an operator to read, not for pairing."""

    @property
    def complete(self) -> bool:
        return sorted(r.rank for r in self.ranks) == list(range(self.tp_size))

    def rank(self, r: int) -> RankInfo:
        for info in self.ranks:
            if info.rank == r:
                return info
        raise WireFormatError(f"topology has no prefill rank {r} (ranks: {[i.rank for i in self.ranks]})")


_rank_decoder = msgspec.json.Decoder(RankInfo)
_topology_decoder = msgspec.json.Decoder(Topology)


class BootstrapRegistry:
    """Rank 0's view of the prefill ranks; serves ``/topology`` and accepts ``PUT /ranks``."""

    def __init__(self, me: RankInfo, tp_size: int, model: str, components: tuple[tuple[str, str], ...]):
        self._me, self._tp_size, self._model, self._components = me, tp_size, model, components
        self._lock = threading.Lock()
        self._ranks: dict[int, RankInfo] = {me.rank: me}

    def topology(self) -> Topology:
        with self._lock:
            ranks = tuple(self._ranks[r] for r in sorted(self._ranks))
        me = self._me
        return Topology(
            me.agent, me.instance, me.generation, self._model, self._tp_size, ranks, self._components
        )

    def announce(self, info: RankInfo) -> None:
        if not 0 < info.rank < self._tp_size:
            raise WireFormatError(f"rank {info.rank} out of range 1..{self._tp_size - 1}")
        if info.generation != self._me.generation:
            raise WireFormatError(
                f"rank {info.rank} generation {info.generation!r} ≠ {self._me.generation!r}"
            )
        with self._lock:
            self._ranks[info.rank] = info

    def routes(self) -> dict[tuple[str, str], Handler]:
        def topology(_: Request) -> Reply:
            return Reply(200, msgspec.json.encode(self.topology()))

        def ranks(req: Request) -> Reply:
            try:
                self.announce(_rank_decoder.decode(req.body))
            except (msgspec.DecodeError, msgspec.ValidationError, WireFormatError) as exc:
                return Reply.json({"error": str(exc)}, 400)
            return Reply.json({"ok": True})

        return {("GET", "/topology"): topology, ("PUT", "/ranks"): ranks}


def fetch_topology(host: str, port: int, timeout: float = 2.0) -> Topology:
    """Decode's query; raises ``WireFormatError`` on a malformed answer, ``OSError`` when unreachable."""
    raw = get_json(f"http://{host}:{port}/topology", timeout=timeout)
    try:
        return _topology_decoder.decode(msgspec.json.encode(raw))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireFormatError(f"bootstrap {host}:{port}: bad topology: {exc}") from exc


def announce_rank(host: str, port: int, info: RankInfo, timeout: float = 2.0) -> None:
    put_json(f"http://{host}:{port}/ranks", msgspec.to_builtins(info), timeout=timeout)
