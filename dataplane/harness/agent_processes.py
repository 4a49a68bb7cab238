"""Start agents as real ``pdpair-agent run`` processes on loopback and talk to their endpoints: what
the demo, the benchmark and the two-process tests share.

Each agent gets a generated config file in a scratch directory, logs to a file there, and publishes
its bound ports through a ready file; ``AgentProcess`` waits for it, reads ``/status`` and stops the
process with SIGTERM (then SIGKILL) — only the processes it started. Agents launched together share a
pairing key made for them (``pairing_key_file``), as the operator's Secret gives one PDPair's agents theirs.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from ..agent.http import get_json
from ..compiled import CompileUnavailable, choose
from ..compiled import child as compiled_child
from ..config import AgentConfig
from ..errors import PDPairError

STATUS_POLL = 0.2
"""How often ``run_pair`` reads decode's ``/status`` while waiting: each read computes percentiles on
decode's HTTP thread (GIL), and the figures come from decode's own timestamps, not from this wait."""


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` of a process log, for error messages ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen[bytes], log: Any, timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout``; closes the process's log file; returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    log.close()
    return int(proc.returncode)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU a live process has used (``/proc``; None where there is none)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
BELOW_EPHEMERAL = 12000
"""How many ports under the kernel's ephemeral range ``free_port`` picks from."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a process about to bind it. Picked at random just below the kernel's
    ephemeral range: a port ``bind(0)`` hands out comes from that range, where any outgoing
    connection (ZMQ, NIXL, HTTP) may take it before the agent binds it ("Address already in use")."""
    low = _ephemeral_low()
    first = max(1024, low - BELOW_EPHEMERAL)
    for _ in range(100 if low - first >= 1000 else 0):
        port = random.randrange(first, low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        with open(EPHEMERAL) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


PAIRING_KEY_BYTES = 32


def pairing_key_file(directory: Path) -> str:
    """``directory``'s pairing key (32 random bytes, mode 0600), made by the first caller."""
    path = directory / "pairing.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return str(path)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(PAIRING_KEY_BYTES))
    return str(path)


def with_pairing_key(cfg: AgentConfig, directory: Path | None = None) -> AgentConfig:
    """``cfg`` as it is when it names a key file, else with ``directory``'s (else a new scratch
    directory's, removed when this process exits)."""
    if cfg.auth.key_file is not None:
        return cfg
    where = directory
    if where is None:
        where = Path(tempfile.mkdtemp(prefix="pdpair-pairing-"))
        atexit.register(shutil.rmtree, where, ignore_errors=True)
    auth = msgspec.structs.replace(cfg.auth, key_file=pairing_key_file(where))
    return msgspec.structs.replace(cfg, auth=auth)


class AgentProcess:
    def __init__(
        self, cfg: AgentConfig, workdir: Path, tag: str, env: dict[str, str] | None = None, *,
        keyless: bool = False, one_rank: bool = False,
    ):
        """``keyless``: start it without a pairing key (a plain peer) instead of ``workdir``'s;
        ``one_rank``: serve ``cfg.tp_rank`` alone (``--tp-rank``), not every rank of the role."""
        cfg = cfg if keyless else with_pairing_key(cfg, workdir)
        self.cfg, self.tag = cfg, tag
        self.config_path = workdir / f"{tag}.json"
        self.config_path.write_bytes(msgspec.json.encode(cfg))
        self.ready_path = workdir / f"{tag}.ready"
        self.log_path = workdir / f"{tag}.log"
        self.ready_path.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "dataplane.cli",
            "run",
            "--role",
            cfg.role,
            "--config",
            str(self.config_path),
            "--ready-file",
            str(self.ready_path),
            "--log-format",
            "json",
            *(("--tp-rank", str(cfg.tp_rank)) if one_rank else ()),
        ]
        child_env = {**os.environ, **(env or {})}
        self.compiled = compiled_child(cmd, child_env)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=child_env)
        self.ports: dict[str, Any] = {}

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_path.exists():
                self.ports = json.loads(self.ready_path.read_text())
                return self.ports
            if self.proc.poll() is not None:
                raise PDPairError(f"{self.tag} agent exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.05)
        raise PDPairError(f"{self.tag} agent not up after {timeout:.0f}s:\n{self.log_tail()}")

    @property
    def url(self) -> str:
        return f"http://{self.ports['host']}:{self.ports['metrics_port']}"

    @property
    def key(self) -> bytes | None:
        """The agent's pairing key, which signs the requests for its full ``/status``."""
        return self.cfg.auth.read_key()

    def status(self, timeout: float = 2.0) -> dict[str, Any]:
        return dict(get_json(self.url + "/status", timeout=timeout, key=self.key))

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)

    def cpu_seconds(self) -> float | None:
        return process_cpu_seconds(self.proc.pid)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> int:
        self.signal(signal.SIGCONT)  # a frozen (SIGSTOP) agent must run to handle SIGTERM
        return stop_process(self.proc, self._log, timeout)


