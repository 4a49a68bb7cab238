"""The agent as a sidecar: one engine rank's memory and requests drive that rank's agent runtime.

``Sidecar`` is the local API's handler for one TP rank (``ranks.SidecarPod`` routes each engine
connection to its rank's). Lifecycle, one engine connection at a time per rank:

1. ``Hello``: the version must be ours, the role the agent's, the ranks consistent with the manifest,
   and the engine's manifest must describe the agent's configured schema (same model, TP, page size,
   KV and components) — else ``Error``. An agent configured with no model layout adopts the engine's
   (``engine_schema``): the manifest is then checked for bounds here and for content at step 2.
2. ``RegisterPools``: map the engine's regions, adopt them as the agent's pools, and start an
   ``AgentRuntime`` on them, its role worker taking rooms from the engine (``sources``): the
   transport registers every region, the rank's control socket and lane come up and the rank joins
   the pod's endpoints (``agent.pod.PodAgent``: bootstrap, metrics, status), decode pairs with prefill.
3. Requests flow through ``EngineLink`` to the worker; room states flow back.
4. The engine disconnects (or dies): every room fails with ``engine disconnected`` (peers are told),
   the rank leaves the pod's endpoints, the runtime stops (the transport deregisters the memory), the
   mappings are unmapped, and the rank waits for its engine to come back and start again at 1.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ..agent import AgentRuntime, MemoryPools
from ..agent.decode import DecodeWorker
from ..agent.pod import PodAgent
from ..agent.prefill import PrefillWorker
from ..agent.roles import RoleWorker
from ..codec import Manifest, decode_manifest, manifest_from_schema
from ..config import AgentConfig
from ..errors import LocalApiError, PDPairError
from ..schema import RoleSchema
from ..schema.profiles import schema_from_config
from ..transports import Transport
from .engine_schema import check_manifest_bounds, schema_from_engine
from .link import Command, DetachCmd, EngineLink
from .mapping import MappedPools, map_pools
from .messages import LOCALAPI_VERSION, Hello, PoolRegion, RoomState
from .server import Session
from .sources import EngineDecodeSource, EnginePrefillSource

log = logging.getLogger(__name__)
DETACH_WAIT = 5.0
UNMAP_WAIT = 5.0


def manifest_mismatch(mine: Manifest, theirs: Manifest) -> str:
    """Empty if the engine's manifest describes the agent's schema; else the first difference."""
    for field in ("role", "model", "tp_size", "tp_rank", "page_size", "kv", "components"):
        a, b = getattr(mine, field), getattr(theirs, field)
        if a != b:
            return f"{field}: agent has {msgspec.to_builtins(a)!r}, engine has {msgspec.to_builtins(b)!r}"
    return ""


def configured_schema(cfg: AgentConfig) -> RoleSchema | None:
    """The schema ``cfg`` names (a profile, or explicit KV and components); None: the engine's."""
    if cfg.model.profile is None and cfg.model.kv_item_len is None:
        return None
    return schema_from_config(cfg.attention_view())


def engine_manifest(msg: Hello) -> Manifest:
    """The ``Hello``'s manifest, decoded, bounded, and consistent with the ranks it names."""
    try:
        m = decode_manifest(msg.manifest)
    except PDPairError as exc:
        raise LocalApiError("bad_request", f"engine manifest: {exc}") from None
    check_manifest_bounds(m)
    if msg.tp_rank >= msg.tp_size or msg.tp_size % msg.dp_size:
        raise LocalApiError(
            "bad_request",
            f"engine tp_rank {msg.tp_rank}, tp_size {msg.tp_size}, dp_size {msg.dp_size}: the rank must be "
            "below tp_size and dp_size must divide tp_size",
        )
    attn = msg.tp_size // msg.dp_size
    if (m.tp_size, m.tp_rank) != (attn, msg.tp_rank % attn) or m.role != msg.role:
        raise LocalApiError(
            "bad_request",
            f"engine manifest is {m.role} rank {m.tp_rank} of {m.tp_size}, its Hello {msg.role} rank "
            f"{msg.tp_rank} of {msg.tp_size} with dp_size {msg.dp_size} (attention TP rank "
            f"{msg.tp_rank % attn} of {attn})",
        )
    return m


