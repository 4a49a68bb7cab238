"""The sidecar agent of a pod: one local API socket, one engine connection per TP rank.

``SidecarPod`` is the ``server.EngineRouter`` of the pod's socket: a connection's ``Hello`` names its
rank (``tp_rank``) and gets that rank's ``sidecar.Sidecar``; a second connection for a rank already
connected gets ``Error(busy)`` naming the rank, and a rank the agent does not serve (outside
``tpSize``, or not the ``--tp-rank`` it was started for) ``Error(bad_request)``. Each rank that
registers its pools joins the pod's endpoints (``agent.pod.PodAgent``); the ready file lists the
ports once every rank has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..agent.pod import PodAgent
from ..config import AgentConfig
from ..errors import LocalApiError
from .messages import Hello
from .server import EngineHandler, LocalApiServer
from .sidecar import Sidecar

log = logging.getLogger(__name__)
SPARE_CONNECTIONS = 4
"""Connections beyond one per rank the socket holds open at once (a restarting rank's next
connection, a stray client): more are refused at once."""


class SidecarPod:
    def __init__(
        self, cfg: AgentConfig, ranks: Sequence[int], *, reporter: Any = None,
        ready_file: str | Path | None = None,
    ):
        self.cfg, self.ranks, self.ready_file = cfg, tuple(ranks), ready_file
        engine = cfg.localapi.engine
        self.server = LocalApiServer(
            engine.socket_path, self, engine.max_frame_bytes, engine.allowed_uids, engine.socket_group,
            max_connections=len(self.ranks) + SPARE_CONNECTIONS,
        )
        server = self.server
        self.pod = PodAgent(
            cfg, self.ranks, reporter=reporter,
            extra_status=lambda: {"local_api": {"refused": server.refused}},
        )
        self.sidecars = {
            r: Sidecar(cfg.for_rank(r), pod=self.pod, on_change=self._changed) for r in self.ranks
        }
        self._lock = threading.Lock()
        self._ready_lock = threading.Lock()
        self._taken: dict[int, bool] = dict.fromkeys(self.ranks, False)

    # ---- EngineRouter -------------------------------------------------------------------------
    def route(self, msg: Hello, current: EngineHandler | None) -> EngineHandler:
        sidecar: Sidecar | None = self.sidecars.get(msg.tp_rank)
        if current is not None and current is not sidecar:
            held = getattr(current, "rank", "?")
            raise LocalApiError(
                "bad_request", f"this connection is engine rank {held}; a connection keeps its first rank"
            )
        if current is not None:
            return current
        if sidecar is None:
            served = ", ".join(map(str, self.ranks))
            raise LocalApiError(
                "bad_request",
                f"engine rank {msg.tp_rank} is not served here (this agent serves {self.cfg.role} ranks "
                f"{served} of tpSize {self.cfg.tp_size})",
            )
        with self._lock:
            if self._taken[msg.tp_rank]:
                raise LocalApiError(
                    "busy", f"engine rank {msg.tp_rank} is already connected; one connection per rank"
                )
            self._taken[msg.tp_rank] = True
        return sidecar

    def release(self, handler: EngineHandler) -> None:
        rank = getattr(handler, "rank", None)
        with self._lock:
            if rank in self._taken:
                self._taken[rank] = False

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> SidecarPod:
        self.pod.start()
        self.server.start()
        return self

    def _changed(self) -> None:
        """A rank attached or detached: the ready file lists the ports while every rank is attached."""
        if not self.ready_file:
            return
        with self._ready_lock:
            if len(self.pod.runtimes()) == len(self.ranks):
                self.pod.write_ready_file(self.ready_file)
            else:
                Path(self.ready_file).unlink(missing_ok=True)

    def alive(self) -> bool:
        return all(s.worker_alive() for s in self.sidecars.values())

    def stop(self) -> None:
        self.server.stop()
        for sidecar in self.sidecars.values():
            sidecar.stop()
        self.pod.stop()
        if self.ready_file:
            Path(self.ready_file).unlink(missing_ok=True)


def serve(
    cfg: AgentConfig, ranks: Sequence[int], *, reporter: Any = None, ready_file: str | None = None
) -> int:
    """``pdpair-agent run`` in sidecar mode (``localapi.engine.mode: external``): serve until SIGTERM."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    pod = SidecarPod(cfg, ranks, reporter=reporter, ready_file=ready_file).start()
    crashed = False
    while not stop.wait(0.5):
        if not pod.alive():
            log.error("a rank's worker thread died; exiting")
            crashed = True
            break
    pod.stop()
    return 1 if crashed else 0


__all__ = ["SidecarPod", "serve"]
