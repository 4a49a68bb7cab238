"""Process and port helpers shared by the cluster and the pod runner.

Role: pick free TCP ports on 127.0.0.1, start a command in its own process group
with its output in a log file, stop a process group (SIGTERM, bounded wait, then
SIGKILL), and poll a condition with a bound on both time and attempts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_PR_SET_PDEATHSIG = 1


def _parent_death_signal(sig: signal.Signals) -> Callable[[], None]:
    def set_signal() -> None:  # runs in the child between fork and exec
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return set_signal


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    on_parent_death: signal.Signals | None = signal.SIGTERM,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (own process group), stdout+stderr to ``log_path``.

    The kernel sends the child ``on_parent_death`` when this process dies (even by SIGKILL), so a
    killed test run leaves nothing behind; ``None`` lets it outlive us (``python -m devcluster up``).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_parent_death_signal(on_parent_death) if on_parent_death else None,
        )


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state != "Z"


def pid_cmdline(pid: int) -> list[str]:
    """The argv of a live process, or [] if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return pid_alive(pgid) or _any_member(pgid)


def _any_member(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pgid_of(int(entry.name)) == pgid and pid_alive(int(entry.name)):
            return True
    return False


def _pgid_of(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return -1


def stop_group(pgid: int, grace: float = 10.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the process group ``pgid``; SIGKILL whatever is left after ``grace`` seconds."""
    _signal_group(pgid, signal.SIGTERM)
    if not wait_until(lambda: _reaped_and_gone(pgid, proc), timeout=grace, interval=0.05):
        _signal_group(pgid, signal.SIGKILL)
        wait_until(lambda: _reaped_and_gone(pgid, proc), timeout=5.0, interval=0.05)


def kill_group(pgid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGKILL the process group ``pgid`` and reap it."""
    _signal_group(pgid, signal.SIGKILL)
    wait_until(lambda: _reaped_and_gone(pgid, proc), timeout=5.0, interval=0.05)


def _reaped_and_gone(pgid: int, proc: subprocess.Popen[bytes] | None) -> bool:
    if proc is not None:
        proc.poll()
    return not _group_alive(pgid)


def wait_until(
    condition: Callable[[], bool], timeout: float, interval: float = 0.2, max_attempts: int = 100_000
) -> bool:
    """Poll ``condition`` until it is true; False after ``timeout`` seconds or ``max_attempts`` tries."""
    deadline = time.monotonic() + timeout
    for _ in range(max_attempts):
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return False
