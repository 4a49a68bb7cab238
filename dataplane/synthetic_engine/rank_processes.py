"""The synthetic engine with TP > 1: one process per rank, as a serving engine runs one scheduler
process per rank, each connected to the pod's agent on its own.

``pdpair-agent engine`` without ``--tp-rank`` for a role of ``tpSize`` N > 1 starts itself N times
with ``--tp-rank 0 .. N-1`` (decode ranks of one attention group with one ``--room-base``: they serve
the same requests, each DP group its own), forwards SIGTERM / SIGINT to them, and exits when they all
have: with the first non-zero status (the other ranks are then stopped too), else 0.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from ..agent.pod import group_room_bases
from ..config import AgentConfig

log = logging.getLogger(__name__)
STOP_WAIT = 10.0


def rank_commands(cfg: AgentConfig, argv: Sequence[str], report: str | None, room_base: int | None) -> list[
    list[str]
]:
    """Each rank's command line: this one's arguments, then the rank's own (argparse keeps the last)."""
    bases, group = group_room_bases(cfg), cfg.tp_size // cfg.dp_size
    out = []
    for rank in range(cfg.tp_size):
        cmd = [sys.executable, "-m", "dataplane.cli", *argv, "--tp-rank", str(rank)]
        if cfg.role == "decode" and room_base is None:
            cmd += ["--room-base", str(bases[rank // group])]
        if report:
            cmd += ["--report", f"{report}.rank{rank}"]
        out.append(cmd)
    return out


def run_ranks(commands: Sequence[Sequence[str]]) -> int:
    """Start one process per command and supervise them (see the module docstring)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    procs = [subprocess.Popen(list(cmd)) for cmd in commands]
    status = 0
    try:
        while any(p.poll() is None for p in procs) and not stop.wait(0.2):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:
                status = failed[0]
                log.error("an engine rank exited with status %d; stopping the others", status)
                break
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    return status or next((p.returncode for p in procs if p.returncode), 0)


__all__ = ["rank_commands", "run_ranks"]
