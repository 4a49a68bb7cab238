"""The prefill bootstrap endpoint: how decode finds prefill's ranks (like sglang's bootstrap server).

The prefill pod's agent serves ``GET /topology``: the prefill TP size, every rank's ZMQ control
address and process instance, the generation and a manifest summary. The ranks it runs itself are
listed directly (``add`` / ``remove``); a rank run by another agent process (``pdpair-agent run
--tp-rank R``) announces itself with ``PUT /ranks`` and re-announces every heartbeat interval, so a
restarted rank 0 re-learns it.

Each process gets a fresh ``instance`` id when it starts: decode compares instances to notice a prefill
replaced behind the same bootstrap address (the sglang PR #34289 failure) and re-handshakes.

With a pairing key both endpoints are for key holders (``httpauth``): ``PUT /ranks`` needs a signed
request, and an unsigned ``GET /topology`` gets only the public part (``PublicTopology``: model, TP
size, generation, whether every rank is known) — no address, agent id or instance to aim at —
unless the PDPair admits plain sglang peers (``auth.allowPlainPeers``), which cannot sign.
"""

from __future__ import annotations

import threading

import msgspec

from ..errors import WireFormatError
from .http import Handler, Reply, Request, get_json, put_json
from .httpauth import HEADER


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


class PublicTopology(msgspec.Struct, frozen=True):
    """What ``/topology`` tells a caller that did not prove the pairing key."""

    model: str
    generation: str
    tp_size: int
    complete: bool
    components: tuple[tuple[str, str], ...] = ()


_rank_decoder = msgspec.json.Decoder(RankInfo)
_topology_decoder = msgspec.json.Decoder(Topology)


class BootstrapRegistry:
    """The pod's view of the prefill ranks; serves ``/topology`` and accepts ``PUT /ranks``."""

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

    def add(self, info: RankInfo) -> None:
        """A rank this process runs (any rank of the TP group)."""
        if not 0 <= info.rank < self._tp_size:
            raise WireFormatError(f"rank {info.rank} out of range 0..{self._tp_size - 1}")
        with self._lock:
            self._ranks[info.rank] = info

    def remove(self, rank: int) -> bool:
        """Forget ``rank`` (its engine went away); whether any rank is left."""
        with self._lock:
            self._ranks.pop(rank, None)
            return bool(self._ranks)

    def announce(self, info: RankInfo) -> None:
        if not 0 < info.rank < self._tp_size:
            raise WireFormatError(f"rank {info.rank} out of range 1..{self._tp_size - 1}")
        if info.generation != self._me.generation:
            raise WireFormatError(
                f"rank {info.rank} generation {info.generation!r} ≠ {self._me.generation!r}"
            )
        with self._lock:
            self._ranks[info.rank] = info

    def routes(self, plain_peers: bool = False) -> dict[tuple[str, str], Handler]:
        """``plain_peers``: the PDPair admits plain sglang peers, which cannot sign, so an unsigned
        ``GET /topology`` gets the ranks' addresses too."""

        def topology(req: Request) -> Reply:
            topo = self.topology()
            if req.authenticated or plain_peers:
                return Reply(200, msgspec.json.encode(topo))
            public = PublicTopology(topo.model, topo.generation, topo.tp_size, topo.complete, topo.components)
            return Reply(200, msgspec.json.encode(public))

        def ranks(req: Request) -> Reply:
            if not req.authenticated:
                why = f"PUT /ranks needs {HEADER} signed with the PDPair's pairing key"
                return Reply.json({"error": why}, 401)
            try:
                self.announce(_rank_decoder.decode(req.body))
            except (msgspec.DecodeError, msgspec.ValidationError, WireFormatError) as exc:
                return Reply.json({"error": str(exc)}, 400)
            return Reply.json({"ok": True})

        return {("GET", "/topology"): topology, ("PUT", "/ranks"): ranks}


def fetch_topology(host: str, port: int, timeout: float = 2.0, key: bytes | None = None) -> Topology:
    """Decode's query, signed with ``key`` (the pairing key, when the PDPair has one), whose answer
    must prove the key as well; raises ``WireFormatError`` on a malformed or unproven answer,
    ``OSError`` when unreachable or refused."""
    raw = get_json(f"http://{host}:{port}/topology", timeout=timeout, key=key, proven=True)
    if isinstance(raw, dict) and "ranks" not in raw and "complete" in raw:
        raise WireFormatError(
            f"bootstrap {host}:{port} gave only its public topology: "
            "set auth.keyFile to the PDPair's pairing key"
        )
    try:
        return _topology_decoder.decode(msgspec.json.encode(raw))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireFormatError(f"bootstrap {host}:{port}: bad topology: {exc}") from exc


def announce_rank(
    host: str, port: int, info: RankInfo, timeout: float = 2.0, key: bytes | None = None
) -> None:
    put_json(f"http://{host}:{port}/ranks", msgspec.to_builtins(info), timeout=timeout, key=key)
