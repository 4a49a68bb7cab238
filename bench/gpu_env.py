"""The environment header of the GPU benchmarks: date, machine, GPU, driver, torch, NIXL and UCX."""

from __future__ import annotations

import ctypes
import datetime
import os
import platform
import subprocess
from importlib import metadata
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _ucx_version() -> str | None:
    """UCX's own version string, read from the libucp this process loaded (NIXL bundles one)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libucp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).ucp_get_version_string
            fn.restype = ctypes.c_char_p
            return f"{fn().decode()} ({os.path.basename(path)})"
        except (OSError, AttributeError):
            continue
    return None


def environment(nixl_loaded: bool = False) -> dict[str, Any]:
    import torch

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
         "--format=csv,noheader"], capture_output=True, text=True, check=False,
    ).stdout.strip()
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "gpu": smi,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nixl": _version("nixl-cu13") or _version("nixl-cu12") or _version("nixl"),
        "ucx_tls": os.environ.get("UCX_TLS", "(default)"),
    }
    if nixl_loaded:
        env["ucx"] = _ucx_version()
    return env
