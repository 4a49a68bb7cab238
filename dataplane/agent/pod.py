"""One agent process for every rank of its pod: per-rank runtimes behind one set of pod endpoints.

An engine with TP N runs N scheduler processes, each with its own memory; the pod's agent serves all
of them with one ``AgentRuntime`` per rank (its own role worker, transport registration, control
socket and lane), composed here. The pod has one HTTP server (``/metrics`` with a ``tp_rank`` label on
every series, ``/status`` with a section per rank, ``/healthz``, ``/readyz``: ready only when every
rank is), one bootstrap endpoint on prefill listing every rank it runs (registered directly, no HTTP
to itself), and one pod condition that is ready only when every rank is.

Ranks come and go: in-process ranks are attached at start and stay; a sidecar's rank is attached when
its engine rank registers its pools and detached when that engine goes (``localapi.sidecar``). Until
a rank is attached the pod is not ready, and the bootstrap endpoint learns the schema (model, TP size,
components) from the first rank attached.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
from prometheus_client.exposition import generate_latest

from ..config import AgentConfig
from .bootstrap import BootstrapRegistry, announce_rank
from .health import ConditionReporter, public_status
from .http import AgentHttpServer, Handler, Reply, Request
from .httpauth import Verifier
from .metrics import CONTENT_TYPE
from .podhealth import PodConditions, RankedFamilies
from .runtime import AgentRuntime

log = logging.getLogger(__name__)


class PodAgent:
    """The pod's endpoints over its ranks' runtimes; ``ranks``: the TP ranks this process serves."""

    def __init__(
        self, cfg: AgentConfig, ranks: Sequence[int], *, reporter: ConditionReporter | None = None,
        extra_status: Callable[[], dict[str, Any]] | None = None,
    ):
        self.cfg, self.ranks = cfg, tuple(ranks)
        self.key = cfg.auth.read_key()
        self.instance = uuid.uuid4().hex[:12]
        self.conditions = PodConditions(reporter, self.ranks) if reporter is not None else None
        self.extra_status = extra_status or dict
        self.stop_event = threading.Event()
        self.servers: list[AgentHttpServer] = []
        self.registry: BootstrapRegistry | None = None
        self._lock = threading.Lock()
        self._runtimes: dict[int, AgentRuntime] = {}
        self._owned: list[AgentRuntime] = []
        self._serves_bootstrap = cfg.role == "prefill" and 0 in self.ranks

    def reporter(self, rank: int) -> ConditionReporter | None:
        """What rank ``rank``'s runtime reports its readiness to."""
        return self.conditions.for_rank(rank) if self.conditions is not None else None

    # ---- ranks ------------------------------------------------------------------------------
    def attach(self, rank: int, runtime: AgentRuntime, *, owned: bool = False) -> None:
        """``runtime`` (started without endpoints of its own) serves ``rank``; ``owned``: the pod
        stops it at ``stop``."""
        with self._lock:
            self._runtimes[rank] = runtime
            if owned:
                self._owned.append(runtime)
            if self._serves_bootstrap:
                info = runtime.rank_info()
                if self.registry is None:
                    schema = runtime.schema
                    comps = tuple((c.name, c.state_type) for c in schema.components)
                    self.registry = BootstrapRegistry(info, schema.tp_size, schema.model, comps)
                else:
                    self.registry.add(info)

    def detach(self, rank: int, reason: str) -> None:
        """Rank ``rank`` has no runtime any more (its engine went away)."""
        with self._lock:
            self._runtimes.pop(rank, None)
            if self.registry is not None and not self.registry.remove(rank):
                self.registry = None  # the next engine may bring another schema
        if self.conditions is not None:
            self.conditions.set(rank, False, "NoEngine", reason)

    def runtimes(self) -> dict[int, AgentRuntime]:
        with self._lock:
            return dict(self._runtimes)

    # ---- probes -----------------------------------------------------------------------------
    def alive(self) -> bool:
        """Every attached rank's worker runs."""
        return all(rt.worker.alive() for rt in self.runtimes().values())

    def waiting(self) -> list[str]:
        """Why each rank that is not ready is not ("" for none: the pod is ready)."""
        runtimes, out = self.runtimes(), []
        for r in self.ranks:
            rt = runtimes.get(r)
            if rt is None:
                out.append(f"rank {r}: no engine attached")
            elif not rt.status.ready:
                out.append(f"rank {r}: no paired peer")
        return out

    def snapshot(self, authenticated: bool = True) -> dict[str, Any]:
        """``/status``: the lowest attached rank's figures at the top (the whole pod for TP 1), every
        rank's under ``ranks``, and the pod's readiness."""
        runtimes = self.runtimes()
        view = (lambda s: s) if authenticated else public_status
        ranks: dict[str, Any] = {
            str(r): view(runtimes[r].status.snapshot()) if r in runtimes else {"attached": False}
            for r in self.ranks
        }
        first = next((str(r) for r in self.ranks if r in runtimes), None)
        top = dict(ranks[first]) if first is not None else {"role": self.cfg.role}
        top.update(self.extra_status())
        top.update(ready=not self.waiting(), tp_size=self.cfg.tp_size, ranks=ranks)
        return top

    def exposition(self) -> bytes:
        metrics = {r: rt.metrics for r, rt in self.runtimes().items()}
        return generate_latest(RankedFamilies(metrics))

    def routes(self) -> dict[tuple[str, str], Handler]:
        def healthz(_: Request) -> Reply:
            ok = self.alive()
            return Reply.json({"live": ok}, 200 if ok else 503)

        def readyz(_: Request) -> Reply:
            why = self.waiting()
            return Reply.json({"ready": True}) if not why else Reply.json(
                {"ready": False, "reason": "; ".join(why)}, 503
            )

        return {
            ("GET", "/healthz"): healthz,
            ("GET", "/readyz"): readyz,
            ("GET", "/status"): lambda req: Reply.json(self.snapshot(req.authenticated)),
            ("GET", "/metrics"): lambda _: Reply(200, self.exposition(), CONTENT_TYPE),
        }

    def _bootstrap_routes(self) -> dict[tuple[str, str], Handler]:
        plain = self.cfg.auth.allow_plain_peers

        def delegate(method: str, path: str) -> Handler:
            def handle(req: Request) -> Reply:
                registry = self.registry
                if registry is None:
                    return Reply.json({"error": "no engine rank attached yet"}, 503)
                return registry.routes(plain_peers=plain)[(method, path)](req)

            return handle

        return {k: delegate(*k) for k in (("GET", "/topology"), ("PUT", "/ranks"))}

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> PodAgent:
        listen = self.cfg.listen
        verifier = Verifier(self.key) if self.key is not None else None
        health = self.routes()
        self.servers.append(
            AgentHttpServer(listen.host, listen.metrics_port, health, "metrics", verifier).start()
        )
        if self._serves_bootstrap:
            routes = {**health, **self._bootstrap_routes()}
            self.servers.append(
                AgentHttpServer(listen.host, listen.bootstrap_port, routes, "bootstrap", verifier).start()
            )
        elif self.cfg.role == "prefill":
            threading.Thread(target=self._announce, name="pdpair-announce", daemon=True).start()
        return self

    def _announce(self) -> None:
        """Ranks of a prefill pod whose rank 0 another process runs (re-)announce themselves to it."""
        peer = self.cfg.peer
        while not self.stop_event.is_set():
            for rt in self.runtimes().values():
                info = rt.rank_info()
                try:
                    announce_rank(peer.bootstrap_host, peer.bootstrap_port, info, key=self.key)
                except OSError as exc:
                    log.debug("announcing rank %d: %s", info.rank, exc)
            self.stop_event.wait(self.cfg.transfer.heartbeat_interval_seconds)

    @property
    def ports(self) -> dict[str, Any]:
        """The lowest attached rank's ports at the top (as a one-rank agent's), every rank's under
        ``ranks``, and the pod's HTTP ports."""
        runtimes = self.runtimes()
        ranks = {str(r): rt.ports for r, rt in sorted(runtimes.items())}
        out: dict[str, Any] = dict(next(iter(ranks.values()), {}))
        out.update(
            metrics_port=self.servers[0].port if self.servers else None, host=self.cfg.listen.host,
            pid=os.getpid(), ranks=ranks, pod_instance=self.instance,
        )
        if len(self.servers) > 1:
            out["bootstrap_port"] = self.servers[1].port
        return out

    def write_ready_file(self, path: str | Path) -> None:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self.ports))
        tmp.replace(path)

    def stop(self) -> None:
        self.stop_event.set()
        for runtime in self._owned:
            runtime.stop()
        for server in self.servers:
            server.stop()