class CpuProbe:
    """CPU an agent spends from now on: its whole process, and its role-worker thread."""

    def __init__(self, agent: AgentProcess):
        self.agent = agent
        self.process, self.worker = agent.cpu_seconds(), self._worker()

    def _worker(self) -> float | None:
        """The role workers' CPU, summed over the pod's ranks (each rank has its own worker)."""
        st = self.agent.status()
        values = [r.get("worker_cpu_seconds") for r in st["ranks"].values()] if st.get("ranks") else []
        values = values or [st.get("worker_cpu_seconds")]
        if any(v is None for v in values):
            return None
        return float(sum(values))

    def spent(self) -> dict[str, float | None]:
        return {
            "process_seconds": _delta(self.process, self.agent.cpu_seconds()),
            "worker_seconds": _delta(self.worker, self._worker()),
        }


def _delta(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def loopback_pair(
    base: AgentConfig, *, prefill_tp: int = 1, decode_tp: int = 1, bootstrap_port: int | None = None
) -> tuple[list[AgentConfig], list[AgentConfig]]:
    """Configs for a prefill group and a decode group on 127.0.0.1 sharing ``base``'s model/transfer
    and pairing key (a new one when ``base`` names none)."""
    base = with_pairing_key(base)
    port = bootstrap_port or free_port()
    listen = msgspec.structs.replace(
        base.listen, host="127.0.0.1", bootstrap_port=port, metrics_port=0, control_port=0
    )
    peer = msgspec.structs.replace(base.peer, bootstrap_host="127.0.0.1", bootstrap_port=port)
    roles = msgspec.structs.replace(
        base,
        listen=listen,
        peer=peer,
        prefill=msgspec.structs.replace(base.prefill, tp_size=prefill_tp),
        decode=msgspec.structs.replace(base.decode, tp_size=decode_tp),
    )
    prefill = [msgspec.structs.replace(roles, role="prefill", tp_rank=r) for r in range(prefill_tp)]
    decode = [msgspec.structs.replace(roles, role="decode", tp_rank=r) for r in range(decode_tp)]
    return prefill, decode


def run_pair(
    cfg: AgentConfig, *, timeout: float = 300.0, prefix: str = "pdpair-run-", prefill_tp: int = 1,
    decode_tp: int = 1,
) -> dict[str, Any]:
    """Run one loopback prefill/decode pair of pods (one agent process per pod serving its
    ``*_tp`` ranks) until every decode rank has completed ``cfg.synthetic.requests`` rooms (or
    ``timeout``), stop both, and return decode's final ``/status`` (a section per rank under
    ``ranks``), with the CPU each pod spent once both were ready under ``prefill_cpu`` / ``decode_cpu``
    (``process_seconds``, ``worker_seconds``: every rank's role worker)."""
    import tempfile

    (p_cfg, *_), (d_cfg, *_) = loopback_pair(cfg, prefill_tp=prefill_tp, decode_tp=decode_tp)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        prefill = AgentProcess(p_cfg, Path(tmp), "prefill")
        decode = AgentProcess(d_cfg, Path(tmp), "decode")
        try:
            prefill.wait_ready()
            decode.wait_ready()
            cpu, decode_cpu = CpuProbe(prefill), CpuProbe(decode)
            deadline, want = time.monotonic() + timeout, cfg.synthetic.requests
            while time.monotonic() < deadline and _completed(decode.status()) < want:
                time.sleep(STATUS_POLL)
            return {**decode.status(), "prefill_cpu": cpu.spent(), "decode_cpu": decode_cpu.spent()}
        finally:
            decode.stop()
            prefill.stop()


def _completed(status: dict[str, Any]) -> int:
    """Rooms completed by the pod's slowest rank."""
    ranks = status.get("ranks") or {"0": status}
    return min(int(r.get("requests", {}).get("completed", 0)) for r in ranks.values())


def compiled_agents(wanted: str, command: str = "bench") -> bool | None:
    """Whether the agents this benchmark starts run compiled (``--compiled``); None: asked for and
    unavailable (the reason printed, under ``command``'s name)."""
    if wanted == "on":
        print(f"{command}: compiled agent modules (built once per source version) ...", file=sys.stderr)
    try:
        return choose(wanted)
    except CompileUnavailable as exc:
        print(f"{command}: --compiled {wanted}: {exc}", file=sys.stderr)
        return None
