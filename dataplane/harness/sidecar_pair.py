"""Start sidecar pairs as real processes on loopback: per role, an agent (``pdpair-agent run`` with
``localapi.engine.mode: external``) and a synthetic engine (``pdpair-agent engine``) sharing a socket
in a scratch directory — two processes per role, as two containers of a pod. The demo, the sidecar
benchmark and the integration tests share this.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..agent.pod import group_room_bases
from ..compiled import child as compiled_child
from ..config import AgentConfig
from ..errors import PDPairError
from .agent_processes import AgentProcess, loopback_pair, stop_process, tail


def external(cfg: AgentConfig, socket_path: Path) -> AgentConfig:
    """``cfg`` in sidecar mode on ``socket_path`` (its other local API settings kept)."""
    return cfg.with_engine(mode="external", socket_path=str(socket_path))


def no_layout(cfg: AgentConfig) -> AgentConfig:
    """``cfg`` naming no model layout (no profile, no explicit KV): a sidecar agent adopts its engine's."""
    model = msgspec.structs.replace(cfg.model, profile=None, kv_item_len=None, kv_layers=0, components=[])
    return msgspec.structs.replace(cfg, model=model)


class EngineProcess:
    """One ``pdpair-agent engine`` process, its log, and its JSON report."""

    def __init__(self, cfg: AgentConfig, workdir: Path, tag: str, args: Sequence[str] = ()):
        self.cfg, self.tag = cfg, tag
        self.config_path = workdir / f"{tag}.json"
        self.config_path.write_bytes(msgspec.json.encode(cfg))
        self.report_path = workdir / f"{tag}.report"
        self.report_path.unlink(missing_ok=True)
        self.log_path = workdir / f"{tag}.log"
        cmd = [
            sys.executable, "-m", "dataplane.cli", "engine", "--role", cfg.role,
            "--config", str(self.config_path), "--report", str(self.report_path), *args,
        ]
        env = dict(os.environ)
        self.compiled = compiled_child(cmd, env)  # the client library, as an engine's image may install it
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def report(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.report_path.read_text()))
        except (OSError, ValueError):
            return {"counts": {}, "components": {}, "made": 0}

    def count(self, key: str) -> int:
        return int(self.report()["counts"].get(key, 0))

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)

    def wait(self, timeout: float) -> int:
        try:
            return int(self.proc.wait(timeout))
        except subprocess.TimeoutExpired as exc:
            tail = self.log_tail()
            raise PDPairError(f"{self.tag} engine still running after {timeout:.0f}s:\n{tail}") from exc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def stop(self, timeout: float = 10.0) -> int:
        return stop_process(self.proc, self._log, timeout)


class SidecarPair:
    """A prefill and a decode pod, each = one sidecar agent + one synthetic engine process per TP
    rank (``prefill_tp``, ``decode_tp``; ``decode_dp``: DP attention on decode), on loopback."""

    def __init__(self, base: AgentConfig, workdir: Path, decode_args: Sequence[str] = (),
                 prefill_args: Sequence[str] = (), *, engine_schema: bool = False,
                 prefill_tp: int = 1, decode_tp: int = 1, decode_dp: int = 1):
        """``engine_schema``: the agents' configs name no model layout, so they adopt the engines'."""
        self.workdir = workdir
        base = msgspec.structs.replace(base, decode=msgspec.structs.replace(base.decode, dp_size=decode_dp))
        (p, *_), (d, *_) = loopback_pair(base, prefill_tp=prefill_tp, decode_tp=decode_tp)
        self.cfg = {
            "prefill": external(p, workdir / "prefill.sock"),
            "decode": external(d, workdir / "decode.sock"),
        }
        self.agent_cfg = {role: no_layout(c) if engine_schema else c for role, c in self.cfg.items()}
        self.args = {"prefill": list(prefill_args), "decode": list(decode_args)}
        self.agents: dict[str, AgentProcess] = {}
        self.engines: dict[str, EngineProcess] = {}
        """Each role's rank-0 engine."""
        self.rank_engines: dict[str, list[EngineProcess]] = {}
        """Each role's engine process per rank."""

    def start_agent(self, role: str) -> AgentProcess:
        self.agents[role] = AgentProcess(self.agent_cfg[role], self.workdir, f"{role}-agent")
        return self.agents[role]

    def start_engine(self, role: str, args: Sequence[str] | None = None) -> EngineProcess:
        """The role's engine: one process per rank; returns rank 0's."""
        extra = self.args[role] if args is None else list(args)
        cfg = self.cfg[role]
        bases, group = group_room_bases(cfg), cfg.tp_size // cfg.dp_size
        procs = []
        for rank in range(cfg.tp_size):
            tag = f"{role}-engine" if rank == 0 else f"{role}-engine-{rank}"
            ranked = ["--tp-rank", str(rank), "--tp-size", str(cfg.tp_size), "--dp-size", str(cfg.dp_size)]
            if role == "decode" and "--room-base" not in extra:  # a group's ranks: the same rooms
                ranked += ["--room-base", str(bases[rank // group])]
            procs.append(EngineProcess(cfg, self.workdir, tag, [*ranked, *extra]))
        self.rank_engines[role] = procs
        self.engines[role] = procs[0]
        return procs[0]

    def start(self, timeout: float = 60.0) -> SidecarPair:
        for role in ("prefill", "decode"):
            self.start_agent(role)
            self.start_engine(role)
        for agent in self.agents.values():
            agent.wait_ready(timeout)
        return self

    def stop(self) -> None:
        for engines in self.rank_engines.values():
            for engine in engines:
                engine.stop()
        for agent in self.agents.values():
            agent.stop()

    def __enter__(self) -> SidecarPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

