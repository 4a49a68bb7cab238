"""Wiring: config → schema → pools → transport → role worker → HTTP servers, and orderly shutdown.

``AgentRuntime`` is what ``pdpair-agent run`` drives and what tests and library users embed: it takes
an ``AgentConfig`` and, optionally, pre-made pools (adopted engine memory), a transport, the engine SDK
module the configured transport should use instead of importing its own (``transport_sdk``: how tests
run ``backend: mori`` through ``dataplane.transports.mori_double``, the MoRI hardware test double,
without patching anything), a wrapper around the transport (``wrap_transport``: the fault matrix's
injected faults) and a pod-condition reporter. ``start`` returns once every listener is bound;
``ports`` then says where (ports 0 in the config pick free ones).

One runtime is one TP rank. Started on its own (``start()``) it is a whole agent: its own HTTP
endpoints, and on prefill rank 0 the bootstrap endpoint (ranks above 0 announce themselves to it).
As a rank of a pod (``start(serve=False)``) it runs only its worker, and ``agent.pod.PodAgent``
serves the endpoints of all the pod's ranks.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import zmq

from ..config import AgentConfig
from ..errors import BadInput
from ..room import Tracer
from ..schema import RoleSchema
from ..schema.profiles import schema_from_config
from ..transports import Transport
from ..transports.netdevs import net_devices_for
from .bootstrap import BootstrapRegistry, RankInfo, announce_rank
from .decode import DecodeWorker
from .health import PEER_REFUSALS_CONDITION, AgentStatus, ConditionReporter
from .http import AgentHttpServer
from .httpauth import Verifier
from .metrics import CONTENT_TYPE, AgentMetrics
from .pools import MemoryPools
from .prefill import PrefillWorker
from .roles import RoleWorker
from .staging_memory import StagingMemory, staging_enabled
from .tracing import room_tracer

log = logging.getLogger(__name__)


def make_transport(cfg: AgentConfig, engine_name: str, sdk: ModuleType | None = None) -> Transport:
    """The configured engine; its SDK is imported only here, lazily — or ``sdk`` is used instead."""
    if cfg.transfer.backend == "cuda-ipc":
        if cfg.transfer.device != "cuda":
            raise BadInput("transfer.backend cuda-ipc moves GPU memory: it needs transfer.device cuda")
        from ..transports.cuda_ipc import CudaIpcTransport

        return CudaIpcTransport(cfg.transfer.gpu_id)
    if cfg.transfer.backend == "mori":
        from ..transports.mori import MoriTransport, rdma_environment

        os.environ.update(rdma_environment(cfg.transfer.mori))  # the agent's process: MoRI's NICs
        return MoriTransport(engine_name, cfg.listen.host, cfg.transfer.mori, sdk=sdk)
    from ..transports.nixl import NixlTransport, ucx_environment

    nixl = cfg.transfer.nixl.for_role(cfg.role, cfg.transfer.device)
    if nixl.ucx_net_devices is None:  # UCX listens only where the agent does (``transports.netdevs``)
        nixl = msgspec.structs.replace(nixl, ucx_net_devices=net_devices_for(cfg.listen.host))
    if cfg.transfer.device == "cuda":  # VRAM copies run on the GPU: no posting thread, no shared agent
        nixl = msgspec.structs.replace(nixl, post_thread=False)
    # The agent's process, where UCX's settings belong: UCX reads them when the backend is made.
    os.environ.update(ucx_environment(nixl))
    return NixlTransport(engine_name, nixl, sdk=sdk)


class AgentRuntime:
    def __init__(
        self,
        cfg: AgentConfig,
        *,
        schema: RoleSchema | None = None,
        pools: MemoryPools | None = None,
        transport: Transport | None = None,
        reporter: ConditionReporter | None = None,
        worker_factory: Callable[..., RoleWorker] | None = None,
        transport_sdk: ModuleType | None = None,
        wrap_transport: Callable[[Transport], Transport] | None = None,
        tracer: Tracer | None = None,
    ):
        self.cfg = cfg
        self.key = cfg.auth.read_key()
        """The PDPair's pairing key (None: none configured): signs and checks the HTTP requests."""
        self.instance = uuid.uuid4().hex[:12]
        pod = cfg.identity.pod_name
        self.name = f"{pod}-r{cfg.tp_rank}" if pod and cfg.tp_size > 1 else pod or f"{cfg.role}-{cfg.tp_rank}"
        self.agent_id = f"{self.name}@{self.instance}"
        self.schema = schema or (pools.schema if pools else schema_from_config(cfg.attention_view()))
        self.pools = pools or MemoryPools.allocate(
            self.schema, cfg.transfer.device, cfg.transfer.gpu_id, arena=staging_enabled(cfg),
            prefault=cfg.model.prefault,
        )
        # The staged path's buffers are registered right after the pools' regions (region ids follow).
        self.staging = StagingMemory.for_agent(cfg, self.pools)
        self.transport = transport or make_transport(cfg, self.agent_id, transport_sdk)
        if wrap_transport is not None:  # the fault matrix's ``FaultyTransport`` (``transports.faulty``)
            self.transport = wrap_transport(self.transport)
        try:
            self._build(cfg, reporter, worker_factory, tracer or room_tracer(cfg.role))
        except BaseException:
            # An engine that reconnects after every failure must not leak a transport's threads each time.
            ctx = getattr(self, "ctx", None)
            if ctx is not None:
                ctx.destroy(linger=0)
            self.transport.close()
            raise
        self.status.set_probes(self.worker.alive, self.worker.snapshot)
        self.stop_event = threading.Event()
        self.servers: list[AgentHttpServer] = []
        self.registry: BootstrapRegistry | None = None

    def _build(
        self, cfg: AgentConfig, reporter: ConditionReporter | None,
        worker_factory: Callable[..., RoleWorker] | None,
        tracer: Tracer,
    ) -> None:
        """Register the memory and make the worker (the caller closes the transport if this fails)."""
        staging_regions = self.staging.regions() if self.staging is not None else []
        blobs = self.transport.register(self.pools.memory_regions() + staging_regions)
        self.metrics = AgentMetrics(cfg.role, self.name)
        sibling = getattr(reporter, "sibling", None)  # PodStatusReporter: the same pod's other condition
        refusals = sibling(PEER_REFUSALS_CONDITION) if sibling is not None else None
        self.status = AgentStatus(cfg.role, self.name, self.instance, reporter, refusals)
        self.ctx = zmq.Context()
        # worker_factory: the sidecar's hook (dataplane.localapi): rooms from a serving engine.
        role_cls: Callable[..., RoleWorker] = worker_factory or (
            PrefillWorker if cfg.role == "prefill" else DecodeWorker
        )
        self.worker = role_cls(
            cfg,
            self.schema,
            self.pools,
            self.transport,
            self.metrics,
            self.status,
            ctx=self.ctx,
            name=self.name,
            instance=self.instance,
            blobs=blobs,
            staging=self.staging,
            tracer=tracer,
        )

    def rank_info(self) -> RankInfo:
        """This rank as the bootstrap endpoint lists it."""
        return RankInfo(
            self.cfg.tp_rank,
            self.cfg.listen.host,
            self.worker.inbox.port,
            self.instance,
            self.agent_id,
            self.cfg.identity.generation,
        )

    def start(self, *, serve: bool = True) -> AgentRuntime:
        """Start the worker and, with ``serve``, this rank's own HTTP endpoints (a pod's rank: off)."""
        if serve:
            self._serve()
        self.worker.start(self.stop_event)
        log.info("agent %s (%s) up: %s", self.agent_id, self.cfg.role, json.dumps(self.ports))
        return self

    def _serve(self) -> None:
        listen = self.cfg.listen
        health = self.status.routes(self.metrics.exposition, CONTENT_TYPE)
        verifier = Verifier(self.key) if self.key is not None else None
        self.servers.append(
            AgentHttpServer(listen.host, listen.metrics_port, health, "metrics", verifier).start()
        )
        if self.cfg.role == "prefill" and self.cfg.tp_rank == 0:
            comps = tuple((c.name, c.state_type) for c in self.schema.components)
            self.registry = BootstrapRegistry(
                self.rank_info(), self.schema.tp_size, self.schema.model, comps
            )
            routes = {**health, **self.registry.routes(plain_peers=self.cfg.auth.allow_plain_peers)}
            self.servers.append(
                AgentHttpServer(listen.host, listen.bootstrap_port, routes, "bootstrap", verifier).start()
            )
        elif self.cfg.role == "prefill":
            threading.Thread(target=self._announce, name="pdpair-announce", daemon=True).start()

    def _announce(self) -> None:
        """Prefill ranks above 0 (re-)announce themselves to rank 0's bootstrap endpoint."""
        peer, info = self.cfg.peer, self.rank_info()
        while not self.stop_event.is_set():
            try:
                announce_rank(peer.bootstrap_host, peer.bootstrap_port, info, key=self.key)
            except OSError as exc:
                log.debug("announcing rank %d: %s", info.rank, exc)
            self.stop_event.wait(self.cfg.transfer.heartbeat_interval_seconds)

    @property
    def ports(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "control_port": self.worker.inbox.port,
            "lane_port": self.worker.lanes.port if self.worker.lanes is not None else None,
            "metrics_port": self.servers[0].port if self.servers else None,
            "instance": self.instance,
            "agent": self.agent_id,
            "pid": os.getpid(),
            "host": self.cfg.listen.host,
            "tp_rank": self.cfg.tp_rank,
        }
        if len(self.servers) > 1:
            out["bootstrap_port"] = self.servers[1].port
        return out

    def write_ready_file(self, path: str | Path) -> None:
        """Atomically publish ``ports`` (tests and the demo wait for this file)."""
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self.ports))
        tmp.replace(path)

    def wait(self, timeout: float | None = None) -> bool:
        return self.stop_event.wait(timeout)

    def stop(self) -> None:
        self.stop_event.set()
        if self.worker.thread is not None:
            self.worker.thread.join(timeout=10)
        for server in self.servers:
            server.stop()
        self.transport.close()
        self.ctx.destroy(linger=0)
        log.info("agent %s stopped", self.agent_id)
