"""The decode agent's prefill pods, by bootstrap address: which prefill ranks a room goes to.

sglang's router picks a prefill per request and hands decode that pod's bootstrap address: the pod's IP
and its ``sglang.ai/bootstrap-port`` annotation, which is the port the prefill *agent* serves
``/topology`` on (sglang's own bootstrap server is not started), so the address needs no mapping. The
engine passes it in ``Expect.bootstrap_addr``. This table holds one ``PrefillPod`` per address — the
configured one (``peer.bootstrapHost``/``bootstrapPort``) and those engines named, ``peer.maxPrefills``
in all — each with the ranks this decode rank needs there. A rank is a ``PrefillPeer`` keyed by its
control address and shared between pods, so one prefill reached by two addresses (the bootstrap
Service and its pod IP) is registered with once; a peer no pod names any more is handed back to be
dropped.

Topologies are read by the decode worker's watch thread (``refresh``: signed with the pairing key,
the answer proving it too) one pod after another, each read bounded by a heartbeat interval, and
applied on the worker thread (``results``). A pod an
engine named that cannot be read — nothing listens, it answers 401 because it holds another pairing
key, its answer is no full topology — comes back as failed with the reason, and is forgotten, so the
rooms waiting for it fail with that reason and a later room tries it afresh. Pairing stays what it
is: the registration's proof and the sealed ``Hello`` (``peerauth``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import MAX_RANKS
from ..errors import BadInput, PDPairError, WireFormatError
from .bootstrap import Topology, fetch_topology
from .control_sockets import tcp
from .peerauth import Pairing

MAX_ADDRESS = 262
"""Characters of a bootstrap address at most (a 253-character host name, ``:`` and a port)."""
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")


def bootstrap_address(text: str) -> str:
    """``host:port`` (or ``[v6]:port``) checked and normalised (host lower-case, IPv6 bracketed);
    ``BadInput`` naming the address and the form it must take."""
    fix = "expected host:port or [ipv6]:port, as sglang's bootstrap_addr"
    if not text or len(text) > MAX_ADDRESS:
        raise BadInput(f"bootstrap address {text[:64]!r}: {fix}")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"bootstrap address {text[:64]!r}: no port 1..65535; {fix}")
    if host.startswith("[") and host.endswith("]"):
        try:
            return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]:{int(port)}"
        except ValueError:
            raise BadInput(f"bootstrap address {text[:64]!r}: not an IPv6 address; {fix}") from None
    host = host.lower()
    labels = host.split(".")
    if not host or not set(host) <= _HOST_CHARS or any(not x or len(x) > 63 or x[0] == "-" for x in labels):
        raise BadInput(f"bootstrap address {text[:64]!r}: {host[:64]!r} is no host name or IPv4; {fix}")
    return f"{host}:{int(port)}"


def split_address(address: str) -> tuple[str, int]:
    """A normalised address's host (no brackets) and port."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(eq=False)
class PrefillPeer:
    rank: int
    label: str
    address: str
    agent: str
    instance: str
    host: str
    state: str = "registering"
    last_seen: float = 0.0
    last_register: float = 0.0
    auth: Pairing | None = None
    """The authenticated pairing (None: none yet, or a plain peer)."""
    attempt: list[bytes] | None = None
    """The registration attempt's frames, proof included (resent as they are until answered)."""
    attempt_time: float = 0.0


@dataclass(eq=False)
class PrefillPod:
    """One prefill pod, as one bootstrap address names it."""

    address: str
    configured: bool = False
    ranks: dict[int, PrefillPeer] = field(default_factory=dict)
    """The prefill ranks this decode rank needs there (and ``required`` in order)."""
    required: list[int] = field(default_factory=list)
    info_num: int = 1
    """sglang's ``required_dst_info_num``: decode ranks that each prefill rank serves for a room."""
    used: float = 0.0
    """``time.monotonic()`` of the last room named this pod."""
    failed: str = ""
    """Why the pod could not be read (it is out of the table; the rooms waiting for it fail)."""
    error: str = ""
    """The last read's error ('' after a good one)."""
    next_read: float = 0.0
    fetched: tuple[Topology | None, str] | None = None
    """The watch thread's latest read, not yet applied by the worker."""
    applied: Topology | None = None

    def ready(self) -> bool:
        return bool(self.required) and all(
            r in self.ranks and self.ranks[r].state == "paired" for r in self.required
        )