def _unmap(mapped: MappedPools) -> bool:
    """Unmap once the runtime's last threads (they exit within one poll interval of stop) let go."""
    deadline = time.monotonic() + UNMAP_WAIT
    while not mapped.close():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def external_worker(*args: Any, link: EngineLink, **kwargs: Any) -> RoleWorker:
    """``AgentRuntime``'s worker factory in sidecar mode: the role's worker (``RoleWorker``'s arguments),
    joined to the engine's ``link``."""
    cfg: AgentConfig = args[0]
    if cfg.role == "prefill":
        return PrefillWorker(*args, source=EnginePrefillSource(link), **kwargs)
    return DecodeWorker(*args, source=EngineDecodeSource(link), **kwargs)


class Sidecar:
    """``cfg``: the rank's config (``AgentConfig.for_rank``); ``pod``: the pod whose endpoints the
    rank joins once attached (None: the runtime serves endpoints of its own)."""

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        schema: RoleSchema | None = None,
        transport_factory: Callable[[], Transport] | None = None,
        reporter: Any = None,
        pod: PodAgent | None = None,
        on_change: Callable[[], None] | None = None,
    ):
        syn = msgspec.structs.replace(cfg.synthetic, enabled=False, verify=False)
        self.cfg = msgspec.structs.replace(cfg, synthetic=syn)
        self.rank = cfg.tp_rank
        self.configured = schema or configured_schema(cfg)
        """The schema the config names; None: the engine's (``engine_schema``), known at ``register``."""
        self.manifest = (
            manifest_from_schema(self.configured, role=cfg.role, generation=cfg.identity.generation)
            if self.configured is not None
            else None
        )
        self._schema = self.configured
        self._engine_manifest: Manifest | None = None
        self.transport_factory, self.reporter, self.pod = transport_factory, reporter, pod
        self.on_change = on_change or (lambda: None)
        """Called after the rank attached or detached (the pod's ready file follows)."""
        self.link = EngineLink()
        self.runtime: AgentRuntime | None = None
        self.mapped: MappedPools | None = None
        self.engine_id = ""
        self.attached = threading.Event()
        self._lock = threading.Lock()

    @property
    def schema(self) -> RoleSchema:
        """The schema requests are checked against: the configured one, or the attached engine's."""
        if self._schema is None:
            raise LocalApiError("not_registered", "register the pools before sending requests")
        return self._schema

    # ---- EngineHandler ------------------------------------------------------------------------
    def hello(self, msg: Hello) -> str:
        if msg.version != LOCALAPI_VERSION:
            theirs, ours = msg.version, LOCALAPI_VERSION
            raise LocalApiError("version", f"engine speaks local API v{theirs}, agent v{ours}")
        if msg.role != self.cfg.role:
            raise LocalApiError("role", f"engine is {msg.role}, this agent is {self.cfg.role}")
        cfg = self.cfg
        if (msg.tp_size, msg.dp_size) != (cfg.tp_size, cfg.dp_size):
            raise LocalApiError(
                "incompatible",
                f"engine has tp_size {msg.tp_size}, dp_size {msg.dp_size}; this agent serves "
                f"{cfg.role}.tpSize {cfg.tp_size}, {cfg.role}.dpSize {cfg.dp_size}",
            )
        manifest = engine_manifest(msg)
        why = manifest_mismatch(self.manifest, manifest) if self.manifest is not None else ""
        if why:
            raise LocalApiError("incompatible", f"engine schema differs from the agent's: {why}")
        with self._lock:
            self._teardown("engine reconnected")
            self.engine_id = msg.engine_id
            self.link = EngineLink()
            self._engine_manifest = manifest
        self.on_change()
        log.info("engine %s (pid %d) connected", msg.engine_id, msg.pid)
        return f"{self.cfg.identity.pod_name or self.cfg.role}-agent"

    def connected(self, push: Callable[[Sequence[RoomState]], None]) -> None:
        self.link.set_push(push)

    def register(self, regions: Sequence[PoolRegion], fds: list[int]) -> None:
        with self._lock:
            # the same connection stays: its push must reach the next runtime's rooms too
            self._teardown("engine re-registered its pools", keep_push=True)
            schema = self._schema_for(regions, fds)
            mapped = map_pools(schema, regions, fds)
            try:
                self._schema = schema
                self.runtime = self._runtime(mapped)
            except BaseException:
                self._schema = self.configured
                mapped.close()
                raise
            self.mapped = mapped
            self.attached.set()
            agent_id = self.runtime.agent_id
        self.on_change()
        log.info("engine %s registered %d regions; agent %s up", self.engine_id, len(regions), agent_id)

    def _schema_for(self, regions: Sequence[PoolRegion], fds: list[int]) -> RoleSchema:
        """The configured schema, or the one the engine's manifest and regions describe (on an error
        the descriptors, which ``map_pools`` would have taken, are closed here)."""
        if self.configured is not None:
            return self.configured
        try:
            if self._engine_manifest is None:  # the server passes RegisterPools only after a Hello
                raise LocalApiError("no_hello", "the first message on a connection must be Hello")
            return schema_from_engine(self._engine_manifest, regions)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def _runtime(self, mapped: MappedPools) -> AgentRuntime:
        schema = self.schema
        pools = MemoryPools(schema, mapped.buffers, mapped.device, mapped.device_id)  # type: ignore[arg-type]
        runtime = AgentRuntime(
            self.cfg,
            schema=schema,
            pools=pools,
            transport=self.transport_factory() if self.transport_factory else None,
            reporter=self.pod.reporter(self.rank) if self.pod is not None else self.reporter,
            worker_factory=functools.partial(external_worker, link=self.link),
        )
        runtime.start(serve=self.pod is None)
        if self.pod is not None:
            self.pod.attach(self.rank, runtime)
        return runtime

    def submit(self, cmd: Command) -> None:
        if self.runtime is None:
            raise LocalApiError("not_registered", "register the pools before sending requests")
        self.link.submit(cmd)

    def state(self, room: int) -> RoomState:
        return self.link.state(room)

    def lend(self, session: Session) -> bool:
        with self._lock:
            if self.runtime is None:
                return False
            self.link.lend(session)
            return True

    def disconnected(self, reason: str) -> None:
        log.warning("engine %s (rank %d): %s", self.engine_id, self.rank, reason)
        with self._lock:
            self._teardown(reason)
        self.on_change()

    # ---- teardown -----------------------------------------------------------------------------
    def _teardown(self, reason: str, keep_push: bool = False) -> None:
        """Fail every room, stop the runtime (deregisters memory), unmap (caller holds the lock).
        ``keep_push``: the engine's connection outlives this runtime (a re-registration on it)."""
        runtime, self.runtime = self.runtime, None
        self._schema = self.configured
        self.attached.clear()
        if runtime is not None:
            if self.pod is not None:
                self.pod.detach(self.rank, reason)
            detach = DetachCmd(reason)
            self.link.submit(detach)
            if not detach.done.wait(DETACH_WAIT):
                log.error("worker did not fail its rooms within %.0fs", DETACH_WAIT)
            if not keep_push:
                self.link.set_push(None)
            runtime.stop()
        del runtime
        mapped, self.mapped = self.mapped, None
        if mapped is not None and not _unmap(mapped):
            log.error("engine memory still referenced %.0fs after stop; mapped until released", UNMAP_WAIT)

    def stop(self) -> None:
        with self._lock:
            self._teardown("agent stopping")

    def worker_alive(self) -> bool:
        """True while no engine is attached or the attached runtime's worker runs. Holds no reference
        to the runtime (one held here would keep the engine's memory mapped past a detach)."""
        with self._lock:
            return self.runtime is None or self.runtime.worker.alive()


__all__ = ["PDPairError", "Sidecar", "configured_schema", "engine_manifest", "manifest_mismatch"]