def group_room_bases(cfg: AgentConfig) -> list[int]:
    """A first room id per attention group of the pod: the ranks of one group serve the same
    requests (sglang's TP ranks run the same batch), each DP group its own."""
    return [random.getrandbits(40) << 20 for _ in range(cfg.dp_size)]


def start_in_process(
    cfg: AgentConfig, ranks: Sequence[int], *, reporter: ConditionReporter | None = None,
    wrap_transport: Callable[[Any], Any] | None = None, transport_sdk: ModuleType | None = None,
) -> PodAgent:
    """The pod with its own synthetic source: one runtime per rank, each started and attached
    (``transport_sdk``: as ``AgentRuntime``'s, e.g. the MoRI hardware test double)."""
    pod = PodAgent(cfg, ranks, reporter=reporter).start()  # the pod's ports first: a taken one stops here
    bases, group = group_room_bases(cfg), cfg.tp_size // cfg.dp_size
    try:
        for rank in ranks:
            ranked = cfg.for_rank(rank)
            if cfg.synthetic.room_base is None:
                syn = msgspec.structs.replace(cfg.synthetic, room_base=bases[rank // group])
                ranked = msgspec.structs.replace(ranked, synthetic=syn)
            rt = AgentRuntime(ranked, reporter=pod.reporter(rank), wrap_transport=wrap_transport,
                              transport_sdk=transport_sdk)
            pod.attach(rank, rt, owned=True)
            rt.start(serve=False)
        return pod
    except BaseException:
        pod.stop()
        raise


__all__ = ["PodAgent", "PodConditions", "start_in_process"]