def plan_ranks(prefill_tp: int, decode_tp: int, decode_rank: int) -> tuple[list[int], int]:
    """The prefill ranks a decode rank reads from, and sglang's ``required_dst_info_num``."""
    ptp, dtp, d = prefill_tp, decode_tp, decode_rank
    if dtp >= ptp:
        return [d // (dtp // ptp)], dtp // ptp
    return list(range(d * (ptp // dtp), (d + 1) * (ptp // dtp))), 1


Fetch = Callable[[str, int, float, bytes | None], Topology]


class PrefillTable:
    def __init__(
        self, host: str, port: int, limit: int, key: bytes | None, idle: float,
        fetch: Fetch | None = None,
    ):
        """``idle``: seconds after its last room a named pod may be forgotten (a transfer timeout:
        every room it had has finished or expired by then)."""
        configured = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        with contextlib.suppress(BadInput):  # as an engine names it: naming it finds this pod
            configured = bootstrap_address(configured)
        self.configured = PrefillPod(configured, configured=True)
        self.pods: dict[str, PrefillPod] = {configured: self.configured}
        self.peers: dict[str, PrefillPeer] = {}
        """Every prefill rank of every pod, by control address."""
        self.limit, self.key, self.idle = limit, key, idle
        self.released: list[tuple[PrefillPeer, str]] = []
        """Peers no pod names any more since a pod was forgotten (``take_released``)."""
        self._fetch = fetch or (lambda h, p, t, k: fetch_topology(h, p, timeout=t, key=k))
        self._lock = threading.Lock()

    # ---- the worker thread ----------------------------------------------------------------------
    def pod(self, address: str, now: float) -> PrefillPod:
        """The pod ``address`` names ('' or the configured address: the configured pod), added when
        new; ``BadInput`` when ``limit`` pods are named and none has been idle for ``idle``."""
        pod = self.pods.get(address) if address else self.configured
        if pod is None:
            if len(self.pods) >= self.limit and not self._forget_idle(now):
                raise BadInput(
                    f"prefill {address}: this decode already pairs with {len(self.pods)} prefill pods, "
                    f"each named within {self.idle:.0f}s (peer.maxPrefills {self.limit}); raise it"
                )
            pod = PrefillPod(address)
            with self._lock:
                self.pods[address] = pod
        pod.used = now
        return pod

    def _forget_idle(self, now: float) -> bool:
        idle = [p for p in self.pods.values() if not p.configured and now - p.used > self.idle]
        if not idle:
            return False
        self.forget(min(idle, key=lambda p: p.used))
        return True

    def forget(self, pod: PrefillPod) -> None:
        """Drop ``pod``; the peers only it named go to ``released``."""
        with self._lock:
            self.pods.pop(pod.address, None)
        pod.ranks = {}
        self.released += self._unnamed()

    def take_released(self) -> list[tuple[PrefillPeer, str]]:
        out, self.released = self.released, []
        return out

    def _unnamed(self) -> list[tuple[PrefillPeer, str]]:
        """Take out the peers no pod names, each with the reason."""
        named = {id(p) for q in self.pods.values() for p in q.ranks.values()}
        out = []
        for address, peer in list(self.peers.items()):
            if id(peer) not in named:
                del self.peers[address]
                out.append((peer, f"prefill {peer.label} no longer named by a bootstrap address"))
        return out

    def results(self) -> list[tuple[PrefillPod, Topology | None, str]]:
        """The reads the watch thread made since the last call that change something: a topology
        not applied yet, or an error."""
        out = []
        with self._lock:
            for pod in self.pods.values():
                got, pod.fetched = pod.fetched, None
                if got is not None and (got[0] is None or got[0] is not pod.applied):
                    out.append((pod, *got))
        return out

    def place(self, pod: PrefillPod, topo: Topology, ranks: list[int]) -> list[tuple[PrefillPeer, str]]:
        """Point ``pod``'s ``ranks`` at the peers ``topo`` names (new ones made, shared ones reused);
        returns the peers to drop, each with the reason: replaced behind their control address
        (another instance), or named by no pod any more."""
        drop: list[tuple[PrefillPeer, str]] = []
        placed: dict[int, PrefillPeer] = {}
        for r in ranks:
            info = topo.rank(r)
            address = tcp(info.host, info.control_port)
            peer = self.peers.get(address)
            if peer is not None and peer.instance != info.instance:
                why = f"prefill rank {r} at {address} replaced (instance {peer.instance} → {info.instance})"
                drop.append((peer, why))
                del self.peers[address]
                peer = None
            if peer is None:
                label = self.label(r, info.host, info.control_port)
                peer = PrefillPeer(r, label, address, info.agent, info.instance, info.host)
                self.peers[address] = peer
            placed[r] = peer
        pod.applied, pod.required, pod.ranks = topo, ranks, placed  # whole: ``/status`` reads it
        return drop + self._unnamed()

    def label(self, rank: int, host: str, control_port: int) -> str:
        """``prefill-<rank>@<host>``, with the control port when another peer has that label."""
        plain = f"prefill-{rank}@{host}"
        if any(p.label == plain for p in self.peers.values()):
            return f"{plain}:{control_port}"
        return plain

    # ---- the watch thread -----------------------------------------------------------------------
    def refresh(self, now: float, interval: float, soon: float) -> None:
        """Read every pod that is due: each ``interval`` after a good read, ``soon`` after a failed
        one; a pod added since the last pass at once."""
        with self._lock:
            due = [p for p in self.pods.values() if p.next_read <= now]
        for pod in due:
            host, port = split_address(pod.address)
            try:
                got: tuple[Topology | None, str] = (_checked(self._fetch(host, port, interval, self.key)), "")
            except urllib.error.HTTPError as exc:
                got = (None, f"bootstrap {pod.address} answered {exc.code}: {_http_reason(exc)}")
            except (OSError, PDPairError) as exc:
                got = (None, f"bootstrap {pod.address}: {type(exc).__name__}: {exc}")
            with self._lock:
                pod.fetched, pod.error = got, got[1]
                pod.next_read = time.monotonic() + (interval if got[0] is not None else soon)

    def snapshot(self) -> dict[str, dict[str, object]]:
        with self._lock:
            pods = list(self.pods.values())
        return {
            p.address: {
                "configured": p.configured, "ready": p.ready(), "error": p.error,
                "ranks": {str(r): peer.label for r, peer in p.ranks.items()},
            }
            for p in pods
        }


def _checked(topo: Topology) -> Topology:
    """A topology whose TP size a decode can plan with (a power of two, as every agent's config)."""
    n = topo.tp_size
    if not 1 <= n <= MAX_RANKS or n & (n - 1):
        raise WireFormatError(f"topology names prefill TP size {n}: not a power of two from 1 to {MAX_RANKS}")
    return topo


def _http_reason(exc: urllib.error.HTTPError) -> str:
    """The agent's one-line reason from an error reply's body (its ``error``), else the status text."""
    try:
        body = json.loads(exc.read(4096) or b"{}")
    except (OSError, ValueError):
        body = {}
    why = body.get("error") if isinstance(body, dict) else None
    return str(why)[:512] if why else str(exc.reason)


__all__ = ["PrefillPeer", "PrefillPod", "PrefillTable", "bootstrap_address", "plan_ranks"]
